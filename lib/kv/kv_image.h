// The KV cache's state as plain arrays in the host reference layout, and the snapshot codec that
// writes it and checks it. KvCache keeps its state in one; a device backend that keeps its cache in
// its own memory copies the cache into an image to save it, and out of one to load it, so the
// snapshot format has this one home whatever the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "byte_io.h"
#include "kv_config.h"

namespace h2o {

// The random policy's generator state after clearing (kv_next_random draws from it).
constexpr uint64_t kv_initial_random_state(uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ull; }

// The floats of one cell's query statistics (KvImage::query_stats) under `config`'s policy.
inline size_t kv_query_stats_floats(const KvConfig &config) {
    return config.policy.policy == KvPolicy::ExpectedAttention ? 2 + 2 * static_cast<size_t>(config.query_group) * config.head_dim : 0;
}

struct KvImage {
    size_t key_row_bytes = 0, value_row_bytes = 0;  // the cache type's rows (kv_format.h)
    // Per slot, KvConfig::total_slots() of them: each cell's region of cell_slots slots from
    // cell_first_slot, the cells in (layer, kv head) order and consecutive.
    std::vector<uint8_t> keys, values;  // one row each
    std::vector<int64_t> stream_index;  // -1: free
    std::vector<int32_t> position;      // rotary position the key is stored rotated by
    std::vector<uint8_t> tags;          // kv_make_tag: pinned flag and retention span
    std::vector<SlotStats> stats;       // empty when the policy reads none
    std::vector<int32_t> free_list;     // per cell, from its first slot: slots freed and not reused
    // Expected Attention's running query statistics, kv_query_stats_floats(config) per cell (empty
    // for the other policies): the queries seen, the first position of the latest batch, then per
    // query head of the group the mean of each dimension, then per query head the variance.
    std::vector<float> query_stats;
    // Per cell, n_layer * n_head_kv of them.
    std::vector<int32_t> used;        // slots [0, used) have been written at least once
    std::vector<int32_t> free_count;  // entries of the cell's free list
    std::vector<int32_t> cell_slots;
    std::vector<int64_t> cell_first_slot;
    uint64_t random_state = 0;
    // Each retention span's minimum per cell, in tokens (set by the session, not saved).
    int32_t span_minimum[KV_MAX_SPANS] = {};

    // Sizes every array for `config` (all of its memory, once), then clear(); without `rows`, keys
    // and values stay empty (the bookkeeping of rows kept elsewhere: KvCache::init_bookkeeping).
    // Errors: H2O_ERR_OUT_OF_MEMORY, or H2O_ERR_UNSUPPORTED when the cache type cannot hold the heads.
    Status allocate(const KvConfig &config, bool rows = true);
    // An empty cache: every slot free, every cell its layer's budget, the seed's generator state,
    // no span minimums.
    void clear(const KvConfig &config);
    // Gives cells [first_cell, end_cell) consecutive regions of `slots` each, from the end of the
    // cell before them (cells before first_cell must be placed already).
    void place_cells(size_t first_cell, size_t end_cell, const int32_t *slots);
    bool any_span_minimum() const;
};

// A snapshot's KV section: the generator state, then per layer (when the heads' budgets move)
// its cells' sizes, and per cell its used and free counts, the used slots' rows, stream indices,
// positions, tags and statistics, its free list and (Expected Attention) its query statistics. A
// cache that has seen few tokens saves little.
void save_kv_image(const KvConfig &config, const KvImage &image, ByteWriter &out);
// Reads what save_kv_image wrote into an image allocated for the same configuration, checking
// that every index in it is consistent with a stream of n_past tokens of which every cell holds
// n_cached, n_pinned of them pinned, and whose tags name none but the first n_spans retention
// spans. n_cached counts the tokens of the layers with the most slots; a layer with fewer holds
// min(n_cached, its slots); when the heads' budgets move, a cell holds at most min(n_past, its
// slots). Errors: H2O_ERR_STATE_FORMAT naming the inconsistency; the image is then cleared.
Status load_kv_image(const KvConfig &config, KvImage &image, ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned,
                     int n_spans);

}  // namespace h2o
