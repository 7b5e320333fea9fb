// The Vulkan backend's KV cache (vk_backend.h): its buffers, clearing, rebalancing between kv
// heads, downloads for tests and evaluation, and snapshots through a host image.
#include "vulkan/vk_backend.h"

namespace h2o {

namespace {

static_assert(sizeof(SlotStats) == 5 * sizeof(float), "download_kv_statistics copies 5 floats per slot");
constexpr int kMaxHeadDim = 256;  // MAX_HEAD_DIM in attention.comp
constexpr VkDeviceSize kAttentionScratchBudget = VkDeviceSize{32} << 20;

// every row starts on a word boundary; mirrors kv_row_words() in kv_row.glsl.
static_assert(static_cast<uint32_t>(KvRowFormat::F32) == 0 && static_cast<uint32_t>(KvRowFormat::F16) == 1 &&
                  static_cast<uint32_t>(KvRowFormat::Q8) == 2 && static_cast<uint32_t>(KvRowFormat::Q4) == 3,
              "the shaders take KvRowFormat values as push constants (KV_F32.. in kv_row.glsl)");
uint32_t kv_row_words(KvRowFormat format, int head_dim) {
    const auto n = static_cast<uint32_t>(head_dim);
    switch (format) {
        case KvRowFormat::F16:
            return (n + 1) / 2;
        case KvRowFormat::Q8:
            return 1 + (n + 3) / 4;
        case KvRowFormat::Q4:
            return 1 + (n + 7) / 8;
        case KvRowFormat::F32:
            break;
    }
    return n;
}

// kv_rebalance.comp's MOVES_LEFT, MOVES_RIGHT, MOVES_ALL.
constexpr uint32_t kKvMovesLeft = 1, kKvMovesRight = 2, kKvMovesAll = 3;
struct KvRebalancePush {
    uint32_t keys_off, values_off, meta_off, work_off, table_off;
    uint32_t first_slot, pool, first_layer, end_layer, incoming;
    uint32_t head_dim, pairs, pairing, rolling;
    uint32_t formats;  // key format | value format << 8
    uint32_t n_cells, total_slots, n_kv, max_batch;
    uint32_t sort_size, area_moves;
    uint32_t chunk_first, direction;  // kv_rebalance.comp's MOVES_LEFT, MOVES_RIGHT, MOVES_ALL
};
static_assert(sizeof(KvRebalancePush) <= vk::kPushConstantBytes, "push constants are limited to 128 bytes");

}  // namespace

// ---- KV cache -----------------------------------------------------------------------------------

// Rebalancing's work buffer (kv_rebalance.comp), when the heads' budgets move: sorted over the
// next power of two of the largest pool, rows moved in chunks of up to 2048 slots. Empty (its
// end 0) when they do not move.
VulkanBackend::RebalancePlan VulkanBackend::plan_rebalancing(const KvConfig &config) {
    RebalancePlan plan;
    if (config.head_share <= 0.0f) return plan;
    while (plan.sort_size < config.max_pool_slots()) plan.sort_size <<= 1;
    int64_t chunk = 2048;
    // Test hook: fewer moves per chunk, so that small caches take the order of large pools'.
    if (const char *moves = std::getenv("H2O_VULKAN_REBALANCE_CHUNK"); moves && *moves)
        chunk = std::clamp<int64_t>(std::strtoll(moves, nullptr, 10), 1, chunk);
    plan.area_moves = static_cast<uint32_t>(std::min(config.max_pool_slots(), chunk));
    const uint32_t slot_words = kv_row_words(kv_key_format(config.type), config.head_dim) +
                                kv_row_words(kv_value_format(config.type), config.head_dim) + KV_TOKEN_WORDS;
    const auto n_cells = static_cast<uint32_t>(config.n_layer * config.n_head_kv);
    plan.work = kv_rebalance_work(static_cast<uint32_t>(config.n_layer), n_cells, plan.sort_size, plan.area_moves * slot_words);
    // The moves' passes: a workgroup of 64 per 64 words of a chunk, at most 64 (they loop).
    plan.move_groups = static_cast<uint32_t>(std::min<uint64_t>(64, (uint64_t{plan.area_moves} * slot_words + 63) / 64));
    return plan;
}

// Rolled keys rotate back by the host's own cosines and sines (kv_rotate_back_table), so that
// they keep the CPU's bits: the global layers' table, then the local layers'.
Status VulkanBackend::upload_rollback_table(const KvConfig &config) {
    const int max_slots = static_cast<int>(config.max_cell_slots());
    std::vector<float> table;
    try {
        table = kv_rotate_back_table(config.rope, max_slots);
        if (!config.layer_window.empty()) {
            const std::vector<float> local = kv_rotate_back_table(config.local_rope, max_slots);
            table.insert(table.end(), local.begin(), local.end());
        }
    } catch (const std::bad_alloc &) {
        return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's rotation table");
    }
    local_rollback_off_ = config.layer_window.empty() ? 0 : static_cast<uint32_t>(table.size() / 4);  // in (cos, sin) pairs
    H2O_TRY(allocate(sizeof(float) * table.size(), &rollback_table_));
    record_upload(block(rollback_table_).buffer, rollback_table_.offset, table.data(), sizeof(float) * table.size());
    return Status::Ok();
}

Status VulkanBackend::create_kv(const KvConfig &config) {
    if (has_kv_) return make_error(H2O_ERR_INVALID_ARGUMENT, "the KV cache was already created");
    H2O_TRY(vulkan_runs_kv(config));
    const KvRowFormat key_format = kv_key_format(config.type), value_format = kv_value_format(config.type);
    const VkDeviceSize range = binding_limit_;
    const auto n_cells = static_cast<uint32_t>(config.n_layer * config.n_head_kv);
    // The most slots a cell may hold (its layer's budget unless the heads' budgets move).
    const auto max_slots = static_cast<uint32_t>(config.max_cell_slots()), n_kv = static_cast<uint32_t>(config.n_head_kv);
    // Keys and values: one region per pool of layers whose cells share slots (each layer, or the
    // whole cache when the budgets move across layers: KvConfig::pool_first_layer).
    auto rows_bytes = [&](int64_t slots, KvRowFormat format) {
        return VkDeviceSize{4} * static_cast<uint64_t>(slots) * kv_row_words(format, config.head_dim);
    };
    const KvLayout layout = kv_layout(0, n_cells, static_cast<uint32_t>(config.total_slots()), n_kv, static_cast<uint32_t>(max_batch_));
    // Expected Attention's query statistics follow the layout's regions (kv_expect.comp).
    const uint32_t query_first = kv_meta_words(layout, max_slots);
    const VkDeviceSize meta_bytes = VkDeviceSize{4} * (query_first + n_cells * kv_query_stats_floats(config));
    // Attention weights of a chunk of queries (weights and group weights per slot) and the
    // visible-slot counts: as many tokens as the budget allows.
    const VkDeviceSize per_token = VkDeviceSize{4} * (2 * n_kv * max_slots + n_kv);
    const auto capacity = static_cast<uint32_t>(std::clamp<VkDeviceSize>(kAttentionScratchBudget / per_token, 1, max_batch_));
    const VkDeviceSize scratch_bytes = per_token * capacity;
    const RebalancePlan plan = plan_rebalancing(config);
    const VkDeviceSize work_bytes = VkDeviceSize{4} * plan.work.end;
    for (VkDeviceSize bytes : {rows_bytes(config.max_pool_slots(), key_format), rows_bytes(config.max_pool_slots(), value_format),
                               meta_bytes, scratch_bytes, work_bytes}) {
        if (bytes + alignment_ > range) {
            return make_error(H2O_ERR_UNSUPPORTED, "the KV cache needs a " + std::to_string(bytes >> 20) +
                                                       " MiB region, more than the device's storage buffer range (" +
                                                       std::to_string(range >> 20) + " MiB); use fewer slots");
        }
    }
    keys_.resize(config.n_layer);
    values_.resize(config.n_layer);
    kv_bytes_ = meta_bytes;
    for (int l = 0; l < config.n_layer; l = config.pool_end_layer(l)) {
        const VkDeviceSize key_bytes = rows_bytes(config.pool_slots(l), key_format),
                           value_bytes = rows_bytes(config.pool_slots(l), value_format);
        H2O_TRY(allocate(key_bytes, &keys_[l]));
        H2O_TRY(allocate(value_bytes, &values_[l]));
        kv_bytes_ += key_bytes + value_bytes;
    }
    H2O_TRY(allocate(meta_bytes, &meta_));
    H2O_TRY(allocate(scratch_bytes, &scratch_));
    if (config.rolling) H2O_TRY(upload_rollback_table(config));
    if (work_bytes > 0) {
        H2O_TRY(allocate(work_bytes, &rebalance_work_));
        kv_bytes_ += work_bytes;
        try {
            rebalance_layers_.assign(KV_REBALANCE_LAYER_WORDS * static_cast<size_t>(config.n_layer), 0);
            rebalance_counts_.assign(4 * static_cast<size_t>(n_cells), 0);
        } catch (const std::bad_alloc &) {
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's rebalancing lists");
        }
    }
    rebalance_layout_ = plan.work;
    rebalance_sort_size_ = plan.sort_size;
    rebalance_area_moves_ = plan.area_moves;
    rebalance_move_groups_ = plan.move_groups;
    kv_ = config;
    layout_ = layout;
    query_first_ = query_first;
    chunk_capacity_ = capacity;
    has_kv_ = true;
    // Slot 1: the global layers' turn fractions, for Expected Attention's queries.
    const bool expects = config.policy.policy == KvPolicy::ExpectedAttention;
    if (expects && config.rope.dims >= 2) ensure_rope_table(1, config.rope);
    return clear_kv();
}

Status VulkanBackend::clear_kv() {
    if (!has_kv_ || failed()) return error_;
    const VkBuffer meta = block(meta_).buffer;
    const uint32_t slots = layout_.position - layout_.stream;               // 2 words per slot
    record_fill(meta, meta_.offset, VkDeviceSize{4} * slots, 0xFFFFFFFFu);  // every slot free (-1)
    record_fill(meta, meta_.offset + VkDeviceSize{4} * layout_.position, VkDeviceSize{4} * (layout_.rng - layout_.position), 0);
    const uint64_t rng = kv_initial_random_state(kv_.policy.seed);
    record_upload(meta, meta_.offset + VkDeviceSize{4} * layout_.rng, &rng, sizeof rng);
    record_fill(meta, meta_.offset + VkDeviceSize{4} * layout_.span_min, VkDeviceSize{4} * KV_MAX_SPANS, 0);
    const size_t query_words = static_cast<size_t>(kv_.n_layer) * kv_.n_head_kv * kv_query_stats_floats(kv_);
    if (query_words != 0) record_fill(meta, meta_.offset + VkDeviceSize{4} * query_first_, VkDeviceSize{4} * query_words, 0);
    // Every cell its layer's budget, as KvImage::clear.
    std::vector<uint32_t> cells(2 * static_cast<size_t>(kv_.n_layer) * kv_.n_head_kv);
    const size_t n_cells = cells.size() / 2;
    for (int l = 0; l < kv_.n_layer; ++l) {
        for (int h = 0; h < kv_.n_head_kv; ++h) {
            const size_t cell = static_cast<size_t>(l) * kv_.n_head_kv + h;
            cells[cell] = static_cast<uint32_t>(kv_.uniform_cell_first(l, h));
            cells[n_cells + cell] = static_cast<uint32_t>(kv_.slots_in(l));
        }
    }
    record_upload(meta, meta_.offset + VkDeviceSize{4} * layout_.cell_first, cells.data(), sizeof(uint32_t) * cells.size());
    return error_;
}

Status VulkanBackend::download_kv_cell_slots(int32_t *out) {
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "vulkan backend: no KV cache");
    const auto n_cells = static_cast<VkDeviceSize>(kv_.n_layer) * kv_.n_head_kv;
    return download_range(block(meta_).buffer, meta_.offset + VkDeviceSize{4} * layout_.cell_slots, out, n_cells * sizeof(int32_t));
}

