// Run-time dispatch, the threading of matmul, and the portable (scalar) kernels.
//
// The scalar kernels compute exactly what the SIMD ones (AVX2, NEON) do, in plain C++: the same
// 8-bit activation quants, the same integer block sums and the same per-block scales, so they
// differ only in the order floating-point sums are taken.
#include "cpu/kernels.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "activation.h"
#include "cpu/kernels_internal.h"
#include "kv_row_codec.h"
#include "quant.h"
#include "rotary.h"

#if defined(H2O_KERNELS_X86)
#include <cpuid.h>
#include <immintrin.h>  // _mm_pause (SSE2, part of every x86-64)
#elif defined(H2O_KERNELS_ARM64) && defined(__linux__)
#include <sys/auxv.h>  // getauxval: the CPU features the kernel reports
#endif

static_assert(h2o::cpu::detail::kQ4Bytes == sizeof(h2o::BlockQ4_0) && h2o::cpu::detail::kQ8Bytes == sizeof(h2o::BlockQ8_0),
              "kernels_internal.h: block sizes");
static_assert(h2o::cpu::detail::kQ6Kx8Bytes == 8 * sizeof(h2o::BlockQ6_K), "Q6_Kx8 is the file's size");
static_assert(h2o::cpu::detail::kQ5Kx8Bytes == h2o::cpu::detail::kQ4Kx8Bytes + 8 * sizeof(h2o::BlockQ5_K::qh), "Q5_Kx8 is Q4_Kx8 and qh");

namespace h2o::cpu {

using detail::ActBlockPair;
using detail::KernelTable;
using detail::kGroupTokens;
using detail::MatmulProblem;

namespace {

bool is_kquant(TensorType t) { return t == TensorType::Q4_K || t == TensorType::Q5_K || t == TensorType::Q6_K; }

[[noreturn]] void fatal(const char *what) {
    std::fprintf(stderr, "h2o: cpu kernels: %s\n", what);
    std::abort();
}

// fp16 -> float for every bit pattern; one load per conversion in the inner loops. Built on first
// use (256 KiB, once per process).
const float *fp16_table() {
    struct Table {
        float v[65536];
        Table() {
            for (uint32_t i = 0; i < 65536; ++i) v[i] = fp16_to_fp32(static_cast<uint16_t>(i));
        }
    };
    static const Table table;
    return table.v;
}

uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// ---- scalar kernels -------------------------------------------------------------------------

// Quantizes 32 activations the way quantize_row(Q8_0) does, keeping the scale as a float (it never
// leaves this process, and an fp16 scale would only add rounding). Returns the scale.
float quantize_block_q8(const float *x, int8_t *q, int32_t *sum) {
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(x[j]));
        finite = finite && std::fabs(x[j]) <= FLT_MAX;
    }
    const float d = finite ? amax / 127.0f : NAN;
    const float id = (finite && d != 0.0f) ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) {
        const float r = std::roundf(x[j] * id);
        q[j] = static_cast<int8_t>(r >= -127.0f && r <= 127.0f ? r : 0.0f);
        s += q[j];
    }
    *sum = s;
    return d;
}

void quantize_activations_scalar(const float *x, int64_t cols, int64_t n_tokens, int64_t g0, int64_t g1, ActBlockPair *act) {
    const int64_t n_blocks = cols / 32, n_pairs = (n_blocks + 1) / 2;
    for (int64_t g = g0; g < g1; ++g) {
        for (int64_t p = 0; p < n_pairs; ++p) {
            ActBlockPair &a = act[g * n_pairs + p];
            std::memset(&a, 0, sizeof a);  // padding tokens and a missing odd block stay zero
            for (int t = 0; t < kGroupTokens; ++t) {
                const int64_t token = g * kGroupTokens + t;
                if (token >= n_tokens) break;
                for (int half = 0; half < 2; ++half) {
                    const int64_t b = 2 * p + half;
                    if (b >= n_blocks) break;
                    int8_t q[32];
                    int32_t sum;
                    a.d[half * kGroupTokens + t] = quantize_block_q8(x + token * cols + b * 32, q, &sum);
                    a.offset[half * kGroupTokens + t] = 8 * sum;
                    std::memcpy(&a.lo[t][16 * half], q, 16);
                    std::memcpy(&a.hi[t][16 * half], q + 16, 16);
                }
            }
        }
    }
}

// One weight block (in the file's layout) as signed integers in the activations' lo/hi order,
// with its scale.
template <TensorType kType>
float unpack_block(const uint8_t *blk, const float *fp16_table, int8_t lo[16], int8_t hi[16]) {
    if constexpr (kType == TensorType::Q4_0) {
        for (int j = 0; j < 16; ++j) {
            lo[j] = static_cast<int8_t>((blk[2 + j] & 0x0F) - 8);
            hi[j] = static_cast<int8_t>((blk[2 + j] >> 4) - 8);
        }
    } else {
        std::memcpy(lo, blk + 2, 16);
        std::memcpy(hi, blk + 18, 16);
    }
    return fp16_table[load_u16(blk)];
}

bool is_interleavable(TensorType t) { return t == TensorType::Q4_0 || t == TensorType::Q8_0 || is_kquant(t); }

// Bytes of one block (Q4_0, Q8_0: 32 columns; the K-quants: a 256-column super-block) of an 8-row
// group in the interleaved layouts (kernels.h), and the offset of the group block holding block b
// of `row`.
int64_t interleaved_block_bytes(TensorType type) {
    switch (type) {
        case TensorType::Q4_0:
            return detail::kQ4x8Bytes;
        case TensorType::Q8_0:
            return detail::kQ8x8Bytes;
        case TensorType::Q4_K:
            return detail::kQ4Kx8Bytes;
        case TensorType::Q5_K:
            return detail::kQ5Kx8Bytes;
        default:
            return detail::kQ6Kx8Bytes;
    }
}
int64_t interleaved_block_offset(TensorType type, int64_t cols, int64_t row, int64_t b) {
    const int64_t per_row = cols / static_cast<int64_t>(traits(type).block_elements);
    return ((row / 8) * per_row + b) * interleaved_block_bytes(type);
}

