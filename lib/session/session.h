// A session: one conversation over a shared model. Owns its backend, activations, KV cache and
// sampler; all of them are allocated in create() and never grow afterwards.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "backend_registry.h"
#include "grammar_matcher.h"
#include "kv_settings.h"
#include "llama_graph.h"
#include "model.h"
#include "sampler.h"

namespace h2o {

struct GenerateSettings {
    uint32_t max_tokens = 256;
    std::shared_ptr<const Grammar> grammar;  // the reply's grammar (h2o_generate_params.grammar), or none
    SamplerSettings sampler;
    std::vector<std::string> stop_strings;
    bool stop_at_eos = true;
};

// Receives complete UTF-8 text; returns true to stop.
using TextSink = bool (*)(const char *text, size_t length, void *user_data);

// How appended tokens are kept in the KV cache: pinned (never evicted) and/or in a retention span
// (an index into the session's spans, -1: none), which keeps a minimum of them per (layer, kv head).
struct Retention {
    bool pinned = false;
    int span = -1;
    uint8_t tag() const { return static_cast<uint8_t>(kv_make_tag(pinned, static_cast<uint32_t>(span + 1))); }
};

// A retention span: text tagged with a caller's id whose tokens keep at least min_tokens slots of
// every (layer, kv head) while it has that many there (kv_policy.h).
struct RetentionSpan {
    uint32_t id = 0;
    float min_share = 0.0f;  // of the smallest layer budget (kv_budget when layers are alike)
    int32_t min_tokens = 0;  // floor(min_share * that budget)
    int64_t n_tokens = 0;    // tokens added to the span
};

// Where a span's tokens stand in the cache: how many each (layer, kv head) holds, and the share
// of the held tokens' accumulated attention that falls on them (-1: the policy gathers none).
struct SpanReport {
    RetentionSpan span;
    int32_t kept_min = 0, kept_max = 0;
    double kept_mean = 0.0;
    double attention_share = -1.0;
};

class Session {
public:
    static Status create(const Model &model, const SessionSettings &settings, std::unique_ptr<Session> *out);
    // Bytes of KV cache and activations a session with these settings allocates: known from the
    // shapes alone, so a memory cap is checked before anything is allocated.
    static uint64_t planned_bytes(const Model &model, const SessionSettings &settings);
    // What a backend must run for a session with these settings, for choosing one before any is made.
    static BackendRequirements requirements(const Model &model, const SessionSettings &settings);

    // Forgets the conversation. A session whose backend failed gets a new backend first (made as
    // at creation); if that fails too, the session stays refused.
    Status reset();
    // Restarts the sampler's generator from seed (h2o_session_set_seed); the conversation stays.
    void set_seed(uint64_t seed) { sampler_.reseed(seed); }
    // Makes the running call return H2O_ERR_CANCELLED at its next batch boundary. Any thread.
    void cancel() { cancel_requested_.store(true, std::memory_order_relaxed); }
    // Called as each public call starts: a cancel that came while nothing ran is forgotten.
    void begin_call() { cancel_requested_.store(false, std::memory_order_relaxed); }
    // Appends tokens (batched) and leaves the last token's logits in logits(), kept as
    // `retention` says.
    Status decode(const int32_t *tokens, size_t n, Retention retention = {});
    // Tokenizes text (BOS first in a fresh session) and appends it. special: the text of control
    // tokens becomes those tokens (Tokenizer::encode_special).
    Status add_text(std::string_view text, bool pinned, bool special = false);
    // add_text into the retention span `span_id` (created on first use, at most KV_MAX_SPANS),
    // whose minimum becomes min_share of the smallest layer budget (kv_budget when every layer has
    // it). Refused, changing nothing, when the pinned
    // tokens and every span's minimum would leave fewer than one slot to eviction.
    Status add_span_text(uint32_t span_id, float min_share, std::string_view text, bool pinned, bool special);
    // The span's definition and where its tokens stand in the cache.
    Status span_report(uint32_t span_id, SpanReport *out);
    // Generation, pull style: begin_generation appends the prompt; each next_piece samples until
    // it has complete text to give (or generation ends: *reason becomes the stop reason, and the
    // text still held back is in *piece). generate() drives both and streams to a sink.
    Status begin_generation(std::string_view prompt, const GenerateSettings &settings);
    Status next_piece(std::string *piece, h2o_stop_reason *reason);
    // Ends a pull-style generation early (another call on the session came between).
    void abandon_generation() { generation_.active = false; }
    Status generate(std::string_view prompt, const GenerateSettings &settings, TextSink sink, void *user_data);