// The rule runs on the device (kv_rebalance.comp), a pool of layers at a time, on the bookkeeping
// and rows where they live: one workgroup decides, then many make its moves (a chunk of the
// largest move list the pool can have at a time) and clear the slots it left empty. Up go each
// layer's parameters (KV_REBALANCE_LAYER_WORDS), down come each cell's four counts (used, free,
// first slot, slots). No slot's words cross (h2o_session_get_device_traffic counts both).
Status VulkanBackend::rebalance_kv(int64_t next_index, int incoming, int floor, int32_t *held, int32_t *slots) {
    if (!has_kv_ || failed() || kv_.head_share <= 0.0f) return error_;
    const auto n_cells = static_cast<uint32_t>(kv_.n_layer * kv_.n_head_kv);
    if (kv_policy_uses_statistics(kv_.policy.policy)) {
        std::vector<uint32_t> &layers = rebalance_layers_;
        for (int l = 0; l < kv_.n_layer; ++l) {
            const KvPolicyConfig policy = kv_.policy_in(l);
            uint32_t *row = layers.data() + KV_REBALANCE_LAYER_WORDS * static_cast<size_t>(l);
            row[0] = static_cast<uint32_t>(kv_.cell_minimum(l, floor));
            row[1] = static_cast<uint32_t>(policy.policy);
            row[2] = static_cast<uint32_t>(std::max(0, policy.sinks));
            split64(kv_recent_from(policy, next_index, incoming), row + 3);
            split64(kv_stale_before(policy, next_index, incoming), row + 5);
        }
        const Bound bwork = bind(rebalance_work_, true);
        record_upload(block(rebalance_work_).buffer, rebalance_work_.offset + VkDeviceSize{4} * rebalance_layout_.layers, layers.data(),
                      sizeof(uint32_t) * layers.size());
        const Bound bmeta = bind(meta_, true);
        // (Without rolling nothing rolls back: any buffer fills the table's binding.)
        const Bound btable = bind(kv_.rolling ? rollback_table_ : rope_table_, false);
        KvRebalancePush push{};
        push.meta_off = bmeta.word;
        push.work_off = bwork.word;
        push.table_off = btable.word / 2;  // in (cos, sin) pairs; pools hold global layers alone
        push.incoming = static_cast<uint32_t>(incoming);
        push.head_dim = static_cast<uint32_t>(kv_.head_dim);
        push.pairs = static_cast<uint32_t>(kv_.rope.pairs());
        push.pairing = kv_.rope.pairing == RotaryPairing::Halves ? 1 : 0;  // rotary.glsl's PAIRING_HALVES
        push.rolling = kv_.rolling ? 1 : 0;
        push.formats = static_cast<uint32_t>(kv_key_format(kv_.type)) | static_cast<uint32_t>(kv_value_format(kv_.type)) << 8;
        push.n_cells = n_cells;
        push.total_slots = static_cast<uint32_t>(kv_.total_slots());
        push.n_kv = static_cast<uint32_t>(kv_.n_head_kv);
        push.max_batch = static_cast<uint32_t>(max_batch_);
        push.sort_size = rebalance_sort_size_;
        push.area_moves = rebalance_area_moves_;
        for (int pool = 0; pool < kv_.n_layer; pool = kv_.pool_end_layer(pool)) {
            if (kv_.is_window_layer(pool)) continue;  // a window's slots never move
            const Bound bkeys = bind(keys_[pool], true), bvalues = bind(values_[pool], true);
            push.keys_off = bkeys.word;
            push.values_off = bvalues.word;
            push.first_slot = static_cast<uint32_t>(kv_.first_slot_of(pool));
            push.pool = static_cast<uint32_t>(kv_.pool_slots(pool));
            push.first_layer = static_cast<uint32_t>(pool);
            push.end_layer = static_cast<uint32_t>(kv_.pool_end_layer(pool));
            dispatch("kv_rebalance", {bkeys, bvalues, bmeta, bwork, btable}, &push, sizeof push, 1);
            // Moves that go left in increasing order, then those that go right in decreasing
            // order, as the rule makes them; a single chunk takes them all at once.
            const auto chunks = static_cast<uint32_t>((push.pool + push.area_moves - 1) / push.area_moves);
            const uint32_t groups = rebalance_move_groups_;
            auto move = [&](uint32_t chunk, uint32_t direction) {
                push.chunk_first = chunk * push.area_moves;
                push.direction = direction;
                dispatch("kv_rebalance_gather", {bkeys, bvalues, bmeta, bwork, btable}, &push, sizeof push, groups);
                dispatch("kv_rebalance_scatter", {bkeys, bvalues, bmeta, bwork, btable}, &push, sizeof push, groups);
            };
            if (chunks == 1) {
                move(0, kKvMovesAll);
            } else {
                for (uint32_t c = 0; c < chunks; ++c) move(c, kKvMovesLeft);
                for (uint32_t c = chunks; c-- > 0;) move(c, kKvMovesRight);
            }
            dispatch("kv_rebalance_clear", {bkeys, bvalues, bmeta, bwork, btable}, &push, sizeof push,
                     static_cast<uint32_t>(std::min<uint64_t>(64, (uint64_t{push.pool} + 63) / 64)));
        }
    }
    // The cells' counts: used, free_count, cell_first and cell_slots follow one another.
    std::vector<uint32_t> &counts = rebalance_counts_;
    H2O_TRY(download_range(block(meta_).buffer, meta_.offset + VkDeviceSize{4} * layout_.used, counts.data(),
                           sizeof(uint32_t) * counts.size()));
    for (uint32_t c = 0; c < n_cells; ++c) {
        held[c] = static_cast<int32_t>(counts[c] - counts[n_cells + c]);
        slots[c] = static_cast<int32_t>(counts[3 * n_cells + c]);
    }
    return error_;
}

