// The Vulkan backend's attention (vk_backend.h): make room and store a batch's keys and values
// (kv_claim.comp, after kv_expect.comp for Expected Attention), attend a chunk of queries at a
// time (attention.comp) and fold the statistics (attention_stats.comp).
#include "vulkan/vk_backend.h"

namespace h2o {

namespace {

constexpr uint32_t kStatsGroup = 64;

struct KvClaimPush {
    uint32_t first_index[2], recent_from[2], stale_before[2];
    uint32_t k_off, v_off, pos_off, k_stride, v_stride;
    uint32_t keys_off, values_off, table_off;
    uint32_t meta_off, n_cells, n_slots, n_kv, max_batch;
    uint32_t first_slot, total_slots;
    uint32_t layer, head_dim, n, tag, policy, sinks, pairs;
    uint32_t flags;    // kKvClaimRolling | kKvClaimByProxy | kKvClaimPositionsPerKvHead
    uint32_t formats;  // key format | value format << 8
    float prompt_share;
    uint32_t prompt_seed;
};
constexpr uint32_t kKvClaimRolling = 1, kKvClaimByProxy = 2, kKvClaimPositionsPerKvHead = 4, kKvClaimHalvesPairing = 8;
struct KvExpectPush {
    uint32_t q_off, q_stride, pos_off, keys_off, values_off, table_off;
    uint32_t meta_off, n_cells, total_slots, n_kv, max_batch, first_slot;
    uint32_t query_off;
    uint32_t layer, head_dim, group, n, pairs;
    uint32_t flags;    // kKvClaimPositionsPerKvHead | kKvClaimHalvesPairing
    uint32_t formats;  // key format | value format << 8
    float scale;
};
struct AttentionPush {
    uint32_t first_index[2];
    uint32_t q_off, q_stride, out_off, out_stride;
    uint32_t keys_off, values_off, meta_off, scratch_off;
    uint32_t n_cells, n_slots, n_kv, max_batch;
    uint32_t first_slot, total_slots;
    uint32_t layer, head_dim, group, chunk_capacity;
    float scale;
    uint32_t key_format, value_format;
    uint32_t window;  // a local layer's sliding window (0: global)
    float softcap;
};
struct StatsPush {
    uint32_t first_index[2];
    uint32_t meta_off, n_cells, n_slots, n_kv, max_batch;
    uint32_t first_slot, total_slots;
    uint32_t layer, scratch_off, chunk_capacity;
    uint32_t chunk_tokens, t0, n, group;
    float decay;
    uint32_t proxy;
    uint32_t window;
};
static_assert(sizeof(KvClaimPush) <= vk::kPushConstantBytes && sizeof(KvExpectPush) <= vk::kPushConstantBytes &&
                  sizeof(AttentionPush) <= vk::kPushConstantBytes && sizeof(StatsPush) <= vk::kPushConstantBytes,
              "push constants are limited to 128 bytes");

}  // namespace

VulkanBackend::LayerCells VulkanBackend::layer_cells(int layer, const ModelShape &shape) {
    LayerCells c;
    c.layer = static_cast<uint32_t>(layer);
    c.n_kv = static_cast<uint32_t>(kv_.n_head_kv);
    c.n_slots = static_cast<uint32_t>(kv_.max_cell_slots(layer));
    c.pool = kv_.pool_first_layer(layer);
    c.first_slot = static_cast<uint32_t>(kv_.first_slot_of(c.pool));
    c.total_slots = static_cast<uint32_t>(kv_.total_slots());
    c.n_cells = static_cast<uint32_t>(kv_.n_layer) * c.n_kv;
    c.head_dim = static_cast<uint32_t>(kv_.head_dim);
    c.group = static_cast<uint32_t>(shape.n_head) / c.n_kv;
    c.window = static_cast<uint32_t>(shape.is_local(layer) ? shape.sliding_window : 0);
    c.policy = kv_.policy_in(layer);
    c.formats = static_cast<uint32_t>(kv_key_format(kv_.type)) | static_cast<uint32_t>(kv_value_format(kv_.type)) << 8;
    c.keys = bind(keys_[c.pool], true);
    c.values = bind(values_[c.pool], true);
    c.meta = bind(meta_, true);
    return c;
}

Status VulkanBackend::attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer,
                                const AttentionBatch &batch, const ModelShape &shape) {
    const int n = batch.n_tokens;
    if (failed() || n <= 0) return error_;
    if (!has_kv_ || n > max_batch_ || shape.head_dim != kv_.head_dim || shape.n_head_kv != kv_.n_head_kv ||
        shape.n_head % shape.n_head_kv != 0) {
        fail("attention called without a matching KV cache or with more than max_batch tokens", H2O_ERR_INTERNAL);
        return error_;
    }
    const LayerCells cells = layer_cells(layer, shape);
    if (cells.policy.policy == KvPolicy::ExpectedAttention) expect_queries(cells, q, batch);
    claim_slots(cells, k, v, batch);
    const float scale = shape.attention_scale != 0.0f ? shape.attention_scale : 1.0f / std::sqrt(static_cast<float>(cells.head_dim));
    // The scratch holds the attention weights of one chunk of queries at a time.
    for (uint32_t t0 = 0; t0 < static_cast<uint32_t>(n); t0 += chunk_capacity_) {
        const uint32_t chunk = std::min<uint32_t>(chunk_capacity_, static_cast<uint32_t>(n) - t0);
        attend_chunk(cells, out, q, batch.first_index, t0, chunk, scale, shape.attention_softcap);
        // Policies that never read the statistics (full, window, sinks, random) skip them, as
        // the CPU backend does; claimed slots still start from zero.
        if (kv_policy_uses_statistics(cells.policy.policy)) fold_statistics(cells, batch, t0, chunk);
    }
    return error_;
}