// Copies one block of one row between the file's layout and its lane of an interleaved group
// block: to_file: src is the group block, dst the file's block; otherwise the other way round.
void copy_interleaved_block(TensorType type, const uint8_t *src, uint8_t *dst, int lane, bool to_file) {
    // n bytes at offset g of the group block <-> offset f of the file's block.
    auto copy = [&](size_t g, size_t f, size_t n) { to_file ? std::memcpy(dst + f, src + g, n) : std::memcpy(dst + g, src + f, n); };
    if (type == TensorType::Q6_K) {
        copy(detail::kQ6Kx8D + 2 * lane, offsetof(BlockQ6_K, d), 2);
        for (int s = 0; s < 16; ++s) copy(detail::kQ6Kx8Scales + 8 * s + lane, offsetof(BlockQ6_K, scales) + s, 1);
        // The quants: element e of the row is q[e] (0..63) in both directions.
        uint8_t q[256];
        if (to_file) {
            for (int s = 0; s < 16; ++s) {
                for (int j = 0; j < 4; ++j) {
                    uint8_t last = 0;  // column 16s + 12 + j, from bits 6..7 of the 3 vectors
                    for (int c = 0; c < 3; ++c) {
                        const uint8_t v = src[96 * s + 32 * c + 4 * lane + j];
                        q[16 * s + 4 * c + j] = v & 0x3F;
                        last = static_cast<uint8_t>(last | (v >> 6) << (2 * c));
                    }
                    q[16 * s + 12 + j] = last;
                }
            }
            BlockQ6_K b;
            std::memset(b.ql, 0, sizeof b.ql);
            std::memset(b.qh, 0, sizeof b.qh);
            for (int e = 0; e < 256; ++e) {  // the inverse of unpack_super_block's Q6_K bit positions
                const int h = e / 128, i = (e % 128) / 32, l = e % 32;
                b.ql[64 * h + l + 32 * (i & 1)] |= static_cast<uint8_t>((q[e] & 0x0F) << (4 * (i / 2)));
                b.qh[32 * h + l] |= static_cast<uint8_t>((q[e] >> 4) << (2 * i));
            }
            std::memcpy(dst + offsetof(BlockQ6_K, ql), b.ql, sizeof b.ql);
            std::memcpy(dst + offsetof(BlockQ6_K, qh), b.qh, sizeof b.qh);
        } else {
            BlockQ6_K b;
            std::memcpy(&b, src, sizeof b);
            for (int e = 0; e < 256; ++e) {
                const int h = e / 128, i = (e % 128) / 32, l = e % 32;
                const int low = (b.ql[64 * h + l + 32 * (i & 1)] >> (4 * (i / 2))) & 0x0F;
                const int high = (b.qh[32 * h + l] >> (2 * i)) & 3;
                q[e] = static_cast<uint8_t>(low | high << 4);
            }
            for (int s = 0; s < 16; ++s) {
                for (int c = 0; c < 3; ++c) {
                    for (int j = 0; j < 4; ++j) {
                        const int top = (q[16 * s + 12 + j] >> (2 * c)) & 3;
                        dst[96 * s + 32 * c + 4 * lane + j] = static_cast<uint8_t>(q[16 * s + 4 * c + j] | top << 6);
                    }
                }
            }
        }
        return;
    }
    if (type == TensorType::Q4_0 || type == TensorType::Q8_0) {  // 16 bytes of nibbles, or 32 quants
        copy(2 * lane, 0, 2);
        const int chunks = type == TensorType::Q4_0 ? 4 : 8;
        for (int c = 0; c < chunks; ++c) copy(16 + 32 * c + 4 * lane, 2 + 4 * c, 4);
        return;
    }
    // Q4_K and Q5_K: the same header and 4-bit quants (after Q5_K's 32 bytes of qh in the file).
    copy(2 * lane, 0, 2);       // d
    copy(16 + 2 * lane, 2, 2);  // dmin
    const size_t qs = type == TensorType::Q5_K ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs);
    for (int k = 0; k < 32; ++k) copy(160 + 32 * k + 4 * lane, qs + 4 * k, 4);
    if (type == TensorType::Q5_K) {
        for (int c = 0; c < 8; ++c) copy(detail::kQ4Kx8Bytes + 32 * c + 4 * lane, offsetof(BlockQ5_K, qh) + 4 * c, 4);
    }
    // The 6-bit scales and mins: packed in the file, a byte each in the group block.
    uint8_t sc[8], m[8];
    if (to_file) {
        for (int sub = 0; sub < 8; ++sub) {
            sc[sub] = src[32 + 8 * sub + lane];
            m[sub] = src[96 + 8 * sub + lane];
        }
        pack_k_scales(sc, m, dst + 4);
    } else {
        unpack_k_scales(src + 4, sc, m);
        for (int sub = 0; sub < 8; ++sub) {
            dst[32 + 8 * sub + lane] = sc[sub];
            dst[96 + 8 * sub + lane] = m[sub];
        }
    }
}

// Block b of row `row` of an interleaved matrix, in the file's layout (at most a Q6_K block).
void gather_interleaved_block(TensorType type, const uint8_t *w, int64_t cols, int64_t row, int64_t b, uint8_t *out) {
    copy_interleaved_block(type, w + interleaved_block_offset(type, cols, row, b), out, static_cast<int>(row % 8), true);
}

