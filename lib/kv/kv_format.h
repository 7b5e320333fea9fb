// Element formats of the KV cache: the row formats (kv_row_format.h) and the cache types built
// of them, with the functions that store and read rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kv_row_format.h"
#include "status.h"

namespace h2o {

const char *kv_row_format_name(KvRowFormat type);

// The cache's format. K8V4 keeps keys at 8 bits and values at 4: keys carry outlier channels that
// a 4-bit grid with one scale per head row destroys, while values average out in the
// attention-weighted sum (docs/EVALUATION.md compares the formats).
enum class KvType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q8 = 2,
    Q4 = 3,
    K8V4 = 4
};

constexpr uint32_t kKvTypeCount = 5;
// Names by type value, as tools and the C API print and parse them.
extern const char *const kKvTypeNames[kKvTypeCount];

const char *kv_type_name(KvType type);
KvRowFormat kv_key_format(KvType type);
KvRowFormat kv_value_format(KvType type);

// Whether rows of `type` can hold heads of head_dim elements: Q4 packs two per byte, so its
// heads must be even. H2O_ERR_UNSUPPORTED (saying so) otherwise; every backend refuses the same.
Status kv_type_fits_head_dim(KvType type, int head_dim);

// Bytes of one stored row of head_dim elements (head_dim must be even for Q4).
size_t kv_row_bytes(KvRowFormat type, int head_dim);

void kv_store_row(KvRowFormat type, const float *src, int head_dim, uint8_t *dst);
void kv_load_row(KvRowFormat type, const uint8_t *src, int head_dim, float *dst);

}  // namespace h2o
