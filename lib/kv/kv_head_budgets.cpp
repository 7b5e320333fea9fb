// KvCache::rebalance_heads: the rule of kv_head_budgets.h.
#include "kv_head_budgets.h"

#include <algorithm>
#include <cstring>

#include "kv_cache.h"
#include "kv_victim_rules.h"

namespace h2o {

void KvCache::rebalance_heads(int64_t next_index, int incoming, int floor) {
    row_edits_.clear();
    if (config_.head_share <= 0.0f || !kv_policy_uses_statistics(config_.policy.policy)) return;
    for (int layer = 0; layer < config_.n_layer; layer = config_.pool_end_layer(layer)) {
        // A local layer's cells are windows of the same tokens (pools span layers only without them).
        if (!config_.is_window_layer(layer)) rebalance_pool(layer, config_.pool_end_layer(layer), next_index, incoming, floor);
    }
}

void KvCache::rebalance_pool(int first_layer, int end_layer, int64_t next_index, int incoming, int floor) {
    const int n_kv = config_.n_head_kv;
    const size_t first_cell = cell_index(first_layer, 0);
    const int n_cells = (end_layer - first_layer) * n_kv;
    // The pool's cells are consecutive, in (layer, kv head) order, from its first layer's first slot.
    const int64_t pool_first = layer_first_slot_[static_cast<size_t>(first_layer)];
    const int64_t pool = layer_first_slot_[static_cast<size_t>(end_layer)] - pool_first;
    // Each cell's fewest slots (its minimum, raised to the floor) and tokens held; the excess is
    // how far the cells' sizes would pass the pool's slots if each kept what it holds or its
    // minimum, whichever is more: a cell raised to the floor takes slots that others must free.
    int32_t *minimum = rebalance_.slots.data(), *cell_held = rebalance_.kept.data();
    int64_t held = 0, excess = -pool;
    bool raised = false;
    for (int i = 0; i < n_cells; ++i) {
        const size_t c = first_cell + static_cast<size_t>(i);
        minimum[i] = config_.cell_minimum(first_layer + i / n_kv, floor);
        cell_held[i] = image_.used[c] - image_.free_count[c];
        held += cell_held[i];
        excess += std::max(cell_held[i], minimum[i]);
        raised |= image_.cell_slots[c] < minimum[i];
    }
    const int64_t needed = held + static_cast<int64_t>(n_cells) * incoming - pool;
    if (needed <= 0 && !raised) return;  // every cell can take the coming tokens: regions stay as they are

    // Candidates of every cell, by their offset in the pool's slots.
    std::vector<int64_t> &candidates = rebalance_.candidates;
    std::vector<float> &priority = rebalance_.priority;
    int32_t *span_held_by_cell = rebalance_.span_held.data();  // [cell of the pool][span]: tokens held
    std::fill(rebalance_.span_held.begin(), rebalance_.span_held.end(), 0);
    size_t n_candidates = 0;
    for (int i = 0; i < n_cells; ++i) {
        const int layer = first_layer + i / n_kv;
        const KvPolicyConfig &policy = layer_policy_[static_cast<size_t>(layer)];
        const int64_t recent_from = kv_recent_from(policy, next_index, incoming);
        const int64_t stale_before = kv_stale_before(policy, next_index, incoming);
        const CellView v = cell(layer, i % n_kv);
        const int64_t offset = image_.cell_first_slot[first_cell + i] - pool_first;
        for (int s = 0; s < image_.used[first_cell + i]; ++s) {
            const int64_t index = v.stream_index[s];
            const uint32_t span = kv_tag_span(v.tag[s]);
            if (index >= 0 && span != 0) ++span_held_by_cell[i * KV_MAX_SPANS + span - 1];
            if (!kv_slot_evictable(index, kv_tag_pinned(v.tag[s]), recent_from, static_cast<uint32_t>(policy.sinks))) continue;
            priority[static_cast<size_t>(offset + s)] = kv_victim_priority(policy, slot_stats(v, s), index, stale_before);
            candidates[n_candidates++] = offset + s;
        }
    }
    // The pool's cell owning an offset (the regions are consecutive in cell order).
    auto cell_of = [&](int64_t offset) {
        const auto cells = image_.cell_first_slot.begin() + static_cast<std::ptrdiff_t>(first_cell);
        return static_cast<int>(std::upper_bound(cells, cells + n_cells, pool_first + offset) - cells) - 1;
    };
    auto before = [&](int64_t a, int64_t b) {
        const int64_t ia = image_.stream_index[static_cast<size_t>(pool_first + a)],
                      ib = image_.stream_index[static_cast<size_t>(pool_first + b)];
        if (priority[a] != priority[b] || ia != ib) return kv_victim_before(priority[a], ia, priority[b], ib);
        return a < b;  // the same token in two cells: the earlier cell first
    };
    // Span minimums and raised cells may pass over any number of candidates; without them the
    // first `needed` in order are the victims.
    const bool passes_over = image_.any_span_minimum() || excess > 0;
    const auto ranked = static_cast<std::ptrdiff_t>(
        passes_over ? n_candidates : std::min<size_t>(n_candidates, static_cast<size_t>(std::max<int64_t>(needed, 0))));
    std::partial_sort(candidates.begin(), candidates.begin() + ranked, candidates.begin() + static_cast<std::ptrdiff_t>(n_candidates),
                      before);
    std::vector<int64_t> &victims = rebalance_.destinations;  // pool offsets (move_to_regions reuses it)
    int64_t evicted = 0;
    // Takes the victim at `offset` unless its span keeps it, or it would not lower the excess
    // once `needed` are taken (its cell holds no more than its minimum).
    auto take = [&](int64_t offset) {
        const int cell = cell_of(offset);
        if (evicted >= needed && cell_held[cell] <= minimum[cell]) return;
        const uint32_t span = kv_tag_span(image_.tags[static_cast<size_t>(pool_first + offset)]);
        if (span != 0) {
            int32_t &held_now = span_held_by_cell[cell * KV_MAX_SPANS + span - 1];
            if (!kv_span_allows_eviction(static_cast<uint32_t>(held_now), static_cast<uint32_t>(image_.span_minimum[span - 1]))) return;
            --held_now;
        }
        if (cell_held[cell]-- > minimum[cell]) --excess;
        victims[static_cast<size_t>(evicted++)] = offset;
    };
    for (size_t i = 0; i < static_cast<size_t>(ranked) && (evicted < needed || excess > 0); ++i) take(candidates[i]);
    if (excess > 0) {
        // The protections (the recent window, sinks) left too few: the oldest unpinned tokens of
        // the cells above their minimum go, as make_room's fallback takes them.
        std::sort(victims.begin(), victims.begin() + evicted);
        const int64_t chosen = evicted;
        n_candidates = 0;
        for (int64_t offset = 0; offset < pool; ++offset) {
            const auto at = static_cast<size_t>(pool_first + offset);
            if (kv_slot_evictable_by_age(image_.stream_index[at], kv_tag_pinned(image_.tags[at])) &&
                !std::binary_search(victims.begin(), victims.begin() + chosen, offset)) {
                candidates[n_candidates++] = offset;
            }
        }
        std::sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(n_candidates), [&](int64_t a, int64_t b) {
            const int64_t ia = image_.stream_index[static_cast<size_t>(pool_first + a)],
                          ib = image_.stream_index[static_cast<size_t>(pool_first + b)];
            return ia != ib ? ia < ib : a < b;
        });
        for (size_t i = 0; i < n_candidates && excess > 0; ++i) take(candidates[i]);
    }
    // The victims leave, cell by cell (in slot order, each cell's a run of them); with rolling,
    // each cell's kept keys roll back past its own victims.
    std::sort(victims.begin(), victims.begin() + evicted);
    int32_t *kept = cell_held, *slots = minimum;  // each cell's minimum becomes its new size
    int64_t given = 0;
    for (int i = 0, v = 0; i < n_cells; ++i) {
        const size_t c = first_cell + static_cast<size_t>(i);
        const int64_t cell_end = image_.cell_first_slot[c] + image_.cell_slots[c] - pool_first;
        int64_t *cell_victims = scratch_[0].evicted.data();  // a cell's victims fit: max_cell_slots
        int n_cell_victims = 0;
        for (; v < evicted && victims[static_cast<size_t>(v)] < cell_end; ++v) {
            const auto at = static_cast<size_t>(pool_first + victims[static_cast<size_t>(v)]);
            cell_victims[n_cell_victims++] = image_.stream_index[at];
            image_.stream_index[at] = -1;
            image_.tags[at] = 0;
        }
        const int layer = first_layer + i / n_kv;
        if (config_.rolling && n_cell_victims > 0)
            roll_back_kept(layer, cell(layer, i % n_kv), image_.used[c], cell_victims, n_cell_victims, scratch_[0].key.data());
        // The cell's new region: what it kept, at least its minimum, then the rest shared evenly.
        kept[i] = 0;
        for (int s = 0; s < image_.used[c]; ++s)
            kept[i] += image_.stream_index[static_cast<size_t>(image_.cell_first_slot[c] + s)] >= 0 ? 1 : 0;
        slots[i] = std::max(kept[i], slots[i]);
        given += slots[i];
    }
    const int64_t left = pool - given;
    bool resized = false;
    for (int i = 0; i < n_cells; ++i) {
        slots[i] += static_cast<int32_t>(left / n_cells + (i < left % n_cells ? 1 : 0));
        resized |= slots[i] != image_.cell_slots[first_cell + static_cast<size_t>(i)];
    }
    if (resized) {
        move_to_regions(first_layer, end_layer, kept, slots);
        return;
    }
    // The regions stay: the victims' slots are free in place, as make_room frees them.
    for (int64_t i = 0; i < evicted; ++i) {
        const int64_t at = pool_first + victims[static_cast<size_t>(i)];
        const size_t c = first_cell + static_cast<size_t>(cell_of(victims[static_cast<size_t>(i)]));
        image_.free_list[static_cast<size_t>(image_.cell_first_slot[c]) + static_cast<size_t>(image_.free_count[c]++)] =
            static_cast<int32_t>(at - image_.cell_first_slot[c]);
    }
}

