// The row formats of the KV cache. A KvType (kv_format.h) names the format of keys and of values;
// each is one of these. Each stored key or value vector (one head of one token) is a
// self-contained row with its own scale, since head sizes vary (stories260K has 8 dimensions per
// head) and blocks of 32 cannot be assumed:
//   F32  head_dim floats
//   F16  head_dim IEEE halves
//   Q8   float scale, then head_dim int8: x = scale * q             (symmetric, q in [-127, 127])
//   Q4   fp16 scale, fp16 min, then head_dim/2 bytes of nibbles: x = min + scale * q  (q in 0..15;
//        element 2i in the low nibble of byte i, element 2i+1 in the high nibble)
// Attention reads these rows in place: dot products and weighted sums work on the stored form, so
// the cache is never expanded to floats as a whole. This header includes nothing of the standard
// library's, so that the SIMD kernel files can name the formats (backends/cpu/kernels_internal.h).
#pragma once

#include <cstdint>

namespace h2o {

enum class KvRowFormat : uint32_t {
    F32 = 0,
    F16 = 1,
    Q8 = 2,
    Q4 = 3
};

constexpr uint32_t kKvRowFormatCount = 4;

}  // namespace h2o
