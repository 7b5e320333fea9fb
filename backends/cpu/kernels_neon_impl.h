// The ARM64 NEON kernels, compiled once per level: kernels_neon.cpp (ARMv8.0),
// kernels_neon_dotprod.cpp (+dotprod) and kernels_neon_i8mm.cpp (+dotprod+i8mm) each include this
// file under their own -march flags (CMakeLists.txt). The compiler's feature macros pick the
// integer dot products:
//   - ARMv8.0: 8-bit products widened to 16 bits (smull/smlal2), pairs added into 32 (sadalp).
//   - __ARM_FEATURE_DOTPROD: sdot, four 8-bit products added into each 32-bit lane.
//   - __ARM_FEATURE_MATMUL_INT8: smmla for groups of 4 tokens (Q4_0, Q8_0, in the file's layout
//     and interleaved): one instruction multiplies 8 bytes of 2 weight rows by 8 bytes of 2
//     tokens, giving all 4 (row, token) sums.
// With dotprod, weights interleaved by 8 rows (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K; kernels.h) run on sdot by
// lane, and the CPU backend interleaves those types at load as it does on x86.
// The results are those of the portable kernels in kernels.cpp: the same 8-bit activation quants,
// the same integer block sums and per-block scales; only the order of float additions differs.
//
// Everything here has internal linkage and no standard-library template or inline function is
// used, so no copy built with +dotprod can end up on the baseline path (see kernels_internal.h).
// Included by those three files only.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels_internal.h"
#include "quant.h"

namespace h2o::cpu::detail {

namespace {

uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

float load_f32(const uint8_t *p) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- integer dot products -------------------------------------------------------------------

// acc + the 16 products a[i] * b[i], spread over the 4 lanes (which lane holds what differs
// between the two paths; only the lanes' total is used). One operand is always an activation
// quant (|y| <= 127), so two products fit an int16 lane: 2 * 128 * 127 < 32768.
int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b));
#endif
}

// A 32-element block: elements 0..15 in lo, 16..31 in hi (the activations' order).
int32x4_t dot32(int8x16_t wlo, int8x16_t whi, const int8_t *ylo, const int8_t *yhi) {
    return dot16(dot16(vdupq_n_s32(0), wlo, vld1q_s8(ylo)), whi, vld1q_s8(yhi));
}

// [total(s0) total(s1) total(s2) total(s3)]
int32x4_t reduce4(int32x4_t s0, int32x4_t s1, int32x4_t s2, int32x4_t s3) { return vpaddq_s32(vpaddq_s32(s0, s1), vpaddq_s32(s2, s3)); }

// ---- activation quantization ----------------------------------------------------------------

// The same bytes as quantize_block_q8 in kernels.cpp: same max, same scalar division for the
// scale, same x * (1/d), and frinta rounds half away from zero exactly as roundf does.
void quantize_block(const float *x, int8_t *lo16, int8_t *hi16, float *d_out, int32_t *offset_out) {
    float32x4_t v[8], amax = vdupq_n_f32(0.0f);
    uint32x4_t finite = vdupq_n_u32(~0u);
    for (int k = 0; k < 8; ++k) {
        v[k] = vld1q_f32(x + 4 * k);
        const float32x4_t a = vabsq_f32(v[k]);
        amax = vmaxq_f32(amax, a);
        finite = vandq_u32(finite, vcleq_f32(a, vdupq_n_f32(3.40282347e38f)));  // false for inf, NaN
    }
    const bool all_finite = vminvq_u32(finite) != 0;
    const float d = all_finite ? vmaxvq_f32(amax) / 127.0f : __builtin_nanf("");
    const float id = (all_finite && d != 0.0f) ? 1.0f / d : 0.0f;
    int32x4_t q[8], sum = vdupq_n_s32(0);
    for (int k = 0; k < 8; ++k) {
        const float32x4_t r = vrndaq_f32(vmulq_n_f32(v[k], id));
        // Out of range only when 1/d overflowed or an inf met a zero id; 0 then, as in scalar.
        const uint32x4_t ok = vandq_u32(vcgeq_f32(r, vdupq_n_f32(-127.0f)), vcleq_f32(r, vdupq_n_f32(127.0f)));
        q[k] = vcvtq_s32_f32(vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(r), ok)));
        sum = vaddq_s32(sum, q[k]);
    }
    int8x8_t bytes[4];
    for (int k = 0; k < 4; ++k) bytes[k] = vmovn_s16(vcombine_s16(vmovn_s32(q[2 * k]), vmovn_s32(q[2 * k + 1])));
    vst1q_s8(lo16, vcombine_s8(bytes[0], bytes[1]));
    vst1q_s8(hi16, vcombine_s8(bytes[2], bytes[3]));
    *d_out = d;
    *offset_out = 8 * vaddvq_s32(sum);
}

void quantize_activations_neon(const float *x, int64_t cols, int64_t n_tokens, int64_t g0, int64_t g1, ActBlockPair *act) {
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
                    quantize_block(x + token * cols + b * 32, &a.lo[t][16 * half], &a.hi[t][16 * half], &a.d[half * kGroupTokens + t],
                                   &a.offset[half * kGroupTokens + t]);
                }
            }
        }
    }
}

// ---- Q4_0 and Q8_0 weights ------------------------------------------------------------------

// One weight block as signed bytes in the activations' lo/hi order, with its scale.
struct WeightBlock {
    int8x16_t lo, hi;
    float d;
};

template <TensorType kType>
WeightBlock load_block(const uint8_t *row, int64_t b, const float *fp16_table) {
    if constexpr (kType == TensorType::Q4_0) {
        const uint8_t *blk = row + b * kQ4Bytes;
        const uint8x16_t raw = vld1q_u8(blk + 2);
        const int8x16_t eight = vdupq_n_s8(8);
        return {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))), eight),
                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight), fp16_table[load_u16(blk)]};
    } else {
        const uint8_t *blk = row + b * kQ8Bytes;
        return {vld1q_s8(reinterpret_cast<const int8_t *>(blk + 2)), vld1q_s8(reinterpret_cast<const int8_t *>(blk + 18)),
                fp16_table[load_u16(blk)]};
    }
}

// The block loops below are kept out of line: they are long enough that a call costs nothing, and
// their instruction mix can be read in the disassembly.

// One row x the 4 tokens of group g, one token per lane (padding tokens are zero and give zero).
template <TensorType kType>
[[gnu::noinline]] float32x4_t quant_group_row(const MatmulProblem &p, const uint8_t *row, const ActBlockPair *act) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < p.cols / 32; ++b) {
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        const WeightBlock w = load_block<kType>(row, b, p.fp16_table);
        int32x4_t s[kGroupTokens];
        for (int t = 0; t < kGroupTokens; ++t) s[t] = dot32(w.lo, w.hi, &a.lo[t][16 * half], &a.hi[t][16 * half]);
        const float32x4_t scale = vmulq_n_f32(vld1q_f32(&a.d[half * kGroupTokens]), w.d);
        acc = vfmaq_f32(acc, vcvtq_f32_s32(reduce4(s[0], s[1], s[2], s[3])), scale);
    }
    return acc;
}