Status VulkanBackend::set_kv_span_minimums(const int32_t *minimums) {
    if (!has_kv_ || failed()) return error_;
    record_upload(block(meta_).buffer, meta_.offset + VkDeviceSize{4} * layout_.span_min, minimums, sizeof(int32_t) * KV_MAX_SPANS);
    return error_;
}

// ---- snapshots ----------------------------------------------------------------------------------
// The host cache is a transient copy as large as the device's (a snapshot holds as much). Rows on
// the device are the host's rows padded to whole words (kv_row.glsl), bit for bit; the bookkeeping
// is kv_meta_layout.h's, the host's in words.

Status VulkanBackend::save_kv(ByteWriter &out) {
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "vulkan backend: no KV cache");
    KvImage image;
    H2O_TRY(image.allocate(kv_));
    H2O_TRY(cache_to_image(image));
    save_kv_image(kv_, image, out);
    return Status::Ok();
}

Status VulkanBackend::load_kv(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) {
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "vulkan backend: no KV cache");
    H2O_TRY(error_);
    KvImage image;
    H2O_TRY(image.allocate(kv_));
    H2O_TRY(load_kv_image(kv_, image, in, n_past, n_cached, n_pinned, n_spans));  // checks everything before the device changes
    return cache_from_image(image);
}

