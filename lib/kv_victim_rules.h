// The per-slot rules of victim selection (kv_policy.h), written once for the CPU's KvCache and the
// CUDA backend's eviction kernel: which slots may be evicted, the order victims are taken in, and
// the random policy's generator. (The priorities themselves are kv_policy_spec.h's.)
#ifndef H2O_KV_VICTIM_RULES_H
#define H2O_KV_VICTIM_RULES_H

#include "device_fn.h"

namespace h2o {

// Whether the token at stream index `index` (-1: a free slot) may be chosen by the policy: not
// pinned, not in the recent window (index >= recent_from, kv_recent_from), not one of the first
// `sinks` tokens.
H2O_HD bool kv_slot_evictable(int64_t index, bool pinned, int64_t recent_from, int64_t sinks) {
    return index >= 0 && !pinned && index < recent_from && index >= sinks;
}

// Whether a candidate of priority pa holding stream index ia is evicted before one of priority pb
// holding ib: the smaller priority first, ties going to the older token.
H2O_HD bool kv_victim_before(float pa, int64_t ia, float pb, int64_t ib) { return pa < pb || (pa == pb && ia < ib); }

// The random policy's generator, xorshift64*: one sequence per cache, drawn in (layer, kv head)
// order, seeded by KvCache::clear.
H2O_HD uint64_t kv_next_random(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

}  // namespace h2o

#endif  // H2O_KV_VICTIM_RULES_H