// Four rows x token t of the group, one row per lane (the decode case).
template <TensorType kType>
[[gnu::noinline]] float32x4_t quant_token_rows4(const MatmulProblem &p, const uint8_t *const row[4], const ActBlockPair *act, int t) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < p.cols / 32; ++b) {
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        const int8_t *ylo = &a.lo[t][16 * half], *yhi = &a.hi[t][16 * half];
        int32x4_t s[4];
        float d[4];
        for (int i = 0; i < 4; ++i) {
            const WeightBlock w = load_block<kType>(row[i], b, p.fp16_table);
            s[i] = dot32(w.lo, w.hi, ylo, yhi);
            d[i] = w.d;
        }
        const float32x4_t scale = vmulq_n_f32(vld1q_f32(d), a.d[half * kGroupTokens + t]);
        acc = vfmaq_f32(acc, vcvtq_f32_s32(reduce4(s[0], s[1], s[2], s[3])), scale);
    }
    return acc;
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// The 8-byte halves of two 16-byte vectors side by side: [a 0..7 | b 0..7] or [a 8..15 | b 8..15],
// the 2x8 operand layout of smmla.
int8x16_t zip_lo64(int8x16_t a, int8x16_t b) { return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b))); }
int8x16_t zip_hi64(int8x16_t a, int8x16_t b) { return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b))); }

// Rows r0, r1 x the 4 tokens of the group: out[0] = [r0 t0, r0 t1, r1 t0, r1 t1], out[1] the
// same for tokens 2 and 3. Per block, 8 smmla do what takes 16 sdot.
template <TensorType kType>
[[gnu::noinline]] void quant_group_row_pair(const MatmulProblem &p, const uint8_t *r0, const uint8_t *r1, const ActBlockPair *act,
                                            float32x4_t out[2]) {
    out[0] = out[1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < p.cols / 32; ++b) {
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        const WeightBlock w0 = load_block<kType>(r0, b, p.fp16_table), w1 = load_block<kType>(r1, b, p.fp16_table);
        const int8x16_t wl0 = zip_lo64(w0.lo, w1.lo), wl1 = zip_hi64(w0.lo, w1.lo);
        const int8x16_t wh0 = zip_lo64(w0.hi, w1.hi), wh1 = zip_hi64(w0.hi, w1.hi);
        const float32x4_t wd = vcombine_f32(vdup_n_f32(w0.d), vdup_n_f32(w1.d));
        for (int tp = 0; tp < 2; ++tp) {
            const int t0 = 2 * tp, t1 = 2 * tp + 1;
            const int8x16_t yl_a = vld1q_s8(&a.lo[t0][16 * half]), yl_b = vld1q_s8(&a.lo[t1][16 * half]);
            const int8x16_t yh_a = vld1q_s8(&a.hi[t0][16 * half]), yh_b = vld1q_s8(&a.hi[t1][16 * half]);
            int32x4_t s = vmmlaq_s32(vdupq_n_s32(0), wl0, zip_lo64(yl_a, yl_b));
            s = vmmlaq_s32(s, wl1, zip_hi64(yl_a, yl_b));
            s = vmmlaq_s32(s, wh0, zip_lo64(yh_a, yh_b));
            s = vmmlaq_s32(s, wh1, zip_hi64(yh_a, yh_b));
            const float32x2_t ad = vld1_f32(&a.d[half * kGroupTokens + t0]);
            out[tp] = vfmaq_f32(out[tp], vcvtq_f32_s32(s), vmulq_f32(wd, vcombine_f32(ad, ad)));
        }
    }
}
#endif

float *out_at(const MatmulProblem &p, int64_t token, int64_t r) { return p.y + token * p.rows + r; }

template <TensorType kType>
void quant_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
        const ActBlockPair *act = p.act + g * p.n_pairs;
        const int64_t tok = g * kGroupTokens, n_tok = min64(kGroupTokens, p.n_tokens - tok);
        if (n_tok == kGroupTokens) {
            int64_t r = r0;
#if defined(__ARM_FEATURE_MATMUL_INT8)
            for (; r + 2 <= r1; r += 2) {
                float32x4_t s[2];
                quant_group_row_pair<kType>(p, p.w + r * p.w_row_bytes, p.w + (r + 1) * p.w_row_bytes, act, s);
                float out[8];  // [r t0, r t1, r+1 t0, r+1 t1 | the same for t2, t3]
                vst1q_f32(out, s[0]);
                vst1q_f32(out + 4, s[1]);
                for (int t = 0; t < kGroupTokens; ++t) {
                    *out_at(p, tok + t, r) = out[4 * (t / 2) + t % 2];
                    *out_at(p, tok + t, r + 1) = out[4 * (t / 2) + 2 + t % 2];
                }
            }
#endif
            for (; r < r1; ++r) {
                float out[kGroupTokens];
                vst1q_f32(out, quant_group_row<kType>(p, p.w + r * p.w_row_bytes, act));
                for (int t = 0; t < kGroupTokens; ++t) *out_at(p, tok + t, r) = out[t];
            }
        } else {
            // Single tokens (decoding, the tail of a prompt): four rows share each activation load.
            // A last tile of fewer rows repeats its first row and keeps only the rows it has.
            for (int t = 0; t < n_tok; ++t) {
                for (int64_t r = r0; r < r1; r += 4) {
                    const int n = static_cast<int>(min64(4, r1 - r));
                    const uint8_t *row[4];
                    for (int i = 0; i < 4; ++i) row[i] = p.w + (r + (i < n ? i : 0)) * p.w_row_bytes;
                    float out[4];
                    vst1q_f32(out, quant_token_rows4<kType>(p, row, act, t));
                    for (int i = 0; i < n; ++i) *out_at(p, tok + t, r + i) = out[i];
                }
            }
        }
    }
}

// ---- K-quant weights ------------------------------------------------------------------------
//
// A super-block of 256 is unpacked once per row and token group into bytes in element order, then
// each 32-element block b meets its activation block (scale a_b):
//   Q4_K/Q5_K: a_b * (step_b * sum(q * y) - off_b * sum(y)), q unsigned (0..15 or 0..31)
//   Q6_K:      a_b * d * (s_lo * sum_lo(q * y) + s_hi * sum_hi(q * y)), q signed (-32..31)
// with the 8 block sums of one token in two vectors.

struct KSuperBlock {
    int8_t q[256];
    float step[8], off[8];  // Q4_K, Q5_K
    float d;                // Q6_K
    int8_t scale16[16];     // Q6_K: one scale per 16 elements
};