// Keys and values are one region of rows per pool of layers (create_kv), its cells' rows in
// (layer, kv head) order from the pool's first slot.
Status VulkanBackend::cache_to_image(KvImage &image) {
    const uint32_t key_words = kv_row_words(kv_key_format(kv_.type), kv_.head_dim);
    const uint32_t value_words = kv_row_words(kv_value_format(kv_.type), kv_.head_dim);
    std::vector<uint32_t> meta(layout_.batch_slot);  // stream .. span_min
    H2O_TRY(download_range(block(meta_).buffer, meta_.offset, meta.data(), VkDeviceSize{4} * meta.size()));
    meta_words_to_image(meta.data(), image);
    std::vector<uint32_t> keys, values;
    for (int pool = 0; pool < kv_.n_layer; pool = kv_.pool_end_layer(pool)) {
        const auto first_slot = static_cast<size_t>(kv_.first_slot_of(pool)), pool_slots = static_cast<size_t>(kv_.pool_slots(pool));
        keys.resize(pool_slots * key_words);
        values.resize(pool_slots * value_words);
        H2O_TRY(download_range(block(keys_[pool]).buffer, keys_[pool].offset, keys.data(), VkDeviceSize{4} * keys.size()));
        H2O_TRY(download_range(block(values_[pool]).buffer, values_[pool].offset, values.data(), VkDeviceSize{4} * values.size()));
        for (size_t row = 0; row < pool_slots; ++row) {
            std::memcpy(&image.keys[(first_slot + row) * image.key_row_bytes], &keys[row * key_words], image.key_row_bytes);
            std::memcpy(&image.values[(first_slot + row) * image.value_row_bytes], &values[row * value_words], image.value_row_bytes);
        }
    }
    if (!image.query_stats.empty()) {
        H2O_TRY(download_range(block(meta_).buffer, meta_.offset + VkDeviceSize{4} * query_first_, image.query_stats.data(),
                               sizeof(float) * image.query_stats.size()));
    }
    return Status::Ok();
}