// Dot products of quantized weight row r with the n_tok tokens of one group.
template <TensorType kType>
void dot_quant_row(const MatmulProblem &p, int64_t r, const ActBlockPair *act, int n_tok, float *out) {
    float sum[kGroupTokens] = {};
    const int64_t n_blocks = p.cols / 32;
    for (int64_t b = 0; b < n_blocks; ++b) {
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        int8_t lo[16], hi[16];
        uint8_t gathered[detail::kQ8Bytes];
        const uint8_t *blk = p.w + r * p.w_row_bytes + b * traits(kType).block_bytes;
        if (p.interleaved) {
            gather_interleaved_block(kType, p.w, p.cols, r, b, gathered);
            blk = gathered;
        }
        const float dw = unpack_block<kType>(blk, p.fp16_table, lo, hi);
        for (int t = 0; t < n_tok; ++t) {
            const int8_t *ylo = &a.lo[t][16 * half], *yhi = &a.hi[t][16 * half];
            int32_t s = 0;
            for (int j = 0; j < 16; ++j) s += lo[j] * ylo[j] + hi[j] * yhi[j];
            sum[t] += (dw * a.d[half * kGroupTokens + t]) * static_cast<float>(s);
        }
    }
    for (int t = 0; t < n_tok; ++t) out[t] = sum[t];
}

// One K-quant super-block as integer quants in element order, with the weight scale (and for
// Q4_K/Q5_K the min) of each 32-element block: value = step[j] * q - off[j] (Q4_K/Q5_K), or
// d * scale16[e / 16] * q (Q6_K; step, off unused).
struct KSuperBlock {
    int8_t q[256];
    float step[8], off[8];
    float d;
    int8_t scale16[16];
};

template <TensorType kType>
void unpack_super_block(const uint8_t *blk, const float *fp16_table, KSuperBlock *out) {
    if constexpr (kType == TensorType::Q6_K) {
        BlockQ6_K b;
        std::memcpy(&b, blk, sizeof b);
        out->d = fp16_table[b.d];
        std::memcpy(out->scale16, b.scales, 16);
        for (int e = 0; e < 256; ++e) {
            const int h = e / 128, i = (e % 128) / 32, l = e % 32;
            const int low = (b.ql[64 * h + l + 32 * (i & 1)] >> (4 * (i / 2))) & 0x0F;
            const int high = (b.qh[32 * h + l] >> (2 * i)) & 3;
            out->q[e] = static_cast<int8_t>((low | (high << 4)) - 32);
        }
    } else {
        // Q4_K and Q5_K share the header: fp16 d, fp16 dmin, 12 bytes of packed scales.
        const float d = fp16_table[load_u16(blk)], dmin = fp16_table[load_u16(blk + 2)];
        uint8_t sc[8], m[8];
        unpack_k_scales(blk + 4, sc, m);
        const uint8_t *qh = blk + 16;  // Q5_K only
        const uint8_t *qs = blk + (kType == TensorType::Q5_K ? 16 + 32 : 16);
        for (int j = 0; j < 8; ++j) {
            out->step[j] = d * static_cast<float>(sc[j]);
            out->off[j] = dmin * static_cast<float>(m[j]);
            for (int l = 0; l < 32; ++l) {
                int v = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0F;
                if constexpr (kType == TensorType::Q5_K) v |= ((qh[l] >> j) & 1) << 4;
                out->q[32 * j + l] = static_cast<int8_t>(v);
            }
        }
    }
}

// Dot products of one K-quant weight row with the n_tok tokens of one group. Per 32-element block
// b and token t, with activation scale a and integer sums over the block:
//   Q4_K/Q5_K: a * (step * sum(q * y) - off * sum(y))
//   Q6_K:      a * d * (scale16[lo] * sum_lo(q * y) + scale16[hi] * sum_hi(q * y))
// sum(y) is the activation block's offset / 8 (see ActBlockPair).
template <TensorType kType>
void dot_kquant_row(const MatmulProblem &p, int64_t r, const ActBlockPair *act, int n_tok, float *out) {
    const size_t block_bytes = traits(kType).block_bytes;
    float sum[kGroupTokens] = {};
    KSuperBlock sb;
    for (int64_t s = 0; s < p.cols / 256; ++s) {
        uint8_t gathered[sizeof(BlockQ6_K)];
        const uint8_t *blk = p.w + r * p.w_row_bytes + s * block_bytes;
        if (p.interleaved) {
            gather_interleaved_block(kType, p.w, p.cols, r, s, gathered);
            blk = gathered;
        }
        unpack_super_block<kType>(blk, p.fp16_table, &sb);
        for (int j = 0; j < 8; ++j) {
            const int64_t b = 8 * s + j;
            const ActBlockPair &a = act[b / 2];
            const int half = static_cast<int>(b & 1);
            const int8_t *q = sb.q + 32 * j;
            for (int t = 0; t < n_tok; ++t) {
                const int8_t *ylo = &a.lo[t][16 * half], *yhi = &a.hi[t][16 * half];
                int32_t slo = 0, shi = 0;
                for (int l = 0; l < 16; ++l) {
                    slo += q[l] * ylo[l];
                    shi += q[16 + l] * yhi[l];
                }
                const float ad = a.d[half * kGroupTokens + t];
                if constexpr (kType == TensorType::Q6_K) {
                    const int32_t s16 = sb.scale16[2 * j] * slo + sb.scale16[2 * j + 1] * shi;
                    sum[t] += (sb.d * ad) * static_cast<float>(s16);
                } else {
                    const float ysum = static_cast<float>(a.offset[half * kGroupTokens + t] / 8);
                    sum[t] += (sb.step[j] * ad) * static_cast<float>(slo + shi) - sb.off[j] * (ad * ysum);
                }
            }
        }
    }
    for (int t = 0; t < n_tok; ++t) out[t] = sum[t];
}

float dot_f32_scalar(const float *a, const float *b, int64_t n) {
    // Eight independent partial sums: no long dependency chain, and the compiler can keep them in
    // SIMD registers without reassociating anything.
    float acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
    }
    for (; i < n; ++i) acc[0] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// F16 row: converted in stack-sized pieces, each reused for all tokens of the group.
