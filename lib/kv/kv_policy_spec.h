// The eviction policies' arithmetic, written once for every backend: the policy ids, a slot's
// attention statistics and how a query updates them, and the priority by which victims are
// chosen. kv_policy.h states the rules in words; this header is their only implementation.
//
// It compiles unchanged as C++ (the CPU backend), as CUDA (every function is __host__ __device__)
// and as GLSL (the Vulkan shaders define H2O_GLSL before including it), so it keeps to their
// common subset: scalar float, uint and bool, one struct, functions that take and return values
// (no pointers, references, overloads or default arguments), constants rather than enums. The
// macros below spell what differs. Every backend computes in IEEE single precision with these
// formulas; a device compiler may still fuse a multiply and an add, so results agree to rounding,
// not always bit for bit (tests/kv/test_kv_policy_spec.cpp checks both).
#ifndef H2O_KV_POLICY_SPEC_H
#define H2O_KV_POLICY_SPEC_H

#if defined(H2O_GLSL)
#define KV_FN
#define KV_UINT uint
#define sqrtf sqrt
#define fmaxf max
#define fminf min
#define float_to_bits floatBitsToUint
#define bits_to_float uintBitsToFloat
#else
#include <math.h>
#include <stdint.h>

#include "device_fn.h"
#define KV_FN H2O_HD  // __host__ __device__ under nvcc
#define KV_UINT uint32_t
#endif

