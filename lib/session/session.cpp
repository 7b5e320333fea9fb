#include "session.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>

#include "kv_cache.h"
#include "kv_head_budgets.h"
#include "kv_layer_budgets.h"
#include "log.h"
#include "utf8.h"

namespace h2o {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Length of the longest suffix of `text` that is a proper prefix of one of the stop strings: that
// much text must be held back, since the next token may complete a stop string.
size_t stop_prefix_overlap(const std::string &text, const std::vector<std::string> &stops) {
    size_t longest = 0;
    for (const std::string &stop : stops) {
        for (size_t len = std::min(stop.size() - 1, text.size()); len > longest; --len) {
            if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
                longest = len;
                break;
            }
        }
    }
    return longest;
}

// A span's minimum per (layer, kv head), in tokens: a share of the smallest layer's slots, which
// every layer can hold.
int32_t span_minimum_tokens(float min_share, const KvConfig &kv) {
    return static_cast<int32_t>(std::floor(static_cast<double>(min_share) * kv.min_slots()));
}

KvConfig make_kv_config(const Model &model, const SessionSettings &settings) {
    const ModelShape &shape = model.shape();
    KvConfig kv;
    kv.n_layer = shape.n_layer;
    kv.n_head_kv = shape.n_head_kv;
    kv.head_dim = shape.head_dim;
    kv.n_slots = settings.kv_budget;
    // A full cache never evicts: its layers all hold the whole context. The budget spreads over
    // the global layers, in their order; local layers get their windows below.
    if (settings.policy.policy != KvPolicy::Full) {
        std::vector<int> global_layers;
        for (int l = 0; l < shape.n_layer; ++l) {
            if (!shape.is_local(l)) global_layers.push_back(l);
        }
        const std::vector<int> budgets =
            kv_layer_budgets(static_cast<int>(global_layers.size()), settings.kv_budget, settings.kv_layer_slope, kMinKvLayerSlots);
        if (!budgets.empty()) {
            kv.layer_slots.assign(static_cast<size_t>(shape.n_layer), settings.kv_budget);
            for (size_t i = 0; i < budgets.size(); ++i) kv.layer_slots[static_cast<size_t>(global_layers[i])] = budgets[i];
        }
    }
    if (!shape.local_layers.empty()) {
        // A local layer holds its window and a batch: a batch's first query sees the window's
        // tokens before it. Without rolling, the stream never outgrows n_ctx.
        int64_t window_slots = static_cast<int64_t>(shape.sliding_window) + settings.n_batch - 1;
        if (!settings.rolling) window_slots = std::min<int64_t>(window_slots, settings.n_ctx);
        if (kv.layer_slots.empty()) kv.layer_slots.assign(static_cast<size_t>(shape.n_layer), settings.kv_budget);
        kv.layer_window.assign(static_cast<size_t>(shape.n_layer), 0);
        for (int l = 0; l < shape.n_layer; ++l) {
            if (!shape.is_local(l)) continue;
            kv.layer_window[static_cast<size_t>(l)] = shape.sliding_window;
            kv.layer_slots[static_cast<size_t>(l)] = static_cast<int>(window_slots);
        }
        kv.local_rope = shape.local_rope;
    }
    kv.head_share = settings.kv_head_share;
    kv.share_across_layers = settings.kv_share_across_layers;
    kv.rebalance_interval = settings.kv_rebalance_interval;
    kv.type = settings.kv_type;
    kv.policy = settings.policy;
    kv.rolling = settings.rolling;
    kv.rope = model.rotary_for_context(settings.n_ctx);
    kv.query_group = shape.n_head / shape.n_head_kv;
    kv.attention_scale = shape.attention_scale != 0.0f ? shape.attention_scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    return kv;
}

}  // namespace

Session::Session(const Model &model, const SessionSettings &settings)
    : model_(model),
      settings_(settings),
      kv_(make_kv_config(model, settings)),
      holdable_(kv_.max_held_from_eviction()),
      sampler_(model.shape().n_vocab, settings.seed) {}

namespace {

Status memory_cap_error(uint64_t needed, uint64_t allowed, const char *when) {
    return make_error(H2O_ERR_OUT_OF_MEMORY, std::string("the session needs ") + std::to_string(needed) + " bytes" + when +
                                                 " but max_memory_bytes allows " + std::to_string(allowed));
}

}  // namespace

uint64_t Session::planned_bytes(const Model &model, const SessionSettings &settings) {
    const KvConfig kv = make_kv_config(model, settings);
    return KvCache::planned_bytes(kv) + LlamaGraph::activation_bytes(model.shape(), settings.n_batch, kv.position_sets());
}

BackendRequirements Session::requirements(const Model &model, const SessionSettings &settings) {
    BackendRequirements needs;
    needs.weight_types = model.weight_types();
    needs.kv = make_kv_config(model, settings);
    needs.weight_bytes = model.weight_bytes();
    needs.session_bytes = planned_bytes(model, settings);
    return needs;
}

