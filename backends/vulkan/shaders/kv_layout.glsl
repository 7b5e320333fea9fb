// The KV bookkeeping buffer's layout (kv_meta_layout.h) and the eviction policies' arithmetic
// (kv_policy_spec.h), both shared with the host code.
#define H2O_GLSL 1
#include "kv_meta_layout.h"

// The statistics of the slot at index `at` of the stats region (an including shader declares the
// `meta` buffer).
SlotStats load_slot_stats(KvLayout l, uint at) {
    const uint base = l.stats + 5u * at;
    SlotStats s;
    s.accumulated = uintBitsToFloat(meta[base]);
    s.squared = uintBitsToFloat(meta[base + 1u]);
    s.steps = uintBitsToFloat(meta[base + 2u]);
    s.last = uintBitsToFloat(meta[base + 3u]);
    s.persistence = uintBitsToFloat(meta[base + 4u]);
    return s;
}
