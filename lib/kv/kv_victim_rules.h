// The rules of victim selection (kv_policy.h states them in words), written once for every
// backend: which slots may be evicted, the order victims are taken in, the priority a batch ranks
// them by, how many tokens of a retention span may go, and the random policy's generator. The CPU's
// KvCache (the reference), the CUDA eviction kernel and the Vulkan shader kv_claim.comp all call
// these; how each walks its slots (a sort, a block-wide argmin) is its own, and the device parity
// tests prove that the decisions are the same.
//
// Like kv_policy_spec.h, whose common subset of C++, CUDA and GLSL it keeps, it compiles as all
// three. A token's stream index is 64 bits: an int64_t in C++ and CUDA (-1: a free slot), a (low
// word, high word) pair in GLSL, where 64-bit integers are an optional device feature (all ones: a
// free slot). 64-bit arithmetic of the generator is written on such word pairs everywhere, so that
// the shader runs the very same steps.
#ifndef H2O_KV_VICTIM_RULES_H
#define H2O_KV_VICTIM_RULES_H

#include "kv_policy_spec.h"

#if defined(H2O_GLSL)
#define KV_INDEX uvec2
#define KV_WORDS uvec2
#define KV_WORDS_OF(low, high) uvec2(low, high)
#else
#define KV_INDEX int64_t
#define KV_WORDS KvWords
#define KV_WORDS_OF(low, high) \
    KvWords { low, high }
#endif