Status Session::create(const Model &model, const SessionSettings &settings, std::unique_ptr<Session> *out) {
    const uint64_t cap = settings.max_memory_bytes;
    if (cap != 0 && planned_bytes(model, settings) > cap) {
        return memory_cap_error(planned_bytes(model, settings), cap, " for its KV cache and activations alone");
    }
    std::unique_ptr<Session> s(new Session(model, settings));
    H2O_TRY(s->build());
    const ModelShape &shape = model.shape();
    s->logits_.assign(shape.n_vocab, 0.0f);
    s->positions_.assign(static_cast<size_t>(settings.n_batch) * s->kv_.position_sets(), 0);
    const size_t cells = s->kv_.head_share > 0.0f ? static_cast<size_t>(shape.n_layer) * shape.n_head_kv : 0;
    s->cell_held_.resize(cells);
    s->cell_slots_.resize(cells);
    s->clear_cell_fill();
    s->spans_.reserve(KV_MAX_SPANS);
    // A backend's own scratch is known only once it is made: check the whole again.
    const h2o_memory_report used = s->memory();
    if (cap != 0 && used.kv_bytes + used.scratch_bytes > cap) return memory_cap_error(used.kv_bytes + used.scratch_bytes, cap, "");
    *out = std::move(s);
    return Status::Ok();
}

Status Session::build() {
    const uint32_t kind = settings_.backend;  // checked by plan_backends
    std::vector<BackendCandidate> plan;
    H2O_TRY(plan_backends(kind, settings_.device_index, requirements(model_, settings_), &plan));
    for (size_t i = 0; i < plan.size(); ++i) {
        BackendCandidate &candidate = plan[i];
        if (!candidate.verdict.ok()) {
            if (kind != H2O_BACKEND_AUTO) return candidate.verdict;
            continue;
        }
        candidate.verdict = start(candidate);
        if (candidate.verdict.ok()) {
            const std::string why = kind == H2O_BACKEND_AUTO ? explain_auto_choice(plan, i)
                                                             : std::string("the ") + backend_kind_title(kind) + " backend was requested";
            log(H2O_LOG_INFO, "session backend: " + device_.name + " (" + why + ")");
            return Status::Ok();
        }
        if (kind != H2O_BACKEND_AUTO) return candidate.verdict;
        // The device said it runs the session, yet making it failed (a driver out of memory):
        // auto does not fail for want of a GPU, so it goes on to the next device.
        log(H2O_LOG_WARN,
            "auto backend: " + candidate_label(candidate) + " failed (" + candidate.verdict.message + "); trying the next device");
    }
    // Only when the CPU backend, always planned last, cannot run the session either.
    return plan.empty() ? make_error(H2O_ERR_INTERNAL, "no backend was planned") : plan.back().verdict;
}

Status Session::start(const BackendCandidate &candidate) {
    // Made aside and kept only when complete, so that a session whose rebuild fails (reset after
    // a device error) still holds a backend to answer queries with.
    std::unique_ptr<Backend> backend;
    std::unique_ptr<LlamaGraph> graph;
    BackendDevice device;
    const BackendOptions options{settings_.n_threads, settings_.n_batch};
    H2O_TRY(candidate.backend->create(candidate.device, options, &backend, &device));
    H2O_TRY(LlamaGraph::create(model_, kv_.rope, *backend, settings_.n_batch, kv_.position_sets(), &graph));
    H2O_TRY(backend->kv_store().create_kv(kv_));
    graph_ = std::move(graph);  // the graph refers to the old backend: it goes first
    backend_ = std::move(backend);
    device_ = device;
    return Status::Ok();
}

Status Session::reset() {
    if (!failure_.ok()) {
        // A backend that failed is not trusted again: the session gets a new one, chosen as at
        // creation.
        if (Status st = build(); !st.ok()) {
            failure_ = st;
            return st;
        }
        failure_ = Status::Ok();
    } else if (Status st = backend_->kv_store().clear_kv(); !st.ok()) {
        return backend_failed(st);
    }
    sampler_.reseed(settings_.seed);
    history_.clear();
    n_past_ = n_cached_ = n_pinned_ = 0;
    announced_full_ = false;
    clear_cell_fill();
    spans_.clear();  // clear_kv() and a new backend hold no span minimums
    last_token_ = pending_token_ = -1;
    has_logits_ = false;
    stats_ = h2o_generate_stats{};
    generation_.active = false;
    return Status::Ok();
}

Status Session::check_usable() const {
    if (failure_.ok()) return Status::Ok();
    return make_error(H2O_ERR_BACKEND_FAILED,
                      "the session's backend failed (" + failure_.message + "); h2o_session_reset() gives the session a new one");
}

Status Session::backend_failed(Status error) {
    failure_ = error;
    has_logits_ = false;
    generation_.active = false;
    return error;
}

h2o_memory_report Session::memory() const {
    h2o_memory_report r{};
    r.struct_size = sizeof(r);
    r.weight_bytes = model_.weight_bytes();
    r.kv_bytes = backend_->kv_store().kv_bytes();
    r.scratch_bytes = backend_->allocated_bytes() - backend_->kv_store().kv_bytes() + logits_.size() * sizeof(float) +
                      (positions_.size() + cell_held_.size() + cell_slots_.size()) * sizeof(int32_t);
    return r;
}

uint64_t Session::prefix_cache_key() const { return cache_settings_hash(settings_); }

Status Session::save_state(std::vector<uint8_t> *out) {
    out->clear();
    H2O_TRY(check_usable());
    H2O_TRY(fetch_logits());
    ByteWriter w(out);
    w.put<int64_t>(n_past_);
    w.put<int64_t>(n_cached_);
    w.put<int64_t>(n_pinned_);
    w.put<uint32_t>(static_cast<uint32_t>(spans_.size()));
    for (const RetentionSpan &span : spans_) {
        w.put<uint32_t>(span.id);
        w.put<float>(span.min_share);
        w.put<int32_t>(span.min_tokens);
        w.put<int64_t>(span.n_tokens);
    }
    w.put<int32_t>(last_token_);
    w.put<int32_t>(pending_token_);
    w.put<uint8_t>(has_logits_ ? 1 : 0);
    w.put_array(logits_);
    sampler_.save(w);
    history_.save(w);
    return backend_->kv_store().save_kv(w);
}

