#include "quant.h"

#include "fp16.h"
#include "weight_element.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

namespace h2o {

namespace {

bool is_finite(float v) { return std::fabs(v) <= FLT_MAX; }  // false for inf and NaN

void quantize_q8_0(const float *x, BlockQ8_0 *out, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < kQK; ++j) {
            amax = std::max(amax, std::fabs(x[j]));
            finite = finite && is_finite(x[j]);
        }
        // llama.cpp: d = amax / 127, quant = roundf(x / d) computed as x * (1 / d); the fp16 scale
        // is rounded after the quants were chosen with the exact one.
        const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
        const float id = (finite && d != 0.0f) ? 1.0f / d : 0.0f;
        out[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK; ++j) {
            // |x * id| <= 127 up to rounding, so the cast is in range; the NaN from an inf times a
            // zero id is not, and is mapped to 0 rather than left undefined.
            const float q = std::roundf(x[j] * id);
            out[b].qs[j] = static_cast<int8_t>(q >= -127.0f && q <= 127.0f ? q : 0.0f);
        }
    }
}

// The scale of a Q4_0 or Q5_0 block of 32 values: the element of largest magnitude, with its
// sign, mapped to -half_range, the asymmetric end of the range [-half_range, half_range - 1], so
// the biggest value is represented exactly. Ties keep the first such element, as llama.cpp does.
// NaN for a block holding inf or NaN.
float signed_extreme_scale(const float *x, float half_range) {
    float amax = 0.0f, max = 0.0f;
    bool finite = true;
    for (int j = 0; j < kQK; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
        finite = finite && is_finite(x[j]);
    }
    return finite ? max / -half_range : std::numeric_limits<float>::quiet_NaN();
}

// 1 / d, or 0 for a zero or NaN scale (whose quants are then all zero).
float inverse_scale(float d) { return (!std::isnan(d) && d != 0.0f) ? 1.0f / d : 0.0f; }

void quantize_q4_0(const float *x, BlockQ4_0 *out, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
        const float d = signed_extreme_scale(x, 8.0f);
        const float id = inverse_scale(d);
        out[b].d = fp32_to_fp16(d);
        // llama.cpp: nibble = min(15, trunc(x / d + 8.5)), i.e. round half up, then clamp the
        // value +8 steps that lands on 16. x / d lies in [-8, 8], so the sum is at least 0.5. The
        // guards only matter where llama.cpp's cast would be undefined: NaN in a non-finite block
        // (nibble 8, zero), and +-inf when 1/d overflows for a block of values below ~1e-37.
        auto nibble = [id](float v) {
            const float t = v * id + 8.5f;
            return t >= 0.0f ? (t < 15.0f ? static_cast<int>(t) : 15) : 8;
        };
        for (int j = 0; j < kQK / 2; ++j) {
            out[b].qs[j] = static_cast<uint8_t>(nibble(x[j]) | (nibble(x[j + kQK / 2]) << 4));
        }
    }
}

void quantize_q5_0(const float *x, BlockQ5_0 *out, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
        // Q4_0's rule over the 5-bit range [-16, 15]: quant = min(31, trunc(x / d + 16.5)).
        const float d = signed_extreme_scale(x, 16.0f);
        const float id = inverse_scale(d);
        out[b].d = fp32_to_fp16(d);
        auto quant = [id](float v) {  // guards as Q4_0's: NaN and overflowing 1/d give zero (16)
            const float t = v * id + 16.5f;
            return t >= 0.0f ? (t < 31.0f ? static_cast<int>(t) : 31) : 16;
        };
        uint32_t qh = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const int lo = quant(x[j]), hi = quant(x[j + kQK / 2]);
            out[b].qs[j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
            qh |= static_cast<uint32_t>(lo >> 4) << j | static_cast<uint32_t>(hi >> 4) << (j + kQK / 2);
        }
        for (int k = 0; k < 4; ++k) out[b].qh[k] = static_cast<uint8_t>(qh >> (8 * k));
    }
}