void dot_f16_row(const MatmulProblem &p, const uint8_t *row, const float *x, int n_tok, float *out) {
    constexpr int64_t kPiece = 256;
    float buf[kPiece];
    float sum[kGroupTokens] = {};
    for (int64_t c0 = 0; c0 < p.cols; c0 += kPiece) {
        const int64_t n = std::min(kPiece, p.cols - c0);
        for (int64_t i = 0; i < n; ++i) buf[i] = p.fp16_table[load_u16(row + 2 * (c0 + i))];
        for (int t = 0; t < n_tok; ++t) sum[t] += dot_f32_scalar(buf, x + t * p.cols + c0, n);
    }
    for (int t = 0; t < n_tok; ++t) out[t] = sum[t];
}

void matmul_range_scalar(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
        const int n_tok = static_cast<int>(std::min<int64_t>(kGroupTokens, p.n_tokens - g * kGroupTokens));
        const float *x = p.x + g * kGroupTokens * p.cols;
        const ActBlockPair *act = p.act ? p.act + g * p.n_pairs : nullptr;
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t *row = p.w + r * p.w_row_bytes;
            float out[kGroupTokens];
            switch (p.wtype) {
                case TensorType::Q4_0:
                    dot_quant_row<TensorType::Q4_0>(p, r, act, n_tok, out);
                    break;
                case TensorType::Q8_0:
                    dot_quant_row<TensorType::Q8_0>(p, r, act, n_tok, out);
                    break;
                case TensorType::Q4_K:
                    dot_kquant_row<TensorType::Q4_K>(p, r, act, n_tok, out);
                    break;
                case TensorType::Q5_K:
                    dot_kquant_row<TensorType::Q5_K>(p, r, act, n_tok, out);
                    break;
                case TensorType::Q6_K:
                    dot_kquant_row<TensorType::Q6_K>(p, r, act, n_tok, out);
                    break;
                case TensorType::F16:
                    dot_f16_row(p, row, x, n_tok, out);
                    break;
                default:
                    for (int t = 0; t < n_tok; ++t) {
                        out[t] = dot_f32_scalar(reinterpret_cast<const float *>(row), x + t * p.cols, p.cols);
                    }
                    break;
            }
            for (int t = 0; t < n_tok; ++t) p.y[(g * kGroupTokens + t) * p.rows + r] = out[t];
        }
    }
}

void dequantize_scalar(TensorType type, const void *src, float *dst, int64_t n, const float *fp16_table) {
    if (type == TensorType::F16) {
        const auto *in = static_cast<const uint8_t *>(src);
        for (int64_t i = 0; i < n; ++i) dst[i] = fp16_table[load_u16(in + 2 * i)];
        return;
    }
    dequantize_row(type, src, dst, n);
}

void axpy_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

float exp_sub_sum_scalar(float *x, float max, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    return static_cast<float>(sum);
}

void silu_mul_scalar(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void gelu_mul_scalar(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

#ifdef H2O_KERNELS_X86
// AVX2, FMA and F16C from the CPUID bits, plus the OS's consent: the CPU's OSXSAVE bit and XCR0
// showing that the OS saves the SSE and AVX (YMM) registers. Plain CPUID rather than
// __builtin_cpu_supports, whose "f16c" name clang 14 does not know.
static bool x86_has_avx2_fma_f16c() {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    const bool fma = ecx & bit_FMA, osxsave = ecx & bit_OSXSAVE, avx = ecx & bit_AVX, f16c = ecx & bit_F16C;
    if (!(fma && osxsave && avx && f16c)) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));  // _xgetbv would need -mxsave here
    if ((xcr0_lo & 0x6) != 0x6) return false;                   // bit 1: SSE state, bit 2: AVX state
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    return ebx & bit_AVX2;
}

// AVX-VNNI (VEX-encoded vpdpbusd on AVX registers: CPUID leaf 7, sub-leaf 1, EAX bit 4) besides
// AVX2, FMA and F16C; the registers are AVX's, which x86_has_avx2_fma_f16c checks the OS saves.
static bool x86_has_avx_vnni() {
    if (!x86_has_avx2_fma_f16c()) return false;
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
    return eax & (1u << 4);
}

// AVX-512 Foundation, Byte/Word, Vector Length and VNNI from CPUID leaf 7, and XCR0 showing that
// the OS saves the opmask and the upper halves of the ZMM registers (bits 5, 6, 7) as well.
static bool x86_has_avx512_vnni() {
    if (!x86_has_avx2_fma_f16c()) return false;
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    constexpr unsigned kF = 1u << 16, kBW = 1u << 30, kVL = 1u << 31;  // EBX
    constexpr unsigned kVnni = 1u << 11;                               // ECX
    if ((ebx & (kF | kBW | kVL)) != (kF | kBW | kVL) || !(ecx & kVnni)) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    return (xcr0_lo & 0xE6) == 0xE6;
}
#endif

// ---- dispatch -------------------------------------------------------------------------------

std::atomic<int> g_isa{-1};  // a KernelIsa, or -1 before the first use

constexpr KernelIsa kAllIsas[] = {KernelIsa::Scalar, KernelIsa::Avx2,        KernelIsa::Avx2Vnni, KernelIsa::Avx512,
                                  KernelIsa::Neon,   KernelIsa::NeonDotprod, KernelIsa::NeonI8mm};

