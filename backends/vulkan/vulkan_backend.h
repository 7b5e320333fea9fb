// The Vulkan compute backend: weights, activations, the KV cache and its eviction statistics live
// in device memory; every operation of an evaluation is recorded into one command buffer and
// submitted once, when the host needs a result (download/synchronize).
//
// Environment:
//   H2O_VULKAN_VALIDATION=1  enable VK_LAYER_KHRONOS_validation (core and synchronization checks)
//                            with a debug messenger; warnings and errors are logged and counted
//                            (VulkanCounters::validation_messages). Read when a backend is made:
//                            backends with and without it are on separate Vulkan devices.
//   H2O_VULKAN_SUBGROUPS=0   use the shared-memory reductions even where subgroup arithmetic is
//                            supported (for testing both paths).
//   H2O_VULKAN_MATVEC_ROWS=1 matvec by whole rows per subgroup on a GPU too (the default on CPU
//                            devices only, where it was measured; =0 turns it off everywhere).
//   H2O_VULKAN_BINDING_LIMIT=<bytes>  pretend storage buffer bindings cover at most this much (for
//                            testing how weights larger than one binding are split).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend.h"

namespace h2o {

struct BackendEntry;

// The Vulkan backend's entry in the backend table (backend_registry.h).
extern const BackendEntry kVulkanBackendEntry;

enum class VulkanDeviceType {
    Other,
    Discrete,
    Integrated,
    Virtual,
    Cpu
};

const char *vulkan_device_type_name(VulkanDeviceType type);

struct VulkanDeviceInfo {
    int index = 0;  // the device_index to pass to make_vulkan_backend
    std::string name;
    VulkanDeviceType type = VulkanDeviceType::Other;
    uint64_t device_local_bytes = 0;  // size of the largest device-local memory heap
    uint32_t api_version = 0;         // VK_MAKE_API_VERSION encoding
};

// The Vulkan devices present. Errors: H2O_ERR_BACKEND_UNAVAILABLE when there is no Vulkan loader
// or the instance cannot be created (an empty list is not an error).
Status list_vulkan_devices(std::vector<VulkanDeviceInfo> *out);

// A backend on device `device_index` (as listed by list_vulkan_devices), or on the best device
// when -1: discrete, then integrated, then virtual, then CPU. max_batch: the most tokens one
// operation will see. Backends on one device share the Vulkan device (created by the first) and
// the weights they adopt from the same model (uploaded by the first); each has its own memory for
// the rest, and its own command stream. Backends may run on different threads at once.
// Errors: H2O_ERR_BACKEND_UNAVAILABLE (no loader, no device, bad index, a device without the
// needed features), H2O_ERR_OUT_OF_MEMORY.
Status make_vulkan_backend(int device_index, int max_batch, std::unique_ptr<Backend> *out);

// What the backend runs, on every device; adopt_weight and create_kv refuse the rest with these
// errors, and the backend's supports() answers from them before anything is made.
// The weight types the kernels run: F32, F16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K (all of kWeightTypes).
std::span<const TensorType> vulkan_weight_types();
// H2O_ERR_UNSUPPORTED, naming the type, unless it is one of those.
Status vulkan_runs_weight_type(TensorType type);
// H2O_ERR_UNSUPPORTED (H2O_ERR_INVALID_ARGUMENT for a malformed config) unless the kernels run a
// KV cache of this type, head size and rotary size. Limits of a device (its storage buffer range)
// are checked when the cache is made on it.
Status vulkan_runs_kv(const KvConfig &config);

// What a Vulkan backend has done so far, for measurements and tests.
//
// Backends on one device share it, and the backends of one model share its weights there
// (vk_shared_device.h): the first to adopt a weight uploads it, and its bytes_to_device and
// weight_bytes_to_device count the upload; the others upload nothing for it. A backend's
// device_memory_bytes is its own memory only (activations, scratch, the KV cache), never the
// shared weights, which shared_weight_bytes reports for every backend holding them, and
// device_total_bytes counts once.
struct VulkanCounters {
    std::string device_name;
    bool subgroups = false;               // subgroup-arithmetic kernels in use
    bool validation = false;              // the validation layer is active
    uint64_t bytes_to_device = 0;         // host -> device copies (weights this backend uploaded, uploads)
    uint64_t weight_bytes_to_device = 0;  // the part of bytes_to_device that uploaded weights
    uint64_t bytes_to_host = 0;           // device -> host copies (downloads)
    uint64_t submissions = 0;             // vkQueueSubmit calls
    uint64_t dispatches = 0;
    uint64_t barriers = 0;             // pipeline barriers recorded
    uint64_t device_memory_bytes = 0;  // VkDeviceMemory of the backend's own: activations, scratch, the KV cache
    uint64_t shared_weight_bytes = 0;  // VkDeviceMemory of the weights it uses, shared with the model's other backends
    uint64_t device_total_bytes = 0;   // VkDeviceMemory on the device now: every backend's own and the weights, once
    uint64_t host_memory_bytes = 0;    // host-visible staging and upload memory
    uint64_t validation_messages = 0;  // validation warnings and errors on the device (H2O_VULKAN_VALIDATION=1)
};

// For tests of error handling: the backend's next submission fails as if the device were lost
// (H2O_ERR_BACKEND_FAILED). False when `backend` is not a Vulkan backend.
bool vulkan_fail_next_submission(Backend &backend);

// The counters of a backend made by make_vulkan_backend; false for any other backend.
bool vulkan_counters(const Backend &backend, VulkanCounters *out);

}  // namespace h2o
