// KV eviction policies: which cached token of a (layer, kv head) gives up its slot when a new
// token needs one and none is free. This file states the rules and holds the host-side
// configuration; their arithmetic (statistics, priorities, policy ids) is kv_policy_spec.h, which
// every backend includes, and the CPU backend's cache (kv_cache.cpp) is the reference that runs it.
//
// Per slot, attention maintains the statistics of SlotStats (kv_policy_spec.h). Prompt processing
// is causal: a query only updates slots at or before its own stream index.
//
// Victim selection for a batch of n new tokens, per (layer, kv head):
//   - pinned tokens are never evicted;
//   - the newest max(0, recent - n) cached tokens are protected (the recent window counts the
//     incoming tokens, as in the H2O paper): kv_recent_from;
//   - for sink_window and mean_h2o, the first `sinks` tokens of the stream are protected;
//   - among the rest, stale tokens go first, oldest first: with a horizon H, a token is stale when
//     it lies H or more tokens behind the newest incoming one (kv_stale_before);
//   - then the token with the smallest kv_victim_priority is evicted (ties: the oldest; the
//     query-agnostic scorers rank by their key priorities of kv_policy_spec.h instead); with
//     one-shot prompt eviction (prompt_proxy > 0), a batch of more than one token (a prompt being
//     read) ranks by kv_prompt_priority instead: the attention of the previous batch's last
//     prompt_proxy queries, a random share of the tokens with a random factor (NACL);
//   - victims are taken in that order, passing over the tokens of a retention span (a tag of
//     kv_policy_spec.h) while the (layer, kv head) holds no more of that span's tokens than the
//     span's minimum: a span keeps at least its minimum, the ones the policy ranks highest;
//   - if the protections leave too few (counting the spans' minimums), the policy's choice is
//     dropped and the oldest unpinned tokens are evicted instead, spans' minimums still kept
//     (the session keeps pins plus minimums below the budget, so enough can always go).
#pragma once

#include <cstdint>

#include "kv_policy_spec.h"
#include "kv_victim_rules.h"

namespace h2o {

enum class KvPolicy : uint32_t {
    Full = KV_POLICY_FULL,
    H2O = KV_POLICY_H2O,
    Window = KV_POLICY_WINDOW,
    SinkWindow = KV_POLICY_SINK_WINDOW,
    Scissorhands = KV_POLICY_SCISSORHANDS,
    Tova = KV_POLICY_TOVA,
    RoCo = KV_POLICY_ROCO,
    Random = KV_POLICY_RANDOM,
    MeanH2O = KV_POLICY_MEAN_H2O,
    KeyNorm = KV_POLICY_KEY_NORM,
    KeyDiff = KV_POLICY_KEY_DIFF,
    ExpectedAttention = KV_POLICY_EXPECTED_ATTENTION,
};

constexpr uint32_t kKvPolicyCount = KV_POLICY_COUNT;

// What each policy keeps, by policy value: the one table the library, the C API
// (h2o_kv_policy_get_info), the tools and the bindings read a policy's traits from. Whether it
// gathers statistics is kv_policy_uses_statistics (kv_policy_spec.h), which the devices need too.
struct KvPolicyTraits {
    const char *name;            // as tools and the C API print and parse it
    bool has_recent_window;      // protects kv_recent (window and sink_window are all window; TOVA has none)
    bool keeps_sinks;            // protects the first kv_sinks tokens of the stream
    float default_recent_ratio;  // the window's share of the budget by default
    float default_horizon;       // kv_horizon's default, in budgets (0: none)
};
extern const KvPolicyTraits kKvPolicyTraits[kKvPolicyCount];
inline const KvPolicyTraits &kv_policy_traits(KvPolicy policy) { return kKvPolicyTraits[static_cast<uint32_t>(policy)]; }

const char *kv_policy_name(KvPolicy policy);
// Parses a name as kv_policy_name prints it; false if unknown.
bool parse_kv_policy(const char *name, KvPolicy *out);

struct KvPolicyConfig {
    KvPolicy policy = KvPolicy::Full;
    int recent = 0;                  // protected recent window (tokens)
    int sinks = 0;                   // protected first tokens of the stream
    float persistence_decay = 0.9f;  // Scissorhands
    // How far back (in stream tokens, the newest included) a heavy hitter may be kept; 0: no
    // limit. Over a long stream, attention statistics keep tokens of text the stream has long
    // moved past (a story's names, a paragraph's topic), and the model, whose positions rolling
    // has moved next to the recent window, reads them as current: Scissorhands' perplexity rose
    // over a long stream until its heavy hitters were limited to 1.5 budgets back
    // (docs/EVALUATION.md, "Long streams"). The random policy draws its victims uniformly and
    // does not use it.
    int horizon = 0;
    // One-shot prompt eviction (NACL, bounded to the cache's slots): 0, the default, ranks a
    // prompt's victims by the policy's own statistics gathered over every query read so far;
    // W > 0 ranks them by the attention of the previous batch's last W queries (the end of the
    // text read so far), a random share of the tokens with a random factor (kv_policy_spec.h).
    // Generation (batches of one token) keeps the policy's ranking. Needs a policy that gathers
    // statistics.
    int prompt_proxy = 0;
    float prompt_random_share = 0.0f;
    uint64_t seed = 0;  // Random, and the random share's hash
};

// kv_prompt_proxy's most queries: a batch is at most 4096 tokens (the session's n_batch), so more
// would sum the same queries.
constexpr int kMaxKvPromptProxy = 4096;

// How many of a batch's last queries `last` sums (kv_is_proxy_query): one unless prompt_proxy says more.
inline int kv_proxy_queries(const KvPolicyConfig &config) { return config.prompt_proxy > 0 ? config.prompt_proxy : 1; }

// Whether a batch of n tokens ranks its victims by kv_prompt_priority.
inline bool kv_ranks_by_proxy(const KvPolicyConfig &config, int n) { return config.prompt_proxy > 0 && n > 1; }

// The seed word of kv_prompt_random_factor.
inline uint32_t kv_prompt_seed(const KvPolicyConfig &config) {
    return static_cast<uint32_t>(config.seed) ^ static_cast<uint32_t>(config.seed >> 32);
}

inline bool kv_policy_uses_statistics(KvPolicy policy) { return kv_policy_uses_statistics(static_cast<uint32_t>(policy)); }

// Stream indices at or after this are in the protected recent window when n tokens starting at
// next_index come in.
int64_t kv_recent_from(const KvPolicyConfig &config, int64_t next_index, int n);

// Stream indices below this are stale when n tokens starting at next_index come in (0 when the
// policy has no horizon, so nothing is).
int64_t kv_stale_before(const KvPolicyConfig &config, int64_t next_index, int n);

// kv_victim_priority of kv_policy_spec.h for a slot holding the token at stream_index.
inline float kv_victim_priority(const KvPolicyConfig &config, const SlotStats &stats, int64_t stream_index, int64_t stale_before) {
    return kv_victim_priority(static_cast<uint32_t>(config.policy), stats, stream_index < stale_before);
}

// kv_batch_priority (kv_victim_rules.h) with this configuration's policy and prompt settings.
// cell: layer * n_head_kv + kv head.
inline float kv_batch_victim_priority(const KvPolicyConfig &config, bool by_proxy, const SlotStats &stats, int64_t stream_index,
                                      int64_t stale_before, uint32_t cell) {
    return kv_batch_priority(static_cast<uint32_t>(config.policy), by_proxy, stats, stream_index < stale_before, stream_index, cell,
                             kv_prompt_seed(config), config.prompt_random_share);
}

}  // namespace h2o