Status Session::load_state(const uint8_t *data, size_t size, bool has_span_table) {
    H2O_TRY(reset());
    ByteReader r(data, size);
    Status st = [&]() -> Status {
        uint8_t has_logits = 0;
        H2O_TRY(r.get("stream length", &n_past_));
        H2O_TRY(r.get("cached token count", &n_cached_));
        H2O_TRY(r.get("pinned token count", &n_pinned_));
        auto bad = [](const std::string &what) { return make_error(H2O_ERR_STATE_FORMAT, "inconsistent session state: " + what); };
        uint32_t n_spans = 0;
        if (has_span_table) H2O_TRY(r.get("retention span count", &n_spans));
        if (n_spans > KV_MAX_SPANS) return bad(std::to_string(n_spans) + " retention spans");
        for (uint32_t i = 0; i < n_spans; ++i) {
            RetentionSpan span;
            H2O_TRY(r.get("retention span id", &span.id));
            H2O_TRY(r.get("retention span share", &span.min_share));
            H2O_TRY(r.get("retention span minimum", &span.min_tokens));
            H2O_TRY(r.get("retention span length", &span.n_tokens));
            const bool share_ok = span.min_share >= 0.0f && span.min_share <= 1.0f;  // false for NaN
            if (span.id == 0 || !share_ok || span.min_tokens != span_minimum_tokens(span.min_share, kv_) || span.n_tokens < 0) {
                return bad("retention span " + std::to_string(i));
            }
            if (span_index(span.id) >= 0) return bad("retention span id " + std::to_string(span.id) + " appears twice");
            spans_.push_back(span);
        }
        H2O_TRY(r.get("last token", &last_token_));
        H2O_TRY(r.get("pending token", &pending_token_));
        H2O_TRY(r.get("logits flag", &has_logits));
        H2O_TRY(r.get_array("logits", logits_.size(), &logits_));
        H2O_TRY(sampler_.load(r));
        H2O_TRY(history_.load(r));
        const int32_t n_vocab = model_.shape().n_vocab;
        auto token_ok = [n_vocab](int32_t t) { return t >= -1 && t < n_vocab; };
        if (n_past_ < 0 || n_cached_ < 0 || n_cached_ > n_past_ || n_cached_ > kv_.max_slots() || n_pinned_ < 0 || n_pinned_ > n_cached_ ||
            (!settings_.rolling && n_past_ > settings_.n_ctx) || n_pinned_ + span_reserved() > holdable_) {
            return bad("stream length " + std::to_string(n_past_) + ", " + std::to_string(n_cached_) + " cached, " +
                       std::to_string(n_pinned_) + " pinned");
        }
        if (!token_ok(last_token_) || !token_ok(pending_token_) || has_logits > 1) return bad("token ids or flags out of range");
        // The sampler indexes the logits by these ids, so each is checked.
        for (uint32_t i = 0; i < history_.size(); ++i) {
            if (history_.recent(i) < 0 || history_.recent(i) >= n_vocab) return bad("a token id in the history is out of range");
        }
        has_logits_ = has_logits != 0;
        logits_on_host_ = true;
        H2O_TRY(backend_->kv_store().load_kv(r, n_past_, n_cached_, n_pinned_, static_cast<int>(spans_.size())));
        H2O_TRY(apply_span_minimums());
        H2O_TRY(read_cell_fill());
        if (r.remaining() != 0) return bad(std::to_string(r.remaining()) + " unexpected bytes at the end");
        announced_full_ = n_past_ > kv_.min_slots();  // a conversation whose cache filled before it was saved
        return Status::Ok();
    }();
    if (!st.ok()) {
        const Status cleared = reset();
        if (!cleared.ok()) return cleared;
    }
    return st;
}

Status Session::check_feed_room(size_t n, bool pinned, int64_t reserved) const {
    H2O_TRY(check_room(n + (pending_token_ >= 0 ? 1 : 0), false, reserved));
    return check_room(n, pinned, reserved);
}

int Session::span_index(uint32_t span_id) const {
    for (size_t i = 0; i < spans_.size(); ++i) {
        if (spans_[i].id == span_id) return static_cast<int>(i);
    }
    return -1;
}

int64_t Session::span_reserved() const {
    int64_t total = 0;
    for (const RetentionSpan &span : spans_) total += span.min_tokens;
    return total;
}

Status Session::apply_span_minimums() {
    int32_t minimums[KV_MAX_SPANS] = {};
    for (size_t i = 0; i < spans_.size(); ++i) minimums[i] = spans_[i].min_tokens;
    if (Status st = backend_->kv_store().set_kv_span_minimums(minimums); !st.ok()) return backend_failed(st);
    return Status::Ok();
}