    // The last token's logits, after fetch_logits() (evaluation leaves them where the backend
    // computed them: greedy generation never needs them on the host).
    Status fetch_logits();
    const std::vector<float> &logits() const { return logits_; }
    bool has_logits() const { return has_logits_; }
    int64_t n_past() const { return n_past_; }
    const h2o_generate_stats &stats() const { return stats_; }
    const Model &model() const { return model_; }
    Backend &backend() { return *backend_; }
    const Backend &backend() const { return *backend_; }
    const SessionSettings &settings() const { return settings_; }
    const KvConfig &kv_config() const { return kv_; }
    // The stream against the cache (h2o_session_get_kv_usage).
    h2o_kv_usage kv_usage() const;
    // Evicts the n oldest unpinned tokens at or after stream index `keep` from every (layer, kv
    // head) at once (h2o_experimental_session_discard: llama.cpp's context shift).
    Status discard_oldest(int64_t keep, int64_t n);
    // Evicts from each (layer, kv head) the unpinned token of stream index stream_index[cell]
    // (h2o_experimental_session_evict).
    Status evict_tokens(const int64_t *stream_index);
    // Every slot's stream index (-1: free) and, unless attention is null, the weight the latest
    // query gave it, [layer][kv head][slot] (h2o_experimental_session_kv_attention).
    Status kv_attention(int64_t *stream_index, float *attention);
    // Receives H2O_EVENT_KV_FULL once per conversation (h2o_session_set_event_callback).
    void set_event_callback(h2o_session_event_callback callback, void *user_data) {
        event_callback_ = callback;
        event_user_data_ = user_data;
    }
    const BackendDevice &device() const { return device_; }
    h2o_memory_report memory() const;

    // The conversation's state for a snapshot: stream counters, the last logits, the sampler's
    // generator and history, and the KV cache slot by slot. A generation in progress is not part
    // of it (a loaded session continues the conversation with the next call).
    Status save_state(std::vector<uint8_t> *out);
    // Restores a state saved by a session with the same settings and model. Every count and
    // index is checked first; on error the session is reset.
    // has_span_table: false for the states of snapshot format versions 1 and 2, which had none.
    Status load_state(const uint8_t *data, size_t size, bool has_span_table = true);
    // Sessions whose states are interchangeable (the settings a snapshot stores) share this key.
    uint64_t prefix_cache_key() const;

private:
    Session(const Model &model, const SessionSettings &settings);
    // Runs the session on the first device of plan_backends() that can run it, and logs which and
    // why. An explicit backend fails with its device's answer; auto goes on to the next device.
    Status build();
    // Makes the candidate's backend, adopts the weights and allocates the KV cache.
    Status start(const BackendCandidate &candidate);
    // decode() without waiting for the backend: a recording backend runs the work with what
    // follows (generation's next token: one submission per token).
    Status feed(const int32_t *tokens, size_t n, Retention retention);
    // Checks that n more tokens fit (stream length, budget of a non-evicting cache, pinning with
    // `reserved` slots held for span minimums).
    Status check_room(size_t n, bool pinned, int64_t reserved) const;
    // check_room for feeding n tokens: the pending token, fed first, counts towards the stream
    // and the cache too (only the n may be pinned). feed() and add_span_text() check with it
    // before anything changes, so that a refused call changes nothing.
    Status check_feed_room(size_t n, bool pinned, int64_t reserved) const;
    // The index in spans_ of the span with this id, or -1.
    int span_index(uint32_t span_id) const;
    // Slots the spans' minimums hold back from eviction (their sum).
    int64_t span_reserved() const;
    // Gives the backend the spans' minimums.
    Status apply_span_minimums();
    // Tokenizes text as add_text would into prompt_tokens_.
    Status tokenize_text(std::string_view text, bool special);
    // Runs tokens through the model in batches, evicting between batches when the cache is full.
    // A cancel stops it between batches; the batches done before stay.
    // *processed receives how many tokens were stored (all of them unless it fails).
    Status evaluate(const int32_t *tokens, size_t n, Retention retention, size_t *processed);
    // Notes that the backend holds the logits of the last stored token.
    void finish_evaluation(int32_t last_token);
    // cell_held_ and cell_slots_ of an empty cache, and as the cache holds them (after a load).
    void clear_cell_fill();
    Status read_cell_fill();
    // The fewest slots a cell of a global layer has now (cell_slots_; with budgets that move).
    int64_t smallest_global_cell() const;
    // Work is refused while the backend has failed (H2O_ERR_BACKEND_FAILED, naming its error).
    Status check_usable() const;
    // Records a failed backend operation: the cache may be half updated, so the session refuses
    // further work until reset. Returns the error.
    Status backend_failed(Status error);
    // Why the cache cannot be evicted from or read outside its policy (discard_oldest,
    // evict_tokens, kv_attention), or Ok.
    Status check_uniform_cells(const char *what) const;
    // The backend's answer to an eviction from outside the policy of n tokens a cell.
    Status evicted_outside(Status st, int64_t n);
    // Ends the generation in progress with `reason`, moving all text still held back to *piece.
    void finish_generation(h2o_stop_reason reason, std::string *piece);
    // The first batch that evicts says so: the log, at info level, and the event callback.
    void announce_full();

