#include "kv_image.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

namespace h2o {

namespace {
// The statistics in the order snapshots store them.
constexpr float SlotStats::*kStatFields[] = {&SlotStats::accumulated, &SlotStats::squared, &SlotStats::steps, &SlotStats::last,
                                             &SlotStats::persistence};

size_t cell_index(const KvConfig &config, int layer, int kv_head) { return static_cast<size_t>(layer) * config.n_head_kv + kv_head; }

// One cell's query statistics as KvCache::observe_queries leaves them: a whole count, a position,
// finite means and variances that are not negative.
bool query_stats_valid(const float *stats, const KvConfig &config) {
    const float count = stats[0], position = stats[1];
    if (!(count >= 0.0f && count <= 16777216.0f && count == std::floor(count)) || !(position >= 0.0f && position <= 2147483647.0f))
        return false;
    const size_t n = static_cast<size_t>(config.query_group) * config.head_dim;
    for (size_t i = 0; i < 2 * n; ++i) {
        if (!std::isfinite(stats[2 + i]) || (i >= n && stats[2 + i] < 0.0f)) return false;
    }
    return true;
}
}  // namespace

Status KvImage::allocate(const KvConfig &config, bool rows) {
    H2O_TRY(kv_type_fits_head_dim(config.type, config.head_dim));
    key_row_bytes = kv_row_bytes(kv_key_format(config.type), config.head_dim);
    value_row_bytes = kv_row_bytes(kv_value_format(config.type), config.head_dim);
    const size_t cells = static_cast<size_t>(config.n_layer) * config.n_head_kv;
    const auto slots = static_cast<size_t>(config.total_slots());
    try {
        keys.assign(rows ? slots * key_row_bytes : 0, 0);
        values.assign(rows ? slots * value_row_bytes : 0, 0);
        stream_index.assign(slots, -1);
        position.assign(slots, 0);
        tags.assign(slots, 0);
        // Attention statistics cost 20 bytes a slot; only policies that read them get them.
        stats.assign(kv_policy_uses_statistics(config.policy.policy) ? slots : 0, kv_stats_zero());
        free_list.assign(slots, 0);
        query_stats.assign(cells * kv_query_stats_floats(config), 0.0f);
        used.assign(cells, 0);
        free_count.assign(cells, 0);
        cell_slots.assign(cells, 0);
        cell_first_slot.assign(cells, 0);
    } catch (const std::bad_alloc &) {
        return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache (" + std::to_string(slots) + " slots)");
    }
    clear(config);
    return Status::Ok();
}

void KvImage::clear(const KvConfig &config) {
    std::fill(stream_index.begin(), stream_index.end(), -1);
    std::fill(tags.begin(), tags.end(), 0);
    std::fill(used.begin(), used.end(), 0);
    std::fill(free_count.begin(), free_count.end(), 0);
    std::fill(span_minimum, span_minimum + KV_MAX_SPANS, 0);
    std::fill(query_stats.begin(), query_stats.end(), 0.0f);
    for (int l = 0; l < config.n_layer; ++l) {
        for (int h = 0; h < config.n_head_kv; ++h) {
            cell_slots[cell_index(config, l, h)] = config.slots_in(l);
            cell_first_slot[cell_index(config, l, h)] = config.uniform_cell_first(l, h);
        }
    }
    random_state = kv_initial_random_state(config.policy.seed);
}

void KvImage::place_cells(size_t first_cell, size_t end_cell, const int32_t *slots) {
    int64_t first = first_cell == 0 ? 0 : cell_first_slot[first_cell - 1] + cell_slots[first_cell - 1];
    for (size_t c = first_cell; c < end_cell; ++c) {
        cell_slots[c] = slots[c - first_cell];
        cell_first_slot[c] = first;
        first += slots[c - first_cell];
    }
}

bool KvImage::any_span_minimum() const {
    return std::any_of(span_minimum, span_minimum + KV_MAX_SPANS, [](int32_t m) { return m > 0; });
}

void save_kv_image(const KvConfig &config, const KvImage &image, ByteWriter &out) {
    out.put<uint64_t>(image.random_state);
    for (int layer = 0; layer < config.n_layer; ++layer) {
        if (config.head_share > 0.0f) {
            for (int kv_head = 0; kv_head < config.n_head_kv; ++kv_head)
                out.put<int32_t>(image.cell_slots[cell_index(config, layer, kv_head)]);
        }
        for (int kv_head = 0; kv_head < config.n_head_kv; ++kv_head) {
            const size_t c = cell_index(config, layer, kv_head), base = static_cast<size_t>(image.cell_first_slot[c]);
            const auto used = static_cast<size_t>(image.used[c]);
            out.put<int32_t>(image.used[c]);
            out.put<int32_t>(image.free_count[c]);
            out.put_raw(image.keys.data() + base * image.key_row_bytes, used * image.key_row_bytes);
            out.put_raw(image.values.data() + base * image.value_row_bytes, used * image.value_row_bytes);
            out.put_raw(image.stream_index.data() + base, used * sizeof(int64_t));
            out.put_raw(image.position.data() + base, used * sizeof(int32_t));
            out.put_raw(image.tags.data() + base, used);
            // Field by field (the snapshot format predates the slot-major layout in memory).
            if (!image.stats.empty()) {
                for (float SlotStats::*field : kStatFields) {
                    for (size_t s = 0; s < used; ++s) out.put<float>(image.stats[base + s].*field);
                }
            }
            out.put_raw(image.free_list.data() + base, static_cast<size_t>(image.free_count[c]) * sizeof(int32_t));
            const size_t stats_floats = kv_query_stats_floats(config);
            out.put_raw(image.query_stats.data() + c * stats_floats, stats_floats * sizeof(float));
        }
    }
}

Status load_kv_image(const KvConfig &config, KvImage &image, ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned,
                     int n_spans) {
    image.clear(config);
    std::vector<int32_t> layer_cell_slots(static_cast<size_t>(config.n_head_kv));
    std::vector<uint8_t> listed;  // marks a cell's slots already on its free list
    Status st = [&]() -> Status {
        H2O_TRY(in.get("KV random state", &image.random_state));
        auto bad = [](const std::string &what) { return make_error(H2O_ERR_STATE_FORMAT, "inconsistent KV cache: " + what); };
        const bool rebalancing = config.head_share > 0.0f;
        int64_t pool_given = 0;  // the slots of the current pool's cells read so far
        for (int layer = 0; layer < config.n_layer; ++layer) {
            if (rebalancing) {
                // Each cell within its bounds, each pool's cells (kv_head_budgets.h) summing to
                // the pool's slots; a layer's regions are placed before its rows are read.
                int32_t *slots = layer_cell_slots.data();
                if (layer == config.pool_first_layer(layer)) pool_given = 0;
                for (int kv_head = 0; kv_head < config.n_head_kv; ++kv_head) {
                    H2O_TRY(in.get("KV cell size", &slots[kv_head]));
                    if (slots[kv_head] < config.min_cell_slots(layer) || slots[kv_head] > config.max_cell_slots(layer)) {
                        return bad("cell size " + std::to_string(slots[kv_head]) + " in (layer " + std::to_string(layer) + ", kv head " +
                                   std::to_string(kv_head) + ")");
                    }
                    pool_given += slots[kv_head];
                }
                const int64_t pool_slots = config.pool_slots(layer);
                if (pool_given > pool_slots || (layer + 1 == config.pool_end_layer(layer) && pool_given != pool_slots)) {
                    return bad("cell sizes of layer " + std::to_string(layer) + " (" + std::to_string(pool_given) + " slots of " +
                               std::to_string(pool_slots) + ")");
                }
                const size_t first_cell = cell_index(config, layer, 0);
                image.place_cells(first_cell, first_cell + static_cast<size_t>(config.n_head_kv), slots);
            }
            for (int kv_head = 0; kv_head < config.n_head_kv; ++kv_head) {
                const size_t c = cell_index(config, layer, kv_head), base = static_cast<size_t>(image.cell_first_slot[c]);
                const int n_slots = image.cell_slots[c];
                // Without rebalancing every cell holds what the session counts; with it, a cell
                // holds at most what its region allows and the stream has had.
                const int64_t layer_cached = std::min<int64_t>(rebalancing ? n_past : n_cached, n_slots);
                const std::string where = " in (layer " + std::to_string(layer) + ", kv head " + std::to_string(kv_head) + ")";
                int32_t used = 0, free_count = 0;
                H2O_TRY(in.get("KV used count", &used));
                H2O_TRY(in.get("KV free count", &free_count));
                if (used < 0 || used > n_slots) return bad("used count " + std::to_string(used) + where);
                if (free_count < 0 || free_count > used) return bad("free count " + std::to_string(free_count) + where);
                const auto n = static_cast<size_t>(used);
                H2O_TRY(in.get_raw("KV keys", image.keys.data() + base * image.key_row_bytes, n * image.key_row_bytes));
                H2O_TRY(in.get_raw("KV values", image.values.data() + base * image.value_row_bytes, n * image.value_row_bytes));
                H2O_TRY(in.get_raw("KV stream indices", image.stream_index.data() + base, n * sizeof(int64_t)));
                H2O_TRY(in.get_raw("KV positions", image.position.data() + base, n * sizeof(int32_t)));
                H2O_TRY(in.get_raw("KV tags", image.tags.data() + base, n));
                if (!image.stats.empty()) {
                    for (float SlotStats::*field : kStatFields) {
                        for (size_t s = 0; s < n; ++s) H2O_TRY(in.get("KV statistics", &(image.stats[base + s].*field)));
                    }
                }
                H2O_TRY(in.get_raw("KV free list", image.free_list.data() + base, static_cast<size_t>(free_count) * sizeof(int32_t)));
                const size_t stats_floats = kv_query_stats_floats(config);
                float *query_stats = image.query_stats.data() + c * stats_floats;
                H2O_TRY(in.get_raw("KV query statistics", query_stats, stats_floats * sizeof(float)));
                if (stats_floats != 0 && !query_stats_valid(query_stats, config)) return bad("query statistics" + where);
                image.used[c] = used;
                image.free_count[c] = free_count;

                int64_t occupied = 0, pinned = 0;
                for (size_t s = 0; s < n; ++s) {
                    const int64_t index = image.stream_index[base + s];
                    if (index < -1 || index >= n_past) return bad("stream index " + std::to_string(index) + where);
                    const uint8_t tag = image.tags[base + s];
                    if (kv_tag_span(tag) > static_cast<uint32_t>(n_spans) || (tag != 0 && (index < 0 || config.is_window_layer(layer)))) {
                        return bad("tag " + std::to_string(tag) + where);
                    }
                    if (image.position[base + s] < 0) return bad("negative position" + where);
                    occupied += index >= 0;
                    pinned += kv_tag_pinned(tag) ? 1 : 0;
                }
                // A local layer's tokens are never pinned (KvConfig::layer_window).
                const int64_t layer_pinned = config.is_window_layer(layer) ? 0 : n_pinned;
                if ((rebalancing ? occupied > layer_cached : occupied != layer_cached) || pinned != layer_pinned) {
                    return bad(std::to_string(occupied) + " tokens (" + std::to_string(pinned) + " pinned)" + where +
                               ", the session says " + std::to_string(layer_cached) + " (" + std::to_string(layer_pinned) + ")");
                }
                // Free-list entries name distinct used slots that hold no token, and are all of them.
                if (used - occupied != free_count) return bad("free list length" + where);
                listed.assign(n, 0);
                for (int i = 0; i < free_count; ++i) {
                    const int32_t s = image.free_list[base + static_cast<size_t>(i)];
                    if (s < 0 || s >= used || image.stream_index[base + static_cast<size_t>(s)] != -1 || listed[static_cast<size_t>(s)]++) {
                        return bad("free-list entry " + std::to_string(s) + where);
                    }
                }
            }
        }
        return Status::Ok();
    }();
    if (!st.ok()) image.clear(config);
    return st;
}

}  // namespace h2o