// Expected Attention: the batch's queries into the cells' statistics, then every held slot's
// score (kv_expect.comp), which the claim ranks by.
void VulkanBackend::expect_queries(const LayerCells &c, const Tensor &q, const AttentionBatch &batch) {
    const Bound bq = bind(q, false);
    const Bound bp = bind(batch.positions, false);
    const Bound bt = bind(rope_table_, false);
    KvExpectPush push{};
    push.q_off = bq.word;
    push.q_stride = static_cast<uint32_t>(q.cols);
    push.pos_off = bp.word;
    push.keys_off = c.keys.word;
    push.values_off = c.values.word;
    push.table_off = bt.word / 2 + kRopeTablePairs;  // slot 1 (create_kv), in uvec2 units
    push.meta_off = c.meta.word;
    push.n_cells = c.n_cells;
    push.total_slots = c.total_slots;
    push.n_kv = c.n_kv;
    push.max_batch = static_cast<uint32_t>(max_batch_);
    push.first_slot = c.first_slot;
    push.query_off = c.meta.word + query_first_;
    push.layer = c.layer;
    push.head_dim = c.head_dim;
    push.group = static_cast<uint32_t>(kv_.query_group);
    push.n = static_cast<uint32_t>(batch.n_tokens);
    push.pairs = static_cast<uint32_t>(kv_.rope.pairs());
    push.flags = (batch.positions_per_kv_head ? kKvClaimPositionsPerKvHead : 0) |
                 (kv_.rope.pairing == RotaryPairing::Halves ? kKvClaimHalvesPairing : 0);
    push.formats = c.formats;
    push.scale = kv_.attention_scale;
    dispatch("kv_expect", {bq, bp, c.keys, c.values, c.meta, bt}, &push, sizeof push, c.n_kv);
}

// Makes room, takes slots, stores the batch's keys and values (kv_claim.comp).
void VulkanBackend::claim_slots(const LayerCells &c, const Tensor &k, const Tensor &v, const AttentionBatch &batch) {
    const int n = batch.n_tokens;
    const Bound bk = bind(k, false);
    const Bound bv = bind(v, false);
    const Bound bp = bind(batch.positions, false);
    // (Without rolling nothing rolls back: any buffer fills the table's binding.)
    const Bound bt = bind(kv_.rolling ? rollback_table_ : rope_table_, false);
    KvClaimPush push{};
    split64(batch.first_index, push.first_index);
    // The recent window counts the incoming tokens (KvCache::make_room).
    split64(kv_recent_from(c.policy, batch.first_index, n), push.recent_from);
    split64(kv_stale_before(c.policy, batch.first_index, n), push.stale_before);
    push.k_off = bk.word;
    push.v_off = bv.word;
    push.pos_off = bp.word;
    push.k_stride = static_cast<uint32_t>(k.cols);
    push.v_stride = static_cast<uint32_t>(v.cols);
    push.keys_off = c.keys.word;
    push.values_off = c.values.word;
    push.table_off = bt.word / 2 + (kv_.is_window_layer(static_cast<int>(c.layer)) ? local_rollback_off_ : 0);  // in (cos, sin) pairs
    push.meta_off = c.meta.word;
    push.n_cells = c.n_cells;
    push.n_slots = c.n_slots;
    push.first_slot = c.first_slot;
    push.total_slots = c.total_slots;
    push.n_kv = c.n_kv;
    push.max_batch = static_cast<uint32_t>(max_batch_);
    push.layer = c.layer;
    push.head_dim = c.head_dim;
    push.n = static_cast<uint32_t>(n);
    push.tag = batch.tag;
    push.policy = static_cast<uint32_t>(c.policy.policy);
    push.sinks = static_cast<uint32_t>(std::max(0, c.policy.sinks));
    push.pairs = static_cast<uint32_t>(kv_.rope.pairs());
    push.flags = (kv_.rolling ? kKvClaimRolling : 0) | (kv_ranks_by_proxy(c.policy, n) ? kKvClaimByProxy : 0) |
                 (batch.positions_per_kv_head ? kKvClaimPositionsPerKvHead : 0) |
                 (kv_.rope.pairing == RotaryPairing::Halves ? kKvClaimHalvesPairing : 0);
    push.formats = c.formats;
    push.prompt_share = c.policy.prompt_random_share;
    push.prompt_seed = kv_prompt_seed(c.policy);
    // The random policy draws from one generator in (layer, kv head) order: one workgroup.
    const uint32_t groups = c.policy.policy == KvPolicy::Random ? 1 : c.n_kv;
    dispatch("kv_claim", {bk, bv, bp, c.keys, c.values, c.meta, bt}, &push, sizeof push, groups);
}

