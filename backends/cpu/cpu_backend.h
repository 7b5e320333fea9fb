// The CPU backend: the reference implementation of every operation, multi-threaded over a
// fork-join pool, with SIMD kernels chosen at run time (kernels.h).
#pragma once

#include <memory>

#include "backend.h"

namespace h2o {

struct BackendEntry;

// The CPU backend's entry in the backend table (backend_registry.h).
extern const BackendEntry kCpuBackendEntry;

// max_batch: the most tokens one operation will see (sizes the matmul scratch).
std::unique_ptr<Backend> make_cpu_backend(int n_threads, int max_batch);

// For tests of error handling: makes a CPU backend's operation `after_operations` operations from
// now (0: the next) fail with H2O_ERR_BACKEND_FAILED, as a device error would. False when
// `backend` is not a CPU backend.
bool cpu_inject_fault(Backend &backend, int after_operations);

}  // namespace h2o
