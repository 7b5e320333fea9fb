// CPU compute kernels: matrix multiplication against weights in their stored format, and the
// small vector operations of a Llama layer.
//
// Every function has a portable implementation and SIMD ones: AVX2/FMA/F16C (also with VNNI's
// vpdpbusd) and AVX-512 on x86-64; NEON on ARM64, with variants for the dot-product (sdot) and
// 8-bit matrix-multiply (smmla) extensions. The choice is made at run time (see KernelIsa), so
// the library runs on any x86-64 or ARM64 CPU. All give the same results up to the order of
// floating-point additions (and, for Q4 KV rows, the one rounding of a fused multiply-add: see
// dot_kv_rows).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/query_stats.h"
#include "kv_row_format.h"
#include "tensor_types.h"
#include "thread_pool.h"

namespace h2o::cpu {

// ---- instruction set selection --------------------------------------------------------------

// Kernel levels, each named by kernel_isa_name(): "scalar" (portable, everywhere), "avx2" (x86-64
// with AVX2, FMA and F16C), "avx2+vnni" (those and a 256-bit vpdpbusd: AVX-VNNI, or AVX-512 VNNI
// with VL), "avx512" (AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI), "neon" (any ARM64),
// "neon+dotprod" (ARMv8.2 dotprod: sdot) and "neon+i8mm" (dotprod and i8mm: smmla).
enum class KernelIsa {
    Scalar,
    Avx2,
    Avx2Vnni,
    Avx512,
    Neon,
    NeonDotprod,
    NeonI8mm
};

const char *kernel_isa_name(KernelIsa isa);

// Whether this CPU can run the kernels of `isa` (false for another architecture's).
bool cpu_supports(KernelIsa isa);

// The kernels in use. Chosen at first use: the best level the CPU supports, or the level the
// environment variable H2O_CPU_KERNELS names (one of the names above). A name that is unknown, or
// a level this CPU cannot run, ends the process with a message rather than running other kernels
// than the ones asked for.
KernelIsa current_kernel_isa();

// Switches kernels, for tests and benchmarks; not while other threads run kernels. Returns false,
// changing nothing, if the CPU cannot run `isa`.
bool set_kernel_isa(KernelIsa isa);

// ---- matrix multiplication ------------------------------------------------------------------

// Weight types matmul and dequantize accept: F32, F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
bool matmul_supports(TensorType wtype);

// Bytes of scratch matmul needs for these sizes (the same whichever KernelIsa is in use). For the
// quantized types it holds the activations quantized to 8 bits; 0 for F32/F16.
size_t matmul_scratch_bytes(TensorType wtype, int64_t cols, int64_t n_tokens);

// y[t*rows + r] = dot(W row r, x[t*cols ...]) for t < n_tokens, r < rows.
//
// W is row-major [rows x cols] in its stored format: row r starts at w + r * row_bytes(wtype, cols).
// x is [n_tokens x cols] floats, y is [n_tokens x rows] floats (token-major), and y must not
// overlap x or W. scratch holds matmul_scratch_bytes(wtype, cols, n_tokens) bytes, any alignment.
// For Q4_0/Q8_0 weights cols must be a multiple of 32, for the K-quants (Q4_K, Q5_K, Q6_K) of 256.
// The activations are quantized to 8 bits per 32-value block as llama.cpp's Q8_0 does (its
// rounding, but the scale kept as a float rather than fp16), so the dot products run on integers;
// the K-quants use the same activation blocks (rather than llama.cpp's Q8_K with one scale per
// 256), which keeps the activation error the same for every quantized type.
// Work is split over the pool's threads with a single ThreadPool::run; nothing is allocated.
// Breaking these preconditions (an unsupported type, a bad row length, no scratch) is a programming
// error and aborts with a message: check matmul_supports() when loading a model.
//
// layout: how W's rows lie in memory: Rows (the file's layout) for every type, or Interleaved8
// for Q4_0, Q8_0, Q4_K, Q5_K and Q6_K weights that interleave_rows has rearranged (below).
enum class WeightLayout {
    Rows,
    Interleaved8
};
void matmul(ThreadPool &pool, TensorType wtype, const void *w, int64_t rows, int64_t cols, const float *x, int64_t n_tokens, float *y,
            void *scratch, WeightLayout layout = WeightLayout::Rows);

// Several products of one input, y_i = W_i · x: a layer's q, k and v, or its gate and up. They run
// in a single ThreadPool::run: the activations are quantized once for all of them, and the threads
// share out the rows of every matrix together, so a small matrix (GQA's k and v) costs no
// synchronisation of its own. Each y_i has exactly the bits matmul gives it. Preconditions as
// matmul's, for each W_i (all of cols columns); count in [1, kMaxMatmulGroup].
struct MatmulOutput {
    TensorType wtype;
    const void *w;
    int64_t rows;
    float *y;  // [n_tokens][rows]
    WeightLayout layout;
};
constexpr int kMaxMatmulGroup = 3;
void matmul_group(ThreadPool &pool, const MatmulOutput *outputs, int count, int64_t cols, const float *x, int64_t n_tokens, void *scratch);

// ---- Q4_0, Q8_0, Q4_K, Q5_K and Q6_K weights, 8 rows interleaved ----------------------------
//
// A matrix-vector product reads each weight once, so its speed is how few instructions a weight
// byte costs. In the file's layout a row's block sums to one number, which costs a horizontal
// reduction per row and block. Interleaving 8 rows puts one row in each 32-bit lane of a 256-bit
// register instead: 4 bytes of each of the 8 rows meet the same 4 activation bytes (broadcast), so
// every integer dot-product instruction works for all 8 rows and no lane is ever reduced across.
// Rows come in groups of 8 (the row count must be a multiple of 8); group g's blocks follow each
// other, block b of group g at byte (g * blocks_per_row + b) * interleaved_block_bytes.
//
// Q4_0x8, 144 bytes per block of 32 columns: the 8 rows' fp16 scales (row i at bytes 2i, 2i+1),
// then 4 chunks of 32 bytes, chunk c holding bytes 4c..4c+3 of each row's 16 quant bytes (row i
// at 4i..4i+3). The same bytes as the file's Q4_0, rearranged, so the same size.
//
// Q8_0x8, 272 bytes per block of 32 columns: the 8 rows' fp16 scales (row i at bytes 2i, 2i+1),
// then 8 chunks of 32 bytes, chunk c holding quants 4c..4c+3 of each row (row i at 4i..4i+3). The
// same bytes as the file's Q8_0, rearranged.
//
// Q4_Kx8, 1184 bytes per super-block of 256 columns: the 8 rows' fp16 d (bytes 0..15) and dmin
// (16..31); the sub-block scales unpacked to one byte each, sub-block s of row i at 32 + 8s + i;
// the mins likewise at 96 + 8s + i; then 32 chunks of 32 bytes from byte 160, chunk k holding bytes
// 4k..4k+3 of each row's 128 quant bytes (row i at 4i..4i+3). The unpacked 6-bit scales make it
// 32 bytes (2.8%) larger than the file's 8 blocks of 144.
//
// Q5_Kx8, 1440 bytes per super-block: Q4_Kx8's 1184 bytes for the header and the low 4 bits of
// the quants, then 8 chunks of 32 bytes from byte 1184, chunk c holding bytes 4c..4c+3 of each
// row's 32 qh bytes (row i at 4i..4i+3), where bit j of qh byte l is bit 4 of element l of
// sub-block j. So quant chunk 8j + c finds its high bits in qh chunk c, bits 2j (low nibbles) and
// 2j + 1 (high nibbles). 32 bytes (2.3%) larger than the file's 8 blocks of 176.
//
// Q6_Kx8, 1680 bytes per super-block of 256 columns, the same size as the file's 8 blocks of 210:
// the quants come first, as 16 scale groups of 96 bytes, group s (columns 16s..16s+15, scale s)
// at byte 96s; then the 8 rows' fp16 d at 1536 + 2i; then the 8-bit scales, scale s of row i at
// 1552 + 8s + i. A group is 3 vectors of 32 bytes, vector c at 96s + 32c, holding bytes 4i..4i+3
// for row i. Byte j of row i in vector c holds the 6-bit quant (0..63, the file's q, not q - 32)
// of column 16s + 4c + j in bits 0..5, and in bits 6..7 bits 2c and 2c+1 of the quant of column
// 16s + 12 + j. So masking the 3 vectors gives 12 of a group's columns, and the 2-bit pieces of
// the last 4 come together with three shifts: the file's split into 4 low and 2 high bits, which
// lie in different places for different columns, is undone once, at conversion.

// Whether the kernels in use run `type` interleaved rather than in the file's layout: Q4_0, Q8_0,
// Q4_K, Q5_K and Q6_K at the x86 SIMD levels and the NEON levels with sdot (neon+dotprod, neon+i8mm),
// where sdot by lane does for one row per 32-bit lane what vpdpbusd does on x86. Every level can
// run interleaved weights except ARMv8.0 NEON's.
bool interleaving_preferred(TensorType type);

// Bytes of a rows x cols matrix of `type` (Q4_0, Q8_0, Q4_K, Q5_K or Q6_K) interleaved.
size_t interleaved_bytes(TensorType type, int64_t rows, int64_t cols);

// Rearranges a Q4_0, Q8_0, Q4_K, Q5_K or Q6_K matrix of `rows` (a multiple of 8) rows into the
// interleaved layout: src holds rows * row_bytes(type, cols) bytes, dst interleaved_bytes(type,
// rows, cols); no overlap.
void interleave_rows(TensorType type, const void *src, void *dst, int64_t rows, int64_t cols);

// Row `row` of an interleaved matrix back in the file's layout: row_bytes(type, cols) bytes at dst.
void deinterleave_row(TensorType type, const void *src, int64_t cols, int64_t row, void *dst);

// ---- weight rows ----------------------------------------------------------------------------

// n values of a supported type (n a multiple of its block size) to floats.
void dequantize(TensorType type, const void *src, float *dst, int64_t n);

// The rows ids[0..n_ids) of a [rows x cols] weight tensor as floats: out[i*cols ...] = row ids[i]
// (an embedding lookup). The ids must be valid row numbers.
void dequantize_rows(TensorType type, const void *w, int64_t cols, const int32_t *ids, int64_t n_ids, float *out,
                     WeightLayout layout = WeightLayout::Rows);

// ---- vector operations ----------------------------------------------------------------------

float dot_f32(const float *a, const float *b, int64_t n);

// y[i] += a * x[i]
void axpy(float *y, float a, const float *x, int64_t n);

// Attention over n cached KV rows of len elements in `format` (kv_row_format.h), row i starting at
// rows + i * row_bytes (rows of F32 4-byte aligned), for m queries at once:
// scores[j * scores_stride + i] = dot(queries[j], row i) for j < m, i < n. A prompt's queries of
// one kv head (its query heads, and neighbouring tokens) read the same rows: the x86 levels take
// the rows in blocks that stay in L1 while all m queries meet them (a block of halves or codes
// widened to floats once). Every score has the bits it has with m = 1, whatever m: tiling the
// queries changes no result. Q8 and Q4 rows are read as their elements' values (x = scale * q,
// x = min + scale * q; the SIMD levels round the latter once, by a fused multiply-add).
void dot_kv_rows(KvRowFormat format, const float *const *queries, int m, const uint8_t *rows, int64_t row_bytes, int64_t n, int64_t len,
                 float *scores, int64_t scores_stride);

// outs[j][c] += sum of w_j[i] * row i [c] over the rows whose weight w_j[i] = weights[j *
// weights_stride + i] is not 0 (the others add nothing, whatever they hold: NaN too), for j < m and
// c < len; the terms are added in row order, so again each output has the bits it has with m = 1.
void weighted_kv_row_sum(KvRowFormat format, float *const *outs, int m, const float *weights, int64_t weights_stride, const uint8_t *rows,
                         int64_t row_bytes, int64_t n, int64_t len);

// n floats to IEEE halves (rounded to nearest even, as fp16.h's half_from_float) and back (exact):
// the F16 KV rows, converted with the processor's instructions where it has them.
void floats_to_halves(const float *src, uint16_t *dst, int64_t n);
void halves_to_floats(const uint16_t *src, float *dst, int64_t n);

// Each pair (x[2i], x[2i + 1]), i < n_pairs, rotated in place by the angle whose cosine and sine
// are cos_sin[2i] and cos_sin[2i + 1], with exactly the bits of rotary.h's rotate_pair (each
// product rounded, then their difference and sum): the KV cache re-rotates kept keys with it when
// positions roll, and the other backends rotate them with that same function.
void rotate_pairs(float *x, const float *cos_sin, int64_t n_pairs);
// The same for the first 2 * n_pairs halves of an F16 row, in place: each pair widened (exactly),
// rotated and rounded back to halves (to nearest even), as converting the row to floats, rotating
// and converting back gives.
void rotate_half_pairs(uint16_t *row, const float *cos_sin, int64_t n_pairs);

// One query's kv_stats_add_query on the slots it sees, with its bits at every level: slot s is
// seen when first_seer[s] <= query <= last_seer[s], and w[s] (finite, not negative) is its
// weight; proxy: the query is a proxy query (it adds to `last`). Slots it does not see keep their
// values. Attention of a default session runs it over every cached slot, query by query.
void add_query_stats(const QueryStats &stats, const float *w, const int32_t *first_seer, const int32_t *last_seer, int64_t n, int32_t query,
                     float threshold, float persistence_weight, bool proxy);

// out[i] = a[i] + b[i]; out may alias a or b.
void add(float *out, const float *a, const float *b, int64_t n);

// out[i] = in[i] / sqrt(mean(in^2) + eps) * weight[i]; out may alias in.
void rmsnorm(float *out, const float *in, const float *weight, int64_t n, float eps);

// In place: x[i] = exp(x[i] - max) / sum. Entries of -inf become exactly 0 (masked positions);
// if every entry is -inf, all become 0.
void softmax(float *x, int64_t n);

// SwiGLU: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); out may alias gate or up.
void silu_mul(float *out, const float *gate, const float *up, int64_t n);

// GeGLU: out[i] = gelu_tanh(gate[i]) * up[i] (activation.h); out may alias gate or up.
void gelu_mul(float *out, const float *gate, const float *up, int64_t n);

}  // namespace h2o::cpu
