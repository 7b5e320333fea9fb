#include "quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

namespace h2o {

namespace {

uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

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

void quantize_q4_0(const float *x, BlockQ4_0 *out, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, x += kQK) {
        // The scale is taken from the element of largest magnitude, with its sign, mapped to -8:
        // that uses the asymmetric end of the 4-bit range [-8, 7] for the biggest value. Ties keep
        // the first such element, as llama.cpp does.
        float amax = 0.0f, max = 0.0f;
        bool finite = true;
        for (int j = 0; j < kQK; ++j) {
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
            finite = finite && is_finite(x[j]);
        }
        const float d = finite ? max / -8.0f : std::numeric_limits<float>::quiet_NaN();
        const float id = (finite && d != 0.0f) ? 1.0f / d : 0.0f;
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

void dequantize_q8_0(const BlockQ8_0 *in, float *y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
        const float d = fp16_to_fp32(in[b].d);
        for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(in[b].qs[j]) * d;
    }
}

void dequantize_q4_0(const BlockQ4_0 *in, float *y, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b, y += kQK) {
        const float d = fp16_to_fp32(in[b].d);
        for (int j = 0; j < kQK / 2; ++j) {
            y[j] = static_cast<float>((in[b].qs[j] & 0x0F) - 8) * d;
            y[j + kQK / 2] = static_cast<float>((in[b].qs[j] >> 4) - 8) * d;
        }
    }
}

}  // namespace

uint16_t fp32_to_fp16(float f) {
    const uint32_t x = float_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFF;
    if (ax > 0x7F800000) {  // NaN: keep the top payload bits and force the quiet bit
        return static_cast<uint16_t>(sign | 0x7E00 | ((ax >> 13) & 0x3FF));
    }
    if (ax >= 0x477FF000) {  // >= 65520, the midpoint above the largest half (65504): infinity
        return static_cast<uint16_t>(sign | 0x7C00);
    }
    if (ax >= 0x38800000) {  // >= 2^-14: a normal half
        // Rebias the exponent (127 -> 15) in place, then drop 13 mantissa bits rounding to nearest
        // even; a carry out of the mantissa correctly bumps the exponent.
        uint32_t h = ax - 0x38000000;
        h += 0x0FFF + ((h >> 13) & 1);
        return static_cast<uint16_t>(sign | (h >> 13));
    }
    // A half subnormal (or zero): the result is round(value / 2^-24) in units of 2^-24.
    const uint32_t exponent = ax >> 23;
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to 0 too)
    const uint32_t mantissa = (ax & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t m = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (m & 1))) ++m;  // may carry into 0x400, the smallest normal
    return static_cast<uint16_t>(sign | m);
}

float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exponent = (h >> 10) & 0x1F;
    const uint32_t mantissa = h & 0x3FF;
    if (exponent == 0x1F) {  // inf, or NaN made quiet
        return bits_float(sign | 0x7F800000 | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
    }
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
        const float v = static_cast<float>(mantissa) * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

bool quant_supported(TensorType type) {
    switch (type) {
        case TensorType::F32:
        case TensorType::F16:
        case TensorType::Q8_0:
        case TensorType::Q4_0: return true;
        default: return false;
    }
}

bool quantize_row(TensorType type, const float *src, void *dst, int64_t n) {
    switch (type) {
        case TensorType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return true;
        case TensorType::F16: {
            auto *out = static_cast<uint16_t *>(dst);
            for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_fp16(src[i]);
            return true;
        }
        case TensorType::Q8_0: quantize_q8_0(src, static_cast<BlockQ8_0 *>(dst), n / kQK); return true;
        case TensorType::Q4_0: quantize_q4_0(src, static_cast<BlockQ4_0 *>(dst), n / kQK); return true;
        default: return false;
    }
}

bool dequantize_row(TensorType type, const void *src, float *dst, int64_t n) {
    switch (type) {
        case TensorType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return true;
        case TensorType::F16: {
            const auto *in = static_cast<const uint16_t *>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(in[i]);
            return true;
        }
        case TensorType::Q8_0: dequantize_q8_0(static_cast<const BlockQ8_0 *>(src), dst, n / kQK); return true;
        case TensorType::Q4_0: dequantize_q4_0(static_cast<const BlockQ4_0 *>(src), dst, n / kQK); return true;
        default: return false;
    }
}

}  // namespace h2o
