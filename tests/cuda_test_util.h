// Helpers of the CUDA tests: a backend on the first device, skipped without one.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "backend.h"
#include "cuda/cuda_backend.h"
#include "status.h"

namespace h2o_test {

// A CUDA backend, or null: without a driver or device (after printing the skip marker, or giving
// the reason to *no_device), after failing the test when creating it failed otherwise.
inline std::unique_ptr<h2o::Backend> make_cuda(int max_batch, std::string *no_device = nullptr) {
    std::unique_ptr<h2o::Backend> backend;
    const h2o::Status st = h2o::make_cuda_backend(-1, max_batch, &backend);
    if (st.code == H2O_ERR_BACKEND_UNAVAILABLE) {
        if (no_device) {
            *no_device = st.message;
        } else {
            std::printf("H2O-SKIP: %s\n", st.message.c_str());
        }
        return nullptr;
    }
    if (!st.ok()) FAIL_CHECK("creating the CUDA backend failed: " << st.message);
    return backend;
}

}  // namespace h2o_test