void VulkanBackend::meta_words_to_image(const uint32_t *meta, KvImage &image) const {
    const size_t n_cells = image.cell_slots.size();
    for (size_t c = 0; c < n_cells; ++c) {
        image.used[c] = static_cast<int32_t>(meta[layout_.used + c]);
        image.free_count[c] = static_cast<int32_t>(meta[layout_.free_count + c]);
    }
    image.place_cells(0, n_cells, reinterpret_cast<const int32_t *>(&meta[layout_.cell_slots]));
    // Cells are consecutive, so the host slot at is the device slot at, whatever the regions.
    const auto slots = static_cast<size_t>(kv_.total_slots());
    for (size_t at = 0; at < slots; ++at) {
        image.stream_index[at] =
            static_cast<int64_t>(uint64_t{meta[layout_.stream + 2 * at]} | uint64_t{meta[layout_.stream + 2 * at + 1]} << 32);
        image.position[at] = static_cast<int32_t>(meta[layout_.position + at]);
        image.tags[at] = static_cast<uint8_t>(meta[layout_.tag + at]);
        if (!image.stats.empty()) std::memcpy(&image.stats[at], &meta[layout_.stats + 5 * at], sizeof(SlotStats));
        image.free_list[at] = static_cast<int32_t>(meta[layout_.free_list + at]);
    }
    image.random_state = uint64_t{meta[layout_.rng]} | uint64_t{meta[layout_.rng + 1]} << 32;
    std::memcpy(image.span_minimum, &meta[layout_.span_min], sizeof(int32_t) * KV_MAX_SPANS);
}

