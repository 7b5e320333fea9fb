#include "backend_registry.h"

#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#ifdef H2O_HAVE_VULKAN
#include "vulkan/vulkan_backend.h"
#endif

namespace h2o {

namespace {

BackendDevice cpu_device(int n_threads) {
    BackendDevice d;
    d.kind = H2O_BACKEND_CPU;
    d.name = std::string("cpu (") + cpu::kernel_isa_name(cpu::current_kernel_isa()) + " kernels" +
             (n_threads > 0 ? ", " + std::to_string(n_threads) + " threads" : "") + ")";
    d.type = "cpu";
    return d;
}

#ifdef H2O_HAVE_VULKAN
// Enumerating devices creates a Vulkan instance, which is slow; the devices of a machine do not
// change while a process runs, so they are listed once.
const std::vector<BackendDevice> &vulkan_devices() {
    static const std::vector<BackendDevice> devices = [] {
        std::vector<VulkanDeviceInfo> infos;
        std::vector<BackendDevice> out;
        if (!list_vulkan_devices(&infos).ok()) return out;
        for (const VulkanDeviceInfo &info : infos) {
            BackendDevice d;
            d.kind = H2O_BACKEND_VULKAN;
            d.device_index = info.index;
            d.name = info.name;
            d.type = vulkan_device_type_name(info.type);
            d.memory_bytes = info.device_local_bytes;
            out.push_back(d);
        }
        return out;
    }();
    return devices;
}
#endif

}  // namespace

std::vector<BackendDevice> list_backend_devices() {
    std::vector<BackendDevice> devices{cpu_device(0)};
#ifdef H2O_HAVE_VULKAN
    for (const BackendDevice &d : vulkan_devices()) devices.push_back(d);
#endif
    return devices;
}

Status make_backend(h2o_backend_kind kind, int device_index, int n_threads, int max_batch,
                    std::unique_ptr<Backend> *out, BackendDevice *chosen, std::string *why) {
    switch (kind) {
        case H2O_BACKEND_CPU:
            if (device_index > 0) {
                return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "the CPU backend has one device (index 0 or -1), not " +
                                                                   std::to_string(device_index));
            }
            *out = make_cpu_backend(n_threads, max_batch);
            *chosen = cpu_device(n_threads);
            *why = "the CPU backend was requested";
            return Status::Ok();
        case H2O_BACKEND_VULKAN: {
#ifdef H2O_HAVE_VULKAN
            H2O_TRY(make_vulkan_backend(device_index, max_batch, out));
            VulkanCounters counters;
            vulkan_counters(**out, &counters);
            for (const BackendDevice &d : vulkan_devices()) {
                if (d.name == counters.device_name) *chosen = d;
            }
            *why = "the Vulkan backend was requested";
            return Status::Ok();
#else
            return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "this build of h2o has no Vulkan backend");
#endif
        }
        case H2O_BACKEND_CUDA:
            return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "this build of h2o has no CUDA backend");
        case H2O_BACKEND_AUTO: {
            if (device_index >= 0) {
                return make_error(H2O_ERR_INVALID_ARGUMENT, "device_index " + std::to_string(device_index) +
                                                                " needs an explicit backend, not auto");
            }
#ifdef H2O_HAVE_VULKAN
            std::string seen;
            for (const BackendDevice &d : vulkan_devices()) {
                seen += (seen.empty() ? "" : ", ") + d.name + " (" + d.type + ")";
                if (d.type == "cpu") continue;
                const Status st = make_vulkan_backend(d.device_index, max_batch, out);
                if (st.ok()) {
                    *chosen = d;
                    *why = "auto: chose the Vulkan GPU " + d.name;
                    return Status::Ok();
                }
                seen += " [failed: " + st.message + "]";
            }
            *why = "auto: chose the CPU backend; Vulkan devices: " + (seen.empty() ? std::string("none") : seen);
#else
            *why = "auto: chose the CPU backend (this build has no GPU backend)";
#endif
            *out = make_cpu_backend(n_threads, max_batch);
            *chosen = cpu_device(n_threads);
            return Status::Ok();
        }
    }
    return make_error(H2O_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace h2o
