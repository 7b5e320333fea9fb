#include "kv_format.h"

#include <cmath>
#include <cstring>
#include <string>

#include "kv_row_codec.h"
#include "quant.h"

namespace h2o {

const char *kv_row_format_name(KvRowFormat type) {
    switch (type) {
        case KvRowFormat::F32:
            return "f32";
        case KvRowFormat::F16:
            return "f16";
        case KvRowFormat::Q8:
            return "q8";
        case KvRowFormat::Q4:
            return "q4";
    }
    return "unknown";
}

const char *const kKvTypeNames[kKvTypeCount] = {"f32", "f16", "q8", "q4", "k8v4"};

const char *kv_type_name(KvType type) {
    const auto i = static_cast<uint32_t>(type);
    return i < kKvTypeCount ? kKvTypeNames[i] : "unknown";
}

KvRowFormat kv_key_format(KvType type) {
    switch (type) {
        case KvType::F16:
            return KvRowFormat::F16;
        case KvType::Q8:
        case KvType::K8V4:
            return KvRowFormat::Q8;
        case KvType::Q4:
            return KvRowFormat::Q4;
        case KvType::F32:
            break;
    }
    return KvRowFormat::F32;
}

KvRowFormat kv_value_format(KvType type) {
    switch (type) {
        case KvType::F16:
            return KvRowFormat::F16;
        case KvType::Q8:
            return KvRowFormat::Q8;
        case KvType::Q4:
        case KvType::K8V4:
            return KvRowFormat::Q4;
        case KvType::F32:
            break;
    }
    return KvRowFormat::F32;
}

Status kv_type_fits_head_dim(KvType type, int head_dim) {
    if ((kv_key_format(type) == KvRowFormat::Q4 || kv_value_format(type) == KvRowFormat::Q4) && head_dim % 2 != 0) {
        return make_error(H2O_ERR_UNSUPPORTED,
                          std::string("the ") + kv_type_name(type) + " KV format needs an even head size, not " + std::to_string(head_dim));
    }
    return Status::Ok();
}

size_t kv_row_bytes(KvRowFormat type, int head_dim) {
    const size_t n = static_cast<size_t>(head_dim);
    switch (type) {
        case KvRowFormat::F32:
            return 4 * n;
        case KvRowFormat::F16:
            return 2 * n;
        case KvRowFormat::Q8:
            return 4 + n;
        case KvRowFormat::Q4:
            return 4 + n / 2;
    }
    return 0;
}

// One implementation for the host and the CUDA kernels: kv_row_codec.h.
void kv_store_row(KvRowFormat type, const float *src, int n, uint8_t *dst) { kv_encode_row(type, src, n, dst); }

void kv_load_row(KvRowFormat type, const uint8_t *src, int n, float *dst) { kv_decode_row(type, src, n, dst); }

}  // namespace h2o
