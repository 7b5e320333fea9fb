// Private to backends/cpu: what the portable kernels.cpp and the SIMD kernel files share.
//
// Only plain data and declarations belong here. An inline function defined in a header would be
// compiled twice, once with -mavx2 (or +dotprod) and once without, and the linker may keep the
// SIMD copy for both callers, putting those instructions on the path meant for older CPUs. For the
// same reason the SIMD kernel files use no standard-library templates or inline functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/query_stats.h"
#include "kv_row_format.h"
#include "tensor_types.h"

namespace h2o::cpu {
enum class KernelIsa;  // kernels.h
}

namespace h2o::cpu::detail {

// Tokens are processed in groups of this many; the last group is padded with zero tokens.
constexpr int kGroupTokens = 4;

// Bytes of a Q4_0 and a Q8_0 block (BlockQ4_0, BlockQ8_0: an fp16 scale and 32 quants).
constexpr int64_t kQ4Bytes = 18, kQ8Bytes = 34;

// Bytes of one block of an 8-row group in the interleaved layouts (kernels.h): Q4_0x8 (8 scales,
// 4 chunks), Q8_0x8 (8 scales, 8 chunks), Q4_Kx8 (8 d, 8 dmin, 64 scales, 64 mins, 32 chunks),
// Q5_Kx8 (Q4_Kx8's, then 8 chunks of high bits from byte kQ4Kx8Bytes) and Q6_Kx8 (16 groups of
// 3 vectors, 8 d, 128 scales).
constexpr int64_t kQ4x8Bytes = 8 * kQ4Bytes, kQ8x8Bytes = 8 * kQ8Bytes, kQ4Kx8Bytes = 160 + 32 * 32, kQ5Kx8Bytes = kQ4Kx8Bytes + 8 * 32,
                  kQ6Kx8Bytes = 16 * 96 + 16 + 128;
// Where Q6_Kx8's d and scales start within its block.
constexpr int64_t kQ6Kx8D = 16 * 96, kQ6Kx8Scales = kQ6Kx8D + 16;

// The activations of one token group, quantized to 8 bits for the integer dot products against
// quantized weights (Q4_0, Q8_0 and the K-quants), covering two 32-column blocks b and b+1 (64
// columns). The byte order matches what
// an AVX2 register holds after loading the quants of blocks b and b+1 side by side: for Q4_0, the
// low nibbles of both blocks' 16 bytes are elements 0..15 of b and of b+1; the high nibbles,
// elements 16..31. So no shuffles are needed in the inner loop.
struct ActBlockPair {
    int8_t lo[kGroupTokens][32];  // token t: [b elements 0..15 | b+1 elements 0..15]
    int8_t hi[kGroupTokens][32];  // token t: [b elements 16..31 | b+1 elements 16..31]
    float d[2 * kGroupTokens];    // scales: [b: tokens 0..3 | b+1: tokens 0..3]
    // 8 * sum of the block's quants, same order: what Q4_0's implicit -8 offset contributes.
    int32_t offset[2 * kGroupTokens];
};
static_assert(sizeof(ActBlockPair) == 320, "ActBlockPair must be 5 cache lines");

// One matmul, as the ISA-specific range functions see it.
struct MatmulProblem {
    TensorType wtype;
    const uint8_t *w;
    size_t w_row_bytes;
    bool interleaved;  // Q4_0, Q8_0 or K-quant weights, 8 rows interleaved (kernels.h); w_row_bytes unused
    int64_t rows, cols, n_tokens;
    const float *x;  // [n_tokens][cols]
    float *y;        // [n_tokens][rows]
    // For quantized weights: the quantized activations, [n_groups][n_pairs].
    const ActBlockPair *act;
    int64_t n_pairs;          // (cols + 63) / 64
    const float *fp16_table;  // fp16 bits -> float, 65536 entries
};

// Element types that name the quantized KV row formats (kv_row_format.h) to the SIMD attention
// kernels, whose rows are pointers to Element: a Q8 or Q4 row begins at its first byte (the
// scale), and a stride of them counts bytes. Each level reads their elements its own way.
struct KvQ8Byte {
    uint8_t byte;
};
struct KvQ4Byte {
    uint8_t byte;
};

using DotKvRows = void (*)(const float *const *queries, int m, const uint8_t *rows, int64_t row_bytes, int64_t n, int64_t len,
                           float *scores, int64_t scores_stride);
using WeightedKvRowSum = void (*)(float *const *outs, int m, const float *weights, int64_t weights_stride, const uint8_t *rows,
                                  int64_t row_bytes, int64_t n, int64_t len);

// Entry points an instruction set provides. Each works on plain pointers; threading, scratch
// layout and dispatch live in kernels.cpp.
struct KernelTable {
    // Quantizes token groups [g0, g1) of x into act (group g starts at act + g * n_pairs).
    void (*quantize_activations)(const float *x, int64_t cols, int64_t n_tokens, int64_t g0, int64_t g1, ActBlockPair *act);
    // y for rows [r0, r1) and token groups [g0, g1).
    void (*matmul_range)(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1);
    // n elements of type (F32, F16, Q8_0 or Q4_0) to floats. (K-quants go to dequantize_row.)
    void (*dequantize)(TensorType type, const void *src, float *dst, int64_t n, const float *fp16_table);
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n);
    // exp(x[i] - max) in place; returns their sum.
    float (*exp_sub_sum)(float *x, float max, int64_t n);
    void (*silu_mul)(float *out, const float *gate, const float *up, int64_t n);
    void (*gelu_mul)(float *out, const float *gate, const float *up, int64_t n);
    // Attention over cached KV rows for m queries (dot_kv_rows and weighted_kv_row_sum in
    // kernels.h), one entry per KvRowFormat (kv_row_format.h), indexed by its value. Optional: a level
    // that leaves an entry null gets the portable loops (kernels.cpp).
    DotKvRows dot_kv_rows[kKvRowFormatCount];
    WeightedKvRowSum weighted_kv_row_sum[kKvRowFormatCount];
    // n floats to IEEE halves and back, as fp16.h converts (rounding to nearest even). Optional as
    // above (a level without conversion instructions leaves them null).
    void (*floats_to_halves)(const float *src, uint16_t *dst, int64_t n);
    void (*halves_to_floats)(const uint16_t *src, float *dst, int64_t n);
    // The largest of n > 0 floats, passing over NaN (what std::max from -infinity gives): a
    // softmax's first pass. Optional as above.
    float (*max_value)(const float *x, int64_t n);
    // Pairs (x[2i], x[2i + 1]) rotated by (cos_sin[2i], cos_sin[2i + 1]) in place, with rotary.h's
    // rotate_pair's bits: rolling re-rotates kept keys (kernels.h). Optional as above.
    void (*rotate_pairs)(float *x, const float *cos_sin, int64_t n_pairs);
    // The same for the first 2 * n_pairs halves of an F16 row, rounded back as floats_to_halves
    // rounds. Optional as above.
    void (*rotate_half_pairs)(uint16_t *row, const float *cos_sin, int64_t n_pairs);
    // add_query_stats (kernels.h). Optional as above.
    void (*add_query_stats)(const QueryStats &stats, const float *w, const int32_t *first_seer, const int32_t *last_seer, int64_t n,
                            int32_t query, float threshold, float persistence_weight, bool proxy);
    // What matmul_range does with interleaved weights: 0: cannot run them; 1: runs them (the
    // scalar reference); 2: runs them faster than the file's layout (interleaving_preferred).
    int interleaved_support;
};

