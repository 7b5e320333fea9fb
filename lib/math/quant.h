// Weight formats: fp16 conversion and llama.cpp's block layouts, in plain portable C++.
//
// This is the ground truth the fast kernels in backends/cpu are tested against. For Q8_0 and Q4_0
// the quantizer writes the same bytes as llama.cpp's reference quantizer (quantize_row_*_ref), so
// a tensor we quantize matches one from a llama.cpp-made GGUF file. For the K-quants the block
// layouts are llama.cpp's exactly (files interoperate both ways), but the quantizer is our own
// search for the scales, so its bytes differ from llama.cpp's while its error is as low or lower.
//
// Adding a type: add its block struct here, then a case to quantize_row, dequantize_row and
// quant_supported in quant.cpp; the kernels dispatch on TensorType too. Q5_0 is read and written
// here but run as Q8_0 (widen_q5_0_to_q8_0).
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

// Q5_0: Q4_0's nibbles with a fifth bit, bit j of qh (little-endian) for element j:
// value = ((nibble | fifth bit << 4) - 16) * d.
struct BlockQ5_0 {
    uint16_t d;  // fp16 scale
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block must match llama.cpp's 22-byte layout");

// Q5_0 blocks rewritten as Q8_0 blocks of the same values, exactly: the same scale, and each
// quant (-16..15) as a signed byte. How files with Q5_0 tensors run on the kernels of every
// backend, at 34 bytes per 32 weights instead of 22. `in` needs no alignment (a file's bytes).
void widen_q5_0_to_q8_0(const void *in, BlockQ8_0 *out, int64_t n_blocks);

// Elements per super-block of the K-quants.
constexpr int kQK_K = 256;

// Q4_K: 8 sub-blocks of 32 elements, each with a 6-bit scale sc[j] and a 6-bit min m[j]:
// value = d * sc[j] * q - dmin * m[j], q in 0..15.
//   scales[12] packs the 8 pairs (see unpack_k_scales): bytes 0-3 hold sc[0..3] in their low 6
//   bits, bytes 4-7 m[0..3]; bytes 8-11 hold the low 4 bits of sc[4..7] (low nibble) and of
//   m[4..7] (high nibble), whose top 2 bits are the top 2 bits of bytes 0-3 (sc) and 4-7 (m).
//   qs: 4 groups of 32 bytes; group g holds sub-block 2g in its low nibbles (byte l = element l
//   of the sub-block) and sub-block 2g+1 in its high nibbles.
struct BlockQ4_K {
    uint16_t d;     // fp16 scale of the sub-block scales
    uint16_t dmin;  // fp16 scale of the sub-block mins
    uint8_t scales[12];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block must match llama.cpp's 144-byte layout");

// Q5_K: Q4_K with a fifth bit per quant (q in 0..31). qh[l] bit 2g holds the high bit of element
// l of sub-block 2g, bit 2g+1 that of element l of sub-block 2g+1.
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[kQK_K / 8];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block must match llama.cpp's 176-byte layout");

// Q6_K: 16 sub-blocks of 16 elements with signed 8-bit scales: value = d * scales[s] * (q - 32),
// q in 0..63. Each half h (elements 128h..128h+127) uses ql[64h..64h+63] and qh[32h..32h+31]; for
// l < 32, element 128h + 32i + l (i = 0..3) takes its low 4 bits from the low (i = 0, 1) or high
// (i = 2, 3) nibble of ql[64h + l + 32 * (i & 1)], and its top 2 bits from bits 2i, 2i+1 of
// qh[32h + l]. Element e uses scales[e / 16].
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];
    uint8_t qh[kQK_K / 4];
    int8_t scales[kQK_K / 16];
    uint16_t d;  // fp16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block must match llama.cpp's 210-byte layout");

// The 8 six-bit scales and mins of a Q4_K/Q5_K block (see BlockQ4_K).
void unpack_k_scales(const uint8_t packed[12], uint8_t sc[8], uint8_t m[8]);
// The inverse; sc and m must be below 64.
void pack_k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t packed[12]);

// Whether quantize_row/dequantize_row handle this type.
bool quant_supported(TensorType type);

// Converts n floats to `type` (n a multiple of the type's block size; dst holds
// row_bytes(type, n) bytes). Q8_0/Q4_0 blocks whose inputs are all finite get exactly llama.cpp's
// reference bytes; K-quant blocks get the scales of a least-squares search (see quant.cpp). A
// block containing inf or NaN gets a NaN scale and zero quants, so the NaN shows.
// Returns false, writing nothing, for a type that quant_supported() rejects.
bool quantize_row(TensorType type, const float *src, void *dst, int64_t n);

// The inverse: n values of `type` to floats. Returns false for an unsupported type.
bool dequantize_row(TensorType type, const void *src, float *dst, int64_t n);

}  // namespace h2o
