// Encoding and decoding of KV cache rows (the formats of kv_format.h), written once for the host
// (kv_format.cpp's kv_store_row/kv_load_row are these) and the CUDA kernels, which therefore store
// and read exactly the bytes and values the CPU does.
#ifndef H2O_KV_ROW_CODEC_H
#define H2O_KV_ROW_CODEC_H

#include <math.h>

#include "device_fn.h"
#include "fp16.h"
#include "kv_format.h"

namespace h2o {

H2O_HD void kv_encode_row(KvRowFormat type, const float *src, int n, uint8_t *dst) {
    switch (type) {
        case KvRowFormat::F32:
            for (int i = 0; i < n; ++i) store_le32(dst + 4 * i, float_to_bits(src[i]));
            return;
        case KvRowFormat::F16:
            for (int i = 0; i < n; ++i) store_le16(dst + 2 * i, half_from_float(src[i]));
            return;
        case KvRowFormat::Q8: {
            float amax = 0;
            for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(src[i]));
            const float scale = amax / 127.0f;
            const float inv = scale > 0 ? 1.0f / scale : 0.0f;
            store_le32(dst, float_to_bits(scale));
            for (int i = 0; i < n; ++i) dst[4 + i] = static_cast<uint8_t>(static_cast<int8_t>(lroundf(H2O_FMUL(src[i], inv))));
            return;
        }
        case KvRowFormat::Q4: {
            float lo = src[0], hi = src[0];
            for (int i = 1; i < n; ++i) {
                lo = fminf(lo, src[i]);
                hi = fmaxf(hi, src[i]);
            }
            // Quantize against the stored (half-precision) scale and minimum, so that decoding
            // reproduces exactly what was rounded here.
            const uint16_t scale_bits = half_from_float(H2O_FSUB(hi, lo) / 15.0f), min_bits = half_from_float(lo);
            store_le16(dst, scale_bits);
            store_le16(dst + 2, min_bits);
            const float scale = half_to_float(scale_bits), min = half_to_float(min_bits);
            const float inv = scale > 0 ? 1.0f / scale : 0.0f;
            uint8_t *q = dst + 4;
            for (int i = 0; i < n / 2; ++i) q[i] = 0;
            for (int i = 0; i < n; ++i) {
                const long v = lroundf(H2O_FMUL(H2O_FSUB(src[i], min), inv));
                const uint8_t code = static_cast<uint8_t>(v < 0 ? 0 : v > 15 ? 15 : v);
                q[i / 2] = static_cast<uint8_t>(q[i / 2] | (code << (4 * (i & 1))));
            }
            return;
        }
    }
}

// Element i of a stored row.
H2O_HD float kv_row_element(KvRowFormat type, const uint8_t *row, int i) {
    switch (type) {
        case KvRowFormat::F32:
            return bits_to_float(load_le32(row + 4 * i));
        case KvRowFormat::F16:
            return half_to_float(load_le16(row + 2 * i));
        case KvRowFormat::Q8:
            return H2O_FMUL(bits_to_float(load_le32(row)), static_cast<float>(static_cast<int8_t>(row[4 + i])));
        case KvRowFormat::Q4: {
            const float scale = half_to_float(load_le16(row)), min = half_to_float(load_le16(row + 2));
            const int code = (row[4 + i / 2] >> (4 * (i & 1))) & 15;
            return H2O_FADD(min, H2O_FMUL(scale, static_cast<float>(code)));
        }
    }
    return 0.0f;
}

H2O_HD void kv_decode_row(KvRowFormat type, const uint8_t *src, int n, float *dst) {
    if (type == KvRowFormat::F16) {  // the default format: a loop of its own, which vectorizes
        for (int i = 0; i < n; ++i) dst[i] = half_to_float(load_le16(src + 2 * i));
        return;
    }
    for (int i = 0; i < n; ++i) dst[i] = kv_row_element(type, src, i);
}

}  // namespace h2o

#endif  // H2O_KV_ROW_CODEC_H