template <TensorType kType>
void unpack_super_block(const uint8_t *blk, const float *fp16_table, KSuperBlock *out) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    if constexpr (kType == TensorType::Q6_K) {
        const uint8_t *ql = blk, *qh = blk + 128;
        std::memcpy(out->scale16, blk + 192, 16);
        out->d = fp16_table[load_u16(blk + 208)];
        // Element e = 128h + 32i + l: low 4 bits from ql[64h + 32(i & 1) + l] (nibble i / 2),
        // high 2 bits from qh[32h + l] (bits 2i, 2i + 1); stored minus 32.
        for (int h = 0; h < 2; ++h) {
            for (int i = 0; i < 4; ++i) {
                for (int c = 0; c < 2; ++c) {
                    const uint8x16_t l = vld1q_u8(ql + 64 * h + 32 * (i & 1) + 16 * c);
                    const uint8x16_t nib = i < 2 ? vandq_u8(l, low4) : vshrq_n_u8(l, 4);
                    const uint8x16_t top =
                        vandq_u8(vshlq_u8(vld1q_u8(qh + 32 * h + 16 * c), vdupq_n_s8(static_cast<int8_t>(-2 * i))), vdupq_n_u8(3));
                    vst1q_s8(out->q + 128 * h + 32 * i + 16 * c,
                             vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib, vshlq_n_u8(top, 4))), vdupq_n_s8(32)));
                }
            }
        }
    } else {
        // Q4_K and Q5_K share the header: fp16 d, fp16 dmin, 12 bytes of packed scales.
        const float d = fp16_table[load_u16(blk)], dmin = fp16_table[load_u16(blk + 2)];
        uint8_t sc[8], m[8];
        unpack_k_scales(blk + 4, sc, m);
        for (int j = 0; j < 8; ++j) {
            out->step[j] = d * static_cast<float>(sc[j]);
            out->off[j] = dmin * static_cast<float>(m[j]);
        }
        const uint8_t *qh = blk + 16;  // Q5_K only: bit j of qh[l] is bit 4 of block j's element l
        const uint8_t *qs = blk + (kType == TensorType::Q5_K ? 16 + 32 : 16);
        for (int j = 0; j < 8; ++j) {
            for (int c = 0; c < 2; ++c) {
                const uint8x16_t raw = vld1q_u8(qs + 32 * (j / 2) + 16 * c);
                uint8x16_t v = (j & 1) ? vshrq_n_u8(raw, 4) : vandq_u8(raw, low4);
                if constexpr (kType == TensorType::Q5_K) {
                    const uint8x16_t bit = vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * c), vdupq_n_s8(static_cast<int8_t>(-j))), vdupq_n_u8(1));
                    v = vorrq_u8(v, vshlq_n_u8(bit, 4));
                }
                vst1q_s8(out->q + 32 * j + 16 * c, vreinterpretq_s8_u8(v));
            }
        }
    }
}

// acc (lanes: blocks 0..3 and 4..7 of the super-block, in acc[0] and acc[1]) plus token t's share
// of one super-block; a points at its 4 activation pairs.
template <TensorType kType>
void kquant_token_step(const KSuperBlock &sb, const ActBlockPair *a, int t, float32x4_t acc[2]) {
    for (int k = 0; k < 2; ++k) {  // blocks 4k .. 4k+3, in activation pairs 2k and 2k + 1
        const ActBlockPair &p0 = a[2 * k], &p1 = a[2 * k + 1];
        const float ad_v[4] = {p0.d[t], p0.d[kGroupTokens + t], p1.d[t], p1.d[kGroupTokens + t]};
        const float32x4_t ad = vld1q_f32(ad_v);
        int32x4_t lo[4], hi[4];
        for (int j = 0; j < 4; ++j) {
            const ActBlockPair &pa = a[2 * k + j / 2];
            const int half = j & 1;
            const int8_t *q = sb.q + 32 * (4 * k + j);
            lo[j] = dot16(vdupq_n_s32(0), vld1q_s8(q), vld1q_s8(&pa.lo[t][16 * half]));
            hi[j] = dot16(vdupq_n_s32(0), vld1q_s8(q + 16), vld1q_s8(&pa.hi[t][16 * half]));
        }
        if constexpr (kType == TensorType::Q6_K) {
            // Sums of the 16-element halves, times their scales, then added per block.
            const int32x4_t s_lo = reduce4(lo[0], hi[0], lo[1], hi[1]), s_hi = reduce4(lo[2], hi[2], lo[3], hi[3]);
            const int16x8_t sc = vmovl_s8(vld1_s8(sb.scale16 + 8 * k));
            const int32x4_t w_lo = vmulq_s32(s_lo, vmovl_s16(vget_low_s16(sc)));
            const int32x4_t w_hi = vmulq_s32(s_hi, vmovl_high_s16(sc));
            const int32x4_t blocks = vpaddq_s32(w_lo, w_hi);
            acc[k] = vfmaq_f32(acc[k], vcvtq_f32_s32(blocks), vmulq_n_f32(ad, sb.d));
        } else {
            const int32x4_t blocks =
                reduce4(vaddq_s32(lo[0], hi[0]), vaddq_s32(lo[1], hi[1]), vaddq_s32(lo[2], hi[2]), vaddq_s32(lo[3], hi[3]));
            // sum(y) of each block: its offset / 8 (see ActBlockPair).
            const int32_t ysum_v[4] = {p0.offset[t] / 8, p0.offset[kGroupTokens + t] / 8, p1.offset[t] / 8,
                                       p1.offset[kGroupTokens + t] / 8};
            const float32x4_t ysum = vcvtq_f32_s32(vld1q_s32(ysum_v));
            acc[k] = vfmaq_f32(acc[k], vcvtq_f32_s32(blocks), vmulq_f32(vld1q_f32(sb.step + 4 * k), ad));
            acc[k] = vfmsq_f32(acc[k], vld1q_f32(sb.off + 4 * k), vmulq_f32(ad, ysum));
        }
    }
}

template <TensorType kType>
void kquant_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    const int64_t sb_bytes = kType == TensorType::Q4_K   ? sizeof(BlockQ4_K)
                             : kType == TensorType::Q5_K ? sizeof(BlockQ5_K)
                                                         : sizeof(BlockQ6_K);
    for (int64_t g = g0; g < g1; ++g) {
        const ActBlockPair *act = p.act + g * p.n_pairs;
        const int64_t tok = g * kGroupTokens;
        const int n_tok = static_cast<int>(min64(kGroupTokens, p.n_tokens - tok));
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t *row = p.w + r * p.w_row_bytes;
            float32x4_t acc[kGroupTokens][2];
            for (int t = 0; t < kGroupTokens; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
            for (int64_t s = 0; s < p.cols / 256; ++s) {
                KSuperBlock sb;
                unpack_super_block<kType>(row + s * sb_bytes, p.fp16_table, &sb);
                for (int t = 0; t < n_tok; ++t) kquant_token_step<kType>(sb, act + 4 * s, t, acc[t]);
            }
            for (int t = 0; t < n_tok; ++t) *out_at(p, tok + t, r) = vaddvq_f32(vaddq_f32(acc[t][0], acc[t][1]));
        }
    }
}