// Quant j of a Q5_0 block, -16..15.
int q5_0_quant(const BlockQ5_0 &blk, int j) {
    const int nibble = j < kQK / 2 ? (blk.qs[j] & 0x0F) : (blk.qs[j - kQK / 2] >> 4);
    const int fifth = (blk.qh[j / 8] >> (j % 8)) & 1;
    return (nibble | fifth << 4) - 16;
}

void dequantize_q5_0(const BlockQ5_0 *in, float *y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
        const float d = fp16_to_fp32(in[b].d);
        for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q5_0_quant(in[b], j)) * d;
    }
}

void dequantize_q8_0(const BlockQ8_0 *in, float *y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
        const float d = fp16_to_fp32(in[b].d);
        for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(in[b].qs[j]) * d;
    }
}

void dequantize_q4_0(const BlockQ4_0 *in, float *y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
        const float d = fp16_to_fp32(in[b].d);
        for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q4_0_nibble(in[b].qs, j) - 8) * d;
    }
}

// ---- K-quants ----------------------------------------------------------------------------
//
// The quantizer below is our own. For each sub-block it searches the scale (and for Q4_K/Q5_K the
// min) that minimizes the squared error of the dequantized values: a sweep of candidate scales
// around "range / levels", each followed by a least-squares refit of scale and min for the quants
// it chose, then a few rounds of requantizing with the best fit. The sub-block scales are then
// quantized against the fp16 super-block scales, and each sub-block tries the neighbouring 6- or
// 8-bit scale codes, keeping the one whose requantized values are closest. Errors are measured
// with the dequantization formula itself, so the choice is made on exactly what a reader sees.
// Unweighted squared error: with no knowledge of the activations, it is what bounds the error of
// a dot product.

// round(v) clamped to [lo, hi]; NaN gives lo. The clamp happens in float (max/min, no branches),
// so no out-of-range conversion is possible. Ties round up, and the float error of adding 0.5 can
// move values within an ulp of a tie either way: harmless, the search measures what it gets.
inline int nearest_clamped(float v, int lo, int hi) {
    const float lo_f = static_cast<float>(lo);
    v = std::min(std::max(lo_f, v), static_cast<float>(hi));  // max(lo, NaN) is lo
    return static_cast<int>(v - lo_f + 0.5f) + lo;            // truncation of a value >= 0.5
}

bool all_finite(const float *x, int n) {
    for (int i = 0; i < n; ++i) {
        if (!is_finite(x[i])) return false;
    }
    return true;
}

// Fit of x ~= scale * L - min_off over one 32-element sub-block, L in [0, nmax], scale > 0,
// min_off >= 0 (the format's mins are unsigned: the lowest value is -min_off <= 0).
struct AffineFit {
    float scale = 0.0f, min_off = 0.0f, err = INFINITY;
};

// Sums over one sub-block for the least-squares fit of scale and offset to fixed quants L.
struct AffineSums {
    float sl = 0.0f, sll = 0.0f, sxl = 0.0f;
};

// Quantizes x with (scale, min_off) by rounding. Returns the squared error of exactly the values
// dequantize_row will produce (scale * L - min_off) and accumulates the fit sums for those L.
float affine_requant(const float *x, int nmax, float scale, float min_off, AffineSums *sums) {
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    float err = 0.0f;
    for (int i = 0; i < 32; ++i) {
        const float l = static_cast<float>(nearest_clamped((x[i] + min_off) * inv, 0, nmax));
        const float diff = scale * l - min_off - x[i];
        err += diff * diff;
        sums->sl += l;
        sums->sll += l * l;
        sums->sxl += x[i] * l;
    }
    return err;
}

