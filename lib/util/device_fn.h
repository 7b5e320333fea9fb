// What host and CUDA device code share: the per-element math that the CPU reference and the CUDA
// kernels both run (fp16.h, kv_row_codec.h, rotary.h, weight_element.h, online_softmax.h) is
// written once in headers built on these macros. Under nvcc every such function is
// __host__ __device__; elsewhere it is a plain inline function.
//
// H2O_FMUL/H2O_FADD/H2O_FSUB are single IEEE roundings that a device compiler may not contract
// into a fused multiply-add, so device results are bit for bit the host's where the format
// demands it (dequantized weights, KV rows, rotations). The host build never contracts: it is
// compiled in ISO C++ mode, where GCC and Clang leave -ffp-contract off.
#ifndef H2O_DEVICE_FN_H
#define H2O_DEVICE_FN_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define H2O_HD __host__ __device__ inline
#else
#define H2O_HD inline
#endif

// Unrolls the loop that follows in device code, so the arrays it indexes stay in registers (the
// host compilers, nvcc's host pass included, would warn of an unknown pragma).
#if defined(__CUDA_ARCH__)
#define H2O_UNROLL _Pragma("unroll")
#else
#define H2O_UNROLL
#endif

#if defined(__CUDA_ARCH__)
#define H2O_FMUL(a, b) __fmul_rn((a), (b))
#define H2O_FADD(a, b) __fadd_rn((a), (b))
#define H2O_FSUB(a, b) __fsub_rn((a), (b))
#else
#define H2O_FMUL(a, b) ((a) * (b))
#define H2O_FADD(a, b) ((a) + (b))
#define H2O_FSUB(a, b) ((a) - (b))
#endif

namespace h2o {

H2O_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

H2O_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

// Little-endian loads and stores at any alignment (KV rows and weight blocks are byte streams).
H2O_HD uint16_t load_le16(const uint8_t *p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
H2O_HD uint32_t load_le32(const uint8_t *p) {
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
}
H2O_HD void store_le16(uint8_t *p, uint16_t v) {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
}
H2O_HD void store_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace h2o

#endif  // H2O_DEVICE_FN_H