#if defined(__ARM_FEATURE_DOTPROD)
// ---- interleaved weights (8 rows; layouts in kernels.h): the dotprod and i8mm levels ---------
//
// A 32-byte chunk of an interleaved block holds 4 bytes of each of 8 rows, one row per 32-bit
// lane: rows 0..3 in its first 16 bytes (row half 0), rows 4..7 in the next 16 (row half 1). sdot
// by lane multiplies every lane's 4 bytes by the same 4 activation bytes (lane c of a 16-byte
// activation vector), so each row's sum builds up in its own lane and nothing is reduced across
// lanes, as vpdpbusd does on x86. The kernels take a block one row half at a time: a half's
// unpacked weights, the int32 sums and the float accumulators of 4 tokens then fit NEON's 32
// registers. Unsigned quants (Q4_0's and Q4_K's nibbles, Q5_K's 5 bits, Q6_K's q + 32) are below
// 128, so sdot reads them as signed bytes unchanged; their offsets are taken from the integer
// sums, which are exact, so the results differ from the scalar path's only in the order of float
// additions.

// acc + the dot product of w[c] (4 bytes per row) with lane c of y, for c < 4: 16 elements of a
// block, in 4 chunks, against their 16 activation bytes.
int32x4_t dot_lanes4(int32x4_t acc, const int8x16_t w[4], int8x16_t y) {
    acc = vdotq_laneq_s32(acc, w[0], y, 0);
    acc = vdotq_laneq_s32(acc, w[1], y, 1);
    acc = vdotq_laneq_s32(acc, w[2], y, 2);
    return vdotq_laneq_s32(acc, w[3], y, 3);
}

// The 4 fp16 values at p (one per row of a row half) as floats.
float32x4_t halves4(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }

// The 4 unsigned bytes at p as floats.
float32x4_t ubytes4_to_floats(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(v)))));
}

// The 4 signed bytes at p as int32.
int32x4_t sbytes4(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return vmovl_s16(vget_low_s16(vmovl_s8(vcreate_s8(v))));
}

// Writes (first) or adds the 8 rows' results of tokens t0.. of group g: acc[t][row half].
template <int kTokens>
void store_rows8(const MatmulProblem &p, int64_t rg, int64_t g, int t0, bool first, const float32x4_t acc[][2]) {
    for (int t = 0; t < kTokens; ++t) {
        float *y = p.y + (g * kGroupTokens + t0 + t) * p.rows + 8 * rg;
        for (int rh = 0; rh < 2; ++rh) vst1q_f32(y + 4 * rh, first ? acc[t][rh] : vaddq_f32(vld1q_f32(y + 4 * rh), acc[t][rh]));
    }
}

// Row half rh of a Q4_0x8 or Q8_0x8 block as 8 element chunks: e[x] holds elements 4x..4x+3 of
// the half's 4 rows, one row per lane. A Q4_0 chunk c's low nibbles are elements 4c..4c+3, its
// high nibbles 16 + 4c..; Q8_0x8's 8 chunks are the elements in order.
template <TensorType kType>
void element_chunks(const uint8_t *blk, int rh, int8x16_t e[8]) {
    if constexpr (kType == TensorType::Q4_0) {
        for (int c = 0; c < 4; ++c) {
            const uint8x16_t v = vld1q_u8(blk + 16 + 32 * c + 16 * rh);
            e[c] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
            e[4 + c] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        }
    } else {
        for (int c = 0; c < 8; ++c) e[c] = vld1q_s8(reinterpret_cast<const int8_t *>(blk + 16 + 32 * c + 16 * rh));
    }
}