Status Session::check_room(size_t n, bool pinned, int64_t reserved) const {
    const int64_t budget = settings_.kv_budget;
    if (!settings_.rolling && n_past_ + static_cast<int64_t>(n) > settings_.n_ctx) {
        return make_error(H2O_ERR_CONTEXT_FULL, "the context is full: the stream has " + std::to_string(n_past_) + " tokens, " +
                                                    std::to_string(n) + " more would pass n_ctx = " + std::to_string(settings_.n_ctx) +
                                                    " (kv_overflow = H2O_KV_OVERFLOW_ERROR without position_rolling ends the "
                                                    "stream there; the default evicts and rolls)");
    }
    if (settings_.policy.policy == KvPolicy::Full && n_cached_ + static_cast<int64_t>(n) > budget) {
        return make_error(H2O_ERR_CONTEXT_FULL, "the KV cache is full: " + std::to_string(n_cached_) + " of " + std::to_string(budget) +
                                                    " slots used, " + std::to_string(n) +
                                                    " more tokens do not fit and the policy is 'full', which never evicts");
    }
    const int64_t pinning = pinned ? static_cast<int64_t>(n) : 0;
    // Every cell keeps one slot to evict into.
    if (n_pinned_ + pinning + reserved > holdable_) {
        const std::string what = pinned ? "pin " + std::to_string(n) + " more tokens" : "hold these retention span minimums";
        const char *limit = kv_.head_share > 0.0f     ? " (the most slots every kv head can be given with these budgets - 1)"
                            : kv_.layer_slots.empty() ? " (kv_budget - 1)"
                                                      : " (the smallest layer budget - 1)";
        return make_error(H2O_ERR_INVALID_ARGUMENT, "cannot " + what + ": " + std::to_string(n_pinned_ + pinning) + " pinned tokens and " +
                                                        std::to_string(reserved) + " slots of span minimums would pass the " +
                                                        std::to_string(holdable_) + limit + " that may be held from eviction");
    }
    return Status::Ok();
}

Status Session::evaluate(const int32_t *tokens, size_t n, Retention retention, size_t *processed) {
    *processed = 0;
    H2O_TRY(check_usable());
    const int64_t reserved = span_reserved();
    H2O_TRY(check_room(n, retention.pinned, reserved));
    // The layer with the fewest slots is the first to evict; with rolling, each layer's ranks
    // count its own cached tokens. A batch that evicts must fit the smallest cell.
    const int64_t min_slots = kv_.min_slots(), max_slots = kv_.max_slots(), min_cell = kv_.min_cell_slots();
    const bool rebalancing = kv_.head_share > 0.0f;
    for (size_t done = 0; done < n;) {
        if (cancel_requested_.load(std::memory_order_relaxed)) {
            if (done > 0) finish_evaluation(tokens[done - 1]);
            return make_error(H2O_ERR_CANCELLED, "cancelled after " + std::to_string(done) + " of " + std::to_string(n) + " tokens");
        }
        // Without eviction a batch may take every free slot. When the batch must evict, it
        // evicts all its victims at once from scores gathered before it, so batches are kept to
        // a quarter of the evictable slots: the rest keep their place by those scores.
        int64_t chunk = std::min<int64_t>(static_cast<int64_t>(n - done), settings_.n_batch);
        const bool evicting = n_cached_ + chunk > min_slots;
        if (evicting && !announced_full_) announce_full();
        // Pins and span minimums beyond the smallest cell's minimum (budgets that move raise the
        // cells to hold them) leave one token at a time.
        const int64_t held_from_eviction = n_pinned_ + reserved;
        if (evicting) {
            chunk = std::max<int64_t>(1, std::min<int64_t>(chunk, (std::max(min_cell, held_from_eviction + 1) - held_from_eviction) / 4));
        }
        // With budgets per kv head, each pool of cells makes room for the batch across its cells
        // first, when the interval schedules it or a cell is smaller than the floor (what the
        // batch needs held from eviction, and room for it: kv_head_budgets.h); until some pool
        // must evict, every cell has room. With rolling, each cell's ranks then follow from what
        // it holds (its fill: cell_held_, cell_slots_).
        const bool cells_differ = rebalancing && evicting, by_cell = cells_differ && kv_.positions_per_kv_head();
        const int64_t floor = held_from_eviction + chunk;
        if (cells_differ && (kv_rebalance_due(kv_.rebalance_interval, n_past_, chunk) || floor > smallest_global_cell())) {
            if (Status st = backend_->kv_store().rebalance_kv(n_past_, static_cast<int>(chunk), static_cast<int>(floor), cell_held_.data(),
                                                              cell_slots_.data());
                !st.ok())
                return backend_failed(st);
        }
        kv_batch_positions(kv_, n_past_, n_cached_, chunk, positions_.data(), by_cell ? cell_held_.data() : nullptr,
                           by_cell ? cell_slots_.data() : nullptr);
        if (Status st = graph_->evaluate(tokens + done, positions_.data(), kv_, static_cast<int>(chunk), n_past_, retention.tag());
            !st.ok()) {
            return backend_failed(st);
        }
        // Every cell took the batch within its region, evicting what did not fit.
        for (size_t c = 0; c < cell_held_.size(); ++c) {
            cell_held_[c] = static_cast<int32_t>(std::min<int64_t>(cell_held_[c] + chunk, cell_slots_[c]));
        }
        n_past_ += chunk;
        n_cached_ = std::min(n_cached_ + chunk, max_slots);
        if (retention.pinned) n_pinned_ += chunk;
        if (retention.span >= 0) spans_[retention.span].n_tokens += chunk;
        done += static_cast<size_t>(chunk);
        *processed = done;
    }
    finish_evaluation(tokens[n - 1]);
    return Status::Ok();
}

