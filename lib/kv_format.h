// Element formats of the KV cache. A KvType names the format of keys and of values; each is one
// of the row formats below. Each stored key or value vector (one head of one token) is a
// self-contained row with its own scale, since head sizes vary (stories260K has 8 dimensions per
// head) and blocks of 32 cannot be assumed:
//   F32  head_dim floats
//   F16  head_dim IEEE halves
//   Q8   float scale, then head_dim int8: x = scale * q             (symmetric, q in [-127, 127])
//   Q4   fp16 scale, fp16 min, then head_dim/2 bytes of nibbles: x = min + scale * q  (q in 0..15;
//        element 2i in the low nibble of byte i, element 2i+1 in the high nibble)
// Attention reads these rows in place: dot products and weighted sums work on the stored form, so
// the cache is never expanded to floats as a whole.
#pragma once

#include <cstddef>
#include <cstdint>

#include "status.h"

namespace h2o {

enum class KvRowFormat : uint32_t { F32 = 0, F16 = 1, Q8 = 2, Q4 = 3 };

constexpr uint32_t kKvRowFormatCount = 4;

const char *kv_row_format_name(KvRowFormat type);

// The cache's format. K8V4 keeps keys at 8 bits and values at 4: keys carry outlier channels that
// a 4-bit grid with one scale per head row destroys (stories260K: +32% perplexity with 4-bit
// keys, +0.04% with 4-bit values), while values average out in the attention-weighted sum.
enum class KvType : uint32_t { F32 = 0, F16 = 1, Q8 = 2, Q4 = 3, K8V4 = 4 };

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
// q · row
float kv_dot_row(KvRowFormat type, const float *q, const uint8_t *row, int head_dim);
// out += w * row
void kv_axpy_row(KvRowFormat type, float *out, float w, const uint8_t *row, int head_dim);

}  // namespace h2o