// kTokens tokens (t0.. of group g) x the 8 rows of group rg (rows 8 rg ..) over blocks [b0, b1) of
// Q4_0x8 or Q8_0x8 (kType): y is set for b0 == 0 and added to otherwise. kTokens = 1 decodes; 4
// unpacks each chunk once for the group's tokens. Element chunks 0..3 meet a.lo, 4..7 a.hi; Q4_0's
// -8 offset is the sums' starting value, -8 sum(y), the activations' offset.
template <TensorType kType, int kTokens>
[[gnu::noinline]] void quant_x8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t b0, int64_t b1) {
    constexpr int64_t kBlockBytes = kType == TensorType::Q4_0 ? kQ4x8Bytes : kQ8x8Bytes;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *w = p.w + rg * (p.cols / 32) * kBlockBytes;
    float32x4_t acc[kTokens][2];
    for (int t = 0; t < kTokens; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    for (int64_t b = b0; b < b1; ++b) {
        const uint8_t *blk = w + b * kBlockBytes;
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        for (int rh = 0; rh < 2; ++rh) {
            int8x16_t e[8];
            element_chunks<kType>(blk, rh, e);
            const float32x4_t dw = halves4(blk + 8 * rh);
            for (int t = 0; t < kTokens; ++t) {
                const int k = half * kGroupTokens + t0 + t;
                const int32x4_t start = vdupq_n_s32(kType == TensorType::Q4_0 ? -a.offset[k] : 0);
                int32x4_t s = dot_lanes4(start, e, vld1q_s8(&a.lo[t0 + t][16 * half]));
                s = dot_lanes4(s, e + 4, vld1q_s8(&a.hi[t0 + t][16 * half]));
                acc[t][rh] = vfmaq_f32(acc[t][rh], vcvtq_f32_s32(s), vmulq_n_f32(dw, a.d[k]));
            }
        }
    }
    store_rows8<kTokens>(p, rg, g, t0, b0 == 0, acc);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// Q4_0x8 and Q8_0x8 for a whole group of 4 tokens with smmla, which multiplies 2 rows of 8 weight
// bytes by 2 tokens' 8 activation bytes at once: lanes [r t, r t', r' t, r' t']. Zipping the 32-bit
// lanes of a row half's element chunks x and x + 1 (elements 4x..4x+3 and 4x+4..4x+7 of 4 rows)
// gives rows 0 and 1 (vzip1q_s32) and rows 2 and 3 (vzip2q_s32) as such operands, elements 8k..
// 8k+7 of each for x = 2k; the activations' operand takes the same elements of 2 tokens. So a
// block takes 32 smmla for 8 rows and 4 tokens, where sdot by lane takes 64.

// Elements 8k..8k+7 of a block for tokens 2 tp and 2 tp + 1 side by side, from the activation
// rows `rows` (a.lo or a.hi) at byte `at`.
int8x16_t token_pair8(const int8_t (*rows)[32], int tp, int at) {
    return vcombine_s8(vld1_s8(rows[2 * tp] + at), vld1_s8(rows[2 * tp + 1] + at));
}

// The kGroupTokens tokens of group g x the 8 rows of group rg over blocks [b0, b1) of Q4_0x8 or
// Q8_0x8 (kType): y set for b0 == 0 and added to otherwise, as quant_x8_rows. Q4_0's -8 offset is
// the sums' starting value, -8 sum(y) per token.
template <TensorType kType>
[[gnu::noinline]] void quant_x8_group_rows_mmla(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t b0, int64_t b1) {
    constexpr bool kQ4 = kType == TensorType::Q4_0;
    constexpr int64_t kBlockBytes = kQ4 ? kQ4x8Bytes : kQ8x8Bytes;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *w = p.w + rg * (p.cols / 32) * kBlockBytes;
    float32x4_t acc[4][2];  // [row pair: rows 0-1, 2-3, 4-5, 6-7][token pair 0-1, 2-3]
    for (int rp = 0; rp < 4; ++rp) acc[rp][0] = acc[rp][1] = vdupq_n_f32(0.0f);
    for (int64_t b = b0; b < b1; ++b) {
        const uint8_t *blk = w + b * kBlockBytes;
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        // Per token pair: the operands of elements 8k..8k+7 (k < 2 in a.lo, k >= 2 in a.hi), the
        // activation scales and the sums' starting values, in the lanes' order [t, t', t, t'].
        int8x16_t y[2][4];
        float32x4_t ad[2];
        int32x4_t start[2];
        for (int tp = 0; tp < 2; ++tp) {
            for (int k = 0; k < 4; ++k) y[tp][k] = token_pair8(k < 2 ? a.lo : a.hi, tp, 16 * half + 8 * (k % 2));
            const int at = half * kGroupTokens + 2 * tp;
            const float32x2_t d2 = vld1_f32(&a.d[at]);
            const int32x2_t o2 = vneg_s32(vld1_s32(&a.offset[at]));
            ad[tp] = vcombine_f32(d2, d2);
            start[tp] = kQ4 ? vcombine_s32(o2, o2) : vdupq_n_s32(0);
        }
        for (int rh = 0; rh < 2; ++rh) {
            int8x16_t e[8];
            element_chunks<kType>(blk, rh, e);
            const float32x4_t dw = halves4(blk + 8 * rh);
            for (int rp = 0; rp < 2; ++rp) {
                int8x16_t op[4];
                for (int k = 0; k < 4; ++k) {
                    const int32x4_t lo = vreinterpretq_s32_s8(e[2 * k]), hi = vreinterpretq_s32_s8(e[2 * k + 1]);
                    op[k] = vreinterpretq_s8_s32(rp == 0 ? vzip1q_s32(lo, hi) : vzip2q_s32(lo, hi));
                }
                const float32x4_t dr = rp == 0 ? vzip1q_f32(dw, dw) : vzip2q_f32(dw, dw);  // [d_r, d_r, d_r', d_r']
                for (int tp = 0; tp < 2; ++tp) {
                    int32x4_t s = start[tp];
                    for (int k = 0; k < 4; ++k) s = vmmlaq_s32(s, op[k], y[tp][k]);
                    acc[2 * rh + rp][tp] = vfmaq_f32(acc[2 * rh + rp][tp], vcvtq_f32_s32(s), vmulq_f32(dr, ad[tp]));
                }
            }
        }
    }
    // Row pairs 2 rh and 2 rh + 1 hold rows 4 rh..4 rh + 3: their even lanes are token 2 tp's,
    // the odd lanes token 2 tp + 1's.
    for (int tp = 0; tp < 2; ++tp) {
        for (int rh = 0; rh < 2; ++rh) {
            const float32x4_t by_token[2] = {vuzp1q_f32(acc[2 * rh][tp], acc[2 * rh + 1][tp]),
                                             vuzp2q_f32(acc[2 * rh][tp], acc[2 * rh + 1][tp])};
            for (int u = 0; u < 2; ++u) {
                float *out = p.y + (g * kGroupTokens + t0 + 2 * tp + u) * p.rows + 8 * rg + 4 * rh;
                vst1q_f32(out, b0 == 0 ? by_token[u] : vaddq_f32(vld1q_f32(out), by_token[u]));
            }
        }
    }
}
#endif  // __ARM_FEATURE_MATMUL_INT8

// A group of tokens against interleaved Q4_0 or Q8_0 rows: smmla where the level has it, else
// sdot by lane.
template <TensorType kType>
#if defined(__ARM_FEATURE_MATMUL_INT8)
constexpr InterleavedRows quant_x8_group_rows = quant_x8_group_rows_mmla<kType>;
#else
constexpr InterleavedRows quant_x8_group_rows = quant_x8_rows<kType, kGroupTokens>;
#endif

// kTokens tokens (t0.. of group g) x the 8 rows of group rg over super-blocks [s0, s1) of Q4_Kx8
// or Q5_Kx8 (kType), y set for s0 == 0 and added to otherwise. Quant chunk 8j + c holds bytes
// 4c..4c+3 of each row's qs group j: low nibbles are elements 4c..4c+3 of sub-block 2j, high
// nibbles those of sub-block 2j + 1, the two blocks of activation pair 4 sb + j; chunks 0..3 meet
// a.lo, 4..7 a.hi. Q5_K's bit 4 comes from qh chunk c, bits 2j and 2j + 1. Per sub-block:
//   row's share = a_d * (d * sc * sum(q * y) - dmin * m * sum(y)),  sum(y) = offset / 8.
template <TensorType kType, int kTokens>
[[gnu::noinline]] void q4kx8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t s0, int64_t s1) {
    constexpr int64_t kBlockBytes = kType == TensorType::Q5_K ? kQ5Kx8Bytes : kQ4Kx8Bytes;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *w = p.w + rg * (p.cols / 256) * kBlockBytes;
    float32x4_t acc[kTokens][2];
    for (int t = 0; t < kTokens; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    for (int64_t sb = s0; sb < s1; ++sb) {
        const uint8_t *blk = w + sb * kBlockBytes;
        const float32x4_t d[2] = {halves4(blk), halves4(blk + 8)}, dmin[2] = {halves4(blk + 16), halves4(blk + 24)};  // [row half]
        for (int j = 0; j < 4; ++j) {
            const ActBlockPair &a = act[4 * sb + j];
            float min_scale[2 * kGroupTokens];  // a.d * sum(y) per (block, token), in a.d's order; sum(y) = offset / 8
            for (int k = 0; k < 2 * kGroupTokens; ++k) min_scale[k] = a.d[k] * static_cast<float>(a.offset[k] / 8);
            for (int rh = 0; rh < 2; ++rh) {
                int32x4_t dots[2][kTokens];  // [sub-block 2j, 2j + 1][token]
                for (int t = 0; t < kTokens; ++t) dots[0][t] = dots[1][t] = vdupq_n_s32(0);
                for (int ch = 0; ch < 2; ++ch) {
                    int8x16_t lo[4], hi[4];
                    for (int c = 0; c < 4; ++c) {
                        const uint8x16_t v = vld1q_u8(blk + 160 + 32 * (8 * j + 4 * ch + c) + 16 * rh);
                        uint8x16_t l = vandq_u8(v, vdupq_n_u8(0x0F)), h = vshrq_n_u8(v, 4);
                        if constexpr (kType == TensorType::Q5_K) {
                            // Bits 2j and 2j + 1 of the qh bytes to bit 4 (a negative count shifts right).
                            const uint8x16_t bits = vld1q_u8(blk + kQ4Kx8Bytes + 32 * (4 * ch + c) + 16 * rh);
                            const uint8x16_t bit4 = vdupq_n_u8(0x10);
                            l = vorrq_u8(l, vandq_u8(vshlq_u8(bits, vdupq_n_s8(static_cast<int8_t>(4 - 2 * j))), bit4));
                            h = vorrq_u8(h, vandq_u8(vshlq_u8(bits, vdupq_n_s8(static_cast<int8_t>(3 - 2 * j))), bit4));
                        }
                        lo[c] = vreinterpretq_s8_u8(l);
                        hi[c] = vreinterpretq_s8_u8(h);
                    }
                    for (int t = 0; t < kTokens; ++t) {
                        const int8_t *y = ch == 0 ? a.lo[t0 + t] : a.hi[t0 + t];
                        dots[0][t] = dot_lanes4(dots[0][t], lo, vld1q_s8(y));
                        dots[1][t] = dot_lanes4(dots[1][t], hi, vld1q_s8(y + 16));
                    }
                }
                for (int h = 0; h < 2; ++h) {
                    const float32x4_t step = vmulq_f32(d[rh], ubytes4_to_floats(blk + 32 + 8 * (2 * j + h) + 4 * rh));
                    const float32x4_t off = vmulq_f32(dmin[rh], ubytes4_to_floats(blk + 96 + 8 * (2 * j + h) + 4 * rh));
                    for (int t = 0; t < kTokens; ++t) {
                        const int k = h * kGroupTokens + t0 + t;
                        acc[t][rh] = vfmaq_f32(acc[t][rh], vcvtq_f32_s32(dots[h][t]), vmulq_n_f32(step, a.d[k]));
                        acc[t][rh] = vfmsq_f32(acc[t][rh], off, vdupq_n_f32(min_scale[k]));
                    }
                }
            }
        }
    }
    store_rows8<kTokens>(p, rg, g, t0, s0 == 0, acc);
}

// q6kx8_range's table for token t of group g: 32 * sum(y) of each scale group, what the stored
// q + 32 adds to its integer sum. Group 4k + m of pair k lies in a.lo (m even) or a.hi (m odd),
// bytes 16 (m / 2) on.
void q6x8_sums(const MatmulProblem &p, int64_t g, int t, int64_t s0, int64_t s1, int32_t *out) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    for (int64_t sb = s0; sb < s1; ++sb) {
        for (int gi = 0; gi < 16; ++gi) {
            const ActBlockPair &a = act[4 * sb + gi / 4];
            const int m = gi % 4;
            out[16 * (sb - s0) + gi] = 32 * vaddlvq_s8(vld1q_s8((m & 1 ? a.hi[t] : a.lo[t]) + 16 * (m / 2)));
        }
    }
}

// Chunks 0..3 of one row half of the scale group at p (its 3 vectors, row half rh's 16 bytes at
// p), unsigned (0..63): chunks 0..2 are the low 6 bits of the vectors, chunk 3's bits 0-1, 2-3
// and 4-5 their bits 6-7.
void q6x8_quants(const uint8_t *p, int8x16_t q[4]) {
    const uint8x16_t v0 = vld1q_u8(p), v1 = vld1q_u8(p + 32), v2 = vld1q_u8(p + 64), low6 = vdupq_n_u8(0x3F);
    q[0] = vreinterpretq_s8_u8(vandq_u8(v0, low6));
    q[1] = vreinterpretq_s8_u8(vandq_u8(v1, low6));
    q[2] = vreinterpretq_s8_u8(vandq_u8(v2, low6));
    // vsli keeps the bits below the shift of its first operand and puts the second above them.
    const uint8x16_t top01 = vsliq_n_u8(vshrq_n_u8(v0, 6), vshrq_n_u8(v1, 6), 2);
    q[3] = vreinterpretq_s8_u8(vsliq_n_u8(top01, vshrq_n_u8(v2, 6), 4));
}

// kTokens tokens (t0.. of group g) x the 8 rows of group rg over super-blocks [s0, s1), with
// q6kx8_range's sums (token t0 + t's at sums + t * kQ6Kx8SliceSums):
//   row's share of block b = a_d * d * sum over b's 2 scale groups of sc * (sum(q * y) - 32 sum(y)).
// |sum((q - 32) y)| <= 16 * 32 * 127 per group, times |sc| <= 128, two groups: below 2^24, so the
// block's integer sum is exact in float too.
template <int kTokens>
[[gnu::noinline]] void q6kx8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t s0, int64_t s1, const int32_t *sums) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *w = p.w + rg * (p.cols / 256) * kQ6Kx8Bytes;
    float32x4_t acc[kTokens][2];
    for (int t = 0; t < kTokens; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    for (int64_t sb = s0; sb < s1; ++sb) {
        const uint8_t *blk = w + sb * kQ6Kx8Bytes;
        const int32_t *ys = sums + 16 * (sb - s0);
        for (int rh = 0; rh < 2; ++rh) {
            const float32x4_t d = halves4(blk + kQ6Kx8D + 8 * rh);
            for (int j = 0; j < 8; ++j) {
                // Block 8 sb + j is half h of activation pair k: scale groups 4k + 2h (in a.lo)
                // and 4k + 2h + 1 (in a.hi), bytes 16 h on.
                const int k = j / 2, h = j % 2;
                const ActBlockPair &a = act[4 * sb + k];
                int32x4_t bsum[kTokens];
                for (int t = 0; t < kTokens; ++t) bsum[t] = vdupq_n_s32(0);
                for (int m = 2 * h; m < 2 * h + 2; ++m) {
                    const int gi = 4 * k + m;
                    int8x16_t q[4];
                    q6x8_quants(blk + 96 * gi + 16 * rh, q);
                    const int32x4_t sc = sbytes4(blk + kQ6Kx8Scales + 8 * gi + 4 * rh);
                    for (int t = 0; t < kTokens; ++t) {
                        const int8_t *y = (m & 1 ? a.hi[t0 + t] : a.lo[t0 + t]) + 16 * h;
                        const int32x4_t s = dot_lanes4(vdupq_n_s32(-ys[t * kQ6Kx8SliceSums + gi]), q, vld1q_s8(y));
                        bsum[t] = vmlaq_s32(bsum[t], s, sc);
                    }
                }
                for (int t = 0; t < kTokens; ++t) {
                    const float ad = a.d[h * kGroupTokens + t0 + t];
                    acc[t][rh] = vfmaq_f32(acc[t][rh], vcvtq_f32_s32(bsum[t]), vmulq_n_f32(d, ad));
                }
            }
        }
    }
    store_rows8<kTokens>(p, rg, g, t0, s0 == 0, acc);
}
#endif  // __ARM_FEATURE_DOTPROD