// The best level this CPU runs, or the one H2O_CPU_KERNELS names; a name that is unknown or a level
// the CPU lacks is fatal, so a test or benchmark never measures other kernels than it asked for.
KernelIsa choose_isa() {
    if (const char *env = std::getenv("H2O_CPU_KERNELS")) {
        for (KernelIsa isa : kAllIsas) {
            if (std::strcmp(env, kernel_isa_name(isa)) != 0) continue;
            if (cpu_supports(isa)) return isa;
            std::fprintf(stderr, "h2o: H2O_CPU_KERNELS=%s: this CPU cannot run the %s kernels\n", env, env);
            std::abort();
        }
        std::fprintf(stderr, "h2o: H2O_CPU_KERNELS=%s: unknown kernel level (known:", env);
        for (KernelIsa isa : kAllIsas) std::fprintf(stderr, " %s", kernel_isa_name(isa));
        std::fprintf(stderr, ")\n");
        std::abort();
    }
    KernelIsa best = KernelIsa::Scalar;
    for (KernelIsa isa : kAllIsas) {
        if (cpu_supports(isa)) best = isa;  // listed from the least to the most capable
    }
    return best;
}

const KernelTable &level_table(KernelIsa isa) {
    switch (isa) {
#if defined(H2O_KERNELS_X86)
        case KernelIsa::Avx2:
            return detail::kAvx2Kernels;
        case KernelIsa::Avx2Vnni: {
            // The AVX2 level with vpdpbusd in the quantized matmuls, in the encoding this CPU runs
            // (the level needs one or the other).
            static const KernelTable vnni = [] {
                KernelTable t = detail::kAvx2Kernels;
                t.matmul_range = x86_has_avx_vnni() ? detail::matmul_range_avx2_vnni : detail::matmul_range_avx2_vnni_evex;
                return t;
            }();
            return vnni;
        }
        case KernelIsa::Avx512:
            return detail::kAvx512Kernels;
#elif defined(H2O_KERNELS_ARM64)
        case KernelIsa::Neon:
            return detail::kNeonKernels;
        case KernelIsa::NeonDotprod:
            return detail::kNeonDotprodKernels;
        case KernelIsa::NeonI8mm:
            return detail::kNeonI8mmKernels;
#endif
        default:
            return detail::kScalarKernels;
    }
}

KernelIsa current_isa() {
    int isa = g_isa.load(std::memory_order_acquire);
    if (isa < 0) {
        isa = static_cast<int>(choose_isa());
        int expected = -1;  // a concurrent first use makes the same choice; keep whichever landed
        if (!g_isa.compare_exchange_strong(expected, isa)) isa = expected;
    }
    return static_cast<KernelIsa>(isa);
}

const KernelTable &kernels() { return level_table(current_isa()); }

// Weight types multiplied on integers, against activations quantized to 8 bits per 32 values.
bool is_quantized(TensorType t) { return t == TensorType::Q4_0 || t == TensorType::Q8_0 || is_kquant(t); }

constexpr size_t kScratchAlign = 64;

ActBlockPair *aligned_act(void *scratch) {
    const auto addr = reinterpret_cast<uintptr_t>(scratch);
    return reinterpret_cast<ActBlockPair *>((addr + kScratchAlign - 1) & ~(uintptr_t{kScratchAlign} - 1));
}

void cpu_relax() {
#if defined(H2O_KERNELS_X86)
    _mm_pause();
#elif defined(H2O_KERNELS_ARM64)
    __asm__ __volatile__("yield");
#endif
}

}  // namespace

namespace detail {
const KernelTable kScalarKernels = {
    quantize_activations_scalar,
    matmul_range_scalar,
    dequantize_scalar,
    dot_f32_scalar,
    axpy_scalar,
    exp_sub_sum_scalar,
    silu_mul_scalar,
    gelu_mul_scalar,
    {},  // dot_kv_rows: the loops in kernels.cpp
    {},  // weighted_kv_row_sum: the same
    nullptr,
    nullptr,  // half conversions: the loops in kernels.cpp
    nullptr,  // max_value: the loop in kernels.cpp
    nullptr,
    nullptr,  // rotate_pairs, rotate_half_pairs: rotary.h's rotate_pair in a loop
    nullptr,  // add_query_stats: the loop in kernels.cpp
    1,        // interleaved weights: runs them, the reference the SIMD levels are tested against
};

const KernelTable &table_of(KernelIsa isa) { return level_table(isa); }
}  // namespace detail

const char *kernel_isa_name(KernelIsa isa) {
    switch (isa) {
        case KernelIsa::Avx2:
            return "avx2";
        case KernelIsa::Avx2Vnni:
            return "avx2+vnni";
        case KernelIsa::Avx512:
            return "avx512";
        case KernelIsa::Neon:
            return "neon";
        case KernelIsa::NeonDotprod:
            return "neon+dotprod";
        case KernelIsa::NeonI8mm:
            return "neon+i8mm";
        default:
            return "scalar";
    }
}