extern const KernelTable kScalarKernels;  // kernels.cpp

// The table of a level (kernels.h's KernelIsa) this CPU supports: what dispatch runs for it (tests
// call a level's kernels directly with it).
const KernelTable &table_of(KernelIsa isa);
#if defined(__x86_64__) || defined(__i386__)
#define H2O_KERNELS_X86 1
extern const KernelTable kAvx2Kernels;  // kernels_avx2.cpp; only for CPUs with AVX2, FMA and F16C
// The avx2+vnni level's matmul (kernels_avx2.cpp; the rest is the AVX2 level's): for CPUs with
// AVX-VNNI (kernels_avx2_vnni.cpp), and with AVX-512 VNNI and VL (kernels_avx2_vnni_evex.cpp).
void matmul_range_avx2_vnni(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1);
void matmul_range_avx2_vnni_evex(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1);
extern const KernelTable kAvx512Kernels;  // kernels_avx512.cpp; those and AVX-512 F/BW/VL/VNNI
#elif defined(__aarch64__)
#define H2O_KERNELS_ARM64 1
extern const KernelTable kNeonKernels;         // kernels_neon.cpp; every ARM64 CPU
extern const KernelTable kNeonDotprodKernels;  // kernels_neon_dotprod.cpp; CPUs with dotprod
extern const KernelTable kNeonI8mmKernels;     // kernels_neon_i8mm.cpp; CPUs with dotprod and i8mm
#endif

// Rows [r0, r1) (whole 8-row groups) x token groups [g0, g1) of interleaved weights, for a SIMD
// level whose row functions work on units (blocks or super-blocks) of kUnitCols columns:
// kGroupRows for a whole group of kGroupTokens tokens, kTokenRows for one token. Token groups go
// over column slices of 4096, as in quant_range, so their activations stay in L1; single tokens
// (decoding, the tail of a prompt) take whole rows. No instructions of its own: each level's
// instantiation (its own row functions, of internal linkage) is its own function.
//
// A level with wider registers may also give kPairRows, which takes two neighbouring 8-row groups
// (rg, rg + 1) at once; its argument after t0 is the token count, kGroupTokens or 1. The range
// then goes over pairs of groups, and a lone last group takes kGroupRows or kTokenRows.
using InterleavedRows = void (*)(const MatmulProblem &, int64_t, int64_t, int, int64_t, int64_t);
using InterleavedPairRows = void (*)(const MatmulProblem &, int64_t, int64_t, int, int, int64_t, int64_t);