// ---- float weights --------------------------------------------------------------------------

template <bool kF16>
float32x4_t load_w4(const uint8_t *row, int64_t c) {
    if constexpr (kF16)
        return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(row + 2 * c)));  // fcvtl: ARMv8.0
    else
        return vld1q_f32(reinterpret_cast<const float *>(row) + c);
}

template <bool kF16>
float load_w1(const uint8_t *row, int64_t c, const float *fp16_table) {
    if constexpr (kF16) return fp16_table[load_u16(row + 2 * c)];
    float v;
    std::memcpy(&v, row + 4 * c, sizeof v);
    return v;
}

// One row x the n_tok tokens from token tok: each weight vector loaded once for all tokens.
template <bool kF16>
void float_row(const MatmulProblem &p, int64_t r, int64_t tok, int n_tok) {
    const uint8_t *row = p.w + r * p.w_row_bytes;
    const float *x = p.x + tok * p.cols;
    float32x4_t acc[kGroupTokens][2];
    for (int t = 0; t < kGroupTokens; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    int64_t c = 0;
    for (; c + 8 <= p.cols; c += 8) {
        const float32x4_t w0 = load_w4<kF16>(row, c), w1 = load_w4<kF16>(row, c + 4);
        for (int t = 0; t < n_tok; ++t) {
            acc[t][0] = vfmaq_f32(acc[t][0], w0, vld1q_f32(x + t * p.cols + c));
            acc[t][1] = vfmaq_f32(acc[t][1], w1, vld1q_f32(x + t * p.cols + c + 4));
        }
    }
    for (int t = 0; t < n_tok; ++t) {
        float s = vaddvq_f32(vaddq_f32(acc[t][0], acc[t][1]));
        for (int64_t cc = c; cc < p.cols; ++cc) s += load_w1<kF16>(row, cc, p.fp16_table) * x[t * p.cols + cc];
        *out_at(p, tok + t, r) = s;
    }
}

template <bool kF16>
void float_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t tok = g * kGroupTokens;
        const int n_tok = static_cast<int>(min64(kGroupTokens, p.n_tokens - tok));
        for (int64_t r = r0; r < r1; ++r) float_row<kF16>(p, r, tok, n_tok);
    }
}