void VulkanBackend::image_to_meta_words(const KvImage &image, uint32_t *meta) const {
    std::fill(meta, meta + layout_.batch_slot, 0u);  // zero statistics for the policies without
    const size_t n_cells = image.cell_slots.size();
    for (size_t c = 0; c < n_cells; ++c) {
        meta[layout_.used + c] = static_cast<uint32_t>(image.used[c]);
        meta[layout_.free_count + c] = static_cast<uint32_t>(image.free_count[c]);
        meta[layout_.cell_first + c] = static_cast<uint32_t>(image.cell_first_slot[c]);
        meta[layout_.cell_slots + c] = static_cast<uint32_t>(image.cell_slots[c]);
    }
    const auto slots = static_cast<size_t>(kv_.total_slots());
    for (size_t at = 0; at < slots; ++at) {
        const auto stream = static_cast<uint64_t>(image.stream_index[at]);  // -1 (free): both words ~0
        meta[layout_.stream + 2 * at] = static_cast<uint32_t>(stream);
        meta[layout_.stream + 2 * at + 1] = static_cast<uint32_t>(stream >> 32);
        meta[layout_.position + at] = static_cast<uint32_t>(image.position[at]);
        meta[layout_.tag + at] = image.tags[at];
        if (!image.stats.empty()) std::memcpy(&meta[layout_.stats + 5 * at], &image.stats[at], sizeof(SlotStats));
        meta[layout_.free_list + at] = static_cast<uint32_t>(image.free_list[at]);
    }
    meta[layout_.rng] = static_cast<uint32_t>(image.random_state);
    meta[layout_.rng + 1] = static_cast<uint32_t>(image.random_state >> 32);
    std::memcpy(&meta[layout_.span_min], image.span_minimum, sizeof(int32_t) * KV_MAX_SPANS);
}