h2o_kv_usage Session::kv_usage() const {
    h2o_kv_usage usage{};
    usage.struct_size = sizeof usage;
    // The global layers' largest cells: a model's local layers hold their windows, whatever the stream.
    int capacity = 0;
    for (int l = 0; l < kv_.n_layer; ++l) {
        if (!kv_.is_window_layer(l)) capacity = std::max(capacity, kv_.slots_in(l));
    }
    usage.capacity = static_cast<uint32_t>(capacity);
    usage.n_past = static_cast<uint64_t>(n_past_);
    usage.n_held = static_cast<uint64_t>(std::min<int64_t>(n_cached_, capacity));
    usage.n_evicted = usage.n_past - usage.n_held;
    usage.n_pinned = static_cast<uint64_t>(n_pinned_);
    // Every cell takes tokens until its slots are full, so eviction began when the stream passed
    // the fewest slots of a global cell (evaluate() chunks by the same count).
    usage.evicting_since = n_past_ > kv_.min_slots() ? static_cast<uint64_t>(kv_.min_slots()) : 0;
    usage.evicts = settings_.policy.policy != KvPolicy::Full ? 1 : 0;
    return usage;
}

Status Session::check_uniform_cells(const char *what) const {
    H2O_TRY(check_usable());
    // The session counts one number of held tokens for every cell (n_cached_): evicting from
    // outside the policy keeps it true only where every cell has the same slots and no span
    // holds a minimum.
    bool window_layers = false;
    for (int l = 0; l < kv_.n_layer; ++l) window_layers = window_layers || kv_.is_window_layer(l);
    if (!kv_.layer_slots.empty() || kv_.head_share > 0.0f || window_layers || !spans_.empty()) {
        return make_error(H2O_ERR_UNSUPPORTED, std::string(what) +
                                                   " needs a cache whose cells all have the same slots and no retention spans (no "
                                                   "kv_layer_slope, kv_head_share or sliding-window layers)");
    }
    return Status::Ok();
}

Status Session::evicted_outside(Status st, int64_t n) {
    if (!st.ok()) {
        // Refused before anything changed: the cache is as it was.
        if (st.code == H2O_ERR_INVALID_ARGUMENT || st.code == H2O_ERR_UNSUPPORTED) return st;
        return backend_failed(st);
    }
    n_cached_ -= n;
    return Status::Ok();
}

Status Session::discard_oldest(int64_t keep, int64_t n) {
    H2O_TRY(check_uniform_cells("discarding"));
    if (settings_.policy.policy == KvPolicy::Full) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "a full cache (kv_policy H2O_KV_FULL) keeps every token: nothing may be discarded");
    }
    if (n == 0) return Status::Ok();
    return evicted_outside(backend_->kv_store().discard_kv(n, keep), n);
}

Status Session::evict_tokens(const int64_t *stream_index) {
    H2O_TRY(check_uniform_cells("evicting chosen tokens"));
    if (settings_.policy.policy == KvPolicy::Full) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "a full cache (kv_policy H2O_KV_FULL) keeps every token: nothing may be evicted");
    }
    return evicted_outside(backend_->kv_store().evict_kv_tokens(stream_index), 1);
}

Status Session::kv_attention(int64_t *stream_index, float *attention) {
    H2O_TRY(check_uniform_cells("reading the cache's attention"));
    if (attention && !kv_policy_uses_statistics(settings_.policy.policy)) {
        return make_error(H2O_ERR_INVALID_ARGUMENT,
                          "the attention is gathered only by a policy that reads it (h2o, scissorhands, tova, roco, mean_h2o)");
    }
    if (Status st = backend_->kv_store().download_kv_stream_indices(stream_index); !st.ok()) return backend_failed(st);
    if (!attention) return Status::Ok();
    std::vector<SlotStats> stats(static_cast<size_t>(kv_.total_slots()));
    if (Status st = backend_->kv_store().download_kv_statistics(stats.data()); !st.ok()) return backend_failed(st);
    for (size_t s = 0; s < stats.size(); ++s) attention[s] = stream_index[s] >= 0 ? stats[s].last : 0.0f;
    return Status::Ok();
}

void Session::announce_full() {
    announced_full_ = true;
    h2o_kv_usage usage = kv_usage();
    usage.evicting_since = static_cast<uint64_t>(kv_.min_slots());
    log(H2O_LOG_INFO, "session: the KV cache is full (" + std::to_string(kv_.min_slots()) +
                          " slots per kv head): older tokens are now evicted by the " + kv_policy_name(settings_.policy.policy) +
                          " policy" + (settings_.rolling ? ", positions rolling" : ""));
    if (event_callback_) event_callback_(H2O_EVENT_KV_FULL, &usage, event_user_data_);
}

void Session::clear_cell_fill() {
    for (size_t c = 0; c < cell_held_.size(); ++c) {
        cell_held_[c] = 0;
        cell_slots_[c] = kv_.slots_in(static_cast<int>(c / static_cast<size_t>(kv_.n_head_kv)));
    }
}

int64_t Session::smallest_global_cell() const {
    int64_t smallest = INT64_MAX;
    for (size_t c = 0; c < cell_slots_.size(); ++c) {
        if (!kv_.is_window_layer(static_cast<int>(c / static_cast<size_t>(kv_.n_head_kv))))
            smallest = std::min<int64_t>(smallest, cell_slots_[c]);
    }
    return smallest;
}

