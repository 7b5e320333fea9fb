// One element of a weight row in its file layout (quant.h's blocks), for kernels that dequantize
// where they read (the CUDA backend). quant.cpp's dequantize_row is the reference; this computes
// the same values with the same roundings, element by element (tests/test_cuda.cpp checks that
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

// Element i of a row of `type` starting at `row` (a weight type: kWeightTypes).
H2O_HD float weight_element(TensorType type, const uint8_t *row, int64_t i) {
    switch (type) {
        case TensorType::F32: return bits_to_float(load_le32(row + 4 * i));
        case TensorType::F16: return half_to_float(load_le16(row + 2 * i));
        case TensorType::Q8_0: {
            const uint8_t *blk = row + 34 * (i / 32);
            const int j = static_cast<int>(i % 32);
            return H2O_FMUL(static_cast<float>(static_cast<int8_t>(blk[2 + j])), half_to_float(load_le16(blk)));
        }
        case TensorType::Q4_0: {
            const uint8_t *blk = row + 18 * (i / 32);
            const int j = static_cast<int>(i % 32);
            const int q = j < 16 ? (blk[2 + j] & 0x0F) : (blk[2 + j - 16] >> 4);
            return H2O_FMUL(static_cast<float>(q - 8), half_to_float(load_le16(blk)));
        }
        case TensorType::Q4_K:
        case TensorType::Q5_K: {
            const bool five = type == TensorType::Q5_K;
            const uint8_t *blk = row + (five ? 176 : 144) * (i / 256);
            const int e = static_cast<int>(i % 256), j = e / 32, l = e % 32;
            const float d = half_to_float(load_le16(blk)), dmin = half_to_float(load_le16(blk + 2));
            int sc, m;
            k_scale_min(blk + 4, j, &sc, &m);
            const uint8_t *qs = blk + (five ? 48 : 16);
            int q = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0F;
            if (five) q |= ((blk[16 + l] >> j) & 1) << 4;
            const float step = H2O_FMUL(d, static_cast<float>(sc)), off = H2O_FMUL(dmin, static_cast<float>(m));
            return H2O_FSUB(H2O_FMUL(step, static_cast<float>(q)), off);
        }
        case TensorType::Q6_K: {
            const uint8_t *blk = row + 210 * (i / 256);
            const int e = static_cast<int>(i % 256), h = e / 128, k = (e % 128) / 32, l = e % 32;
            const uint8_t low = static_cast<uint8_t>(blk[64 * h + l + 32 * (k & 1)] >> (4 * (k / 2)));
            const uint8_t high = static_cast<uint8_t>(blk[128 + 32 * h + l] >> (2 * k));
            const int q = ((low & 0x0F) | ((high & 3) << 4)) - 32;
            const float d = half_to_float(load_le16(blk + 208));
            const float sc = static_cast<float>(static_cast<int8_t>(blk[192 + e / 16]));
            return H2O_FMUL(H2O_FMUL(d, sc), static_cast<float>(q));
        }
        default: return 0.0f;
    }
}

}  // namespace h2o

#endif  // H2O_WEIGHT_ELEMENT_H