// Least-squares scale and offset for the quants behind `sums`, the offset held at or below zero.
// err is the residual of that fit for those quants (sum x^2 - <fit, normal equations>); requantizing
// with the new fit can only lower it. Returns false when the quants are constant (nothing to fit).
bool affine_refit(const AffineSums &s, float sx, float sxx, AffineFit *fit) {
    const float n = 32.0f;
    const float det = n * s.sll - s.sl * s.sl;
    if (!(det > 0.0f)) return false;
    float scale = (n * s.sxl - sx * s.sl) / det;
    float offset = (s.sll * sx - s.sl * s.sxl) / det;
    if (offset > 0.0f) {  // not representable: fit the scale alone
        offset = 0.0f;
        scale = s.sxl / s.sll;
    }
    if (!(scale > 0.0f)) return false;
    fit->scale = scale;
    fit->min_off = -offset;
    fit->err = sxx - scale * s.sxl - offset * sx;
    return true;
}

AffineFit search_affine(const float *x, int nmax) {
    float lo = 0.0f, hi = x[0], sx = 0.0f, sxx = 0.0f;
    for (int i = 0; i < 32; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
        sx += x[i];
        sxx += x[i] * x[i];
    }
    AffineFit best;
    if (!(hi - lo > 0.0f)) {  // constant block at or below zero: the offset alone is exact
        best.min_off = -lo;
        best.err = 0.0f;
        return best;
    }
    // Candidate steps spreading the range over nmax - 1 to nmax + 1 levels: fewer leave room to
    // round the extremes, more give finer steps at the cost of clipping the extremes. Each
    // candidate's quants get their least-squares scale and offset.
    for (int k = -5; k <= 5; ++k) {
        AffineSums sums;
        affine_requant(x, nmax, (hi - lo) / (static_cast<float>(nmax) + 0.2f * static_cast<float>(k)), -lo, &sums);
        AffineFit cand;
        if (affine_refit(sums, sx, sxx, &cand) && cand.err < best.err) best = cand;
    }
    if (!(best.err < INFINITY)) {  // no candidate had two distinct quants
        best.scale = (hi - lo) / static_cast<float>(nmax);
        best.min_off = -lo;
    }
    // Requantize with the best fit and refit, while that helps (it settles in a round or two).
    for (int round = 0; round < 3; ++round) {
        AffineSums sums;
        best.err = affine_requant(x, nmax, best.scale, best.min_off, &sums);
        AffineFit cand;
        if (!affine_refit(sums, sx, sxx, &cand) || !(cand.err < best.err * 0.999f)) break;
        best = cand;
    }
    return best;
}

// Q4_K and Q5_K share everything but the quant width and the bit packing.
template <int kBits>
void quantize_k_affine(const float *x, uint16_t *d_out, uint16_t *dmin_out, uint8_t scales_out[12], uint8_t L[kQK_K]) {
    constexpr int nmax = (1 << kBits) - 1;
    std::memset(L, 0, kQK_K);
    std::memset(scales_out, 0, 12);
    *dmin_out = 0;
    if (!all_finite(x, kQK_K)) {
        *d_out = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
        return;
    }
    AffineFit fit[8];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
        fit[j] = search_affine(x + 32 * j, nmax);
        max_scale = std::max(max_scale, fit[j].scale);
        max_min = std::max(max_min, fit[j].min_off);
    }
    // The largest scale and min map to code 63; the codes are chosen against the fp16-rounded
    // super-block scales, as the reader will use them.
    *d_out = fp32_to_fp16(max_scale / 63.0f);
    *dmin_out = fp32_to_fp16(max_min / 63.0f);
    const float d = fp16_to_fp32(*d_out), dmin = fp16_to_fp32(*dmin_out);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
        const float *xj = x + 32 * j;
        const int sc0 = d > 0.0f ? nearest_clamped(fit[j].scale / d, 0, 63) : 0;
        const int mn0 = dmin > 0.0f ? nearest_clamped(fit[j].min_off / dmin, 0, 63) : 0;
        // Neighbouring codes can beat plain rounding of the two: try them, measuring exactly what
        // dequantize_row computes, (d * sc) * q - dmin * m.
        float best_err = INFINITY;
        for (int s = std::max(0, sc0 - 1); s <= std::min(63, sc0 + 1); ++s) {
            for (int m = std::max(0, mn0 - 1); m <= std::min(63, mn0 + 1); ++m) {
                AffineSums unused;
                const float err = affine_requant(xj, nmax, d * static_cast<float>(s), dmin * static_cast<float>(m), &unused);
                if (err < best_err) {
                    best_err = err;
                    sc[j] = static_cast<uint8_t>(s);
                    mn[j] = static_cast<uint8_t>(m);
                }
            }
        }
        const float step = d * static_cast<float>(sc[j]), off = dmin * static_cast<float>(mn[j]);
        const float inv = step > 0.0f ? 1.0f / step : 0.0f;
        for (int i = 0; i < 32; ++i) L[32 * j + i] = static_cast<uint8_t>(nearest_clamped((xj[i] + off) * inv, 0, nmax));
    }
    pack_k_scales(sc, mn, scales_out);
}