    // The state of a generation between next_piece calls.
    struct Generation {
        bool active = false;
        GenerateSettings settings;
        std::string held;                         // decoded bytes not yet given out (incomplete UTF-8, possible stop-string prefix)
        std::unique_ptr<GrammarMatcher> grammar;  // the state of settings.grammar, if any
        std::chrono::steady_clock::time_point start;
    };

    const Model &model_;
    SessionSettings settings_;
    KvConfig kv_;  // the cache's shape, from the settings
    // kv_.max_held_from_eviction(): what pins and span minimums may hold (every feed checks it).
    int64_t holdable_;
    std::unique_ptr<Backend> backend_;
    BackendDevice device_;
    std::unique_ptr<LlamaGraph> graph_;
    Sampler sampler_;
    TokenHistory history_;

    int64_t n_past_ = 0;  // tokens in the stream so far
    // Tokens in the cache of every (layer, kv head) of the layers with the most slots; a layer
    // with fewer holds min(n_cached_, its slots).
    int64_t n_cached_ = 0;
    int64_t n_pinned_ = 0;              // pinned tokens among them
    std::vector<RetentionSpan> spans_;  // capacity KV_MAX_SPANS, reserved at creation
    int32_t last_token_ = -1;           // the most recent token fed to the model
    int32_t pending_token_ = -1;        // sampled and delivered but not yet fed to the model
    bool has_logits_ = false;
    bool logits_on_host_ = false;  // logits_ holds the last token's logits (else only the backend does)
    Status failure_;               // the backend's error (see backend_failed)
    std::vector<float> logits_;
    std::vector<int32_t> positions_;  // scratch for one batch: n_batch per position set (KvConfig::position_sets)
    // With budgets per kv head: each cell's tokens held and slots, [layer][kv head], as the last
    // rebalancing left them (KvStore::rebalance_kv) and every batch since filled them.
    std::vector<int32_t> cell_held_, cell_slots_;
    std::vector<int32_t> prompt_tokens_;
    std::shared_ptr<const TokenSurfaces> token_surfaces_;  // made by the first generation with a grammar,
    std::vector<int32_t> surfaces_spelled_;                // with these control tokens spelled

    h2o_generate_stats stats_{};
    Generation generation_;
    // H2O_EVENT_KV_FULL went out for this conversation (or its cache had filled before it was loaded).
    bool announced_full_ = false;
    h2o_session_event_callback event_callback_ = nullptr;
    void *event_user_data_ = nullptr;
    std::atomic<bool> cancel_requested_{false};
    static_assert(std::atomic<bool>::is_always_lock_free, "h2o_session_cancel must be async-signal-safe");
};

}  // namespace h2o