void matmul_range_neon(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
#if defined(__ARM_FEATURE_DOTPROD)
    if (p.interleaved) {
        switch (p.wtype) {
            case TensorType::Q4_0:
                interleaved_range<32, quant_x8_group_rows<TensorType::Q4_0>, quant_x8_rows<TensorType::Q4_0, 1>>(p, r0, r1, g0, g1);
                return;
            case TensorType::Q8_0:
                interleaved_range<32, quant_x8_group_rows<TensorType::Q8_0>, quant_x8_rows<TensorType::Q8_0, 1>>(p, r0, r1, g0, g1);
                return;
            case TensorType::Q4_K:
                interleaved_range<256, q4kx8_rows<TensorType::Q4_K, kGroupTokens>, q4kx8_rows<TensorType::Q4_K, 1>>(p, r0, r1, g0, g1);
                return;
            case TensorType::Q5_K:
                interleaved_range<256, q4kx8_rows<TensorType::Q5_K, kGroupTokens>, q4kx8_rows<TensorType::Q5_K, 1>>(p, r0, r1, g0, g1);
                return;
            default:  // Q6_K, the last interleaved type
                q6kx8_range<q6x8_sums, q6kx8_rows<kGroupTokens>, q6kx8_rows<1>>(p, r0, r1, g0, g1);
                return;
        }
    }
#endif
    switch (p.wtype) {
        case TensorType::Q4_0:
            quant_range<TensorType::Q4_0>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q8_0:
            quant_range<TensorType::Q8_0>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q4_K:
            kquant_range<TensorType::Q4_K>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q5_K:
            kquant_range<TensorType::Q5_K>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q6_K:
            kquant_range<TensorType::Q6_K>(p, r0, r1, g0, g1);
            break;
        case TensorType::F16:
            float_range<true>(p, r0, r1, g0, g1);
            break;
        default:
            float_range<false>(p, r0, r1, g0, g1);
            break;
    }
}

// ---- dequantization -------------------------------------------------------------------------

// d * q for 16 quants, as dequantize_row computes it (the products are exact in either order).
void store_scaled16(int8x16_t q, float d, float *dst) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    const int32x4_t v[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_high_s16(lo), vmovl_s16(vget_low_s16(hi)), vmovl_high_s16(hi)};
    for (int k = 0; k < 4; ++k) vst1q_f32(dst + 4 * k, vmulq_n_f32(vcvtq_f32_s32(v[k]), d));
}

void dequantize_neon(TensorType type, const void *src, float *dst, int64_t n, const float *fp16_table) {
    const auto *in = static_cast<const uint8_t *>(src);
    switch (type) {
        case TensorType::F16: {
            int64_t i = 0;
            for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, load_w4<true>(in, i));
            for (; i < n; ++i) dst[i] = fp16_table[load_u16(in + 2 * i)];
            break;
        }
        case TensorType::Q8_0:
        case TensorType::Q4_0:
            for (int64_t b = 0; b < n / 32; ++b, dst += 32) {
                const WeightBlock w = type == TensorType::Q8_0 ? load_block<TensorType::Q8_0>(in, b, fp16_table)
                                                               : load_block<TensorType::Q4_0>(in, b, fp16_table);
                store_scaled16(w.lo, w.d, dst);
                store_scaled16(w.hi, w.d, dst + 16);
            }
            break;
        default:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            break;
    }
}

// ---- vector operations ----------------------------------------------------------------------

float dot_f32_neon(const float *a, const float *b, int64_t n) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int k = 0; k < 4; ++k) acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + i + 4 * k), vld1q_f32(b + i + 4 * k));
    }
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

void axpy_neon(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; ++i) y[i] += a * x[i];
}

// Attention over KV rows of halves, Q8 and Q4 (F32 rows take the loops over dot_f32 and axpy in
// kernels.cpp).
// Elements j..j+3 of a KV row (j a multiple of 4) as floats: IEEE halves widened, Q8 codes times
// the row's scale, Q4 codes scaled and offset by one fused multiply-add (as the x86 levels read
// them). element() reads one element the same way (the tails). Rows are read no further than
// their last element.
float float_of(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
float32x4_t load4(const uint16_t *row, int64_t j) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(row + j))); }
float32x4_t load4(const KvQ8Byte *row, int64_t j) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    uint32_t packed;
    std::memcpy(&packed, p + 4 + j, sizeof packed);
    const int16x8_t codes = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(packed)));
    return vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(codes))), load_f32(p));
}
float32x4_t load4(const KvQ4Byte *row, int64_t j) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    const uint8x8_t packed = vreinterpret_u8_u16(vdup_n_u16(load_u16(p + 4 + j / 2)));
    const uint8x8_t codes = vzip1_u8(vand_u8(packed, vdup_n_u8(15)), vshr_n_u8(packed, 4));  // low, high nibble of each byte
    const float32x4_t c = vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(codes))));
    return vfmaq_n_f32(vdupq_n_f32(float_of(load_u16(p + 2))), c, float_of(load_u16(p)));
}
float element(const uint16_t *row, int64_t j) { return float_of(row[j]); }
float element(const KvQ8Byte *row, int64_t j) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    return load_f32(p) * static_cast<float>(static_cast<int8_t>(p[4 + j]));
}
float element(const KvQ4Byte *row, int64_t j) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    const float code = static_cast<float>((p[4 + j / 2] >> (4 * (j & 1))) & 15);
    return vgetq_lane_f32(vfmaq_n_f32(vdupq_n_f32(float_of(load_u16(p + 2))), vdupq_n_f32(code), float_of(load_u16(p))), 0);
}

