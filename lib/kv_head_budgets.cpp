// KvCache::rebalance_heads: the rule of kv_head_budgets.h.
#include "kv_head_budgets.h"

#include <algorithm>
#include <cstring>

#include "kv_cache.h"
#include "kv_victim_rules.h"

namespace h2o {

void KvCache::rebalance_heads(int64_t next_index, int incoming) {
    if (config_.head_share <= 0.0f || !kv_policy_uses_statistics(config_.policy.policy)) return;
    for (int layer = 0; layer < config_.n_layer; ++layer) rebalance_layer(layer, next_index, incoming);
}

void KvCache::rebalance_layer(int layer, int64_t next_index, int incoming) {
    const int n_kv = config_.n_head_kv;
    const int64_t layer_first = layer_first_slot_[static_cast<size_t>(layer)];
    const int64_t pool = static_cast<int64_t>(n_kv) * config_.slots_in(layer);
    int64_t held = 0;
    for (int h = 0; h < n_kv; ++h) held += used_[head_index(layer, h)] - free_count_[head_index(layer, h)];
    const int64_t needed = held + static_cast<int64_t>(n_kv) * incoming - pool;
    if (needed <= 0) return;  // every cell can take the coming tokens: regions stay as they are

    // Candidates of every cell, by their offset in the layer's slots.
    const KvPolicyConfig &policy = layer_policy_[static_cast<size_t>(layer)];
    const int64_t recent_from = kv_recent_from(policy, next_index, incoming);
    const int64_t stale_before = kv_stale_before(policy, next_index, incoming);
    std::vector<int64_t> &candidates = rebalance_.candidates;
    std::vector<float> &priority = rebalance_.priority;
    int32_t *span_held_by_cell = rebalance_.span_held.data();  // [kv head][span]: tokens held
    std::fill(rebalance_.span_held.begin(), rebalance_.span_held.end(), 0);
    size_t n_candidates = 0;
    for (int h = 0; h < n_kv; ++h) {
        const HeadView v = head(layer, h);
        const int64_t offset = static_cast<int64_t>(slot_base(layer, h)) - layer_first;
        for (int s = 0; s < used_[head_index(layer, h)]; ++s) {
            const int64_t index = v.stream_index[s];
            const uint32_t span = kv_tag_span(v.tag[s]);
            if (index >= 0 && span != 0) ++span_held_by_cell[h * KV_MAX_SPANS + span - 1];
            if (!kv_slot_evictable(index, kv_tag_pinned(v.tag[s]), recent_from, policy.sinks)) continue;
            priority[static_cast<size_t>(offset + s)] = kv_victim_priority(policy, slot_stats(v, s), index, stale_before);
            candidates[n_candidates++] = offset + s;
        }
    }
    // The kv head owning a layer offset (the regions are in kv head order).
    auto head_of = [&](int64_t offset) {
        int h = 0;
        while (h + 1 < n_kv && static_cast<int64_t>(slot_base(layer, h + 1)) - layer_first <= offset) ++h;
        return h;
    };
    auto before = [&](int64_t a, int64_t b) {
        const int64_t ia = stream_index_[static_cast<size_t>(layer_first + a)], ib = stream_index_[static_cast<size_t>(layer_first + b)];
        if (priority[a] != priority[b] || ia != ib) return kv_victim_before(priority[a], ia, priority[b], ib);
        return a < b;  // the same token in two cells: the lower kv head first
    };
    // Span minimums may pass over any number of candidates; without them the first `needed` in
    // order are the victims.
    const auto ranked = static_cast<std::ptrdiff_t>(any_span_minimum_ ? n_candidates : std::min<size_t>(n_candidates, static_cast<size_t>(needed)));
    std::partial_sort(candidates.begin(), candidates.begin() + ranked, candidates.begin() + static_cast<std::ptrdiff_t>(n_candidates), before);
    std::vector<int64_t> &victims = rebalance_.destinations;  // layer offsets (move_to_regions reuses it)
    int64_t evicted = 0;
    for (size_t i = 0; i < static_cast<size_t>(ranked) && evicted < needed; ++i) {
        const int64_t offset = candidates[i];
        const size_t at = static_cast<size_t>(layer_first + offset);
        const uint32_t span = kv_tag_span(tags_[at]);
        if (span != 0) {
            int32_t &held_now = span_held_by_cell[head_of(offset) * KV_MAX_SPANS + span - 1];
            if (!kv_span_allows_eviction(static_cast<uint32_t>(held_now), static_cast<uint32_t>(span_minimum_[span - 1]))) continue;
            --held_now;
        }
        victims[static_cast<size_t>(evicted++)] = offset;
    }
    // The victims leave; with rolling, each cell's kept keys roll back past its own victims.
    for (int h = 0; h < n_kv; ++h) {
        const int64_t cell_from = static_cast<int64_t>(slot_base(layer, h)) - layer_first, cell_to = cell_from + cell_slots(layer, h);
        int64_t *cell_victims = scratch_[0].evicted.data();  // a cell's victims fit: max_cell_slots
        int n_cell_victims = 0;
        for (int64_t i = 0; i < evicted; ++i) {
            const int64_t offset = victims[static_cast<size_t>(i)];
            if (offset < cell_from || offset >= cell_to) continue;
            const size_t at = static_cast<size_t>(layer_first + offset);
            cell_victims[n_cell_victims++] = stream_index_[at];
            stream_index_[at] = -1;
            tags_[at] = 0;
        }
        if (config_.rolling && n_cell_victims > 0) {
            roll_back_kept(head(layer, h), used_[head_index(layer, h)], cell_victims, n_cell_victims, scratch_[0].key.data());
        }
    }

    // New regions: what each cell kept, at least its minimum, then the rest shared evenly.
    int32_t *kept = rebalance_.kept.data(), *slots = rebalance_.slots.data();
    int64_t given = 0;
    for (int h = 0; h < n_kv; ++h) {
        const HeadView v = head(layer, h);
        kept[h] = 0;
        for (int s = 0; s < used_[head_index(layer, h)]; ++s) kept[h] += v.stream_index[s] >= 0 ? 1 : 0;
        slots[h] = std::max(kept[h], config_.min_cell_slots(layer));
        given += slots[h];
    }
    const int64_t left = pool - given;
    bool resized = false;
    for (int h = 0; h < n_kv; ++h) {
        slots[h] += static_cast<int32_t>(left / n_kv + (h < left % n_kv ? 1 : 0));
        resized |= slots[h] != cell_slots(layer, h);
    }
    if (resized) {
        move_to_regions(layer, kept, slots);
        return;
    }
    // The regions stay: the victims' slots are free in place, as make_room frees them.
    for (int64_t i = 0; i < evicted; ++i) {
        const int h = head_of(victims[static_cast<size_t>(i)]);
        const auto slot = static_cast<int32_t>(layer_first + victims[static_cast<size_t>(i)] - static_cast<int64_t>(slot_base(layer, h)));
        free_list_[slot_base(layer, h) + static_cast<size_t>(free_count_[head_index(layer, h)]++)] = slot;
    }
}

void KvCache::move_slot(size_t from, size_t to) {
    std::memcpy(keys_.data() + to * key_row_bytes_, keys_.data() + from * key_row_bytes_, key_row_bytes_);
    std::memcpy(values_.data() + to * value_row_bytes_, values_.data() + from * value_row_bytes_, value_row_bytes_);
    stream_index_[to] = stream_index_[from];
    position_[to] = position_[from];
    tags_[to] = tags_[from];
    if (!stats_.empty()) stats_[to] = stats_[from];
}

void KvCache::move_to_regions(int layer, const int32_t *kept, const int32_t *slots) {
    // Each kept slot's destination: cells in kv head order, kept slots in slot order. Sources and
    // destinations both increase along that order, so moving the slots that go left in increasing
    // order, then those that go right in decreasing order, never overwrites a slot not yet moved.
    const int n_kv = config_.n_head_kv;
    std::vector<int64_t> &from = rebalance_.candidates, &to = rebalance_.destinations;
    size_t n_moves = 0;
    int64_t region = layer_first_slot_[static_cast<size_t>(layer)];
    for (int h = 0; h < n_kv; ++h) {
        const auto base = static_cast<int64_t>(slot_base(layer, h));
        int64_t next = region;
        for (int s = 0; s < used_[head_index(layer, h)]; ++s) {
            if (stream_index_[static_cast<size_t>(base + s)] < 0) continue;
            from[n_moves] = base + s;
            to[n_moves++] = next++;
        }
        region += slots[h];
    }
    for (size_t i = 0; i < n_moves; ++i) {
        if (to[i] < from[i]) move_slot(static_cast<size_t>(from[i]), static_cast<size_t>(to[i]));
    }
    for (size_t i = n_moves; i-- > 0;) {
        if (to[i] > from[i]) move_slot(static_cast<size_t>(from[i]), static_cast<size_t>(to[i]));
    }
    set_cell_slots(layer, slots);
    for (int h = 0; h < n_kv; ++h) {
        const size_t c = head_index(layer, h), base = slot_base(layer, h);
        used_[c] = kept[h];
        free_count_[c] = 0;
        // The region past the kept slots holds nothing (unused slots read as free).
        for (int s = kept[h]; s < slots[h]; ++s) {
            stream_index_[base + s] = -1;
            tags_[base + s] = 0;
        }
    }
}

}  // namespace h2o