Status VulkanBackend::cache_from_image(const KvImage &image) {
    const uint32_t key_words = kv_row_words(kv_key_format(kv_.type), kv_.head_dim);
    const uint32_t value_words = kv_row_words(kv_value_format(kv_.type), kv_.head_dim);
    std::vector<uint32_t> keys, values;
    for (int pool = 0; pool < kv_.n_layer; pool = kv_.pool_end_layer(pool)) {
        const auto first_slot = static_cast<size_t>(kv_.first_slot_of(pool)), pool_slots = static_cast<size_t>(kv_.pool_slots(pool));
        keys.assign(pool_slots * key_words, 0u);
        values.assign(pool_slots * value_words, 0u);
        for (size_t row = 0; row < pool_slots; ++row) {
            std::memcpy(&keys[row * key_words], &image.keys[(first_slot + row) * image.key_row_bytes], image.key_row_bytes);
            std::memcpy(&values[row * value_words], &image.values[(first_slot + row) * image.value_row_bytes], image.value_row_bytes);
        }
        record_upload(block(keys_[pool]).buffer, keys_[pool].offset, keys.data(), VkDeviceSize{4} * keys.size());  // staged: copied now
        record_upload(block(values_[pool]).buffer, values_[pool].offset, values.data(), VkDeviceSize{4} * values.size());
    }
    std::vector<uint32_t> meta(layout_.batch_slot);  // stream .. span_min
    image_to_meta_words(image, meta.data());
    record_upload(block(meta_).buffer, meta_.offset, meta.data(), VkDeviceSize{4} * meta.size());  // staged: copied now
    if (!image.query_stats.empty()) {
        record_upload(block(meta_).buffer, meta_.offset + VkDeviceSize{4} * query_first_, image.query_stats.data(),
                      sizeof(float) * image.query_stats.size());
    }
    return error_;
}

Status VulkanBackend::download_kv_stream_indices(int64_t *out) {
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "vulkan backend: no KV cache");
    const auto slots = static_cast<VkDeviceSize>(kv_.total_slots());
    return download_range(block(meta_).buffer, meta_.offset + VkDeviceSize{4} * layout_.stream, out, slots * sizeof(int64_t));
}

Status VulkanBackend::download_kv_tags(uint8_t *out) {
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "vulkan backend: no KV cache");
    const auto slots = static_cast<size_t>(kv_.total_slots());
    std::vector<uint32_t> words(slots);
    std::vector<int64_t> stream(slots);
    H2O_TRY(download_range(block(meta_).buffer, meta_.offset + VkDeviceSize{4} * layout_.tag, words.data(), slots * sizeof(uint32_t)));
    H2O_TRY(download_kv_stream_indices(stream.data()));
    // A freed slot keeps its last token's tag on the device.
    for (size_t i = 0; i < slots; ++i) out[i] = stream[i] >= 0 ? static_cast<uint8_t>(words[i]) : 0;
    return Status::Ok();
}

Status VulkanBackend::download_kv_statistics(SlotStats *out) {
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "vulkan backend: no KV cache");
    const auto slots = static_cast<VkDeviceSize>(kv_.total_slots());
    // The policies without statistics have none (the key scorers keep their scores in those words).
    if (!kv_policy_uses_statistics(kv_.policy.policy)) {
        std::fill(out, out + slots, kv_stats_zero());
        return Status::Ok();
    }
    return download_range(block(meta_).buffer, meta_.offset + VkDeviceSize{4} * layout_.stats, out, slots * sizeof(SlotStats));
}

Status vulkan_runs_kv(const KvConfig &config) {
    if (static_cast<uint32_t>(config.type) >= kKvTypeCount) return make_error(H2O_ERR_INVALID_ARGUMENT, "unknown KV cache type");
    if (config.n_slots <= 0 || config.n_layer <= 0 || config.n_head_kv <= 0 || config.head_dim <= 0) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "empty KV cache configuration");
    }
    if (config.head_dim > kMaxHeadDim) {
        return make_error(H2O_ERR_UNSUPPORTED, "head_dim " + std::to_string(config.head_dim) +
                                                   " is larger than the Vulkan backend supports (" + std::to_string(kMaxHeadDim) + ")");
    }
    H2O_TRY(kv_type_fits_head_dim(config.type, config.head_dim));
    if (config.rolling && config.rope.pairs() > static_cast<int>(kRopeTablePairs)) {
        return make_error(H2O_ERR_UNSUPPORTED, "rotary dimensions " + std::to_string(config.rope.dims) +
                                                   " are more than the Vulkan backend rolls (" + std::to_string(2 * kRopeTablePairs) + ")");
    }
    return Status::Ok();
}

}  // namespace h2o