Status Session::read_cell_fill() {
    if (cell_held_.empty()) return Status::Ok();
    std::vector<int64_t> stream(static_cast<size_t>(kv_.total_slots()));
    H2O_TRY(backend_->kv_store().download_kv_cell_slots(cell_slots_.data()));
    H2O_TRY(backend_->kv_store().download_kv_stream_indices(stream.data()));
    for (size_t c = 0, at = 0; c < cell_held_.size(); ++c) {
        cell_held_[c] = 0;
        for (int s = 0; s < cell_slots_[c]; ++s, ++at) cell_held_[c] += stream[at] >= 0 ? 1 : 0;
    }
    return Status::Ok();
}

void Session::finish_evaluation(int32_t last_token) {
    last_token_ = last_token;
    has_logits_ = true;
    logits_on_host_ = false;
}

Status Session::fetch_logits() {
    H2O_TRY(check_usable());
    if (!has_logits_ || logits_on_host_) return Status::Ok();
    if (Status st = graph_->download_logits(logits_.data()); !st.ok()) return backend_failed(st);
    logits_on_host_ = true;
    return Status::Ok();
}

Status Session::decode(const int32_t *tokens, size_t n, Retention retention) {
    H2O_TRY(feed(tokens, n, retention));
    // The work is done, and any device error reported, before the call returns.
    if (Status st = backend_->synchronize(); !st.ok()) return backend_failed(st);
    return Status::Ok();
}

Status Session::feed(const int32_t *tokens, size_t n, Retention retention) {
    H2O_TRY(check_usable());
    const int32_t n_vocab = model_.shape().n_vocab;
    for (size_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return make_error(H2O_ERR_INVALID_ARGUMENT, "token " + std::to_string(i) + " has id " + std::to_string(tokens[i]) +
                                                            ", outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
        }
    }
    // Check before feeding the pending token, so that a refused call changes nothing.
    const int64_t reserved = span_reserved();
    H2O_TRY(check_feed_room(n, retention.pinned, reserved));
    size_t processed = 0;
    if (pending_token_ >= 0) {
        const int32_t pending = pending_token_;
        H2O_TRY(evaluate(&pending, 1, Retention{}, &processed));
        pending_token_ = -1;  // already in the history: it was pushed when it was sampled
    }
    if (n == 0) return Status::Ok();
    // A fresh session may start from a state the model's prefix cache holds for its first tokens
    // (not once it has a retention span: the cached state has none, or another session's).
    PrefixCache &cache = model_.prefix_cache();
    const bool fresh = n_past_ == 0 && cache.enabled() && spans_.empty();
    const bool pinned = retention.pinned;
    size_t reused = 0;
    if (fresh) {
        size_t matched = 0;
        const auto state = cache.find(prefix_cache_key(), pinned, tokens, n, &matched);
        if (state && load_state(state->data(), state->size()).ok()) reused = matched;  // else: processed below
    }
    Status st = Status::Ok();
    if (reused < n) st = evaluate(tokens + reused, n - reused, retention, &processed);
    for (size_t i = 0; i < processed; ++i) history_.push(tokens[reused + i]);
    if (fresh && reused < n && st.ok()) {
        std::vector<uint8_t> state;
        if (save_state(&state).ok()) cache.insert(prefix_cache_key(), pinned, tokens, n, std::move(state));
    }
    return st;
}

Status Session::tokenize_text(std::string_view text, bool special) {
    const Tokenizer &tok = model_.tokenizer();
    const bool fresh = n_past_ == 0 && pending_token_ < 0;
    const bool add_bos = fresh && tok.add_bos();
    return special ? tok.encode_special(text, add_bos, &prompt_tokens_) : tok.encode(text, add_bos, &prompt_tokens_);
}

Status Session::add_text(std::string_view text, bool pinned, bool special) {
    H2O_TRY(tokenize_text(text, special));
    if (prompt_tokens_.empty()) return Status::Ok();
    return decode(prompt_tokens_.data(), prompt_tokens_.size(), Retention{pinned});
}

Status Session::add_span_text(uint32_t span_id, float min_share, std::string_view text, bool pinned, bool special) {
    H2O_TRY(check_usable());
    if (span_id == 0) return make_error(H2O_ERR_INVALID_ARGUMENT, "retention span id 0 is reserved (no span)");
    if (!(min_share >= 0.0f && min_share <= 1.0f)) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "a retention span's min_share must lie in [0, 1], not " + number_text(min_share));
    }
    int index = span_index(span_id);
    if (index < 0 && spans_.size() == KV_MAX_SPANS) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "a session holds at most " + std::to_string(KV_MAX_SPANS) + " retention spans");
    }
    if (settings_.policy.policy == KvPolicy::Full && min_share > 0.0f) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "retention span minimums need an evicting policy; this session's is 'full'");
    }
    H2O_TRY(tokenize_text(text, special));
    // Check everything before anything changes: the new minimum with the others and the pins.
    const int32_t min_tokens = span_minimum_tokens(min_share, kv_);
    const int64_t reserved = span_reserved() - (index >= 0 ? spans_[index].min_tokens : 0) + min_tokens;
    H2O_TRY(check_feed_room(prompt_tokens_.size(), pinned, reserved));
    if (index < 0) {
        index = static_cast<int>(spans_.size());
        spans_.push_back(RetentionSpan{span_id, min_share, min_tokens, 0});
    } else {
        spans_[index].min_share = min_share;
        spans_[index].min_tokens = min_tokens;
    }
    H2O_TRY(apply_span_minimums());
    if (prompt_tokens_.empty()) return Status::Ok();
    return decode(prompt_tokens_.data(), prompt_tokens_.size(), Retention{pinned, index});
}

