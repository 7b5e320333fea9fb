// Which compute backends and devices exist, and making one for a session.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "h2o/h2o.h"

namespace h2o {

struct BackendDevice {
    h2o_backend_kind kind = H2O_BACKEND_CPU;
    int device_index = 0;
    std::string name;
    std::string type;  // "cpu", "discrete", "integrated", "virtual", "other"
    uint64_t memory_bytes = 0;
};

// The CPU, then every Vulkan device (none when Vulkan is not built or not installed).
std::vector<BackendDevice> list_backend_devices();

// Makes the backend a session asked for. AUTO picks a Vulkan GPU when there is one and the CPU
// otherwise (a Vulkan device that is itself a CPU implementation is slower than the CPU backend),
// and falls back to the CPU if the GPU backend cannot be made; *why says what was chosen and why.
Status make_backend(h2o_backend_kind kind, int device_index, int n_threads, int max_batch,
                    std::unique_ptr<Backend> *out, BackendDevice *chosen, std::string *why);

}  // namespace h2o
