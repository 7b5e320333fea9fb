// IEEE binary16 <-> binary32 (the semantics are quant.h's fp32_to_fp16/fp16_to_fp32, which call
// these), usable on the host and in CUDA kernels.
#ifndef H2O_FP16_H
#define H2O_FP16_H

#include "device_fn.h"

namespace h2o {

H2O_HD uint16_t half_from_float(float f) {
    const uint32_t x = float_to_bits(f);
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

// Without branches: every case is computed and masks select one, so that a loop over a row
// vectorizes.
H2O_HD float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exponent = (h >> 10) & 0x1F;
    const uint32_t mantissa = h & 0x3FF;
    // inf, or NaN made quiet (the quiet bit set when the mantissa is not 0: mantissa + 0x3FF
    // reaches bit 10 exactly then)
    const uint32_t special = 0x7F800000 | (mantissa << 13) | (((mantissa + 0x3FF) & 0x400) << 12);
    // zero or subnormal: mantissa * 2^-24, exact in float
    const uint32_t small = float_to_bits(static_cast<float>(mantissa) * 0x1p-24f);
    const uint32_t normal = ((exponent + 112) << 23) | (mantissa << 13);
    const uint32_t is_special = 0u - static_cast<uint32_t>(exponent == 0x1F), is_small = 0u - static_cast<uint32_t>(exponent == 0);
    return bits_to_float(sign | (special & is_special) | (small & is_small) | (normal & ~(is_special | is_small)));
}

}  // namespace h2o

#endif  // H2O_FP16_H