// Symmetric fit of x ~= scale * L, L in [-32, 31], for one 16-element Q6_K sub-block. The scale
// may be negative: that lets the element of largest magnitude use the -32 end.
float search_symmetric(const float *x, int n) {
    float amax = 0.0f, vmax = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            vmax = x[i];
        }
    }
    if (!(amax > 0.0f)) return 0.0f;
    // Squared error of the least-squares scale for the quants of `scale`: sum x^2 - <x,L>^2/<L,L>;
    // minimizing it is maximizing <x,L>^2 / <L,L>.
    auto score = [x, n](float scale, float *refit) {
        const float inv = 1.0f / scale;
        float sxl = 0.0f, sll = 0.0f;
        for (int i = 0; i < n; ++i) {
            const float l = static_cast<float>(nearest_clamped(x[i] * inv, -32, 31));
            sxl += x[i] * l;
            sll += l * l;
        }
        *refit = sll > 0.0f ? sxl / sll : 0.0f;
        return sll > 0.0f ? sxl * sxl / sll : 0.0f;
    };
    float best_scale = 0.0f, best_score = -1.0f;
    for (int sign = -1; sign <= 1; sign += 2) {
        // The extreme maps near -32 or near +31: the levels available on either side.
        const float top = sign < 0 ? 32.0f : 31.0f;
        for (int k = -4; k <= 4; ++k) {
            float refit;
            const float target = static_cast<float>(sign) * (top + 0.25f * static_cast<float>(k));
            const float sc = score(vmax / target, &refit);
            if (sc > best_score && refit != 0.0f) {
                best_score = sc;
                best_scale = refit;
            }
        }
    }
    for (int round = 0; round < 3; ++round) {  // requantize with the refit scale while it helps
        float refit;
        const float sc = score(best_scale, &refit);
        if (!(sc > best_score) || refit == 0.0f) break;
        best_score = sc;
        best_scale = refit;
    }
    return best_scale;
}

// Squared error of 16 values against (d * sc) * (L - 32) with L chosen by rounding; fills L.
float q6_requant(const float *x, float d, int sc, uint8_t *L) {
    const float step = d * static_cast<float>(sc);
    const float inv = step != 0.0f ? 1.0f / step : 0.0f;
    float err = 0.0f;
    for (int i = 0; i < 16; ++i) {
        const int q = nearest_clamped(x[i] * inv, -32, 31);
        L[i] = static_cast<uint8_t>(q + 32);
        const float diff = step * static_cast<float>(q) - x[i];
        err += diff * diff;
    }
    return err;
}