// Attention of the queries [t0, t0 + chunk) of the batch over the cells (attention.comp), their
// weights left in the scratch for fold_statistics.
void VulkanBackend::attend_chunk(const LayerCells &c, const Tensor &out, const Tensor &q, int64_t first_index, uint32_t t0, uint32_t chunk,
                                 float scale, float softcap) {
    const Bound bq = bind(q, false);
    const Bound bo = bind(out, true);
    const Bound bscratch = bind(scratch_, true);
    AttentionPush push{};
    split64(first_index + t0, push.first_index);
    push.q_off = bq.word + t0 * static_cast<uint32_t>(q.cols);
    push.q_stride = static_cast<uint32_t>(q.cols);
    push.out_off = bo.word + t0 * static_cast<uint32_t>(out.cols);
    push.out_stride = static_cast<uint32_t>(out.cols);
    push.keys_off = c.keys.word;
    push.values_off = c.values.word;
    push.meta_off = c.meta.word;
    push.scratch_off = bscratch.word;
    push.n_cells = c.n_cells;
    push.n_slots = c.n_slots;
    push.first_slot = c.first_slot;
    push.total_slots = c.total_slots;
    push.n_kv = c.n_kv;
    push.max_batch = static_cast<uint32_t>(max_batch_);
    push.layer = c.layer;
    push.head_dim = c.head_dim;
    push.group = c.group;
    push.chunk_capacity = chunk_capacity_;
    push.scale = scale;
    push.window = c.window;
    push.softcap = softcap;
    push.key_format = static_cast<uint32_t>(kv_key_format(kv_.type));
    push.value_format = static_cast<uint32_t>(kv_value_format(kv_.type));
    Bound read_keys = c.keys, read_values = c.values, read_meta = c.meta;
    read_keys.access.write = read_values.access.write = read_meta.access.write = false;
    dispatch(reduction_kernel("attention"), {bq, bo, read_keys, read_values, read_meta, bscratch}, &push, sizeof push, c.n_kv, chunk);
}

// Folds the weights attend_chunk left in the scratch into the slots' statistics (attention_stats.comp).
void VulkanBackend::fold_statistics(const LayerCells &c, const AttentionBatch &batch, uint32_t t0, uint32_t chunk) {
    Bound read_scratch = bind(scratch_, false);
    StatsPush stats{};
    split64(batch.first_index + t0, stats.first_index);
    stats.meta_off = c.meta.word;
    stats.n_cells = c.n_cells;
    stats.n_slots = c.n_slots;
    stats.first_slot = c.first_slot;
    stats.total_slots = c.total_slots;
    stats.n_kv = c.n_kv;
    stats.max_batch = static_cast<uint32_t>(max_batch_);
    stats.layer = c.layer;
    stats.scratch_off = read_scratch.word;
    stats.chunk_capacity = chunk_capacity_;
    stats.chunk_tokens = chunk;
    stats.t0 = t0;
    stats.n = static_cast<uint32_t>(batch.n_tokens);
    stats.group = c.group;
    stats.decay = c.policy.persistence_decay;
    stats.proxy = static_cast<uint32_t>(kv_proxy_queries(c.policy));
    stats.window = c.window;
    dispatch("attention_stats", {c.meta, read_scratch}, &stats, sizeof stats, (c.n_slots + kStatsGroup - 1) / kStatsGroup, c.n_kv);
}

}  // namespace h2o