bool cpu_supports(KernelIsa isa) {
    if (isa == KernelIsa::Scalar) return true;
#if defined(H2O_KERNELS_X86)
    if (isa == KernelIsa::Avx2) return x86_has_avx2_fma_f16c();
    if (isa == KernelIsa::Avx2Vnni) return x86_has_avx_vnni() || x86_has_avx512_vnni();
    return isa == KernelIsa::Avx512 && x86_has_avx512_vnni();
#elif defined(H2O_KERNELS_ARM64)
    if (isa == KernelIsa::Neon) return true;  // Advanced SIMD is part of every ARMv8-A CPU
#if defined(__linux__)
    // The features Linux reports for this CPU (the same bits as /proc/cpuinfo's "asimddp", "i8mm").
    const bool dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    const bool i8mm = (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
    if (isa == KernelIsa::NeonDotprod) return dotprod;
    if (isa == KernelIsa::NeonI8mm) return dotprod && i8mm;
#endif
    return false;
#else
    return false;
#endif
}

KernelIsa current_kernel_isa() { return current_isa(); }

bool set_kernel_isa(KernelIsa isa) {
    if (!cpu_supports(isa)) return false;
    g_isa.store(static_cast<int>(isa), std::memory_order_release);
    return true;
}

bool matmul_supports(TensorType wtype) { return wtype == TensorType::F32 || wtype == TensorType::F16 || is_quantized(wtype); }

size_t matmul_scratch_bytes(TensorType wtype, int64_t cols, int64_t n_tokens) {
    if (!is_quantized(wtype) || cols <= 0 || n_tokens <= 0) return 0;
    const int64_t n_groups = (n_tokens + kGroupTokens - 1) / kGroupTokens;
    const int64_t n_pairs = (cols / 32 + 1) / 2;
    return static_cast<size_t>(n_groups * n_pairs) * sizeof(ActBlockPair) + kScratchAlign;
}

bool interleaving_preferred(TensorType type) { return is_interleavable(type) && kernels().interleaved_support == 2; }

size_t interleaved_bytes(TensorType type, int64_t rows, int64_t cols) {
    const int64_t per_row = cols / static_cast<int64_t>(traits(type).block_elements);
    return static_cast<size_t>(rows / 8 * per_row * interleaved_block_bytes(type));
}

void interleave_rows(TensorType type, const void *src, void *dst, int64_t rows, int64_t cols) {
    if (!is_interleavable(type)) fatal("interleave_rows: only Q4_0, Q8_0, Q4_K, Q5_K and Q6_K interleave");
    const int64_t block = traits(type).block_elements;
    if (rows % 8 != 0 || cols % block != 0) fatal("interleave_rows: rows must be a multiple of 8, columns of the block");
    const size_t rb = row_bytes(type, cols);
    const auto *in = static_cast<const uint8_t *>(src);
    auto *out = static_cast<uint8_t *>(dst);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < cols / block; ++b) {
            copy_interleaved_block(type, in + r * rb + b * traits(type).block_bytes, out + interleaved_block_offset(type, cols, r, b),
                                   static_cast<int>(r % 8), false);
        }
    }
}

void deinterleave_row(TensorType type, const void *src, int64_t cols, int64_t row, void *dst) {
    const int64_t block = traits(type).block_elements;
    for (int64_t b = 0; b < cols / block; ++b) {
        gather_interleaved_block(type, static_cast<const uint8_t *>(src), cols, row, b,
                                 static_cast<uint8_t *>(dst) + b * traits(type).block_bytes);
    }
}

void matmul_group(ThreadPool &pool, const MatmulOutput *outputs, int count, int64_t cols, const float *x, int64_t n_tokens, void *scratch) {
    if (count < 1 || count > kMaxMatmulGroup) fatal("matmul_group: between 1 and kMaxMatmulGroup outputs");
    if (n_tokens <= 0) return;
    bool quantized = false;
    for (int i = 0; i < count; ++i) {
        const MatmulOutput &o = outputs[i];
        if (!matmul_supports(o.wtype)) fatal("matmul: unsupported weight type");
        const bool interleaved = o.layout == WeightLayout::Interleaved8;
        if (interleaved && (!is_interleavable(o.wtype) || o.rows % 8 != 0)) {
            fatal("matmul: interleaved weights must be Q4_0, Q8_0, Q4_K, Q5_K or Q6_K, rows a multiple of 8");
        }
        if (interleaved && kernels().interleaved_support == 0) fatal("matmul: these kernels cannot run interleaved weights");
        if (is_quantized(o.wtype) && cols % traits(o.wtype).block_elements != 0) {
            fatal("matmul: quantized rows must be a multiple of the block size long (32, or 256 for K-quants)");
        }
        quantized |= is_quantized(o.wtype);
    }
    if (cols <= 0) {  // empty dot products
        for (int i = 0; i < count; ++i) {
            std::memset(outputs[i].y, 0, static_cast<size_t>(std::max<int64_t>(outputs[i].rows, 0) * n_tokens) * sizeof(float));
        }
        return;
    }
    if (quantized && !scratch) fatal("matmul: quantized weights need scratch");

    // Everything the threads need, in one object: the pool job captures only its address, so the
    // std::function holding it needs no heap allocation.
    struct Job {
        const KernelTable *k;
        MatmulProblem p[kMaxMatmulGroup];
        int64_t chunk[kMaxMatmulGroup];
        int64_t first_unit[kMaxMatmulGroup + 1];  // product i's units are [first_unit[i], first_unit[i + 1])
        int count;
        ActBlockPair *act;
        int64_t n_groups, n_slices;
        bool parallel_quantize;
        std::atomic<int> done_quantizing{0};

        void run(int thread, int threads) {
            int64_t begin, end;
            if (parallel_quantize) {
                ThreadPool::split(n_groups, thread, threads, &begin, &end);
                k->quantize_activations(p[0].x, p[0].cols, p[0].n_tokens, begin, end, act);
                done_quantizing.fetch_add(1, std::memory_order_acq_rel);
                while (done_quantizing.load(std::memory_order_acquire) < threads) cpu_relax();
            }
            ThreadPool::split(first_unit[count], thread, threads, &begin, &end);
            for (int i = 0; i < count && begin < end; ++i) {
                // This thread's units of product i, as offsets into its own units.
                const int64_t u0 = std::max(begin, first_unit[i]) - first_unit[i], u1 = std::min(end, first_unit[i + 1]) - first_unit[i];
                for (int64_t u = u0; u < u1;) {
                    // Consecutive units of one row chunk become a single call over their token groups.
                    const int64_t c = u / n_slices;
                    const int64_t u_end = std::min(u1, (c + 1) * n_slices);
                    const int64_t g0 = (u - c * n_slices) * n_groups / n_slices;
                    const int64_t g1 = (u_end - c * n_slices) * n_groups / n_slices;
                    k->matmul_range(p[i], c * chunk[i], std::min(p[i].rows, (c + 1) * chunk[i]), g0, g1);
                    u = u_end;
                }
            }
        }
    } job;
    job.k = &kernels();
    job.count = count;
    job.act = quantized ? aligned_act(scratch) : nullptr;
    job.n_groups = (n_tokens + kGroupTokens - 1) / kGroupTokens;
    // Work units: chunks of rows whose weights stay in cache (about 32 KiB) while every token group
    // passes over them, times slices of the token groups when there are too few row chunks to keep
    // every thread busy. Each thread takes a contiguous run of units in row-chunk-major order, so it
    // writes disjoint parts of each y. How the rows are cut changes no output's bits.
    int64_t n_chunks[kMaxMatmulGroup], all_chunks = 0, work = 0;
    for (int i = 0; i < count; ++i) {
        const MatmulOutput &o = outputs[i];
        MatmulProblem &p = job.p[i];
        p.wtype = o.wtype;
        p.w = static_cast<const uint8_t *>(o.w);
        p.w_row_bytes = row_bytes(o.wtype, cols);
        p.interleaved = o.layout == WeightLayout::Interleaved8;
        p.rows = std::max<int64_t>(o.rows, 0);
        p.cols = cols;
        p.n_tokens = n_tokens;
        p.x = x;
        p.y = o.y;
        p.n_pairs = (cols / 32 + 1) / 2;
        p.fp16_table = fp16_table();
        p.act = job.act;
        // Interleaved chunks are whole pairs of 8-row groups (the AVX-512 kernels take two at once).
        const int64_t chunk_align = p.interleaved ? 16 : 4;
        job.chunk[i] = std::clamp<int64_t>(static_cast<int64_t>(32768 / p.w_row_bytes) & ~(chunk_align - 1), chunk_align, 64);
        n_chunks[i] = (p.rows + job.chunk[i] - 1) / job.chunk[i];
        all_chunks += n_chunks[i];
        work += p.rows * cols * n_tokens;
    }
    const int n_threads = pool.size();
    job.n_slices = 1;
    while (all_chunks * job.n_slices < 4 * n_threads && job.n_slices < job.n_groups) job.n_slices *= 2;
    job.n_slices = std::min(job.n_slices, job.n_groups);
    job.first_unit[0] = 0;
    for (int i = 0; i < count; ++i) job.first_unit[i + 1] = job.first_unit[i] + n_chunks[i] * job.n_slices;

    // The activations are quantized once, up front, for every product. For a few tokens that is
    // cheaper than any synchronisation, so the calling thread does it; for many, all threads share
    // it and meet at a barrier inside the single pool job.
    job.parallel_quantize = quantized && n_threads > 1 && job.n_groups >= 2 * n_threads;
    if (quantized && !job.parallel_quantize) job.k->quantize_activations(x, cols, n_tokens, 0, job.n_groups, job.act);

    pool.run([&job](int thread, int threads) { job.run(thread, threads); }, work);
}

