// Q4_0, Q8_0 and K-quant (Q4_K, Q5_K, Q6_K) weight matrices interleaved by 8 rows (cpu/kernels.h) for the CPU kernels.
//
// The model file's bytes cannot be used in place for that layout, so each matrix is copied once,
// and the copy is shared by every CPU session that uses the same matrix of the same loaded model
// (sessions on several threads included): memory stays one copy of the weights however many
// sessions run. The copy is freed with the last session that holds it.
#pragma once

#include <cstdint>
#include <memory>

#include "status.h"
#include "tensor_types.h"

namespace h2o::cpu {

// The interleaved copy of the Q4_0, Q8_0, Q4_K, Q5_K or Q6_K matrix at `file_data` (rows a multiple of 8), made on
// the first request and shared with every later one while any holder lives.
// Errors: H2O_ERR_OUT_OF_MEMORY.
Status shared_interleaved(TensorType type, const void *file_data, int64_t rows, int64_t cols, std::shared_ptr<const uint8_t> *out);

}  // namespace h2o::cpu
