// The weight formats' bit layouts (quant.h's blocks), written once for the host reference and the
// device kernels: where each quant and scale of a block lies. quant.cpp's dequantize_row walks
// blocks with these; weight_element reads one element where it is needed (the CUDA backend's
// kernels dequantize where they read), with the same roundings (tests/backends/test_cuda.cpp checks that
// the two agree bit for bit on the host).
#ifndef H2O_WEIGHT_ELEMENT_H
#define H2O_WEIGHT_ELEMENT_H

#include "device_fn.h"
#include "fp16.h"
#include "tensor_types.h"

namespace h2o {

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block (quant.h's unpack_k_scales).
H2O_HD void k_scale_min(const uint8_t *scales, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

// Quant j (0..31) of a Q4_0 block's 16 bytes of nibbles, 0..15: element j < 16 is the low nibble
// of byte j, element j + 16 its high nibble.
H2O_HD int q4_0_nibble(const uint8_t *qs, int j) { return j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4); }

// The 4 low bits (0..15) of element e (0..255) of a Q4_K/Q5_K block's qs: sub-block j = e / 32
// lies in the low (j even) or high (j odd) nibbles of bytes 32 (j / 2) to 32 (j / 2) + 31.
H2O_HD int k_nibble(const uint8_t *qs, int e) { return (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) & 1))) & 0x0F; }

// Q5_K's fifth bit of element e, in place (0 or 16): bit e / 32 of qh[e % 32].
H2O_HD int q5k_fifth_bit(const uint8_t *qh, int e) { return ((qh[e % 32] >> (e / 32)) & 1) << 4; }

// Quant of element e (0..255) of a Q6_K block, -32..31: 4 low bits in ql, 2 high bits in qh.
H2O_HD int q6k_quant(const uint8_t *ql, const uint8_t *qh, int e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t low = static_cast<uint8_t>(ql[64 * h + l + 32 * (k & 1)] >> (4 * (k / 2)));
    const uint8_t high = static_cast<uint8_t>(qh[32 * h + l] >> (2 * k));
    return ((low & 0x0F) | ((high & 3) << 4)) - 32;
}

// Element i of a row of `type` starting at `row` (a weight type: kWeightTypes).
H2O_HD float weight_element(TensorType type, const uint8_t *row, int64_t i) {
    switch (type) {
        case TensorType::F32:
            return bits_to_float(load_le32(row + 4 * i));
        case TensorType::F16:
            return half_to_float(load_le16(row + 2 * i));
        case TensorType::Q8_0: {
            const uint8_t *blk = row + 34 * (i / 32);
            const int j = static_cast<int>(i % 32);
            return H2O_FMUL(static_cast<float>(static_cast<int8_t>(blk[2 + j])), half_to_float(load_le16(blk)));
        }
        case TensorType::Q4_0: {
            const uint8_t *blk = row + 18 * (i / 32);
            const int j = static_cast<int>(i % 32);
            return H2O_FMUL(static_cast<float>(q4_0_nibble(blk + 2, j) - 8), half_to_float(load_le16(blk)));
        }
        case TensorType::Q4_K:
        case TensorType::Q5_K: {
            const bool five = type == TensorType::Q5_K;
            const uint8_t *blk = row + (five ? 176 : 144) * (i / 256);
            const int e = static_cast<int>(i % 256);
            const float d = half_to_float(load_le16(blk)), dmin = half_to_float(load_le16(blk + 2));
            int sc, m;
            k_scale_min(blk + 4, e / 32, &sc, &m);
            int q = k_nibble(blk + (five ? 48 : 16), e);
            if (five) q |= q5k_fifth_bit(blk + 16, e);
            const float step = H2O_FMUL(d, static_cast<float>(sc)), off = H2O_FMUL(dmin, static_cast<float>(m));
            return H2O_FSUB(H2O_FMUL(step, static_cast<float>(q)), off);
        }
        case TensorType::Q6_K: {
            const uint8_t *blk = row + 210 * (i / 256);
            const int e = static_cast<int>(i % 256);
            const int q = q6k_quant(blk, blk + 128, e);
            const float d = half_to_float(load_le16(blk + 208));
            const float sc = static_cast<float>(static_cast<int8_t>(blk[192 + e / 16]));
            return H2O_FMUL(H2O_FMUL(d, sc), static_cast<float>(q));
        }
        default:
            return 0.0f;
    }
}