void matmul(ThreadPool &pool, TensorType wtype, const void *w, int64_t rows, int64_t cols, const float *x, int64_t n_tokens, float *y,
            void *scratch, WeightLayout layout) {
    if (rows <= 0) return;
    const MatmulOutput output{wtype, w, rows, y, layout};
    matmul_group(pool, &output, 1, cols, x, n_tokens, scratch);
}

void dequantize(TensorType type, const void *src, float *dst, int64_t n) {
    if (!matmul_supports(type)) fatal("dequantize: unsupported type");
    // K-quant rows are only ever looked up (embeddings), never streamed: the reference is enough.
    if (is_kquant(type)) {
        dequantize_row(type, src, dst, n);
        return;
    }
    kernels().dequantize(type, src, dst, n, fp16_table());
}

void dequantize_rows(TensorType type, const void *w, int64_t cols, const int32_t *ids, int64_t n_ids, float *out, WeightLayout layout) {
    if (!matmul_supports(type)) fatal("dequantize_rows: unsupported type");
    const KernelTable &k = kernels();
    const size_t rb = row_bytes(type, cols);
    if (layout == WeightLayout::Interleaved8) {
        if (!is_interleavable(type)) fatal("dequantize_rows: interleaved weights must be Q4_0, Q8_0, Q4_K, Q5_K or Q6_K");
        const int64_t block = traits(type).block_elements;
        for (int64_t i = 0; i < n_ids; ++i) {
            for (int64_t b = 0; b < cols / block; ++b) {
                uint8_t blk[sizeof(BlockQ6_K)];
                gather_interleaved_block(type, static_cast<const uint8_t *>(w), cols, ids[i], b, blk);
                float *dst = out + i * cols + b * block;
                if (is_kquant(type))
                    dequantize_row(type, blk, dst, block);
                else
                    k.dequantize(type, blk, dst, block, fp16_table());
            }
        }
        return;
    }
    for (int64_t i = 0; i < n_ids; ++i) {
        const uint8_t *row = static_cast<const uint8_t *>(w) + static_cast<size_t>(ids[i]) * rb;
        if (is_kquant(type))
            dequantize_row(type, row, out + i * cols, cols);
        else
            k.dequantize(type, row, out + i * cols, cols, fp16_table());
    }
}

float dot_f32(const float *a, const float *b, int64_t n) { return kernels().dot_f32(a, b, n); }

void axpy(float *y, float a, const float *x, int64_t n) { kernels().axpy(y, a, x, n); }

// The portable loops, for levels without a kernel of the row format: F32 rows by the level's own
// dot_f32 and axpy, the others element by element as kv_load_row decodes them.
void dot_kv_rows(KvRowFormat format, const float *const *queries, int m, const uint8_t *rows, int64_t row_bytes, int64_t n, int64_t len,
                 float *scores, int64_t scores_stride) {
    const KernelTable &k = kernels();
    const auto f = static_cast<uint32_t>(format);
    if (f < kKvRowFormatCount && k.dot_kv_rows[f]) return k.dot_kv_rows[f](queries, m, rows, row_bytes, n, len, scores, scores_stride);
    const float *half = fp16_table();
    for (int j = 0; j < m; ++j) {
        for (int64_t i = 0; i < n; ++i) {
            const uint8_t *row = rows + i * row_bytes;
            float sum = 0.0f;
            if (format == KvRowFormat::F32) {
                sum = k.dot_f32(queries[j], reinterpret_cast<const float *>(row), len);
            } else if (format == KvRowFormat::F16) {
                const auto *h = reinterpret_cast<const uint16_t *>(row);
                for (int64_t c = 0; c < len; ++c) sum += queries[j][c] * half[h[c]];
            } else {
                for (int64_t c = 0; c < len; ++c) sum += queries[j][c] * kv_row_element(format, row, static_cast<int>(c));
            }
            scores[j * scores_stride + i] = sum;
        }
    }
}

