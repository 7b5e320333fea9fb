// The CUDA backend's entry in the backend table (backend_registry.h).
#include <string>

#include "backend_registry.h"
#include "cuda/cuda_backend.h"

namespace h2o {

namespace {

Status cuda_devices(std::vector<BackendDevice> *out) {
    std::vector<CudaDeviceInfo> infos;
    out->clear();
    H2O_TRY(list_cuda_devices(&infos));
    for (const CudaDeviceInfo &info : infos) {
        BackendDevice d;
        d.kind = H2O_BACKEND_CUDA;
        d.device_index = info.index;
        d.name = info.name;
        d.type = info.integrated ? "integrated" : "discrete";
        d.memory_bytes = info.memory_bytes;
        out->push_back(std::move(d));
    }
    return Status::Ok();
}

Status cuda_supports(const BackendRequirements &needs, const BackendDevice &device) {
    for (TensorType type : needs.weight_types) H2O_TRY(cuda_runs_weight_type(type));
    H2O_TRY(cuda_runs_kv(needs.kv));
    return check_device_memory(needs, device);
}

Status cuda_create(const BackendDevice &device, const BackendOptions &options, std::unique_ptr<Backend> *out, BackendDevice *running) {
    H2O_TRY(make_cuda_backend(device.device_index, options.max_batch, out));
    *running = device;
    return Status::Ok();
}

}  // namespace

const BackendEntry kCudaBackendEntry = {H2O_BACKEND_CUDA, cuda_devices, cuda_supports, cuda_create, nullptr};

}  // namespace h2o