void quantize_q6_k(const float *x, BlockQ6_K *out, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
        BlockQ6_K &blk = out[b];
        std::memset(&blk, 0, sizeof blk);
        uint8_t L[kQK_K];
        std::fill(L, L + kQK_K, uint8_t{32});  // q = 0
        if (!all_finite(x, kQK_K)) {
            blk.d = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
        } else {
            float scale[16], amax = 0.0f;
            for (int j = 0; j < 16; ++j) {
                scale[j] = search_symmetric(x + 16 * j, 16);
                amax = std::max(amax, std::fabs(scale[j]));
            }
            blk.d = fp32_to_fp16(amax / 127.0f);
            const float d = fp16_to_fp32(blk.d);
            for (int j = 0; j < 16 && d > 0.0f; ++j) {
                const int sc0 = nearest_clamped(scale[j] / d, -128, 127);
                float best_err = INFINITY;
                uint8_t Lc[16];
                for (int s = std::max(-128, sc0 - 1); s <= std::min(127, sc0 + 1); ++s) {
                    const float err = q6_requant(x + 16 * j, d, s, Lc);
                    if (err < best_err) {
                        best_err = err;
                        blk.scales[j] = static_cast<int8_t>(s);
                        std::memcpy(L + 16 * j, Lc, 16);
                    }
                }
            }
        }
        for (int h = 0; h < 2; ++h) {
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; ++l) {
                blk.ql[64 * h + l] = static_cast<uint8_t>((Lh[l] & 0x0F) | ((Lh[l + 64] & 0x0F) << 4));
                blk.ql[64 * h + l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0x0F) | ((Lh[l + 96] & 0x0F) << 4));
                blk.qh[32 * h + l] =
                    static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

void quantize_q4_k(const float *x, BlockQ4_K *out, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
        uint8_t L[kQK_K];
        quantize_k_affine<4>(x, &out[b].d, &out[b].dmin, out[b].scales, L);
        for (int g = 0; g < 4; ++g) {
            for (int l = 0; l < 32; ++l) {
                out[b].qs[32 * g + l] = static_cast<uint8_t>(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
            }
        }
    }
}

void quantize_q5_k(const float *x, BlockQ5_K *out, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, x += kQK_K) {
        uint8_t L[kQK_K];
        quantize_k_affine<5>(x, &out[b].d, &out[b].dmin, out[b].scales, L);
        std::memset(out[b].qh, 0, sizeof out[b].qh);
        for (int g = 0; g < 4; ++g) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t lo = L[64 * g + l], hi = L[64 * g + 32 + l];
                out[b].qs[32 * g + l] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
                out[b].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
            }
        }
    }
}

void dequantize_q4_k(const BlockQ4_K *in, float *y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b) {
        const float d = fp16_to_fp32(in[b].d), dmin = fp16_to_fp32(in[b].dmin);
        for (int j = 0; j < 8; ++j, y += 32) {
            int sc, m;
            k_scale_min(in[b].scales, j, &sc, &m);
            const float step = d * static_cast<float>(sc), off = dmin * static_cast<float>(m);
            for (int l = 0; l < 32; ++l) y[l] = step * static_cast<float>(k_nibble(in[b].qs, 32 * j + l)) - off;
        }
    }
}

void dequantize_q5_k(const BlockQ5_K *in, float *y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b) {
        const float d = fp16_to_fp32(in[b].d), dmin = fp16_to_fp32(in[b].dmin);
        for (int j = 0; j < 8; ++j, y += 32) {
            int sc, m;
            k_scale_min(in[b].scales, j, &sc, &m);
            const float step = d * static_cast<float>(sc), off = dmin * static_cast<float>(m);
            for (int e = 32 * j; e < 32 * j + 32; ++e) {
                y[e - 32 * j] = step * static_cast<float>(k_nibble(in[b].qs, e) | q5k_fifth_bit(in[b].qh, e)) - off;
            }
        }
    }
}

void dequantize_q6_k(const BlockQ6_K *in, float *y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, y += kQK_K) {
        const float d = fp16_to_fp32(in[b].d);
        for (int e = 0; e < kQK_K; ++e) {
            // (d * scale) * q, in this order, as llama.cpp computes it.
            y[e] = d * static_cast<float>(in[b].scales[e / 16]) * static_cast<float>(q6k_quant(in[b].ql, in[b].qh, e));
        }
    }
}

}  // namespace

