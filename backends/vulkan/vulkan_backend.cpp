// The Vulkan backend (vulkan_backend.h): its public functions. The backend itself is
// vk_backend.h's class, implemented by concern in the vk_*.cpp files beside this one.
#include "vulkan/vulkan_backend.h"

#include "vulkan/vk_backend.h"

namespace h2o {

Status make_vulkan_backend(int device_index, int max_batch, std::unique_ptr<Backend> *out) {
    if (max_batch <= 0) return make_error(H2O_ERR_INVALID_ARGUMENT, "max_batch must be positive");
    std::shared_ptr<vk::SharedDevice> device;
    H2O_TRY(vk::SharedDevice::get(device_index, &device));
    auto backend = std::make_unique<VulkanBackend>(std::move(device), max_batch);
    H2O_TRY(backend->init());
    *out = std::move(backend);
    return Status::Ok();
}

bool vulkan_fail_next_submission(Backend &backend) {
    auto *vulkan = dynamic_cast<VulkanBackend *>(&backend);
    if (vulkan) vulkan->fail_next_submission();
    return vulkan != nullptr;
}

bool vulkan_counters(const Backend &backend, VulkanCounters *out) {
    const auto *vulkan = dynamic_cast<const VulkanBackend *>(&backend);
    if (!vulkan) return false;
    *out = vulkan->counters();
    return true;
}

}  // namespace h2o
