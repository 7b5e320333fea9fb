// Weight formats: fp16 conversion and llama.cpp's block layouts, in plain portable C++.
//
// This is the ground truth the fast kernels in backends/cpu are tested against, and the quantizer
// writes the same bytes as llama.cpp's reference quantizer (quantize_row_*_ref), so a tensor we
// quantize matches one from a llama.cpp-made GGUF file.
//
// Adding a type (e.g. the K-quants): add its block struct here, then a case to quantize_row,
// dequantize_row and quant_supported in quant.cpp; the kernels dispatch on TensorType too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor_types.h"

namespace h2o {

// IEEE binary16 <-> binary32, as ggml and the F16C instructions do it: float -> half rounds to
// nearest, ties to even; overflow gives infinity; results below the smallest half subnormal round
// to (signed) zero. NaN stays NaN with its sign and the top 9 payload bits, made quiet.
uint16_t fp32_to_fp16(float f);
float fp16_to_fp32(uint16_t h);

// Elements per block of the legacy quant formats.
constexpr int kQK = 32;

// Q8_0: value j = qs[j] * d.
struct BlockQ8_0 {
    uint16_t d;  // fp16 scale
    int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must match llama.cpp's 34-byte layout");

// Q4_0: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble;
// value = (nibble - 8) * d.
struct BlockQ4_0 {
    uint16_t d;  // fp16 scale
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must match llama.cpp's 18-byte layout");

// Whether quantize_row/dequantize_row handle this type.
bool quant_supported(TensorType type);

// Converts n floats to `type` (n a multiple of the type's block size; dst holds
// row_bytes(type, n) bytes). Blocks whose inputs are all finite get exactly llama.cpp's reference
// bytes; a block containing inf or NaN gets a NaN scale and zero quants, so the NaN shows.
// Returns false, writing nothing, for a type that quant_supported() rejects.
bool quantize_row(TensorType type, const float *src, void *dst, int64_t n);

// The inverse: n values of `type` to floats. Returns false for an unsupported type.
bool dequantize_row(TensorType type, const void *src, float *dst, int64_t n);

}  // namespace h2o