Status Session::span_report(uint32_t span_id, SpanReport *out) {
    H2O_TRY(check_usable());
    int index = span_index(span_id);
    if (index < 0) return make_error(H2O_ERR_INVALID_ARGUMENT, "this session has no retention span with id " + std::to_string(span_id));
    const ModelShape &shape = model_.shape();
    const size_t n_cells = static_cast<size_t>(shape.n_layer) * shape.n_head_kv;
    // The whole cache's tags, stream indices and statistics, read for this report only.
    std::vector<uint8_t> tags(static_cast<size_t>(kv_.total_slots()));
    std::vector<int64_t> stream(tags.size());
    std::vector<SlotStats> stats;
    const bool has_stats = kv_policy_uses_statistics(settings_.policy.policy);
    if (Status st = backend_->kv_store().download_kv_tags(tags.data()); !st.ok()) return backend_failed(st);
    if (Status st = backend_->kv_store().download_kv_stream_indices(stream.data()); !st.ok()) return backend_failed(st);
    if (has_stats) {
        stats.resize(tags.size());
        if (Status st = backend_->kv_store().download_kv_statistics(stats.data()); !st.ok()) return backend_failed(st);
    }
    SpanReport report;
    report.span = spans_[index];
    report.kept_min = INT32_MAX;
    double kept_total = 0.0, span_attention = 0.0, all_attention = 0.0;
    std::vector<int32_t> cell_slots(n_cells);
    if (Status st = backend_->kv_store().download_kv_cell_slots(cell_slots.data()); !st.ok()) return backend_failed(st);
    for (size_t cell = 0, at = 0; cell < n_cells; ++cell) {
        int32_t kept = 0;
        for (int s = 0; s < cell_slots[cell]; ++s, ++at) {
            if (stream[at] < 0) continue;
            const bool mine = kv_tag_span(tags[at]) == static_cast<uint32_t>(index + 1);
            kept += mine ? 1 : 0;
            if (has_stats) {
                all_attention += stats[at].accumulated;
                if (mine) span_attention += stats[at].accumulated;
            }
        }
        report.kept_min = std::min(report.kept_min, kept);
        report.kept_max = std::max(report.kept_max, kept);
        kept_total += kept;
    }
    report.kept_mean = kept_total / static_cast<double>(n_cells);
    if (has_stats) report.attention_share = all_attention > 0.0 ? span_attention / all_attention : 0.0;
    *out = report;
    return Status::Ok();
}

namespace {

// A generation's grammar as the sampler's filter (sampler.h). Right after BOS a sentencepiece
// piece loses its leading space, which the walk over the sorted pieces does not know: that one
// token is found by checking tokens one at a time.
class GrammarFilter final : public TokenFilter {
public:
    GrammarFilter(const GrammarMatcher &matcher, bool after_bos, int32_t n_vocab) : m_(matcher), after_bos_(after_bos), n_vocab_(n_vocab) {}
    bool allows(int32_t token) const override { return m_.allows(token, after_bos_); }
    bool mask(std::vector<uint8_t> *allowed, size_t budget) const override {
        if (!after_bos_) return m_.mask(allowed, budget);
        if (budget != 0) return false;
        allowed->assign(static_cast<size_t>(n_vocab_), 0);
        for (int32_t t = 0; t < n_vocab_; ++t) (*allowed)[static_cast<size_t>(t)] = m_.allows(t, true);
        return true;
    }

private:
    const GrammarMatcher &m_;
    bool after_bos_;
    int32_t n_vocab_;
};

}  // namespace

Status Session::begin_generation(std::string_view prompt, const GenerateSettings &settings) {
    const Tokenizer &tok = model_.tokenizer();
    const auto start = std::chrono::steady_clock::now();
    generation_.active = false;
    stats_ = h2o_generate_stats{};
    stats_.struct_size = sizeof(stats_);

    // The prompt: the pending token of the previous call (if any), BOS for a fresh session when
    // the vocabulary asks for it (Qwen's does not), text.
    const bool fresh = n_past_ == 0 && pending_token_ < 0;
    H2O_TRY(tok.encode(prompt, fresh && tok.add_bos(), &prompt_tokens_));
    if (prompt_tokens_.empty() && !has_logits_ && pending_token_ < 0) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "nothing to generate from: the prompt is empty and the vocabulary adds no BOS token");
    }
    H2O_TRY(decode(prompt_tokens_.data(), prompt_tokens_.size()));
    stats_.n_prompt_tokens = static_cast<uint32_t>(prompt_tokens_.size());
    stats_.prompt_seconds = seconds_since(start);
    stats_.n_past = static_cast<uint64_t>(n_past_);
    generation_.settings = settings;
    generation_.held.clear();
    generation_.grammar.reset();
    if (settings.grammar) {
        std::vector<int32_t> spelled = TokenSurfaces::spelled_controls(tok, *settings.grammar);
        if (!token_surfaces_ || spelled != surfaces_spelled_) {
            token_surfaces_ = TokenSurfaces::build(tok, spelled);
            surfaces_spelled_ = std::move(spelled);
        }
        generation_.grammar = std::make_unique<GrammarMatcher>(settings.grammar, token_surfaces_);
    }
    generation_.start = std::chrono::steady_clock::now();
    generation_.active = true;
    return Status::Ok();
}

void Session::finish_generation(h2o_stop_reason reason, std::string *piece) {
    stats_.stop_reason = reason;
    // Whatever is still held back is final now (an unfinished character becomes U+FFFD).
    take_complete_utf8(&generation_.held, piece, /*flush=*/true);
    generation_.active = false;
    stats_.generate_seconds = seconds_since(generation_.start);
    stats_.n_past = static_cast<uint64_t>(n_past_);
}

