// The CUDA backend (cuda_backend.h): its public functions. The backend itself is cuda_impl.cuh's
// class, implemented by concern in the cuda_*.cu files beside this one.
#include "cuda/cuda_impl.cuh"

namespace h2o {

std::vector<TensorType> cuda_weight_types() { return {std::begin(kCudaWeightTypes), std::end(kCudaWeightTypes)}; }

Status cuda_runs_weight_type(TensorType type) {
    if (std::find(std::begin(kCudaWeightTypes), std::end(kCudaWeightTypes), type) == std::end(kCudaWeightTypes)) {
        return make_error(H2O_ERR_UNSUPPORTED, std::string("the CUDA backend does not support ") + type_name(type) + " weights");
    }
    return Status::Ok();
}

Status cuda_runs_kv(const KvConfig &config) {
    H2O_TRY(kv_type_fits_head_dim(config.type, config.head_dim));
    if (config.head_dim > kCudaMaxHeadDim) {
        return make_error(H2O_ERR_UNSUPPORTED, "the CUDA attention kernels run heads of up to " + std::to_string(kCudaMaxHeadDim) +
                                                   " dimensions, not " + std::to_string(config.head_dim));
    }
    if (config.rope.dims < 0 || config.rope.dims > config.head_dim) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "rotary dimensions " + std::to_string(config.rope.dims) + " do not fit heads of " +
                                                        std::to_string(config.head_dim));
    }
    return Status::Ok();
}

Status list_cuda_devices(std::vector<CudaDeviceInfo> *out) {
    // Counting devices loads the driver; the devices of a machine do not change while a process
    // runs, so they are listed once.
    static const std::pair<Status, std::vector<CudaDeviceInfo>> listed = [] {
        std::vector<CudaDeviceInfo> devices;
        int count = 0;
        const cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess) {
            // No driver (cudaErrorInsufficientDriver), or a driver without devices (cudaErrorNoDevice).
            (void)cudaGetLastError();
            return std::make_pair(
                make_error(H2O_ERR_BACKEND_UNAVAILABLE, "no usable CUDA device: cudaGetDeviceCount: " + cuda_error_text(e)), devices);
        }
        for (int i = 0; i < count; ++i) {
            cudaDeviceProp props;
            const cudaError_t pe = cudaGetDeviceProperties(&props, i);
            if (pe != cudaSuccess) {
                (void)cudaGetLastError();
                return std::make_pair(
                    make_error(H2O_ERR_BACKEND_UNAVAILABLE, "cudaGetDeviceProperties(" + std::to_string(i) + "): " + cuda_error_text(pe)),
                    std::vector<CudaDeviceInfo>());
            }
            CudaDeviceInfo d;
            d.index = i;
            d.name = props.name;
            d.integrated = props.integrated != 0;
            d.memory_bytes = props.totalGlobalMem;
            d.compute_major = props.major;
            d.compute_minor = props.minor;
            devices.push_back(std::move(d));
        }
        return std::make_pair(Status::Ok(), devices);
    }();
    *out = listed.second;
    return listed.first;
}

Status make_cuda_backend(int device_index, int max_batch, std::unique_ptr<Backend> *out) {
    out->reset();
    std::vector<CudaDeviceInfo> devices;
    H2O_TRY(list_cuda_devices(&devices));
    if (devices.empty()) return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "no CUDA device is present");
    if (device_index < -1 || device_index >= static_cast<int>(devices.size())) {
        return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "CUDA device index " + std::to_string(device_index) + " is out of range (" +
                                                           std::to_string(devices.size()) + " devices)");
    }
    auto backend = std::make_unique<CudaBackend>(device_index < 0 ? 0 : device_index, max_batch);
    H2O_TRY(backend->init());
    *out = std::move(backend);
    return Status::Ok();
}

}  // namespace h2o