#ifdef __cplusplus
namespace h2o {
// A 64-bit value as GLSL holds it: x the low word, y the high one.
struct KvWords {
    KV_UINT x, y;
};
#endif

// ---- stream indices -----------------------------------------------------------------------------
#if defined(H2O_GLSL)
bool kv_index_free(uvec2 i) { return int(i.y) < 0; }
bool kv_index_less(uvec2 a, uvec2 b) { return a.y < b.y || (a.y == b.y && a.x < b.x); }
// Whether the index is among the stream's first n tokens.
bool kv_index_below(uvec2 i, uint n) { return i.y == 0u && i.x < n; }
uint kv_index_low(uvec2 i) { return i.x; }
uint kv_index_high(uvec2 i) { return i.y; }
#else
KV_FN bool kv_index_free(int64_t i) { return i < 0; }
KV_FN bool kv_index_less(int64_t a, int64_t b) { return a < b; }
KV_FN bool kv_index_below(int64_t i, KV_UINT n) { return i < static_cast<int64_t>(n); }
KV_FN KV_UINT kv_index_low(int64_t i) { return static_cast<KV_UINT>(static_cast<uint64_t>(i)); }
KV_FN KV_UINT kv_index_high(int64_t i) { return static_cast<KV_UINT>(static_cast<uint64_t>(i) >> 32); }
#endif

// ---- which slots may go, and in which order -----------------------------------------------------

// Whether the token at `index` may be chosen by the policy: not a free slot, not pinned, not in
// the recent window (index >= recent_from, kv_recent_from) and not one of the first `sinks`.
KV_FN bool kv_slot_evictable(KV_INDEX index, bool pinned, KV_INDEX recent_from, KV_UINT sinks) {
    return !kv_index_free(index) && !pinned && kv_index_less(index, recent_from) && !kv_index_below(index, sinks);
}

// When the protections leave too few candidates, the policy's choice is dropped and these go,
// oldest first: every token that is not pinned.
KV_FN bool kv_slot_evictable_by_age(KV_INDEX index, bool pinned) { return !kv_index_free(index) && !pinned; }

// Whether a candidate of priority pa holding index ia is evicted before one of priority pb
// holding ib: the smaller priority first, ties going to the older token.
KV_FN bool kv_victim_before(float pa, KV_INDEX ia, float pb, KV_INDEX ib) { return pa < pb || (pa == pb && kv_index_less(ia, ib)); }

// The priority a batch ranks a candidate by: kv_prompt_priority while a prompt is read with
// one-shot prompt eviction (by_proxy, kv_ranks_by_proxy), else the policy's kv_victim_priority.
// cell: layer * n_kv + kv head; seed and share: kv_prompt_random_factor's.
KV_FN float kv_batch_priority(KV_UINT policy, bool by_proxy, SlotStats s, bool stale, KV_INDEX index, KV_UINT cell, KV_UINT seed,
                              float share) {
    if (!by_proxy) return kv_victim_priority(policy, s, stale);
    return kv_prompt_priority(s, stale, kv_prompt_random_factor(kv_index_low(index), kv_index_high(index), cell, seed, share));
}

// How many of a span's `eligible` tokens may go while its cell holds `held` of them and the span
// keeps `minimum` (kv_span_allows_eviction, applied victim by victim).
KV_FN KV_UINT kv_span_takeable(KV_UINT held, KV_UINT eligible, KV_UINT minimum) {
    if (held <= minimum) return 0u;
    return eligible < held - minimum ? eligible : held - minimum;
}

// ---- the random policy's generator: xorshift64*, one sequence per cache -------------------------
// It is drawn in (layer, kv head) order and seeded by KvCache::clear. A partial Fisher-Yates
// shuffle takes candidate i + kv_random_below(draw, count - i) at step i.

KV_FN KV_WORDS kv_words_xor(KV_WORDS a, KV_WORDS b) { return KV_WORDS_OF(a.x ^ b.x, a.y ^ b.y); }
// Shifts by 0 < k < 32.
KV_FN KV_WORDS kv_words_shift_right(KV_WORDS a, KV_UINT k) { return KV_WORDS_OF((a.x >> k) | (a.y << (32u - k)), a.y >> k); }
KV_FN KV_WORDS kv_words_shift_left(KV_WORDS a, KV_UINT k) { return KV_WORDS_OF(a.x << k, (a.y << k) | (a.x >> (32u - k))); }

// The full 64-bit product of two words, from 16-bit halves.
KV_FN KV_WORDS kv_words_product(KV_UINT a, KV_UINT b) {
    const KV_UINT a0 = a & 0xFFFFu, a1 = a >> 16, b0 = b & 0xFFFFu, b1 = b >> 16;
    const KV_UINT p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const KV_UINT middle = (p00 >> 16) + (p01 & 0xFFFFu) + (p10 & 0xFFFFu);
    return KV_WORDS_OF((p00 & 0xFFFFu) | (middle << 16), p11 + (p01 >> 16) + (p10 >> 16) + (middle >> 16));
}

// The generator's next state.
KV_FN KV_WORDS kv_random_step(KV_WORDS state) {
    state = kv_words_xor(state, kv_words_shift_right(state, 12u));
    state = kv_words_xor(state, kv_words_shift_left(state, 25u));
    return kv_words_xor(state, kv_words_shift_right(state, 27u));
}

// The draw a state gives: state * 0x2545F4914F6CDD1D, modulo 2^64.
KV_FN KV_WORDS kv_random_draw(KV_WORDS state) {
    const KV_UINT m_low = 0x4F6CDD1Du, m_high = 0x2545F491u;
    const KV_WORDS low = kv_words_product(state.x, m_low);
    return KV_WORDS_OF(low.x, low.y + state.x * m_high + state.y * m_low);
}

// A draw modulo m (0 < m < 2^31), by binary long division.
KV_FN KV_UINT kv_random_below(KV_WORDS draw, KV_UINT m) {
    KV_UINT r = 0u;
    for (int bit = 63; bit >= 0; --bit) {
        const KV_UINT b = bit >= 32 ? (draw.y >> KV_UINT(bit - 32)) & 1u : (draw.x >> KV_UINT(bit)) & 1u;
        r = (r << 1) | b;
        if (r >= m) r -= m;
    }
    return r;
}

#if !defined(H2O_GLSL)
// The C++ and CUDA form: the state in one 64-bit word, advanced; the draw as one word.
KV_FN uint64_t kv_next_random(uint64_t *state) {
    const KvWords next = kv_random_step(KV_WORDS_OF(static_cast<KV_UINT>(*state), static_cast<KV_UINT>(*state >> 32)));
    *state = (static_cast<uint64_t>(next.y) << 32) | next.x;
    const KvWords draw = kv_random_draw(next);
    return (static_cast<uint64_t>(draw.y) << 32) | draw.x;
}

// kv_random_below of a kv_next_random draw.
KV_FN KV_UINT kv_random_index(uint64_t draw, KV_UINT m) {
    return kv_random_below(KV_WORDS_OF(static_cast<KV_UINT>(draw), static_cast<KV_UINT>(draw >> 32)), m);
}
#endif

#ifdef __cplusplus
}  // namespace h2o
#endif

#endif  // H2O_KV_VICTIM_RULES_H
