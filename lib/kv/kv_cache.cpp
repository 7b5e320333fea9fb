#include "kv_cache.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

#include "kv_victim_rules.h"
#include "rotary.h"

namespace h2o {

namespace {
// The statistics in the order snapshots store them.
constexpr float SlotStats::*kStatFields[] = {&SlotStats::accumulated, &SlotStats::squared, &SlotStats::steps, &SlotStats::last,
                                             &SlotStats::persistence};
}  // namespace

Status KvCache::init(const KvConfig &config, int threads) {
    config_ = config;
    key_format_ = kv_key_format(config.type);
    value_format_ = kv_value_format(config.type);
    H2O_TRY(kv_type_fits_head_dim(config.type, config.head_dim));
    key_row_bytes_ = kv_row_bytes(key_format_, config.head_dim);
    value_row_bytes_ = kv_row_bytes(value_format_, config.head_dim);
    const size_t heads = static_cast<size_t>(config.n_layer) * config.n_head_kv;
    const auto slots = static_cast<size_t>(config.total_slots());
    // A cell holds at most max_cell_slots (max_slots when the heads' budgets stay put).
    max_cell_slots_ = config.max_cell_slots();
    const auto max_slots = static_cast<size_t>(max_cell_slots_);
    try {
        layer_first_slot_.resize(static_cast<size_t>(config.n_layer) + 1);
        layer_policy_.resize(static_cast<size_t>(config.n_layer));
        for (int l = 0; l <= config.n_layer; ++l) layer_first_slot_[l] = config.first_slot_of(l);
        for (int l = 0; l < config.n_layer; ++l) layer_policy_[l] = config.policy_in(l);
        keys_.assign(slots * key_row_bytes_, 0);
        values_.assign(slots * value_row_bytes_, 0);
        stream_index_.assign(slots, -1);
        position_.assign(slots, 0);
        tags_.assign(slots, 0);
        // Attention statistics cost 20 bytes a slot; only policies that read them get them.
        stats_.assign(kv_policy_uses_statistics(config.policy.policy) ? slots : 0, kv_stats_zero());
        used_.assign(heads, 0);
        cell_first_slot_.assign(heads, 0);
        cell_slots_.assign(heads, 0);
        // The largest pool of cells whose slots move together (kv_head_budgets.h).
        const bool rebalancing = config.head_share > 0.0f;
        const auto pool_slots = static_cast<size_t>(config.max_pool_slots()), pool_cells = static_cast<size_t>(config.max_pool_cells());
        rebalance_.candidates.assign(rebalancing ? pool_slots : 0, 0);
        rebalance_.destinations.assign(rebalancing ? pool_slots : 0, 0);
        rebalance_.priority.assign(rebalancing ? pool_slots : 0, 0.0f);
        rebalance_.span_held.assign(rebalancing ? pool_cells * KV_MAX_SPANS : 0, 0);
        rebalance_.kept.assign(rebalancing ? pool_cells : 0, 0);
        rebalance_.slots.assign(rebalancing ? heads : 0, 0);
        free_list_.assign(slots, 0);
        free_count_.assign(heads, 0);
        scratch_.assign(static_cast<size_t>(std::max(1, threads)), EvictionScratch{});
        for (EvictionScratch &scratch : scratch_) {
            scratch.candidates.assign(max_slots, 0);
            scratch.priority.assign(max_slots, 0.0f);
            scratch.evicted.assign(max_slots, 0);
            // A key as floats, then (halves pairing) its rotated pairs side by side.
            scratch.key.assign(static_cast<size_t>(config.head_dim + config.rope.dims), 0.0f);
        }
    } catch (const std::bad_alloc &) {
        return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache (" + std::to_string(slots) + " slots)");
    }
    const int n_pairs = config.rope.pairs();
    const std::vector<double> inv_freq = config.rope.inv_freqs();
    // One eviction of k tokens moves kept keys back by 1..k <= max_slots positions: the rotations
    // for every such shift are computed once here. Evaluating them per key instead (a double
    // sine and cosine per pair) cost rolling sessions 7x their decoding speed at budget 256.
    try {
        rotate_back_cos_sin_.assign(config.rolling ? (max_slots + 1) * n_pairs * 2 : 0, 0.0f);
    } catch (const std::bad_alloc &) {
        return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's rotation table");
    }
    for (int shift = 1; config.rolling && shift <= static_cast<int>(max_slots); ++shift) {
        float *row = rotate_back_cos_sin_.data() + static_cast<size_t>(shift) * n_pairs * 2;
        for (int i = 0; i < n_pairs; ++i) rotary_cos_sin(-shift, inv_freq[i], &row[2 * i], &row[2 * i + 1]);
    }
    clear();
    return Status::Ok();
}

void KvCache::clear() {
    std::fill(stream_index_.begin(), stream_index_.end(), -1);
    std::fill(tags_.begin(), tags_.end(), 0);
    std::fill(span_minimum_, span_minimum_ + KV_MAX_SPANS, 0);
    any_span_minimum_ = false;
    std::fill(used_.begin(), used_.end(), 0);
    std::fill(free_count_.begin(), free_count_.end(), 0);
    reset_cell_slots();
    random_state_ = config_.policy.seed ^ 0x9E3779B97F4A7C15ull;
}

void KvCache::reset_cell_slots() {
    for (int l = 0; l < config_.n_layer; ++l) {
        for (int h = 0; h < config_.n_head_kv; ++h) {
            cell_slots_[cell_index(l, h)] = config_.slots_in(l);
            cell_first_slot_[cell_index(l, h)] = config_.uniform_cell_first(l, h);
        }
    }
}

void KvCache::place_cells(size_t first_cell, size_t end_cell, const int32_t *slots) {
    int64_t first = first_cell == 0 ? 0 : cell_first_slot_[first_cell - 1] + cell_slots_[first_cell - 1];
    for (size_t c = first_cell; c < end_cell; ++c) {
        cell_slots_[c] = slots[c - first_cell];
        cell_first_slot_[c] = first;
        first += slots[c - first_cell];
    }
}

void KvCache::set_cell_slots(const int32_t *slots) { place_cells(0, cell_slots_.size(), slots); }

size_t KvCache::planned_bytes(const KvConfig &config) {
    const auto slots = static_cast<size_t>(config.total_slots());
    const size_t row_bytes =
        kv_row_bytes(kv_key_format(config.type), config.head_dim) + kv_row_bytes(kv_value_format(config.type), config.head_dim);
    const size_t stats = kv_policy_uses_statistics(config.policy.policy) ? sizeof(SlotStats) : 0;
    // Per slot: key and value rows, stream index, position, tag, free-list entry, statistics;
    // when the heads' budgets move, rebalancing's candidates, destinations and priorities of a
    // pool, and each cell's new size.
    const size_t rebalancing = config.head_share > 0.0f
                                   ? static_cast<size_t>(config.max_pool_slots()) * (2 * sizeof(int64_t) + sizeof(float)) +
                                         static_cast<size_t>(config.n_layer) * config.n_head_kv * sizeof(int32_t)
                                   : 0;
    return slots * (row_bytes + sizeof(int64_t) + sizeof(int32_t) + sizeof(uint8_t) + sizeof(int32_t) + stats) + rebalancing;
}

KvCache::CellView KvCache::cell(int layer, int kv_head) {
    const size_t base = slot_base(layer, kv_head);
    return CellView{keys_.data() + base * key_row_bytes_,
                    values_.data() + base * value_row_bytes_,
                    stream_index_.data() + base,
                    position_.data() + base,
                    tags_.data() + base,
                    stats_.empty() ? nullptr : stats_.data() + base};
}

int KvCache::free_slots(int layer, int kv_head) const {
    const size_t h = cell_index(layer, kv_head);
    return cell_slots_[h] - used_[h] + free_count_[h];
}

uint64_t KvCache::next_random() {
    // xorshift64*: deterministic for a given seed and sequence of evictions (kv_victim_rules.h).
    return kv_next_random(&random_state_);
}

void KvCache::rotate_back(uint8_t *stored_key, int shift, float *key) {
    const int n_pairs = config_.rope.pairs();
    const bool adjacent = config_.rope.pairing == RotaryPairing::Adjacent;
    const float *cos_sin = rotate_back_cos_sin_.data() + static_cast<size_t>(shift) * n_pairs * 2;
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

void KvCache::set_span_minimums(const int32_t *minimums) {
    any_span_minimum_ = false;
    for (uint32_t i = 0; i < KV_MAX_SPANS; ++i) {
        span_minimum_[i] = minimums[i];
        any_span_minimum_ |= minimums[i] > 0;
    }
}

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
    if (!kv_span_allows_eviction(static_cast<uint32_t>(held), static_cast<uint32_t>(span_minimum_[span - 1]))) return false;
    --held;
    return true;
}

int KvCache::make_room(int layer, int kv_head, int n, int64_t next_index, int thread) {
    const int needed = n - free_slots(layer, kv_head);
    if (needed <= 0) return 0;
    CellView v = cell(layer, kv_head);
    EvictionScratch &scratch = scratch_[thread];
    std::vector<int32_t> &candidates = scratch.candidates;
    std::vector<int64_t> &evicted = scratch.evicted;
    const KvPolicyConfig &policy = layer_policy_[static_cast<size_t>(layer)];
    const int used = used_[cell_index(layer, kv_head)];
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
        for (int i = 0; i < n_candidates; ++i) {
            const int32_t s = candidates[i];
            priority[s] = kv_batch_victim_priority(policy, by_proxy, slot_stats(v, s), v.stream_index[s], stale_before, cell);
        }
        auto before = [&](int32_t a, int32_t b) {
            return kv_victim_before(priority[a], v.stream_index[a], priority[b], v.stream_index[b]);
        };
        // Span minimums may pass over any number of candidates; without them the first `needed`
        // in order are the victims.
        const int ranked = any_span_minimum_ ? n_candidates : std::min(needed, n_candidates);
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

    const size_t h = cell_index(layer, kv_head);
    int32_t *free_list = free_list_.data() + slot_base(layer, kv_head);
    for (int i = 0; i < n_victims; ++i) {
        const int s = candidates[i];
        evicted[i] = v.stream_index[s];
        v.stream_index[s] = -1;
        free_list[free_count_[h]++] = s;
    }
    if (config_.rolling && n_victims > 0) roll_back_kept(v, used, evicted.data(), n_victims, scratch.key.data());
    return n_victims;
}

void KvCache::roll_back_kept(const CellView &v, int used, int64_t *evicted, int n_evicted, float *key_scratch) {
    std::sort(evicted, evicted + n_evicted);
    for (int s = 0; s < used; ++s) {
        if (v.stream_index[s] < 0) continue;
        const int shift = static_cast<int>(std::lower_bound(evicted, evicted + n_evicted, v.stream_index[s]) - evicted);
        if (shift == 0) continue;
        v.position[s] -= shift;
        rotate_back(v.keys + static_cast<size_t>(s) * key_row_bytes_, shift, key_scratch);
    }
}

void KvCache::cell_fill(int32_t *held, int32_t *slots) const {
    for (size_t c = 0; c < used_.size(); ++c) {
        if (held) held[c] = used_[c] - free_count_[c];
        if (slots) slots[c] = cell_slots_[c];
    }
}

// When the heads' budgets move (head_share > 0), first each layer's cell sizes. Then per
// (layer, kv head): the used count, the free-list length, then for the used slots only
// (a slot is used once it has held a token; later slots were never touched) the key and value
// rows, stream indices, positions, tags and statistics, then the free list. A cache that
// has seen few tokens saves little.
void KvCache::save(ByteWriter &out) const {
    out.put<uint64_t>(random_state_);
    for (int layer = 0; layer < config_.n_layer; ++layer) {
        if (config_.head_share > 0.0f) {
            for (int kv_head = 0; kv_head < config_.n_head_kv; ++kv_head) out.put<int32_t>(cell_slots(layer, kv_head));
        }
        for (int kv_head = 0; kv_head < config_.n_head_kv; ++kv_head) {
            const size_t h = cell_index(layer, kv_head), base = slot_base(layer, kv_head);
            const size_t used = static_cast<size_t>(used_[h]);
            out.put<int32_t>(used_[h]);
            out.put<int32_t>(free_count_[h]);
            out.put_raw(keys_.data() + base * key_row_bytes_, used * key_row_bytes_);
            out.put_raw(values_.data() + base * value_row_bytes_, used * value_row_bytes_);
            out.put_raw(stream_index_.data() + base, used * sizeof(int64_t));
            out.put_raw(position_.data() + base, used * sizeof(int32_t));
            out.put_raw(tags_.data() + base, used);
            // Field by field (the snapshot format predates the slot-major layout in memory).
            if (!stats_.empty()) {
                for (float SlotStats::*field : kStatFields) {
                    for (size_t s = 0; s < used; ++s) out.put<float>(stats_[base + s].*field);
                }
            }
            out.put_raw(free_list_.data() + base, static_cast<size_t>(free_count_[h]) * sizeof(int32_t));
        }
    }
}

Status KvCache::load(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) {
    clear();
    Status st = [&]() -> Status {
        H2O_TRY(in.get("KV random state", &random_state_));
        auto bad = [](const std::string &what) { return make_error(H2O_ERR_STATE_FORMAT, "inconsistent KV cache: " + what); };
        const bool rebalancing = config_.head_share > 0.0f;
        int64_t pool_given = 0;  // the slots of the current pool's cells read so far
        for (int layer = 0; layer < config_.n_layer; ++layer) {
            if (rebalancing) {
                // Each cell within its bounds, each pool's cells (kv_head_budgets.h) summing to
                // the pool's slots; a layer's regions are placed before its rows are read.
                const size_t first_cell = cell_index(layer, 0);
                int32_t *slots = rebalance_.slots.data() + first_cell;
                if (layer == config_.pool_first_layer(layer)) pool_given = 0;
                for (int kv_head = 0; kv_head < config_.n_head_kv; ++kv_head) {
                    H2O_TRY(in.get("KV cell size", &slots[kv_head]));
                    if (slots[kv_head] < config_.min_cell_slots(layer) || slots[kv_head] > config_.max_cell_slots(layer)) {
                        return bad("cell size " + std::to_string(slots[kv_head]) + " in (layer " + std::to_string(layer) + ", kv head " +
                                   std::to_string(kv_head) + ")");
                    }
                    pool_given += slots[kv_head];
                }
                const int64_t pool_slots = config_.pool_slots(layer);
                if (pool_given > pool_slots || (layer + 1 == config_.pool_end_layer(layer) && pool_given != pool_slots)) {
                    return bad("cell sizes of layer " + std::to_string(layer) + " (" + std::to_string(pool_given) + " slots of " +
                               std::to_string(pool_slots) + ")");
                }
                place_cells(first_cell, first_cell + static_cast<size_t>(config_.n_head_kv), slots);
            }
            for (int kv_head = 0; kv_head < config_.n_head_kv; ++kv_head) {
                const size_t h = cell_index(layer, kv_head), base = slot_base(layer, kv_head);
                const int n_slots = cell_slots(layer, kv_head);
                // Without rebalancing every cell holds what the session counts; with it, a cell
                // holds at most what its region allows and the stream has had.
                const int64_t layer_cached = std::min<int64_t>(rebalancing ? n_past : n_cached, n_slots);
                const std::string where = " in (layer " + std::to_string(layer) + ", kv head " + std::to_string(kv_head) + ")";
                int32_t used = 0, free_count = 0;
                H2O_TRY(in.get("KV used count", &used));
                H2O_TRY(in.get("KV free count", &free_count));
                if (used < 0 || used > n_slots) return bad("used count " + std::to_string(used) + where);
                if (free_count < 0 || free_count > used) return bad("free count " + std::to_string(free_count) + where);
                const size_t n = static_cast<size_t>(used);
                H2O_TRY(in.get_raw("KV keys", keys_.data() + base * key_row_bytes_, n * key_row_bytes_));
                H2O_TRY(in.get_raw("KV values", values_.data() + base * value_row_bytes_, n * value_row_bytes_));
                H2O_TRY(in.get_raw("KV stream indices", stream_index_.data() + base, n * sizeof(int64_t)));
                H2O_TRY(in.get_raw("KV positions", position_.data() + base, n * sizeof(int32_t)));
                H2O_TRY(in.get_raw("KV tags", tags_.data() + base, n));
                if (!stats_.empty()) {
                    for (float SlotStats::*field : kStatFields) {
                        for (size_t s = 0; s < n; ++s) H2O_TRY(in.get("KV statistics", &(stats_[base + s].*field)));
                    }
                }
                H2O_TRY(in.get_raw("KV free list", free_list_.data() + base, static_cast<size_t>(free_count) * sizeof(int32_t)));
                used_[h] = used;
                free_count_[h] = free_count;

                int64_t occupied = 0, pinned = 0;
                for (int s = 0; s < used; ++s) {
                    const int64_t index = stream_index_[base + s];
                    if (index < -1 || index >= n_past) return bad("stream index " + std::to_string(index) + where);
                    const uint8_t tag = tags_[base + s];
                    if (kv_tag_span(tag) > static_cast<uint32_t>(n_spans) || (tag != 0 && index < 0)) {
                        return bad("tag " + std::to_string(tag) + where);
                    }
                    if (position_[base + s] < 0) return bad("negative position" + where);
                    occupied += index >= 0;
                    pinned += kv_tag_pinned(tag) ? 1 : 0;
                }
                if ((rebalancing ? occupied > layer_cached : occupied != layer_cached) || pinned != n_pinned) {
                    return bad(std::to_string(occupied) + " tokens (" + std::to_string(pinned) + " pinned)" + where +
                               ", the session says " + std::to_string(layer_cached) + " (" + std::to_string(n_pinned) + ")");
                }
                // Free-list entries name distinct used slots that hold no token, and are all of them.
                if (used - occupied != free_count) return bad("free list length" + where);
                std::vector<int32_t> &listed = scratch_[0].candidates;
                std::fill(listed.begin(), listed.end(), 0);  // marks slots already listed
                for (int i = 0; i < free_count; ++i) {
                    const int32_t s = free_list_[base + i];
                    if (s < 0 || s >= used || stream_index_[base + s] != -1 || listed[s]++) {
                        return bad("free-list entry " + std::to_string(s) + where);
                    }
                }
            }
        }
        return Status::Ok();
    }();
    if (!st.ok()) clear();
    return st;
}

int KvCache::claim_slot(int layer, int kv_head, int64_t stream_index, int32_t position, uint8_t tag) {
    const size_t h = cell_index(layer, kv_head);
    const int slot = free_count_[h] > 0 ? free_list_[slot_base(layer, kv_head) + --free_count_[h]] : used_[h]++;
    const size_t at = slot_base(layer, kv_head) + slot;
    stream_index_[at] = stream_index;
    position_[at] = position;
    tags_[at] = tag;
    if (!stats_.empty()) stats_[at] = kv_stats_zero();
    return slot;
}

}  // namespace h2o
