// The backends compiled into this build, which lib/ reaches only through this table. An explicit
// list rather than entries that register themselves from static initialisers: the linker leaves
// out of a program any object file of a static library that nothing refers to, and with it such
// an initialiser. The build's #ifdefs for backends live here, not in lib/.
#include "backend_registry.h"
#include "cpu/cpu_backend.h"
#ifdef H2O_HAVE_VULKAN
#include "vulkan/vulkan_backend.h"
#endif
#ifdef H2O_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace h2o {

std::span<const BackendEntry *const> registered_backends() {
    static const BackendEntry *const table[] = {
        &kCpuBackendEntry,
#ifdef H2O_HAVE_VULKAN
        &kVulkanBackendEntry,
#endif
#ifdef H2O_HAVE_CUDA
        &kCudaBackendEntry,
#endif
    };
    return table;
}

}  // namespace h2o