void KvCache::move_slot(size_t from, size_t to) {
    if (rows_elsewhere_) {
        row_edits_.moves.push_back({static_cast<int64_t>(from), static_cast<int64_t>(to)});
    } else {
        std::memcpy(image_.keys.data() + to * image_.key_row_bytes, image_.keys.data() + from * image_.key_row_bytes, image_.key_row_bytes);
        std::memcpy(image_.values.data() + to * image_.value_row_bytes, image_.values.data() + from * image_.value_row_bytes,
                    image_.value_row_bytes);
    }
    image_.stream_index[to] = image_.stream_index[from];
    image_.position[to] = image_.position[from];
    image_.tags[to] = image_.tags[from];
    if (!image_.stats.empty()) image_.stats[to] = image_.stats[from];
}

void KvCache::move_to_regions(int first_layer, int end_layer, const int32_t *kept, const int32_t *slots) {
    // Each kept slot's destination: cells in (layer, kv head) order, kept slots in slot order.
    // Sources and destinations both increase along that order, so moving the slots that go left
    // in increasing order, then those that go right in decreasing order, never overwrites a slot
    // not yet moved.
    const size_t first_cell = cell_index(first_layer, 0), end_cell = cell_index(end_layer, 0);
    std::vector<int64_t> &from = rebalance_.candidates, &to = rebalance_.destinations;
    size_t n_moves = 0;
    int64_t region = layer_first_slot_[static_cast<size_t>(first_layer)];
    for (size_t c = first_cell; c < end_cell; ++c) {
        const int64_t base = image_.cell_first_slot[c];
        int64_t next = region;
        for (int s = 0; s < image_.used[c]; ++s) {
            if (image_.stream_index[static_cast<size_t>(base + s)] < 0) continue;
            from[n_moves] = base + s;
            to[n_moves++] = next++;
        }
        region += slots[c - first_cell];
    }
    for (size_t i = 0; i < n_moves; ++i) {
        if (to[i] < from[i]) move_slot(static_cast<size_t>(from[i]), static_cast<size_t>(to[i]));
    }
    for (size_t i = n_moves; i-- > 0;) {
        if (to[i] > from[i]) move_slot(static_cast<size_t>(from[i]), static_cast<size_t>(to[i]));
    }
    image_.place_cells(first_cell, end_cell, slots);
    for (size_t c = first_cell; c < end_cell; ++c) {
        const auto base = static_cast<size_t>(image_.cell_first_slot[c]);
        image_.used[c] = kept[c - first_cell];
        image_.free_count[c] = 0;
        // The region past the kept slots holds nothing (unused slots read as free).
        for (int s = kept[c - first_cell]; s < slots[c - first_cell]; ++s) {
            image_.stream_index[base + s] = -1;
            image_.tags[base + s] = 0;
        }
    }
}

}  // namespace h2o