#ifdef __cplusplus
namespace h2o {
#endif

// Policy ids, as stored in sessions and snapshots, passed to shaders, and numbered in the public
// header's h2o_kv_policy (which must agree: lib/kv/kv_policy.cpp checks it at compile time).
const KV_UINT KV_POLICY_FULL = 0u;                 // no eviction: a full cache is an error
const KV_UINT KV_POLICY_H2O = 1u;                  // recent window + heavy hitters by accumulated attention
const KV_UINT KV_POLICY_WINDOW = 2u;               // most recent tokens only
const KV_UINT KV_POLICY_SINK_WINDOW = 3u;          // first `sinks` tokens + most recent (StreamingLLM)
const KV_UINT KV_POLICY_SCISSORHANDS = 4u;         // recent window + tokens that were persistently important
const KV_UINT KV_POLICY_TOVA = 5u;                 // lowest attention at the latest step
const KV_UINT KV_POLICY_ROCO = 6u;                 // recent window + mean attention, ties by its deviation
const KV_UINT KV_POLICY_RANDOM = 7u;               // a uniformly random unprotected token
const KV_UINT KV_POLICY_MEAN_H2O = 8u;             // sinks + recent window + mean attention since entry
const KV_UINT KV_POLICY_KEY_NORM = 9u;             // recent window + the keys of smallest norm
const KV_UINT KV_POLICY_KEY_DIFF = 10u;            // recent window + the keys least like the cell's others (KeyDiff)
const KV_UINT KV_POLICY_EXPECTED_ATTENTION = 11u;  // recent window + attention expected of future queries
const KV_UINT KV_POLICY_COUNT = 12u;

// The statistics of one slot. w is the attention weight a query gives the slot, summed over the
// query heads that share the kv head (so it lies in [0, group size]). Backends store them as five
// consecutive floats per slot, in this order.
struct SlotStats {
    float accumulated;  // Σ w over every query since the token entered        (H2O)
    float squared;      // Σ w²                                                 (RoCo: variance)
    float steps;        // number of queries that have seen the token           (RoCo: mean)
    float last;         // w of the most recent query                           (TOVA)
    float persistence;  // decay·persistence + [w > group/visible], per query    (Scissorhands)
};

// Whether the policy reads attention statistics; the others (full, window, sink_window, random)
// let attention skip gathering them.
KV_FN bool kv_policy_uses_statistics(KV_UINT policy) {
    return policy == KV_POLICY_H2O || policy == KV_POLICY_SCISSORHANDS || policy == KV_POLICY_TOVA || policy == KV_POLICY_ROCO ||
           policy == KV_POLICY_MEAN_H2O;
}

// Whether the policy ranks tokens by what is stored (keys, values and, for Expected Attention, the
// statistics of the queries seen): the query-agnostic scorers of the section below.
KV_FN bool kv_policy_scores_keys(KV_UINT policy) {
    return policy == KV_POLICY_KEY_NORM || policy == KV_POLICY_KEY_DIFF || policy == KV_POLICY_EXPECTED_ATTENTION;
}

KV_FN SlotStats kv_stats_zero() {
    SlotStats s;
    s.accumulated = 0.0f;
    s.squared = 0.0f;
    s.steps = 0.0f;
    s.last = 0.0f;
    s.persistence = 0.0f;
    return s;
}

// x^k by repeated squaring: the same roundings on every backend (a library pow need not agree).
KV_FN float kv_power(float x, KV_UINT k) {
    float result = 1.0f;
    while (k > 0u) {
        if ((k & 1u) != 0u) result *= x;
        x *= x;
        k >>= 1u;
    }
    return result;
}

// ---- the statistics update ----------------------------------------------------------------------
// Statistics change once per batch of n queries (a prompt chunk or one decoded token). A backend
// sums the queries' contributions into a partial (from kv_stats_zero), in any grouping, adding
// partials with kv_stats_add; then kv_stats_fold applies the partial to the slot. Persistence
// decays once per query, so over the batch query t's indicator is worth decay^(n-1-t) and the old
// value decay^n.

// A query finds a slot important when it gives it more than a uniform share of its attention:
// w > group / visible, where `visible` slots are visible to the query.
KV_FN float kv_importance_threshold(KV_UINT group, KV_UINT visible) { return float(group) / float(visible); }

// The weight of query t's importance indicator in a batch of n queries.
KV_FN float kv_persistence_weight(float decay, KV_UINT n, KV_UINT t) { return kv_power(decay, n - 1u - t); }

// `last` sums the weights of the batch's proxy queries: its last `proxy` ones (KvPolicyConfig::
// prompt_proxy, at least 1). With one proxy query it is the weight of the batch's last query, which
// TOVA ranks by; one-shot prompt eviction ranks by the sum over more (kv_prompt_priority). Every
// slot a query of the batch sees is seen by its last query (attention is causal).
KV_FN bool kv_is_proxy_query(KV_UINT n, KV_UINT t, KV_UINT proxy) { return t + proxy >= n; }

// A partial after one more query saw the slot with weight w.
KV_FN SlotStats kv_stats_add_query(SlotStats partial, float w, float threshold, float persistence_weight, bool proxy_query) {
    partial.accumulated += w;
    partial.squared += w * w;
    partial.steps += 1.0f;
    if (w > threshold) partial.persistence += persistence_weight;
    if (proxy_query) partial.last += w;
    return partial;
}

// Two partials of one batch together.
KV_FN SlotStats kv_stats_add(SlotStats a, SlotStats b) {
    a.accumulated += b.accumulated;
    a.squared += b.squared;
    a.steps += b.steps;
    a.last += b.last;
    a.persistence += b.persistence;
    return a;
}

// A slot's statistics after a batch: old_persistence_weight is decay^n for the whole batch (a
// backend that folds a batch in several parts of consecutive queries passes it and first_part with
// the first part, 1 and false after). `last` restarts with the first part and adds the later
// parts' proxy weights (a slot the first part does not see holds a token of the batch, whose
// `last` starts at zero); a slot no query saw keeps its `last`.
KV_FN SlotStats kv_stats_fold(SlotStats old, SlotStats batch, float old_persistence_weight, bool first_part) {
    old.accumulated += batch.accumulated;
    old.squared += batch.squared;
    if (batch.steps > 0.0f) old.last = first_part ? batch.last : old.last + batch.last;
    old.steps += batch.steps;
    old.persistence = old.persistence * old_persistence_weight + batch.persistence;
    return old;
}

// ---- the victim priority ------------------------------------------------------------------------
// Among the slots no protection covers (kv_policy.h), the victim is the one with the smallest
// priority, ties going to the oldest token. Stale slots (behind the horizon) rank -1, below every
// policy's priority (which is never negative); the window-like policies rank every other slot 0,
// so age alone decides.
KV_FN float kv_victim_priority(KV_UINT policy, SlotStats s, bool stale) {
    if (stale) return -1.0f;
    if (policy == KV_POLICY_H2O) return s.accumulated;
    if (policy == KV_POLICY_SCISSORHANDS) return s.persistence;
    if (policy == KV_POLICY_TOVA) return s.last;
    if (policy == KV_POLICY_ROCO) {
        // Mean attention since entry; the standard deviation, scaled far below any real
        // difference of means, only breaks ties between tokens with equal means.
        const float steps = s.steps > 0.0f ? s.steps : 1.0f;
        const float mean = s.accumulated / steps;
        const float variance = fmaxf(0.0f, s.squared / steps - mean * mean);
        return mean + 1e-3f * sqrtf(variance);
    }
    if (policy == KV_POLICY_MEAN_H2O) return s.steps > 0.0f ? s.accumulated / s.steps : 0.0f;
    return 0.0f;
}

// ---- query-agnostic scorers -------------------------------------------------------------------
// Three policies rank a cell's tokens by their stored vectors rather than by the attention they
// were paid, so they need no statistics from attention and hold their ranking whatever the
// queries to come. A backend computes each slot's inputs from the cell's rows (the key decoded,
// rotated by its position as stored) and ranks by the priority below, stale slots first
// (kv_scored_priority).

// A scored slot's priority: -1 when stale, below every score (which is never negative).
KV_FN float kv_scored_priority(float score, bool stale) { return stale ? -1.0f : score; }

// key_norm (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache
// Compression"): keys of small L2 norm draw high attention; the largest norms go first. Norms
// that agree to 11 bits (5e-4) tie, and the older token goes: a token's key norm does not change
// with its rotation, so in the first layer, whose keys depend on the token alone, every repeat of
// a token ties with the others, and rounding (which differs between backends and kernel levels)
// must not be what breaks such ties.
KV_FN float kv_key_norm_priority(float key_norm) { return 1.0f / (1.0f + bits_to_float(float_to_bits(key_norm) & 0xFFFFF000u)); }

// key_diff (KeyDiff, Park et al. 2025): a key pointing where the cell's keys point on average is
// redundant; the anchor is the mean of the cell's keys scaled to unit length, and the keys most
// similar to it (by cosine) go first.
KV_FN float kv_key_diff_priority(float cosine) { return fmaxf(0.0f, 1.0f - cosine); }

// expected_attention (Devoto et al. 2025, arXiv 2510.00636): the attention future queries are
// expected to pay a key, in closed form. A query head's recent queries, taken back to position 0
// (before rotation), have per dimension a mean m and a variance v; a query T positions ahead is
// rotated by R(p + t), whose average over the next T positions is, per rotary pair of frequency
// θ, c·I + s·J with c and s the means of cos θ(p + t) and sin θ(p + t). Modelling the future
// query as Gaussian q ~ N(R̄m, R̄ diag(v) R̄ᵀ), E[exp(scale q·k)] = exp(z) with
//   z = scale · m·u + ½ scale² Σ_j v_j u_j²,   u = R̄ᵀ k
// (the covariance is kept diagonal before the rotation: the paper's full covariance is d² per
// head). A slot's priority is its softmax of z over the cell's tokens, averaged over the group's
// query heads, times the norm of its value (the value's weight in the output).

// u = R̄ᵀ k for one rotary pair (x, y) of a key: R̄ᵀ = [[c, s], [-s, c]]. Unrotated dimensions
// have c = 1, s = 0.
KV_FN float kv_expected_pair_u_first(float x, float y, float c, float s) { return c * x + s * y; }
KV_FN float kv_expected_pair_u_second(float x, float y, float c, float s) { return c * y - s * x; }

// One dimension's term of z: scale m u + ½ scale² v u².
KV_FN float kv_expected_logit_term(float u, float mean, float variance, float scale) {
    return scale * mean * u + 0.5f * scale * scale * variance * u * u;
}

// How many queries the statistics average: the first this many with equal weights, later ones
// exponentially with this length. Long enough that a story's few sentences of queries make the
// estimate, short enough to follow a stream that changes subject.
KV_FN float kv_expected_attention_queries() { return 512.0f; }

// A query head's running statistics after one more query value x in one dimension: the first
// `window` queries are averaged with equal weights, later ones with weight 1 / window (an
// exponential average of that length). count is the queries seen before this one. The variance
// is updated from the deviation d = x - mean (before the mean moves), not as a mean square less
// the squared mean: where a dimension's mean is large against its spread, that difference would
// cancel most of a float's digits, and the backends' roundings would rank tokens differently.
KV_FN float kv_query_rate(float count, float window) { return 1.0f / fmaxf(1.0f, fminf(count + 1.0f, window)); }
KV_FN float kv_query_mean(float mean, float d, float rate) { return mean + rate * d; }
KV_FN float kv_query_variance(float variance, float d, float rate) { return (1.0f - rate) * (variance + rate * d * d); }

// The priority of a slot from its group-averaged expected weight and its value's norm.
KV_FN float kv_expected_attention_priority(float expected_weight, float value_norm) { return expected_weight * value_norm; }

#if !defined(H2O_GLSL)
// The average rotation (c, s) of a pair of inverse frequency theta over the T positions from
// `first`: the means of cos and sin of θ(first + t), t < T, in closed form in double precision:
// cos and sin of θ(first + (T - 1) / 2) times the Dirichlet kernel sin(θT/2) / (T sin(θ/2)).
// (kv_expect.comp computes the same from the turn fractions of rotary.glsl, in float.)
KV_FN void kv_expected_rotation(double theta, double first, double T, float *c, float *s) {
    const double half = 0.5 * theta, spread = fabs(sin(half)) < 1e-12 ? 1.0 : sin(half * T) / (T * sin(half));
    const double centre = theta * (first + 0.5 * (T - 1.0));
    *c = static_cast<float>(cos(centre) * spread);
    *s = static_cast<float>(sin(centre) * spread);
}
#endif

// ---- one-shot prompt eviction (NACL) ----------------------------------------------------------
// While a prompt is read (a batch of more than one token) with prompt_proxy > 0, victims are
// ranked by the attention the previous batch's proxy queries gave them (`last`) instead of the
// policy's priority: what the end of the text read so far attends to, not what accumulated while
// reading it. A random share of the tokens, drawn by a hash of the token's stream index, its cell
// (layer * n_kv + kv head) and the session's seed, has that attention multiplied by a random factor
// in [0, 2): some tokens the proxy ignores survive and some it favours go, for diversity. The
// hash is integer arithmetic and the factor a multiple of 2^-23, so every backend ranks alike.

// A 32-bit integer mix (xor-shift-multiply rounds): every input bit reaches every output bit.
KV_FN KV_UINT kv_hash(KV_UINT x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// The factor of a token's proxy attention: 1 outside the random share, else uniform in [0, 2).
KV_FN float kv_prompt_random_factor(KV_UINT index_low, KV_UINT index_high, KV_UINT cell, KV_UINT seed, float share) {
    const KV_UINT h = kv_hash(index_low ^ kv_hash(index_high ^ kv_hash(cell ^ kv_hash(seed))));
    if (float(h >> 8) * (1.0f / 16777216.0f) >= share) return 1.0f;
    return float(kv_hash(h) >> 8) * (1.0f / 8388608.0f);
}

KV_FN float kv_prompt_priority(SlotStats s, bool stale, float random_factor) { return stale ? -1.0f : s.last * random_factor; }

// ---- retention tags -----------------------------------------------------------------------------
// A slot's tag says how its token is kept: bit 0 set when it is pinned (never evicted), and bits
// 1 and up hold the retention span it belongs to, 0 for none or s + 1 for span s < KV_MAX_SPANS.
// A span has a minimum per (layer, kv head): while that cell holds no more of the span's tokens
// than the minimum, none of them may be evicted (kv_policy.h). Pinned tokens of a span count as
// held tokens of it and stay pinned.
const KV_UINT KV_MAX_SPANS = 32u;
const KV_UINT KV_TAG_PINNED = 1u;

KV_FN KV_UINT kv_make_tag(bool pinned, KV_UINT span_plus_one) { return (span_plus_one << 1) | (pinned ? KV_TAG_PINNED : 0u); }
KV_FN bool kv_tag_pinned(KV_UINT tag) { return (tag & KV_TAG_PINNED) != 0u; }
// 0: in no span; otherwise the span's index + 1.
KV_FN KV_UINT kv_tag_span(KV_UINT tag) { return tag >> 1; }
// Whether an unpinned token of a span may be evicted, given how many tokens of the span its cell
// holds now and the span's minimum there.
KV_FN bool kv_span_allows_eviction(KV_UINT held, KV_UINT minimum) { return held > minimum; }

#ifdef __cplusplus
}  // namespace h2o
#endif

#if defined(H2O_GLSL)
#undef sqrtf
#undef fmaxf
#undef fminf
#undef float_to_bits
#undef bits_to_float
#endif

#endif  // H2O_KV_POLICY_SPEC_H