Status Session::next_piece(std::string *piece, h2o_stop_reason *reason) {
    piece->clear();
    *reason = H2O_STOP_NONE;
    if (!generation_.active) return make_error(H2O_ERR_INVALID_ARGUMENT, "no generation in progress (call h2o_generate_begin first)");
    const Tokenizer &tok = model_.tokenizer();
    const GenerateSettings &settings = generation_.settings;
    std::string &held = generation_.held;
    while (piece->empty()) {
        if (cancel_requested_.load(std::memory_order_relaxed)) {
            generation_.active = false;
            return make_error(H2O_ERR_CANCELLED, "generation was cancelled after " + std::to_string(stats_.n_generated_tokens) + " tokens");
        }
        if (stats_.n_generated_tokens >= settings.max_tokens) {
            finish_generation(*reason = H2O_STOP_MAX_TOKENS, piece);
            return Status::Ok();
        }
        GrammarMatcher *grammar = generation_.grammar.get();
        if (grammar && grammar->must_end()) {
            finish_generation(*reason = H2O_STOP_GRAMMAR, piece);
            return Status::Ok();
        }
        if (pending_token_ >= 0) {
            // Feeds the token sampled before. On failure (cancel, full context) the generation
            // ends; the token stays pending, so the conversation can continue later.
            if (Status st = feed(nullptr, 0, Retention{}); !st.ok()) {
                generation_.active = false;
                stats_.generate_seconds = seconds_since(generation_.start);
                stats_.n_past = static_cast<uint64_t>(n_past_);
                return st;
            }
        }
        // Greedy sampling without a penalty takes the argmax where the logits are, reading back
        // 4 bytes (the same token: Sampler::sample's greedy choice is the first maximum too).
        const SamplerSettings &sampling = settings.sampler;
        const bool greedy_on_backend = sampling.temperature <= 0.0f && (sampling.repeat_penalty == 1.0f || sampling.repeat_last_n == 0) &&
                                       !logits_on_host_ && !grammar && sampling.logit_bias.empty();
        int32_t token = 0;
        Status fetched = greedy_on_backend ? graph_->greedy_token(&token) : fetch_logits();
        if (!fetched.ok()) {
            generation_.active = false;
            return greedy_on_backend ? backend_failed(fetched) : fetched;
        }
        const bool after_bos = last_token_ == tok.bos();
        if (!greedy_on_backend && grammar) {
            const GrammarFilter filter(*grammar, after_bos, tok.n_vocab());
            token = sampler_.sample(logits_.data(), sampling, history_, &filter);
        } else if (!greedy_on_backend) {
            token = sampler_.sample(logits_.data(), sampling, history_);
        }
        if (token < 0 || (grammar && !grammar->failure().ok())) {
            generation_.active = false;
            if (grammar && !grammar->failure().ok()) return grammar->failure();
            return make_error(H2O_ERR_INVALID_ARGUMENT, "the grammar allows no token of this vocabulary here (after " +
                                                            std::to_string(stats_.n_generated_tokens) + " generated tokens)");
        }
        if (grammar) {
            if (Status st = grammar->accept(token, after_bos); !st.ok()) {
                generation_.active = false;
                return st;
            }
        }
        ++stats_.n_generated_tokens;
        history_.push(token);
        pending_token_ = token;
        if (settings.stop_at_eos && tok.is_end_of_generation(token)) {
            finish_generation(*reason = H2O_STOP_EOS, piece);
            return Status::Ok();
        }
        // A control token a grammar asked for by its spelling is delivered as that spelling.
        if (grammar && tok.is_control(token))
            held += tok.piece(token);
        else
            tok.append_piece(token, last_token_ == tok.bos(), &held);

        if (!settings.stop_strings.empty()) {
            size_t found = std::string::npos;
            for (const std::string &stop : settings.stop_strings) found = std::min(found, held.find(stop));
            if (found != std::string::npos) {
                held.resize(found);
                finish_generation(*reason = H2O_STOP_STRING, piece);
                return Status::Ok();
            }
        }
        const size_t hold = stop_prefix_overlap(held, settings.stop_strings);
        std::string kept = held.substr(held.size() - hold);
        held.resize(held.size() - hold);
        take_complete_utf8(&held, piece, /*flush=*/false);
        held += kept;
    }
    return Status::Ok();
}

Status Session::generate(std::string_view prompt, const GenerateSettings &settings, TextSink sink, void *user_data) {
    H2O_TRY(begin_generation(prompt, settings));
    std::string piece;
    h2o_stop_reason reason = H2O_STOP_NONE;
    while (reason == H2O_STOP_NONE) {
        Status st = next_piece(&piece, &reason);
        if (!st.ok()) {
            // Deliver what was held back before the failure, then report it.
            take_complete_utf8(&generation_.held, &piece, /*flush=*/true);
            if (sink && !piece.empty()) sink(piece.data(), piece.size(), user_data);
            return st;
        }
        if (sink && !piece.empty() && sink(piece.data(), piece.size(), user_data) && reason == H2O_STOP_NONE) {
            // The caller asked to stop: text held back for a possible stop string is dropped.
            generation_.held.clear();
            finish_generation(reason = H2O_STOP_CALLBACK, &piece);
        }
    }
    return Status::Ok();
}

}  // namespace h2o
