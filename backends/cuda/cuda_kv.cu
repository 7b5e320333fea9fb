// The CUDA backend's KV cache (cuda_impl.cuh): its arrays, clearing, rebalancing between kv heads
// (with its kernels) and snapshots.
#include "cuda/cuda_impl.cuh"

namespace h2o {

namespace {

// Budgets that move (kv_head_budgets.h) done on the device: what the host's rule did to the rows
// (KvRowEdits), a chunk of `n` entries of two int64 at a time. (slot, shift): the slot's key rolls
// back; only global layers rebalance, so by the global rotation.
__global__ void kv_rebalance_roll_kernel(KvDevice kv, const int64_t *entries, int n, KvRowFormat format, size_t key_row, int head_dim,
                                         RotaryPairing pairing, int pairs) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        roll_key_back(kv.keys + entries[2 * i] * key_row, static_cast<int>(entries[2 * i + 1]), format, head_dim, kv.inv_freq, pairing,
                      pairs);
    }
}

// (from, to): gathering copies the key and value rows of slot `from` to `area` (entry after
// entry), scattering copies them from there to slot `to`. A chunk's gather before its scatter
// moves its rows as one move after another in the rule's order would (KvRowEdits).
__global__ void kv_rebalance_move_kernel(KvDevice kv, const int64_t *entries, int n, uint8_t *area, size_t key_row, size_t value_row,
                                         bool gather) {
    const size_t slot_bytes = key_row + value_row, total = static_cast<size_t>(n) * slot_bytes;
    for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < total;
         k += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const size_t i = k / slot_bytes, b = k % slot_bytes;
        const auto slot = static_cast<size_t>(entries[2 * i + (gather ? 0 : 1)]);
        uint8_t *row = b < key_row ? kv.keys + slot * key_row + b : kv.values + slot * value_row + (b - key_row);
        if (gather) {
            area[k] = *row;
        } else {
            *row = area[k];
        }
    }
}

}  // namespace

Status CudaBackend::create_kv(const KvConfig &config) {
    H2O_TRY(failed_);
    H2O_TRY(cuda_runs_kv(config));
    if (has_kv_) return make_error(H2O_ERR_INVALID_ARGUMENT, "the KV cache was already created");
    const KvRowFormat key_format = kv_key_format(config.type), value_format = kv_value_format(config.type);
    key_row_ = kv_row_bytes(key_format, config.head_dim);
    value_row_ = kv_row_bytes(value_format, config.head_dim);
    kv_config_ = config;
    const size_t cells = static_cast<size_t>(config.n_layer) * config.n_head_kv;
    const size_t slots = static_cast<size_t>(config.total_slots()),
                 per_head = static_cast<size_t>(config.n_head_kv) * config.max_cell_slots();
    H2O_TRY(device_array(slots * key_row_, &kv_.keys));
    H2O_TRY(device_array(slots * value_row_, &kv_.values));
    H2O_TRY(device_array(slots, &kv_.stream));
    H2O_TRY(device_array(slots, &kv_.position));
    H2O_TRY(device_array(slots, &kv_.tag));
    if (kv_policy_uses_statistics(config.policy.policy)) {
        H2O_TRY(device_array(slots, &kv_.stats));
        H2O_TRY(device_array(per_head, &kv_.partial));
    }
    H2O_TRY(device_array(slots, &kv_.free_list));
    H2O_TRY(device_array(cells, &kv_.used));
    H2O_TRY(device_array(cells, &kv_.free_count));
    H2O_TRY(device_array(cells, &kv_.cell_first));
    H2O_TRY(device_array(cells, &kv_.cell_slots));
    H2O_TRY(device_array(1, &kv_.rng));
    H2O_TRY(device_array(per_head, &kv_.batch_slot));
    H2O_TRY(device_array(per_head, &kv_.victims));
    H2O_TRY(device_array(static_cast<size_t>(config.max_cell_slots()), &kv_.candidates));
    if (kv_policy_scores_keys(static_cast<uint32_t>(config.policy.policy))) {
        H2O_TRY(device_array(per_head * 2, &kv_.key_scores));
    }
    if (kv_query_stats_floats(config) != 0) H2O_TRY(device_array(cells * kv_query_stats_floats(config), &kv_.query_stats));
    // Budgets per kv head move by the rule of kv_head_budgets.h, run on a host copy of the
    // bookkeeping, its edits of the rows done here a chunk at a time (rebalance_kv).
    if (config.head_share > 0.0f) {
        H2O_TRY(rebalance_books_.init_bookkeeping(config));
        const size_t chunk = std::min(kRebalanceChunk, slots);
        H2O_TRY(device_array(2 * chunk, &rebalance_edits_));
        H2O_TRY(device_array(chunk * (key_row_ + value_row_), &rebalance_rows_));
        try {
            rebalance_entries_.assign(2 * chunk, 0);
        } catch (const std::bad_alloc &) {
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's rebalancing entries");
        }
    }
    const int pairs = config.rope.pairs();
    H2O_TRY(device_array(static_cast<size_t>(std::max(pairs, 1)), &kv_.inv_freq));
    const std::vector<double> inv_freq = config.rope.inv_freqs();
    H2O_TRY(copy_to_device_now(kv_.inv_freq, inv_freq.data(), inv_freq.size() * sizeof(double)));
    if (!config.layer_window.empty()) {
        H2O_TRY(device_array(static_cast<size_t>(std::max(pairs, 1)), &local_inv_freq_));
        const std::vector<double> local = config.local_rope.inv_freqs();
        H2O_TRY(copy_to_device_now(local_inv_freq_, local.data(), local.size() * sizeof(double)));
    }
    // The attention scratch is sized at the first attention call, when the number of query heads
    // is known.
    has_kv_ = true;
    return clear_kv();
}

