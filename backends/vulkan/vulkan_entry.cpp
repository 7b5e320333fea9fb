// The Vulkan backend's entry in the backend table (backend_registry.h).
#include <utility>

#include "backend_registry.h"
#include "vulkan/vk_installed_drivers.h"
#include "vulkan/vulkan_backend.h"

namespace h2o {

namespace {

Status vulkan_devices(std::vector<BackendDevice> *out) {
    // Enumerating devices creates a Vulkan instance, which is slow; the devices of a machine do not
    // change while a process runs, so they are listed once.
    static const std::pair<Status, std::vector<BackendDevice>> listed = [] {
        std::vector<VulkanDeviceInfo> infos;
        std::vector<BackendDevice> devices;
        const Status st = list_vulkan_devices(&infos);
        for (const VulkanDeviceInfo &info : infos) {
            BackendDevice d;
            d.kind = H2O_BACKEND_VULKAN;
            d.device_index = info.index;
            d.name = info.name;
            d.type = vulkan_device_type_name(info.type);
            d.memory_bytes = info.device_local_bytes;
            devices.push_back(std::move(d));
        }
        return std::make_pair(st, std::move(devices));
    }();
    *out = listed.second;
    return listed.first;
}

// AUTO passes over a CPU implementation, so where the installed drivers can offer nothing else it
// need not load them (vk_installed_drivers.h). What is installed does not change while a process
// runs, so the drivers are looked at once.
Status vulkan_auto_screen() {
    static const Status verdict = vk::drivers_may_offer_gpu(vk::find_installed_drivers());
    return verdict;
}

Status vulkan_supports(const BackendRequirements &needs, const BackendDevice &device) {
    for (TensorType type : needs.weight_types) H2O_TRY(vulkan_runs_weight_type(type));
    H2O_TRY(vulkan_runs_kv(needs.kv));
    return check_device_memory(needs, device);
}

Status vulkan_create(const BackendDevice &device, const BackendOptions &options, std::unique_ptr<Backend> *out, BackendDevice *running) {
    H2O_TRY(make_vulkan_backend(device.device_index, options.max_batch, out));
    *running = device;
    return Status::Ok();
}

}  // namespace

const BackendEntry kVulkanBackendEntry = {H2O_BACKEND_VULKAN, vulkan_devices, vulkan_supports, vulkan_create, vulkan_auto_screen};

}  // namespace h2o
