// kv_policy_spec.h compiled as CUDA: the test cases of policy_spec_cases.h evaluated by
// nvcc-compiled code on the host and, when a device is present, in a kernel.
#include <cuda_runtime.h>

#include <cstdio>

#include "policy_spec_cases.h"

namespace h2o {

namespace {

__global__ void evaluate_kernel(const SpecCase *cases, int n, SpecResult *out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = evaluate_spec_case(cases[i]);
}

bool failed(cudaError_t e, const char *what, char *error, int size) {
    if (e == cudaSuccess) return false;
    std::snprintf(error, static_cast<size_t>(size), "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return true;
}

}  // namespace

void evaluate_spec_cases_cuda_host(const SpecCase *cases, int n, SpecResult *out) {
    for (int i = 0; i < n; ++i) out[i] = evaluate_spec_case(cases[i]);
}

bool evaluate_spec_cases_cuda_device(const SpecCase *cases, int n, SpecResult *out, char *error, int size) {
    error[0] = '\0';
    int devices = 0;
    if (failed(cudaGetDeviceCount(&devices), "cudaGetDeviceCount", error, size)) return false;
    if (devices == 0) {
        std::snprintf(error, static_cast<size_t>(size), "no CUDA device");
        return false;
    }
    SpecCase *d_cases = nullptr;
    SpecResult *d_out = nullptr;
    const bool ok = !failed(cudaMalloc(&d_cases, sizeof(SpecCase) * n), "cudaMalloc", error, size) &&
                    !failed(cudaMalloc(&d_out, sizeof(SpecResult) * n), "cudaMalloc", error, size) &&
                    !failed(cudaMemcpy(d_cases, cases, sizeof(SpecCase) * n, cudaMemcpyHostToDevice), "cudaMemcpy", error, size) &&
                    [&] {
                        evaluate_kernel<<<(n + 63) / 64, 64>>>(d_cases, n, d_out);
                        return !failed(cudaGetLastError(), "kernel launch", error, size);
                    }() &&
                    !failed(cudaMemcpy(out, d_out, sizeof(SpecResult) * n, cudaMemcpyDeviceToHost), "cudaMemcpy", error, size);
    cudaFree(d_cases);
    cudaFree(d_out);
    return ok;
}

}  // namespace h2o