Status CudaBackend::clear_kv() {
    H2O_TRY(failed_);
    if (!has_kv_) return Status::Ok();
    const size_t cells = static_cast<size_t>(kv_config_.n_layer) * kv_config_.n_head_kv;
    H2O_TRY(check(cudaMemsetAsync(kv_.stream, 0xFF, slot_count() * sizeof(int64_t), stream_), "cudaMemsetAsync"));  // -1: free
    H2O_TRY(check(cudaMemsetAsync(kv_.tag, 0, slot_count(), stream_), "cudaMemsetAsync"));
    std::fill(span_min_, span_min_ + KV_MAX_SPANS, 0);
    H2O_TRY(check(cudaMemsetAsync(kv_.used, 0, cells * sizeof(int32_t), stream_), "cudaMemsetAsync"));
    H2O_TRY(check(cudaMemsetAsync(kv_.free_count, 0, cells * sizeof(int32_t), stream_), "cudaMemsetAsync"));
    // Every cell its layer's budget (KvImage::clear).
    std::vector<int64_t> first(cells);
    std::vector<int32_t> sizes(cells);
    for (size_t c = 0; c < cells; ++c) {
        const int layer = static_cast<int>(c / static_cast<size_t>(kv_config_.n_head_kv)),
                  head = static_cast<int>(c % static_cast<size_t>(kv_config_.n_head_kv));
        first[c] = kv_config_.uniform_cell_first(layer, head);
        sizes[c] = kv_config_.slots_in(layer);
    }
    H2O_TRY(copy_to_device_now(kv_.cell_first, first.data(), cells * sizeof(int64_t)));
    H2O_TRY(copy_to_device_now(kv_.cell_slots, sizes.data(), cells * sizeof(int32_t)));
    if (kv_.stats) H2O_TRY(check(cudaMemsetAsync(kv_.stats, 0, slot_count() * sizeof(SlotStats), stream_), "cudaMemsetAsync"));
    if (kv_.query_stats) {
        H2O_TRY(check(cudaMemsetAsync(kv_.query_stats, 0, cells * kv_query_stats_floats(kv_config_) * sizeof(float), stream_),
                      "cudaMemsetAsync"));
    }
    // KvImage::clear's generator state (the value is on this stack: the copy is waited for).
    const uint64_t rng = kv_initial_random_state(kv_config_.policy.seed);
    return copy_to_device_now(kv_.rng, &rng, sizeof rng);
}

// The device arrays of the cache and their host image's, with their sizes in bytes: the device
// keeps the image's arrays, array for array (statistics only for the policies that read them).
std::vector<CudaBackend::ImageArray> CudaBackend::image_arrays(KvImage &image, ImagePart part) {
    std::vector<ImageArray> arrays = {
        {kv_.stream, image.stream_index.data(), image.stream_index.size() * sizeof(int64_t)},
        {kv_.position, image.position.data(), image.position.size() * sizeof(int32_t)},
        {kv_.tag, image.tags.data(), image.tags.size()},
        {kv_.free_list, image.free_list.data(), image.free_list.size() * sizeof(int32_t)},
        {kv_.used, image.used.data(), image.used.size() * sizeof(int32_t)},
        {kv_.free_count, image.free_count.data(), image.free_count.size() * sizeof(int32_t)},
        {kv_.cell_first, image.cell_first_slot.data(), image.cell_first_slot.size() * sizeof(int64_t)},
        {kv_.cell_slots, image.cell_slots.data(), image.cell_slots.size() * sizeof(int32_t)},
        {kv_.rng, &image.random_state, sizeof image.random_state},
    };
    if (kv_.stats) arrays.push_back({kv_.stats, image.stats.data(), image.stats.size() * sizeof(SlotStats)});
    if (part == ImagePart::Bookkeeping) return arrays;
    arrays.push_back({kv_.keys, image.keys.data(), image.keys.size()});
    arrays.push_back({kv_.values, image.values.data(), image.values.size()});
    if (kv_.query_stats) arrays.push_back({kv_.query_stats, image.query_stats.data(), image.query_stats.size() * sizeof(float)});
    return arrays;
}

