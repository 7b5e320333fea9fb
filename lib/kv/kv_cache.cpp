#include "kv_cache.h"

#include <algorithm>
#include <cmath>
#include <new>

#include "kv_victim_rules.h"
#include "rotary.h"

namespace h2o {

std::vector<float> kv_rotate_back_table(const RotarySpec &rope, int max_shift) {
    const int n_pairs = rope.pairs();
    const std::vector<double> inv_freq = rope.inv_freqs();
    std::vector<float> cos_sin((static_cast<size_t>(max_shift) + 1) * n_pairs * 2, 0.0f);
    for (int shift = 1; shift <= max_shift; ++shift) {
        float *row = cos_sin.data() + static_cast<size_t>(shift) * n_pairs * 2;
        for (int i = 0; i < n_pairs; ++i) rotary_cos_sin(-shift, inv_freq[i], &row[2 * i], &row[2 * i + 1]);
    }
    return cos_sin;
}

Status KvCache::init(const KvConfig &config, int threads) { return init_with(config, threads, true); }

Status KvCache::init_bookkeeping(const KvConfig &config) { return init_with(config, 1, false); }

Status KvCache::init_with(const KvConfig &config, int threads, bool rows) {
    config_ = config;
    key_format_ = kv_key_format(config.type);
    value_format_ = kv_value_format(config.type);
    rows_elsewhere_ = !rows;
    H2O_TRY(image_.allocate(config, rows));
    // A cell holds at most max_cell_slots (max_slots when the heads' budgets stay put).
    max_cell_slots_ = config.max_cell_slots();
    const auto max_slots = static_cast<size_t>(max_cell_slots_);
    try {
        layer_first_slot_.resize(static_cast<size_t>(config.n_layer) + 1);
        layer_policy_.resize(static_cast<size_t>(config.n_layer));
        for (int l = 0; l <= config.n_layer; ++l) layer_first_slot_[l] = config.first_slot_of(l);
        for (int l = 0; l < config.n_layer; ++l) layer_policy_[l] = config.policy_in(l);
        // The largest pool of cells whose slots move together (kv_head_budgets.h).
        const bool rebalancing = config.head_share > 0.0f;
        const auto pool_slots = static_cast<size_t>(config.max_pool_slots()), pool_cells = static_cast<size_t>(config.max_pool_cells());
        rebalance_.candidates.assign(rebalancing ? pool_slots : 0, 0);
        rebalance_.destinations.assign(rebalancing ? pool_slots : 0, 0);
        rebalance_.priority.assign(rebalancing ? pool_slots : 0, 0.0f);
        rebalance_.span_held.assign(rebalancing ? pool_cells * KV_MAX_SPANS : 0, 0);
        rebalance_.kept.assign(rebalancing ? pool_cells : 0, 0);
        rebalance_.slots.assign(rebalancing ? pool_cells : 0, 0);
        scratch_.assign(static_cast<size_t>(std::max(1, threads)), EvictionScratch{});
        for (EvictionScratch &scratch : scratch_) {
            scratch.candidates.assign(max_slots, 0);
            scratch.priority.assign(max_slots, 0.0f);
            scratch.evicted.assign(max_slots, 0);
            // A key as floats, then (halves pairing) its rotated pairs side by side.
            scratch.key.assign(static_cast<size_t>(config.head_dim + config.rope.dims), 0.0f);
            const bool scores_keys = kv_policy_scores_keys(static_cast<uint32_t>(config.policy.policy));
            const bool expects = config.policy.policy == KvPolicy::ExpectedAttention;
            scratch.row.assign(scores_keys ? static_cast<size_t>(config.head_dim) : 0, 0.0f);
            scratch.anchor.assign(scores_keys ? static_cast<size_t>(config.head_dim) : 0, 0.0f);
            scratch.logits.assign(expects ? static_cast<size_t>(config.query_group) * max_slots : 0, 0.0f);
            scratch.rotation.assign(expects ? static_cast<size_t>(config.rope.dims) : 0, 0.0f);
        }
        if (config.policy.policy == KvPolicy::ExpectedAttention) rope_inv_freq_ = config.rope.inv_freqs();
        // A rebalancing rolls back or moves each slot at most once.
        row_edits_ = KvRowEdits{};
        if (rows_elsewhere_) {
            row_edits_.rotations.reserve(static_cast<size_t>(config.total_slots()));
            row_edits_.moves.reserve(static_cast<size_t>(config.total_slots()));
        }
    } catch (const std::bad_alloc &) {
        return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's working memory");
    }
    // One eviction of k tokens moves kept keys back by 1..k <= max_slots positions: the rotations
    // for every such shift are computed once here. Evaluating them per key instead (a double
    // sine and cosine per pair) cost rolling sessions 7x their decoding speed at budget 256.
    for (int table = 0; table < 2; ++table) {
        const bool wanted = config.rolling && (table == 0 || !config.layer_window.empty());
        try {
            rotate_back_cos_sin_[table] =
                wanted ? kv_rotate_back_table(table == 0 ? config.rope : config.local_rope, max_cell_slots_) : std::vector<float>{};
        } catch (const std::bad_alloc &) {
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's rotation table");
        }
    }
    return Status::Ok();
}

void KvCache::clear() { image_.clear(config_); }

size_t KvCache::planned_bytes(const KvConfig &config) {
    const auto slots = static_cast<size_t>(config.total_slots());
    const size_t row_bytes =
        kv_row_bytes(kv_key_format(config.type), config.head_dim) + kv_row_bytes(kv_value_format(config.type), config.head_dim);
    const size_t stats = kv_policy_uses_statistics(config.policy.policy) ? sizeof(SlotStats) : 0;
    const size_t query_stats = static_cast<size_t>(config.n_layer) * config.n_head_kv * kv_query_stats_floats(config) * sizeof(float);
    // Per slot: key and value rows, stream index, position, tag, free-list entry, statistics;
    // when the heads' budgets move, rebalancing's candidates, destinations and priorities of a
    // pool, and per cell of a pool its kept count, new size and span counts.
    const size_t rebalancing = config.head_share > 0.0f
                                   ? static_cast<size_t>(config.max_pool_slots()) * (2 * sizeof(int64_t) + sizeof(float)) +
                                         static_cast<size_t>(config.max_pool_cells()) * (2 + KV_MAX_SPANS) * sizeof(int32_t)
                                   : 0;
    return slots * (row_bytes + sizeof(int64_t) + sizeof(int32_t) + sizeof(uint8_t) + sizeof(int32_t) + stats) + rebalancing + query_stats;
}

size_t KvCache::bytes() const {
    if (!rows_elsewhere_) return planned_bytes(config_);
    const auto slots = static_cast<size_t>(config_.total_slots());
    const size_t rows = slots * (image_.key_row_bytes + image_.value_row_bytes);
    return planned_bytes(config_) - rows + slots * (sizeof(KvRowEdits::Rotation) + sizeof(KvRowEdits::Move));
}

KvCache::CellView KvCache::cell(int layer, int kv_head) {
    const size_t base = slot_base(layer, kv_head);
    // Null rows when they live elsewhere (init_bookkeeping).
    return CellView{rows_elsewhere_ ? nullptr : image_.keys.data() + base * image_.key_row_bytes,
                    rows_elsewhere_ ? nullptr : image_.values.data() + base * image_.value_row_bytes,
                    image_.stream_index.data() + base,
                    image_.position.data() + base,
                    image_.tags.data() + base,
                    image_.stats.empty() ? nullptr : image_.stats.data() + base};
}

int KvCache::free_slots(int layer, int kv_head) const {
    const size_t h = cell_index(layer, kv_head);
    return image_.cell_slots[h] - image_.used[h] + image_.free_count[h];
}

uint64_t KvCache::next_random() {
    // xorshift64*: deterministic for a given seed and sequence of evictions (kv_victim_rules.h).
    return kv_next_random(&image_.random_state);
}

void KvCache::rotate_back(int layer, uint8_t *stored_key, int shift, float *key) {
    const int n_pairs = config_.rope.pairs();
    const bool adjacent = config_.rope.pairing == RotaryPairing::Adjacent;
    const std::vector<float> &table = rotate_back_cos_sin_[config_.is_window_layer(layer) ? 1 : 0];
    const float *cos_sin = table.data() + static_cast<size_t>(shift) * n_pairs * 2;
    if (adjacent && key_format_ == KvRowFormat::F16 && rotation_kernels_.rotate_half_pairs) {
        // F16 rows are 2-byte aligned; the rest of the row (partial rotation) is left as it is.
        rotation_kernels_.rotate_half_pairs(reinterpret_cast<uint16_t *>(stored_key), cos_sin, n_pairs);
        return;
    }
    // Other formats are decoded, rotated and stored again (quantized keys: one more rounding per
    // eviction; F16 rows round back to the bits the kernel above gives).
    kv_load_row(key_format_, stored_key, config_.head_dim, key);
    // The pairs side by side, as the kernels rotate them: the key itself when they are adjacent,
    // else gathered after it (each pair is rotated alone, so the bits are rotate_head_pair's).
    float *pairs = key;
    if (!adjacent) {
        pairs = key + config_.head_dim;
        for (int i = 0; i < n_pairs; ++i) {
            pairs[2 * i] = key[i];
            pairs[2 * i + 1] = key[i + n_pairs];
        }
    }
    if (rotation_kernels_.rotate_pairs) {
        rotation_kernels_.rotate_pairs(pairs, cos_sin, n_pairs);
    } else {
        for (int i = 0; i < n_pairs; ++i) rotate_pair(&pairs[2 * i], &pairs[2 * i + 1], cos_sin[2 * i], cos_sin[2 * i + 1]);
    }
    if (!adjacent) {
        for (int i = 0; i < n_pairs; ++i) {
            key[i] = pairs[2 * i];
            key[i + n_pairs] = pairs[2 * i + 1];
        }
    }
    kv_store_row(key_format_, key, config_.head_dim, stored_key);
}

void KvCache::set_span_minimums(const int32_t *minimums) { std::copy(minimums, minimums + KV_MAX_SPANS, image_.span_minimum); }

void KvCache::count_span_tokens(const CellView &v, int used, EvictionScratch &scratch) {
    std::fill(scratch.span_held, scratch.span_held + KV_MAX_SPANS, 0);
    for (int s = 0; s < used; ++s) {
        const uint32_t span = kv_tag_span(v.tag[s]);
        if (v.stream_index[s] >= 0 && span != 0) ++scratch.span_held[span - 1];
    }
}

bool KvCache::take_if_span_allows(const CellView &v, int s, EvictionScratch &scratch) const {
    const uint32_t span = kv_tag_span(v.tag[s]);
    if (span == 0) return true;
    int32_t &held = scratch.span_held[span - 1];
    if (!kv_span_allows_eviction(static_cast<uint32_t>(held), static_cast<uint32_t>(image_.span_minimum[span - 1]))) return false;
    --held;
    return true;
}

int KvCache::make_room(int layer, int kv_head, int n, int64_t next_index, int thread) {
    const int needed = n - free_slots(layer, kv_head);
    if (needed <= 0) return 0;
    CellView v = cell(layer, kv_head);
    EvictionScratch &scratch = scratch_[thread];
    std::vector<int32_t> &candidates = scratch.candidates;
    const KvPolicyConfig &policy = layer_policy_[static_cast<size_t>(layer)];
    const int used = image_.used[cell_index(layer, kv_head)];
    // The recent window counts the incoming tokens: protect the newest (recent - n) cached ones.
    const int64_t recent_from = kv_recent_from(policy, next_index, n);

    int n_candidates = 0;
    for (int s = 0; s < used; ++s) {
        const int64_t index = v.stream_index[s];
        if (!kv_slot_evictable(index, kv_tag_pinned(v.tag[s]), recent_from, static_cast<uint32_t>(policy.sinks))) continue;
        candidates[n_candidates++] = s;
    }
    // Victims are taken from the candidates in the policy's order, passing over tokens whose
    // span is down to its minimum; they are gathered at the front of candidates.
    count_span_tokens(v, used, scratch);
    int n_victims = 0;
    if (policy.policy == KvPolicy::Random) {
        // A partial Fisher-Yates shuffle draws the candidates in random order, one draw each
        // until enough are taken or none is left.
        for (int i = 0; i < n_candidates && n_victims < needed; ++i) {
            const int j = i + static_cast<int>(kv_random_index(next_random(), static_cast<uint32_t>(n_candidates - i)));
            std::swap(candidates[i], candidates[j]);
            if (take_if_span_allows(v, candidates[i], scratch)) candidates[n_victims++] = candidates[i];
        }
    } else {
        const int64_t stale_before = kv_stale_before(policy, next_index, n);
        const bool by_proxy = kv_ranks_by_proxy(policy, n);
        const auto cell = static_cast<uint32_t>(cell_index(layer, kv_head));
        // Each candidate's priority once, by slot, rather than twice per comparison of the sort.
        std::vector<float> &priority = scratch.priority;
        if (kv_policy_scores_keys(static_cast<uint32_t>(policy.policy))) {
            score_keys(layer, kv_head, used, scratch);
            for (int i = 0; i < n_candidates; ++i) {
                const int32_t s = candidates[i];
                priority[s] = kv_scored_priority(priority[s], v.stream_index[s] < stale_before);
            }
        } else {
            for (int i = 0; i < n_candidates; ++i) {
                const int32_t s = candidates[i];
                priority[s] = kv_batch_victim_priority(policy, by_proxy, slot_stats(v, s), v.stream_index[s], stale_before, cell);
            }
        }
        auto before = [&](int32_t a, int32_t b) {
            return kv_victim_before(priority[a], v.stream_index[a], priority[b], v.stream_index[b]);
        };
        // Span minimums may pass over any number of candidates; without them the first `needed`
        // in order are the victims.
        const int ranked = image_.any_span_minimum() ? n_candidates : std::min(needed, n_candidates);
        std::partial_sort(candidates.begin(), candidates.begin() + ranked, candidates.begin() + n_candidates, before);
        for (int i = 0; i < ranked && n_victims < needed; ++i) {
            if (take_if_span_allows(v, candidates[i], scratch)) candidates[n_victims++] = candidates[i];
        }
    }
    if (n_victims < needed) {
        // Everything evictable is protected by the windows: the policy's choice is dropped and
        // the oldest unpinned tokens go, span minimums still kept.
        n_candidates = 0;
        for (int s = 0; s < used; ++s) {
            if (kv_slot_evictable_by_age(v.stream_index[s], kv_tag_pinned(v.tag[s]))) candidates[n_candidates++] = s;
        }
        std::sort(candidates.begin(), candidates.begin() + n_candidates,
                  [&](int32_t a, int32_t b) { return kv_index_less(v.stream_index[a], v.stream_index[b]); });
        count_span_tokens(v, used, scratch);
        n_victims = 0;
        for (int i = 0; i < n_candidates && n_victims < needed; ++i) {
            if (take_if_span_allows(v, candidates[i], scratch)) candidates[n_victims++] = candidates[i];
        }
    }

    free_victims(layer, kv_head, v, used, n_victims, scratch);
    return n_victims;
}

void KvCache::free_victims(int layer, int kv_head, const CellView &v, int used, int n_victims, EvictionScratch &scratch) {
    const size_t h = cell_index(layer, kv_head);
    int32_t *free_list = image_.free_list.data() + slot_base(layer, kv_head);
    for (int i = 0; i < n_victims; ++i) {
        const int s = scratch.candidates[i];
        scratch.evicted[i] = v.stream_index[s];
        v.stream_index[s] = -1;
        free_list[image_.free_count[h]++] = s;
    }
    if (config_.rolling && n_victims > 0) roll_back_kept(layer, v, used, scratch.evicted.data(), n_victims, scratch.key.data());
}

int KvCache::discardable(int layer, int kv_head, int64_t keep) const {
    const size_t h = cell_index(layer, kv_head), base = slot_base(layer, kv_head);
    int count = 0;
    for (int s = 0; s < image_.used[h]; ++s) {
        const int64_t index = image_.stream_index[base + s];
        count += kv_slot_evictable_by_age(index, kv_tag_pinned(image_.tags[base + s])) && index >= keep;
    }
    return count;
}

void KvCache::discard_oldest(int layer, int kv_head, int n, int64_t keep) {
    CellView v = cell(layer, kv_head);
    EvictionScratch &scratch = scratch_[0];
    std::vector<int32_t> &candidates = scratch.candidates;
    const int used = image_.used[cell_index(layer, kv_head)];
    int n_candidates = 0;
    for (int s = 0; s < used; ++s) {
        const int64_t index = v.stream_index[s];
        if (kv_slot_evictable_by_age(index, kv_tag_pinned(v.tag[s])) && index >= keep) candidates[n_candidates++] = s;
    }
    const int n_victims = std::min(n, n_candidates);
    std::partial_sort(candidates.begin(), candidates.begin() + n_victims, candidates.begin() + n_candidates,
                      [&](int32_t a, int32_t b) { return kv_index_less(v.stream_index[a], v.stream_index[b]); });
    free_victims(layer, kv_head, v, used, n_victims, scratch);
}

int KvCache::unpinned_slot_of(int layer, int kv_head, int64_t stream_index) const {
    const size_t h = cell_index(layer, kv_head), base = slot_base(layer, kv_head);
    for (int s = 0; s < image_.used[h]; ++s) {
        if (image_.stream_index[base + s] == stream_index && stream_index >= 0) return kv_tag_pinned(image_.tags[base + s]) ? -1 : s;
    }
    return -1;
}

void KvCache::evict_slot(int layer, int kv_head, int slot) {
    EvictionScratch &scratch = scratch_[0];
    scratch.candidates[0] = slot;
    free_victims(layer, kv_head, cell(layer, kv_head), image_.used[cell_index(layer, kv_head)], 1, scratch);
}

void KvCache::roll_back_kept(int layer, const CellView &v, int used, int64_t *evicted, int n_evicted, float *key_scratch) {
    std::sort(evicted, evicted + n_evicted);
    for (int s = 0; s < used; ++s) {
        if (v.stream_index[s] < 0) continue;
        const int shift = static_cast<int>(std::lower_bound(evicted, evicted + n_evicted, v.stream_index[s]) - evicted);
        if (shift == 0) continue;
        v.position[s] -= shift;
        if (rows_elsewhere_) {
            row_edits_.rotations.push_back({v.stream_index + s - image_.stream_index.data(), shift});
        } else {
            rotate_back(layer, v.keys + static_cast<size_t>(s) * image_.key_row_bytes, shift, key_scratch);
        }
    }
}

void KvCache::cell_fill(int32_t *held, int32_t *slots) const {
    for (size_t c = 0; c < image_.used.size(); ++c) {
        if (held) held[c] = image_.used[c] - image_.free_count[c];
        if (slots) slots[c] = image_.cell_slots[c];
    }
}

void KvCache::save(ByteWriter &out) const { save_kv_image(config_, image_, out); }

Status KvCache::load(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) {
    return load_kv_image(config_, image_, in, n_past, n_cached, n_pinned, n_spans);
}

int KvCache::claim_slot(int layer, int kv_head, int64_t stream_index, int32_t position, uint8_t tag) {
    const size_t h = cell_index(layer, kv_head);
    const int slot = image_.free_count[h] > 0 ? image_.free_list[slot_base(layer, kv_head) + --image_.free_count[h]] : image_.used[h]++;
    const size_t at = slot_base(layer, kv_head) + slot;
    image_.stream_index[at] = stream_index;
    image_.position[at] = position;
    image_.tags[at] = tag;
    if (!image_.stats.empty()) image_.stats[at] = kv_stats_zero();
    return slot;
}

}  // namespace h2o