template <int64_t kUnitCols, InterleavedRows kGroupRows, InterleavedRows kTokenRows, InterleavedPairRows kPairRows = nullptr>
void interleaved_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    constexpr int64_t kSliceUnits = 4096 / kUnitCols;
    const int64_t n_units = p.cols / kUnitCols;
    // Row groups [r0 / 8, r1 / 8) of token group g, the given tokens, over units [u0, u1).
    const auto row_groups = [&](int64_t g, int t0, int n_tok, int64_t u0, int64_t u1) {
        int64_t rg = r0 / 8;
        if constexpr (kPairRows != nullptr) {
            for (; rg + 2 <= r1 / 8; rg += 2) kPairRows(p, rg, g, t0, n_tok, u0, u1);
        }
        for (; rg < r1 / 8; ++rg) (n_tok == 1 ? kTokenRows : kGroupRows)(p, rg, g, t0, u0, u1);
    };
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n_tok = p.n_tokens - g * kGroupTokens;
        if (n_tok >= kGroupTokens) {
            for (int64_t u0 = 0; u0 < n_units; u0 += kSliceUnits) {
                row_groups(g, 0, kGroupTokens, u0, u0 + kSliceUnits < n_units ? u0 + kSliceUnits : n_units);
            }
        } else {
            for (int t = 0; t < n_tok; ++t) row_groups(g, t, 1, 0, n_units);
        }
    }
}

// Q6_Kx8 (kernels.h) stores quants unsigned, q + 32, so a group's integer sum of q * y carries
// 32 * sum(y) too much, y being the 16 activation quants of its scale group. Those sums depend on
// the token only, so they are made once per column slice of 16 super-blocks (4096 columns, as
// above) and token, and every row group of the range reads them: kSums writes token t's (of
// group g) for super-blocks [s0, s1), one int32 per scale group (16 * (s - s0) + group) in
// whatever form the level's row functions want. The row functions take (p, rg, g, t0, s0, s1,
// sums): kGroupRows all kGroupTokens tokens of group g (t0 = 0), whose sums lie kQ6Kx8SliceSums
// apart; kTokenRows token t0 alone. Both set y for s0 == 0 and add to it otherwise. Single tokens
// go over slices too, which only bounds the table (a whole row of sums would need the stack to
// grow with the row length). kPairRows, where given, takes pairs of row groups as in
// interleaved_range (with the token count before s0).
constexpr int64_t kQ6Kx8SliceSupers = 16, kQ6Kx8SliceSums = 16 * kQ6Kx8SliceSupers;

using Q6Kx8Rows = void (*)(const MatmulProblem &, int64_t, int64_t, int, int64_t, int64_t, const int32_t *);
using Q6Kx8PairRows = void (*)(const MatmulProblem &, int64_t, int64_t, int, int, int64_t, int64_t, const int32_t *);

template <void (*kSums)(const MatmulProblem &, int64_t, int, int64_t, int64_t, int32_t *), Q6Kx8Rows kGroupRows, Q6Kx8Rows kTokenRows,
          Q6Kx8PairRows kPairRows = nullptr>
void q6kx8_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    const int64_t n_super = p.cols / 256;
    alignas(64) int32_t sums[kGroupTokens * kQ6Kx8SliceSums];
    const auto row_groups = [&](int64_t g, int t0, int n_tok, int64_t s0, int64_t s1) {
        int64_t rg = r0 / 8;
        if constexpr (kPairRows != nullptr) {
            for (; rg + 2 <= r1 / 8; rg += 2) kPairRows(p, rg, g, t0, n_tok, s0, s1, sums);
        }
        for (; rg < r1 / 8; ++rg) (n_tok == 1 ? kTokenRows : kGroupRows)(p, rg, g, t0, s0, s1, sums);
    };
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n_tok = p.n_tokens - g * kGroupTokens;
        for (int64_t s0 = 0; s0 < n_super; s0 += kQ6Kx8SliceSupers) {
            const int64_t s1 = s0 + kQ6Kx8SliceSupers < n_super ? s0 + kQ6Kx8SliceSupers : n_super;
            if (n_tok >= kGroupTokens) {
                for (int t = 0; t < kGroupTokens; ++t) kSums(p, g, t, s0, s1, sums + t * kQ6Kx8SliceSums);
                row_groups(g, 0, kGroupTokens, s0, s1);
            } else {
                for (int t = 0; t < n_tok; ++t) {
                    kSums(p, g, t, s0, s1, sums);
                    row_groups(g, t, 1, s0, s1);
                }
            }
        }
    }
}

}  // namespace h2o::cpu::detail