// The queries one after the other: a NEON core widens a row's elements at little cost, and no
// ARM64 target was measured for a tiled form. Rows of halves, Q8 or Q4 (F32 rows take the loops
// over dot_f32 and axpy in kernels.cpp).
template <typename Element>
void dot_kv_rows_neon(const float *const *queries, int m, const uint8_t *rows, int64_t row_bytes, int64_t n, int64_t len, float *scores,
                      int64_t scores_stride) {
    for (int q_index = 0; q_index < m; ++q_index) {
        const float *q = queries[q_index];
        for (int64_t i = 0; i < n; ++i) {
            const auto *row = reinterpret_cast<const Element *>(rows + i * row_bytes);
            float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
            int64_t j = 0;
            for (; j + 8 <= len; j += 8) {
                acc[0] = vfmaq_f32(acc[0], vld1q_f32(q + j), load4(row, j));
                acc[1] = vfmaq_f32(acc[1], vld1q_f32(q + j + 4), load4(row, j + 4));
            }
            for (; j + 4 <= len; j += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(q + j), load4(row, j));
            float s = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
            for (; j < len; ++j) s += q[j] * element(row, j);
            scores[q_index * scores_stride + i] = s;
        }
    }
}

template <typename Element>
void weighted_kv_row_sum_neon(float *const *outs, int m, const float *weights, int64_t weights_stride, const uint8_t *rows,
                              int64_t row_bytes, int64_t n, int64_t len) {
    for (int q_index = 0; q_index < m; ++q_index) {
        float *out = outs[q_index];
        const float *w = weights + q_index * weights_stride;
        for (int64_t i = 0; i < n; ++i) {
            if (w[i] == 0.0f) continue;
            const auto *row = reinterpret_cast<const Element *>(rows + i * row_bytes);
            int64_t j = 0;
            for (; j + 4 <= len; j += 4) vst1q_f32(out + j, vfmaq_n_f32(vld1q_f32(out + j), load4(row, j), w[i]));
            for (; j < len; ++j) out[j] += w[i] * element(row, j);
        }
    }
}

// exp(x) to about 2 ulp, the same method as the AVX2 kernels: exp(x) = 2^n * exp(r) with
// n = round(x / ln 2), ln 2 split in two parts so r is exact enough, and exp(r) by a degree-7
// polynomial (the Cephes expf coefficients). Below -87 gives 0, above 88 saturates at exp(88);
// NaN stays NaN (fmax/fmin propagate it).
float32x4_t exp4(float32x4_t x) {
    const float32x4_t xc = vminq_f32(vdupq_n_f32(88.0f), vmaxq_f32(vdupq_n_f32(-87.0f), x));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(xc, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(xc, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t poly = vdupq_n_f32(1.9875691500e-4f);
    poly = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), poly, r);
    poly = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), poly, r);
    poly = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), poly, r);
    poly = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), poly, r);
    poly = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), poly, r);
    poly = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), poly, vmulq_f32(r, r));
    const int32x4_t pow2n = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t e = vmulq_f32(poly, vreinterpretq_f32_s32(pow2n));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), vcltq_f32(x, vdupq_n_f32(-87.0f))));
}

float exp_sub_sum_neon(float *x, float max, int64_t n) {
    const float32x4_t m = vdupq_n_f32(max);
    float32x4_t sum = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), m));
        vst1q_f32(x + i, e);
        sum = vaddq_f32(sum, e);
    }
    float total = vaddvq_f32(sum);
    if (i < n) {  // the last 1..3 values, through a padded vector
        float buf[4] = {max, max, max, max};
        for (int64_t k = i; k < n; ++k) buf[k - i] = x[k];
        vst1q_f32(buf, exp4(vsubq_f32(vld1q_f32(buf), m)));
        for (int64_t k = i; k < n; ++k) total += x[k] = buf[k - i];
    }
    return total;
}

float32x4_t silu_mul4(float32x4_t g, float32x4_t u) {
    const float32x4_t e = exp4(vnegq_f32(g));
    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), u);
}

// out[i] = op4(gate[i], up[i]) four at a time.
template <float32x4_t (*op4)(float32x4_t, float32x4_t)>
void gated_neon(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, op4(vld1q_f32(gate + i), vld1q_f32(up + i)));
    if (i < n) {  // the last 1..3 values, through padded vectors
        float g[4] = {}, u[4] = {};
        for (int64_t k = i; k < n; ++k) g[k - i] = gate[k], u[k - i] = up[k];
        vst1q_f32(g, op4(vld1q_f32(g), vld1q_f32(u)));
        for (int64_t k = i; k < n; ++k) out[k] = g[k - i];
    }
}

void silu_mul_neon(float *out, const float *gate, const float *up, int64_t n) { gated_neon<silu_mul4>(out, gate, up, n); }

// gelu_tanh(g) * u in the sigmoid form of activation.h.
float32x4_t gelu_mul4(float32x4_t g, float32x4_t u) {
    const float32x4_t arg =
        vmulq_f32(vmulq_f32(vdupq_n_f32(1.5957691216057308f), g), vfmaq_f32(vdupq_n_f32(1.0f), vdupq_n_f32(0.044715f), vmulq_f32(g, g)));
    const float32x4_t e = exp4(vnegq_f32(arg));
    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), u);
}

void gelu_mul_neon(float *out, const float *gate, const float *up, int64_t n) { gated_neon<gelu_mul4>(out, gate, up, n); }

// The table each level's file exports under its own name.
constexpr KernelTable kThisLevelKernels = {
    quantize_activations_neon,
    matmul_range_neon,
    dequantize_neon,
    dot_f32_neon,
    axpy_neon,
    exp_sub_sum_neon,
    silu_mul_neon,
    gelu_mul_neon,
    // KV rows of halves, Q8 and Q4; F32 rows take the loops in kernels.cpp.
    {nullptr, dot_kv_rows_neon<uint16_t>, dot_kv_rows_neon<KvQ8Byte>, dot_kv_rows_neon<KvQ4Byte>},
    {nullptr, weighted_kv_row_sum_neon<uint16_t>, weighted_kv_row_sum_neon<KvQ8Byte>, weighted_kv_row_sum_neon<KvQ4Byte>},
    nullptr,
    nullptr,  // half conversions: the loops in kernels.cpp
    nullptr,  // max_value: the loop in kernels.cpp
    nullptr,
    nullptr,  // rotate_pairs, rotate_half_pairs: the loops in kernels.cpp
    nullptr,  // add_query_stats: the loop in kernels.cpp
#if defined(__ARM_FEATURE_DOTPROD)
    2,  // interleaved weights: preferred, sdot by lane serves 4 rows with no reduction across lanes
#else
    0,  // interleaved weights: without sdot the file's layout
#endif
};

}  // namespace

}  // namespace h2o::cpu::detail