void weighted_kv_row_sum(KvRowFormat format, float *const *outs, int m, const float *weights, int64_t weights_stride, const uint8_t *rows,
                         int64_t row_bytes, int64_t n, int64_t len) {
    const KernelTable &k = kernels();
    const auto f = static_cast<uint32_t>(format);
    if (f < kKvRowFormatCount && k.weighted_kv_row_sum[f]) {
        return k.weighted_kv_row_sum[f](outs, m, weights, weights_stride, rows, row_bytes, n, len);
    }
    const float *half = fp16_table();
    for (int j = 0; j < m; ++j) {
        const float *w = weights + j * weights_stride;
        for (int64_t i = 0; i < n; ++i) {
            if (w[i] == 0.0f) continue;
            const uint8_t *row = rows + i * row_bytes;
            if (format == KvRowFormat::F32) {
                k.axpy(outs[j], w[i], reinterpret_cast<const float *>(row), len);
            } else if (format == KvRowFormat::F16) {
                const auto *h = reinterpret_cast<const uint16_t *>(row);
                for (int64_t c = 0; c < len; ++c) outs[j][c] += w[i] * half[h[c]];
            } else {
                for (int64_t c = 0; c < len; ++c) outs[j][c] += w[i] * kv_row_element(format, row, static_cast<int>(c));
            }
        }
    }
}

void floats_to_halves(const float *src, uint16_t *dst, int64_t n) {
    const KernelTable &k = kernels();
    if (k.floats_to_halves) return k.floats_to_halves(src, dst, n);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

void halves_to_floats(const uint16_t *src, float *dst, int64_t n) {
    const KernelTable &k = kernels();
    if (k.halves_to_floats) return k.halves_to_floats(src, dst, n);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

void rotate_pairs(float *x, const float *cos_sin, int64_t n_pairs) {
    const KernelTable &k = kernels();
    if (k.rotate_pairs) return k.rotate_pairs(x, cos_sin, n_pairs);
    for (int64_t i = 0; i < n_pairs; ++i) rotate_pair(&x[2 * i], &x[2 * i + 1], cos_sin[2 * i], cos_sin[2 * i + 1]);
}

void rotate_half_pairs(uint16_t *row, const float *cos_sin, int64_t n_pairs) {
    const KernelTable &k = kernels();
    if (k.rotate_half_pairs) return k.rotate_half_pairs(row, cos_sin, n_pairs);
    for (int64_t i = 0; i < n_pairs; ++i) {
        float a = fp16_to_fp32(row[2 * i]), b = fp16_to_fp32(row[2 * i + 1]);
        rotate_pair(&a, &b, cos_sin[2 * i], cos_sin[2 * i + 1]);
        row[2 * i] = fp32_to_fp16(a);
        row[2 * i + 1] = fp32_to_fp16(b);
    }
}

void add(float *out, const float *a, const float *b, int64_t n) {
    // Plain element-wise work: the compiler vectorizes it, and it is bound by memory anyway.
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void rmsnorm(float *out, const float *in, const float *weight, int64_t n, float eps) {
    // Sum of squares in double, in four chains (as ggml sums in double): the rest of the layer
    // depends on this one number.
    double s[4] = {};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(in[i + k]) * in[i + k];
    }
    for (; i < n; ++i) s[0] += static_cast<double>(in[i]) * in[i];
    const double mean = ((s[0] + s[1]) + (s[2] + s[3])) / static_cast<double>(n);
    const float scale = static_cast<float>(1.0 / std::sqrt(mean + eps));
    for (i = 0; i < n; ++i) out[i] = in[i] * scale * weight[i];
}

void add_query_stats(const QueryStats &stats, const float *w, const int32_t *first_seer, const int32_t *last_seer, int64_t n, int32_t query,
                     float threshold, float persistence_weight, bool proxy) {
    const KernelTable &k = kernels();
    if (k.add_query_stats) return k.add_query_stats(stats, w, first_seer, last_seer, n, query, threshold, persistence_weight, proxy);
    for (int64_t s = 0; s < n; ++s) {
        if (first_seer[s] > query || query > last_seer[s]) continue;
        stats.accumulated[s] += w[s];
        stats.squared[s] += w[s] * w[s];
        stats.steps[s] += 1.0f;
        if (w[s] > threshold) stats.persistence[s] += persistence_weight;
        if (proxy) stats.last[s] += w[s];
    }
}

void softmax(float *x, int64_t n) {
    if (n <= 0) return;
    const KernelTable &k = kernels();
    float max = -INFINITY;
    if (k.max_value) {
        max = k.max_value(x, n);
    } else {
        for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
    }
    if (max == -INFINITY) {  // everything masked: no distribution; return uniform zeros, not NaN
        std::memset(x, 0, static_cast<size_t>(n) * sizeof(float));
        return;
    }
    const float sum = k.exp_sub_sum(x, max, n);
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void silu_mul(float *out, const float *gate, const float *up, int64_t n) { kernels().silu_mul(out, gate, up, n); }
void gelu_mul(float *out, const float *gate, const float *up, int64_t n) { kernels().gelu_mul(out, gate, up, n); }

}  // namespace h2o::cpu