Status CudaBackend::save_kv(ByteWriter &out) {
    H2O_TRY(failed_);
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
    KvImage image;
    H2O_TRY(image.allocate(kv_config_));
    for (const ImageArray &a : image_arrays(image)) H2O_TRY(download_raw(a.device, a.host, a.bytes));
    save_kv_image(kv_config_, image, out);
    return Status::Ok();
}

Status CudaBackend::load_kv(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) {
    H2O_TRY(failed_);
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
    KvImage image;
    H2O_TRY(image.allocate(kv_config_));
    H2O_TRY(load_kv_image(kv_config_, image, in, n_past, n_cached, n_pinned, n_spans));  // checked before the device changes
    for (const ImageArray &a : image_arrays(image)) H2O_TRY(copy_to_device_now(a.device, a.host, a.bytes));
    std::copy(image.span_minimum, image.span_minimum + KV_MAX_SPANS, span_min_);  // none: the session sets them again
    return Status::Ok();
}

Status CudaBackend::rebalance_kv(int64_t next_index, int incoming, int floor, int32_t *held, int32_t *slots) {
    H2O_TRY(failed_);
    if (!has_kv_ || kv_config_.head_share <= 0.0f) return Status::Ok();
    KvImage &image = rebalance_books_.image();
    const std::vector<ImageArray> books = image_arrays(image, ImagePart::Bookkeeping);
    for (const ImageArray &a : books) H2O_TRY(download_raw(a.device, a.host, a.bytes));
    std::copy(span_min_, span_min_ + KV_MAX_SPANS, image.span_minimum);
    rebalance_books_.rebalance_heads(next_index, incoming, floor);
    rebalance_books_.cell_fill(held, slots);
    const KvRowEdits &edits = rebalance_books_.row_edits();
    std::vector<int64_t> &entries = rebalance_entries_;
    for (size_t done = 0; done < edits.rotations.size();) {
        const size_t n = std::min(edits.rotations.size() - done, kRebalanceChunk);
        for (size_t i = 0; i < n; ++i) {
            entries[2 * i] = edits.rotations[done + i].slot;
            entries[2 * i + 1] = edits.rotations[done + i].shift;
        }
        H2O_TRY(copy_to_device_now(rebalance_edits_, entries.data(), 2 * n * sizeof(int64_t)));  // (also waits for the last chunk)
        kv_rebalance_roll_kernel<<<grid_for(static_cast<int64_t>(n)), kBlock, 0, stream_>>>(
            kv_, rebalance_edits_, static_cast<int>(n), kv_key_format(kv_config_.type), key_row_, kv_config_.head_dim,
            kv_config_.rope.pairing, kv_config_.rope.pairs());
        H2O_TRY(launched("kv_rebalance_roll"));
        done += n;
    }
    for (size_t done = 0; done < edits.moves.size();) {
        const size_t n = std::min(edits.moves.size() - done, kRebalanceChunk);
        for (size_t i = 0; i < n; ++i) {
            entries[2 * i] = edits.moves[done + i].from;
            entries[2 * i + 1] = edits.moves[done + i].to;
        }
        H2O_TRY(copy_to_device_now(rebalance_edits_, entries.data(), 2 * n * sizeof(int64_t)));
        const unsigned grid = grid_for(static_cast<int64_t>(n * (key_row_ + value_row_)));
        for (const bool gather : {true, false}) {
            kv_rebalance_move_kernel<<<grid, kBlock, 0, stream_>>>(kv_, rebalance_edits_, static_cast<int>(n), rebalance_rows_, key_row_,
                                                                   value_row_, gather);
            H2O_TRY(launched("kv_rebalance_move"));
        }
        done += n;
    }
    for (const ImageArray &a : books) H2O_TRY(copy_to_device_now(a.device, a.host, a.bytes));
    return Status::Ok();
}

}  // namespace h2o
