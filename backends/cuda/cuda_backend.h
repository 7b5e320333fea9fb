// The CUDA backend: weights (in their file's block layout), activations, the KV cache and its
// eviction statistics live in device memory; every operation is a kernel launched on one stream,
// and the host waits only where it needs a result (download, synchronize).
//
// Eviction runs on the device as kv_policy.h specifies it (victims, pinning, the random policy's
// generator, rolling re-rotation of kept keys), with the arithmetic of kv_policy_spec.h; KV rows,
// rotations and dequantized weights come from the headers the CPU reference uses too
// (kv_row_codec.h, rotary.h, weight_element.h), and softmax from online_softmax.h.
//
// The runtime is linked statically and opens the driver itself: without a driver or a device the
// backend lists no devices and refuses to be made, with the CUDA error in the message. Decode
// steps are not captured in CUDA graphs; session snapshots are not supported yet.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"

namespace h2o {

struct BackendEntry;

// The CUDA backend's entry in the backend table (backend_registry.h).
extern const BackendEntry kCudaBackendEntry;

struct CudaDeviceInfo {
    int index = 0;
    std::string name;
    bool integrated = false;
    uint64_t memory_bytes = 0;
    int compute_major = 0, compute_minor = 0;
};

// The CUDA devices present (listed once per process). Errors: H2O_ERR_BACKEND_UNAVAILABLE naming
// the CUDA error when the runtime counts none: no driver or one too old
// (cudaErrorInsufficientDriver), no device (cudaErrorNoDevice).
Status list_cuda_devices(std::vector<CudaDeviceInfo> *out);

// A backend on device `device_index` (-1: the first). max_batch: the most tokens one operation
// sees. Errors: H2O_ERR_BACKEND_UNAVAILABLE (no driver, no device, a bad index),
// H2O_ERR_BACKEND_FAILED (the device failed while being set up).
Status make_cuda_backend(int device_index, int max_batch, std::unique_ptr<Backend> *out);

// What the kernels run, on every device; adopt_weight and create_kv refuse the rest.
std::vector<TensorType> cuda_weight_types();
Status cuda_runs_weight_type(TensorType type);
// The KV cache types and head sizes the attention kernels run (heads up to kCudaMaxHeadDim).
constexpr int kCudaMaxHeadDim = 256;
Status cuda_runs_kv(const KvConfig &config);

}  // namespace h2o