// One implementation for the host and the CUDA kernels: fp16.h.
uint16_t fp32_to_fp16(float f) { return half_from_float(f); }

float fp16_to_fp32(uint16_t h) { return half_to_float(h); }

void unpack_k_scales(const uint8_t packed[12], uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 8; ++j) {
        int s, mm;
        k_scale_min(packed, j, &s, &mm);
        sc[j] = static_cast<uint8_t>(s);
        m[j] = static_cast<uint8_t>(mm);
    }
}

void pack_k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t packed[12]) {
    for (int j = 0; j < 4; ++j) {
        packed[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        packed[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
    }
}

void widen_q5_0_to_q8_0(const void *in, BlockQ8_0 *out, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b) {
        BlockQ5_0 blk;
        std::memcpy(&blk, static_cast<const uint8_t *>(in) + b * sizeof blk, sizeof blk);
        out[b].d = blk.d;
        for (int j = 0; j < kQK; ++j) out[b].qs[j] = static_cast<int8_t>(q5_0_quant(blk, j));
    }
}

bool quant_supported(TensorType type) {
    switch (type) {
        case TensorType::F32:
        case TensorType::F16:
        case TensorType::Q8_0:
        case TensorType::Q4_0:
        case TensorType::Q5_0:
        case TensorType::Q4_K:
        case TensorType::Q5_K:
        case TensorType::Q6_K:
            return true;
        default:
            return false;
    }
}

bool quantize_row(TensorType type, const float *src, void *dst, int64_t n) {
    switch (type) {
        case TensorType::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            return true;
        case TensorType::F16: {
            auto *out = static_cast<uint16_t *>(dst);
            for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_fp16(src[i]);
            return true;
        }
        case TensorType::Q8_0:
            quantize_q8_0(src, static_cast<BlockQ8_0 *>(dst), n / kQK);
            return true;
        case TensorType::Q4_0:
            quantize_q4_0(src, static_cast<BlockQ4_0 *>(dst), n / kQK);
            return true;
        case TensorType::Q5_0:
            quantize_q5_0(src, static_cast<BlockQ5_0 *>(dst), n / kQK);
            return true;
        case TensorType::Q4_K:
            quantize_q4_k(src, static_cast<BlockQ4_K *>(dst), n / kQK_K);
            return true;
        case TensorType::Q5_K:
            quantize_q5_k(src, static_cast<BlockQ5_K *>(dst), n / kQK_K);
            return true;
        case TensorType::Q6_K:
            quantize_q6_k(src, static_cast<BlockQ6_K *>(dst), n / kQK_K);
            return true;
        default:
            return false;
    }
}

bool dequantize_row(TensorType type, const void *src, float *dst, int64_t n) {
    switch (type) {
        case TensorType::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            return true;
        case TensorType::F16: {
            const auto *in = static_cast<const uint16_t *>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(in[i]);
            return true;
        }
        case TensorType::Q8_0:
            dequantize_q8_0(static_cast<const BlockQ8_0 *>(src), dst, n / kQK);
            return true;
        case TensorType::Q4_0:
            dequantize_q4_0(static_cast<const BlockQ4_0 *>(src), dst, n / kQK);
            return true;
        case TensorType::Q5_0:
            dequantize_q5_0(static_cast<const BlockQ5_0 *>(src), dst, n / kQK);
            return true;
        case TensorType::Q4_K:
            dequantize_q4_k(static_cast<const BlockQ4_K *>(src), dst, n / kQK_K);
            return true;
        case TensorType::Q5_K:
            dequantize_q5_k(static_cast<const BlockQ5_K *>(src), dst, n / kQK_K);
            return true;
        case TensorType::Q6_K:
            dequantize_q6_k(static_cast<const BlockQ6_K *>(src), dst, n / kQK_K);
            return true;
        default:
            return false;
    }
}

}  // namespace h2o