// Elements 32 g to 32 g + 31 of a row of `type` (its g-th group of 32: a Q4_0/Q8_0 block, a
// K-quant block's sub-block), each as weight_element gives it, with the group's scales read once:
// the CUDA matmul dequantizes a group per lane. The row must hold whole groups (a quantized row
// always does; F32/F16 rows past their last whole group are read by weight_element).
H2O_HD void weight_group32(TensorType type, const uint8_t *row, int64_t g, float *w) {
    switch (type) {
        case TensorType::F32:
            H2O_UNROLL for (int e = 0; e < 32; ++e) w[e] = bits_to_float(load_le32(row + 4 * (32 * g + e)));
            return;
        case TensorType::F16:
            H2O_UNROLL for (int e = 0; e < 32; ++e) w[e] = half_to_float(load_le16(row + 2 * (32 * g + e)));
            return;
        case TensorType::Q8_0: {
            const uint8_t *blk = row + 34 * g;
            const float d = half_to_float(load_le16(blk));
            H2O_UNROLL for (int e = 0; e < 32; ++e) w[e] = H2O_FMUL(static_cast<float>(static_cast<int8_t>(blk[2 + e])), d);
            return;
        }
        case TensorType::Q4_0: {
            const uint8_t *blk = row + 18 * g;
            const float d = half_to_float(load_le16(blk));
            H2O_UNROLL for (int e = 0; e < 16; ++e) {
                const int byte = blk[2 + e];
                w[e] = H2O_FMUL(static_cast<float>((byte & 0x0F) - 8), d);
                w[e + 16] = H2O_FMUL(static_cast<float>((byte >> 4) - 8), d);
            }
            return;
        }
        case TensorType::Q4_K:
        case TensorType::Q5_K: {
            const bool five = type == TensorType::Q5_K;
            const uint8_t *blk = row + (five ? 176 : 144) * (g / 8);
            const int j = static_cast<int>(g % 8);
            const float d = half_to_float(load_le16(blk)), dmin = half_to_float(load_le16(blk + 2));
            int sc, m;
            k_scale_min(blk + 4, j, &sc, &m);
            const float step = H2O_FMUL(d, static_cast<float>(sc)), off = H2O_FMUL(dmin, static_cast<float>(m));
            H2O_UNROLL for (int e = 0; e < 32; ++e) {
                int q = k_nibble(blk + (five ? 48 : 16), 32 * j + e);
                if (five) q |= q5k_fifth_bit(blk + 16, 32 * j + e);
                w[e] = H2O_FSUB(H2O_FMUL(step, static_cast<float>(q)), off);
            }
            return;
        }
        case TensorType::Q6_K: {
            const uint8_t *blk = row + 210 * (g / 8);
            const int j = static_cast<int>(g % 8);
            const float d = half_to_float(load_le16(blk + 208));
            H2O_UNROLL for (int half = 0; half < 2; ++half) {  // the group's two 16-element scales
                const float step = H2O_FMUL(d, static_cast<float>(static_cast<int8_t>(blk[192 + 2 * j + half])));
                H2O_UNROLL for (int e = 16 * half; e < 16 * half + 16; ++e) {
                    w[e] = H2O_FMUL(step, static_cast<float>(q6k_quant(blk, blk + 128, 32 * j + e)));
                }
            }
            return;
        }
        default:
            H2O_UNROLL for (int e = 0; e < 32; ++e) w[e] = 0.0f;
            return;
    }
}

}  // namespace h2o

#endif  // H2O_WEIGHT_ELEMENT_H
