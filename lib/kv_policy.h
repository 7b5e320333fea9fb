// KV eviction policies: which cached token of a (layer, kv head) gives up its slot when a new
// token needs one and none is free. This file is the specification every backend follows; the
// CPU backend runs it as written (kv_cache.cpp), GPU backends reimplement it in their kernels.
//
// Per slot, attention maintains these statistics, where w is the attention weight a query gives
// the slot summed over the query heads that share the kv head (so it lies in [0, group size]):
//   accumulated  Σ w over every query since the token entered           (H2O)
//   squared      Σ w²                                                    (RoCo: variance)
//   steps        number of queries that have seen the token              (RoCo: mean)
//   last         w of the most recent query                              (TOVA)
//   persistence  decay·persistence + [w > group/visible], per query      (Scissorhands)
// Prompt processing is causal: a query only updates slots at or before its own stream index.
//
// Victim selection for a batch of n new tokens, per (layer, kv head):
//   - pinned tokens are never evicted;
//   - the newest max(0, recent - n) cached tokens are protected (the recent window counts the
//     incoming tokens, as in the H2O paper);
//   - for sink_window and mean_h2o, the first `sinks` tokens of the stream are protected;
//   - among the rest, stale tokens go first, oldest first: with a horizon H, a token is stale when
//     it lies H or more tokens behind the newest incoming one (kv_stale_before);
//   - then the token with the smallest priority is evicted (ties: the oldest);
//   - if nothing is left after the protections, the oldest unpinned token is evicted.
#pragma once

#include <cstdint>

namespace h2o {

enum class KvPolicy : uint32_t {
    Full = 0,          // no eviction: a full cache is an error (H2O_ERR_CONTEXT_FULL)
    H2O = 1,           // recent window + heavy hitters by accumulated attention
    Window = 2,        // most recent tokens only (priority: stream index)
    SinkWindow = 3,    // first `sinks` tokens + most recent (StreamingLLM)
    Scissorhands = 4,  // recent window + tokens that were persistently important
    Tova = 5,          // lowest attention at the latest step
    RoCo = 6,          // recent window + mean attention, ties broken by its standard deviation
    Random = 7,        // sanity baseline: a uniformly random unprotected token
    MeanH2O = 8,       // sinks + recent window + heavy hitters by mean attention since entry
};

constexpr uint32_t kKvPolicyCount = 9;
// Names by policy value, as tools and the C API print and parse them.
extern const char *const kKvPolicyNames[kKvPolicyCount];

const char *kv_policy_name(KvPolicy policy);
// Parses a name as kv_policy_name prints it; false if unknown.
bool parse_kv_policy(const char *name, KvPolicy *out);

struct KvPolicyConfig {
    KvPolicy policy = KvPolicy::Full;
    int recent = 0;             // protected recent window (tokens)
    int sinks = 0;              // protected first tokens of the stream
    float persistence_decay = 0.9f;  // Scissorhands
    // How far back (in stream tokens, the newest included) a heavy hitter may be kept; 0: no
    // limit. Over a long stream, attention statistics keep tokens of text the stream has long
    // moved past (a story's names, a paragraph's topic), and the model, whose positions rolling
    // has moved next to the recent window, reads them as current: Scissorhands' perplexity rose
    // 8.5% over 20 000 tokens until its heavy hitters were limited to 1.5 budgets back. The
    // random policy draws its victims uniformly and does not use it.
    int horizon = 0;
    uint64_t seed = 0;          // Random
};

// The statistics of one slot (see above).
struct SlotStats {
    float accumulated = 0;
    float squared = 0;
    float steps = 0;
    float last = 0;
    float persistence = 0;
};

// Whether the policy reads attention statistics; the others (full, window, sink_window, random)
// let attention skip gathering them.
bool kv_policy_uses_statistics(KvPolicy policy);

// The policy's priority of a slot: the victim is the eligible slot with the smallest value.
double kv_priority(const KvPolicyConfig &config, const SlotStats &stats, int64_t stream_index);

// Stream indices below this are stale when n tokens starting at next_index come in (0 when the
// policy has no horizon, so nothing is).
int64_t kv_stale_before(const KvPolicyConfig &config, int64_t next_index, int n);

// The victim order of make_room: a stale slot ranks below every other (priorities are never
// negative), otherwise kv_priority. Ties go to the oldest.
double kv_victim_priority(const KvPolicyConfig &config, const SlotStats &stats, int64_t stream_index, int64_t stale_before);

}  // namespace h2o
