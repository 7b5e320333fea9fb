#include "cpu/cpu_backend.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/shared_weights.h"
#include "activation.h"
#include "kv_cache.h"
#include "rotary.h"
#include "greedy_index.h"
#include "thread_pool.h"

namespace h2o {

namespace {

template <typename T>
T *host(const Tensor &t) {
    return reinterpret_cast<T *>(t.buffer + t.offset);
}

struct AlignedFree {
    void operator()(void *p) const { std::free(p); }
};

class CpuBackend final : public Backend, public KvStore {
public:
    KvStore &kv_store() override { return *this; }
    CpuBackend(int n_threads, int max_batch) : pool_(n_threads), max_batch_(max_batch) {}

    const char *name() const override { return "cpu"; }

    Status alloc(TensorType type, int64_t cols, int64_t rows, Tensor *out) override {
        const size_t bytes = row_bytes(type, cols) * static_cast<size_t>(rows);
        void *p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!p) return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes");
        std::memset(p, 0, bytes);
        buffers_.emplace_back(p);
        allocated_ += bytes;
        *out = Tensor{reinterpret_cast<uintptr_t>(p), 0, type, cols, rows};
        return Status::Ok();
    }

    Status adopt_weight(TensorType type, int64_t cols, int64_t rows, const void *host_data, Tensor *out) override {
        // The mapped file is used in place: weights cost no extra memory and are shared by every
        // session of the model. Q4_0, Q8_0 and K-quant matrices are the exception where the kernels
        // run them interleaved faster: one rearranged copy, shared by the model's CPU sessions.
        *out = Tensor{reinterpret_cast<uintptr_t>(host_data), 0, type, cols, rows};
        if (rows % 8 == 0 && cpu::interleaving_preferred(type)) {
            std::shared_ptr<const uint8_t> copy;
            H2O_TRY(cpu::shared_interleaved(type, host_data, rows, cols, &copy));
            out->buffer = reinterpret_cast<uintptr_t>(copy.get());
            interleaved_weights_[out->buffer] = std::move(copy);
        }
        const size_t scratch = cpu::matmul_scratch_bytes(type, cols, max_batch_);
        if (scratch > matmul_scratch_.size()) matmul_scratch_.resize(scratch);
        return Status::Ok();
    }

    bool weight_is_copy(const Tensor &weight) const override { return interleaved_weights_.count(weight.buffer) != 0; }

    Status upload(const Tensor &dst, const void *src, size_t bytes) override {
        H2O_TRY(injected_fault());
        std::memcpy(host<uint8_t>(dst), src, bytes);
        return Status::Ok();
    }
    Status download(const Tensor &src, void *dst, size_t bytes) override {
        H2O_TRY(injected_fault());
        std::memcpy(dst, host<const uint8_t>(src), bytes);
        return Status::Ok();
    }
    Status synchronize() override { return injected_fault(); }
    size_t allocated_bytes() const override {
        return allocated_ + matmul_scratch_.size() + attention_weights_.size() * sizeof(float) + attention_slots_.size() * sizeof(int32_t) +
               partial_stats_.size() * sizeof(float) + kv_.bytes();
    }

    Status get_rows(const Tensor &out, const Tensor &table, const Tensor &ids, int n) override {
        H2O_TRY(injected_fault());
        cpu::dequantize_rows(table.type, host<const void>(table), table.cols, host<const int32_t>(ids), n, host<float>(out), layout(table));
        return Status::Ok();
    }

    Status rms_norm(const Tensor &out, const Tensor &in, const Tensor &weight, int n, float eps) override {
        H2O_TRY(injected_fault());
        for (int t = 0; t < n; ++t) {
            cpu::rmsnorm(host<float>(out) + t * out.cols, host<const float>(in) + t * in.cols, host<const float>(weight), in.cols, eps);
        }
        return Status::Ok();
    }

    Status matmul(const Tensor &out, const Tensor &weight, const Tensor &in, int n) override {
        H2O_TRY(injected_fault());
        cpu::matmul(pool_, weight.type, host<const void>(weight), weight.rows, weight.cols, host<const float>(in), n, host<float>(out),
                    matmul_scratch_.data(), layout(weight));
        return Status::Ok();
    }

    Status matmuls(const Tensor *outs, const Tensor *weights, int count, const Tensor &in, int n) override {
        static_assert(kMaxMatmulsOfOneInput <= cpu::kMaxMatmulGroup, "the kernels take every product of one input at once");
        if (count < 1 || count > kMaxMatmulsOfOneInput) return make_error(H2O_ERR_INTERNAL, "matmuls: 1 to 3 products");
        H2O_TRY(injected_fault());
        cpu::MatmulOutput outputs[kMaxMatmulsOfOneInput];
        for (int i = 0; i < count; ++i) {
            if (weights[i].cols != weights[0].cols) return make_error(H2O_ERR_INTERNAL, "matmuls: weights of different widths");
            outputs[i] = {weights[i].type, host<const void>(weights[i]), weights[i].rows, host<float>(outs[i]), layout(weights[i])};
        }
        cpu::matmul_group(pool_, outputs, count, weights[0].cols, host<const float>(in), n, matmul_scratch_.data());
        return Status::Ok();
    }

    Status rope(const Tensor &q, const Tensor &k, const Tensor &positions, int n, const ModelShape &shape, bool per_kv_head) override {
        H2O_TRY(injected_fault());
        const int32_t *pos = host<const int32_t>(positions);
        const RotarySpec &rope = shape.rope;
        const int n_pairs = rope.pairs(), group = shape.n_head / shape.n_head_kv;
        const std::vector<double> &inv_freq = rope_inv_freqs(rope);
        // Each kv head's positions (all the same set unless per_kv_head); its query heads share them.
        const int sets = per_kv_head ? shape.n_head_kv : 1;
        for (int set = 0; set < sets; ++set) {
            const int first_kv = per_kv_head ? set : 0, end_kv = per_kv_head ? set + 1 : shape.n_head_kv;
            for (int t = 0; t < n; ++t) {
                for (int i = 0; i < n_pairs; ++i) {
                    // Angles in double precision: positions reach tens of thousands, where float angles
                    // would lose the low bits that distinguish neighbouring positions.
                    // (rotary.h: the one implementation, shared with the KV cache and the CUDA kernels)
                    float c, s;
                    rotary_cos_sin_scaled(pos[set * n + t], inv_freq[static_cast<size_t>(i)], rope.magnitude, &c, &s);
                    auto rotate = [&](float *x, int first_head, int end_head) {
                        for (int h = first_head; h < end_head; ++h)
                            rotate_head_pair(x + h * shape.head_dim, rope.pairing, i, n_pairs, c, s);
                    };
                    rotate(host<float>(q) + t * q.cols, first_kv * group, end_kv * group);
                    rotate(host<float>(k) + t * k.cols, first_kv, end_kv);
                }
            }
        }
        return Status::Ok();
    }

    Status swiglu(const Tensor &gate, const Tensor &up, int n) override { return gated(gate, up, n, cpu::silu_mul); }
    Status geglu(const Tensor &gate, const Tensor &up, int n) override { return gated(gate, up, n, cpu::gelu_mul); }
    // gate[t] = activation(gate[t]) * up[t] by `kernel`, the rows shared by the threads.
    Status gated(const Tensor &gate, const Tensor &up, int n, void (*kernel)(float *, const float *, const float *, int64_t)) {
        H2O_TRY(injected_fault());
        float *g = host<float>(gate);
        const float *u = host<const float>(up);
        const int64_t count = gate.cols * n;
        pool_.run(
            [&](int index, int threads) {
                int64_t begin, end;
                ThreadPool::split(count, index, threads, &begin, &end);
                kernel(g + begin, g + begin, u + begin, end - begin);
            },
            count * 8);  // an exp and a few flops per element
        return Status::Ok();
    }

    Status scale(const Tensor &x, float factor, int n) override {
        H2O_TRY(injected_fault());
        float *p = host<float>(x);
        for (int64_t i = 0, count = x.cols * n; i < count; ++i) p[i] *= factor;
        return Status::Ok();
    }

    Status softcap(const Tensor &x, float cap, int n) override {
        H2O_TRY(injected_fault());
        float *p = host<float>(x);
        for (int64_t i = 0, count = x.cols * n; i < count; ++i) p[i] = soft_cap(p[i], cap);
        return Status::Ok();
    }

    Status add(const Tensor &acc, const Tensor &x, int n) override {
        H2O_TRY(injected_fault());
        cpu::add(host<float>(acc), host<const float>(acc), host<const float>(x), acc.cols * n);
        return Status::Ok();
    }

    Status add_bias(const Tensor &acc, const Tensor &bias, int n) override {
        H2O_TRY(injected_fault());
        for (int t = 0; t < n; ++t) {
            float *row = host<float>(acc) + t * acc.cols;
            cpu::add(row, row, host<const float>(bias), acc.cols);
        }
        return Status::Ok();
    }

    Status argmax(const Tensor &out, const Tensor &in, int n) override {
        H2O_TRY(injected_fault());
        for (int t = 0; t < n; ++t) {
            host<int32_t>(out)[t] = greedy_index(host<const float>(in) + t * in.cols, in.cols);
        }
        return Status::Ok();
    }

    Status create_kv(const KvConfig &config) override {
        H2O_TRY(kv_.init(config, pool_.size()));
        kv_.set_rotation_kernels({cpu::rotate_pairs, cpu::rotate_half_pairs});
        // Per thread: the attention weights of a tile's kTileQueries queries and of its tokens'
        // kv-head groups (at most kTileQueries tokens), a list of slots, and the batch's partial
        // statistics of every (kv head, slot).
        const size_t threads = pool_.size(), n_slots = static_cast<size_t>(kv_.max_cell_slots());
        try {
            attention_weights_.assign(2 * kTileQueries * n_slots * threads, 0.0f);
            attention_slots_.assign(3 * n_slots * threads, 0);
            partial_stats_.assign(kv_policy_uses_statistics(config.policy.policy) ? kStatFields * n_slots * config.n_head_kv * threads : 0,
                                  0.0f);
        } catch (const std::bad_alloc &) {
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate attention scratch");
        }
        return Status::Ok();
    }

    Status clear_kv() override {
        kv_.clear();
        return Status::Ok();
    }
    Status save_kv(ByteWriter &out) override {
        kv_.save(out);
        return Status::Ok();
    }
    Status load_kv(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) override {
        return kv_.load(in, n_past, n_cached, n_pinned, n_spans);
    }
    Status set_kv_span_minimums(const int32_t *minimums) override {
        kv_.set_span_minimums(minimums);
        return Status::Ok();
    }
    size_t kv_bytes() const override { return kv_.bytes(); }

    Status download_kv_statistics(SlotStats *out) override {
        const KvConfig &c = kv_.config();
        for (int l = 0; l < c.n_layer; ++l) {
            for (int h = 0; h < c.n_head_kv; ++h) {
                const KvCache::CellView view = kv_.cell(l, h);
                for (int s = 0; s < kv_.cell_slots(l, h); ++s) {
                    *out++ = KvCache::slot_stats(view, s);
                }
            }
        }
        return Status::Ok();
    }

    Status download_kv_stream_indices(int64_t *out) override {
        const KvConfig &c = kv_.config();
        for (int l = 0; l < c.n_layer; ++l) {
            for (int h = 0; h < c.n_head_kv; ++h) {
                const KvCache::CellView view = kv_.cell(l, h);
                out = std::copy(view.stream_index, view.stream_index + kv_.cell_slots(l, h), out);
            }
        }
        return Status::Ok();
    }

    Status download_kv_tags(uint8_t *out) override {
        const KvConfig &c = kv_.config();
        for (int l = 0; l < c.n_layer; ++l) {
            for (int h = 0; h < c.n_head_kv; ++h) {
                const KvCache::CellView view = kv_.cell(l, h);
                for (int s = 0; s < kv_.cell_slots(l, h); ++s) *out++ = view.stream_index[s] >= 0 ? view.tag[s] : 0;
            }
        }
        return Status::Ok();
    }

    Status download_kv_cell_slots(int32_t *out) override {
        kv_.cell_fill(nullptr, out);
        return Status::Ok();
    }

    Status rebalance_kv(int64_t next_index, int incoming, int floor, int32_t *held, int32_t *slots) override {
        kv_.rebalance_heads(next_index, incoming, floor);
        kv_.cell_fill(held, slots);
        return Status::Ok();
    }

    Status discard_kv(int64_t n, int64_t keep) override {
        const KvConfig &c = kv_.config();
        // Every cell is checked before any changes.
        for (int l = 0; l < c.n_layer; ++l) {
            for (int h = 0; h < c.n_head_kv; ++h) {
                if (const int held = kv_.discardable(l, h, keep); held < n) {
                    return make_error(H2O_ERR_INVALID_ARGUMENT, "cannot discard " + std::to_string(n) + " tokens: (layer " +
                                                                    std::to_string(l) + ", kv head " + std::to_string(h) + ") holds " +
                                                                    std::to_string(held) + " unpinned tokens after the first " +
                                                                    std::to_string(keep));
                }
            }
        }
        for (int l = 0; l < c.n_layer; ++l) {
            for (int h = 0; h < c.n_head_kv; ++h) kv_.discard_oldest(l, h, static_cast<int>(n), keep);
        }
        return Status::Ok();
    }

    Status evict_kv_tokens(const int64_t *stream_index) override {
        const KvConfig &c = kv_.config();
        std::vector<int> slots(static_cast<size_t>(c.n_layer) * c.n_head_kv);
        // Every cell is checked before any changes.
        for (int l = 0, i = 0; l < c.n_layer; ++l) {
            for (int h = 0; h < c.n_head_kv; ++h, ++i) {
                slots[i] = kv_.unpinned_slot_of(l, h, stream_index[i]);
                if (slots[i] < 0) {
                    return make_error(H2O_ERR_INVALID_ARGUMENT, "(layer " + std::to_string(l) + ", kv head " + std::to_string(h) +
                                                                    ") holds no unpinned token of stream index " +
                                                                    std::to_string(stream_index[i]));
                }
            }
        }
        for (int l = 0, i = 0; l < c.n_layer; ++l) {
            for (int h = 0; h < c.n_head_kv; ++h, ++i) kv_.evict_slot(l, h, slots[i]);
        }
        return Status::Ok();
    }

    Status attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                     const ModelShape &shape) override;

    // Test hook (cpu_inject_fault): the operation `after` operations from now fails.
    void inject_fault(int after) { fault_countdown_ = after; }

private:
    // The inverse frequencies of `rope`, computed when it changes (a session's model: once).
    const std::vector<double> &rope_inv_freqs(const RotarySpec &rope) {
        if (!(rope == rope_spec_)) {
            rope_spec_ = rope;
            rope_inv_freq_ = rope.inv_freqs();
        }
        return rope_inv_freq_;
    }

    // Like a device error, an injected fault stays: every later operation fails too.
    Status injected_fault() {
        if (fault_countdown_ == 0) fault_ = make_error(H2O_ERR_BACKEND_FAILED, "cpu backend: injected fault");
        if (fault_countdown_ >= 0) --fault_countdown_;
        return fault_;
    }

    // Query rows of one kv head that attention computes together (a tile of tokens times the
    // query heads of the group, or part of a larger group): enough to share each key and value
    // row's load, few enough that the kernels keep their outputs in registers.
    static constexpr int kTileQueries = 8;

    // A batch's partial statistics (kv_policy_spec.h's SlotStats), field by field, so that the
    // loops over a tile's slots run on whole vectors: [field][n_head_kv × max_cell_slots].
    enum StatField {
        kAccumulated,
        kSquared,
        kSteps,
        kLast,
        kPersistence,
        kStatFields
    };
    struct AttentionScratch {
        float *weight;        // [kTileQueries × max_cell_slots]: a query's softmax weights
        float *group_weight;  // [kTileQueries × max_cell_slots]: a token's weights summed over its group
        int32_t *unseen;      // [max_cell_slots]: the slots some token of a tile does not see
        // [max_cell_slots]: the first and last token of a tile (0-based within it) that see a
        // slot; first > last when none does.
        int32_t *first_seer, *last_seer;
        float *partial;  // [kStatFields × n_head_kv × max_cell_slots], or null
    };
    AttentionScratch attention_scratch(int thread) {
        const size_t n_slots = static_cast<size_t>(kv_.max_cell_slots());  // the stride create_kv allocated
        float *weights = attention_weights_.data() + 2 * kTileQueries * n_slots * thread;
        float *partial = partial_stats_.empty() ? nullptr : partial_stats_.data() + kStatFields * n_slots * kv_.config().n_head_kv * thread;
        int32_t *slots = attention_slots_.data() + 3 * n_slots * thread;
        return AttentionScratch{weights, weights + kTileQueries * n_slots, slots, slots + n_slots, slots + 2 * n_slots, partial};
    }

    // ---- attention (one layer)
    // What every tile of one layer's attention reads (attention()).
    struct LayerAttention {
        const Tensor *out, *q;
        int layer, n;
        int hd = 0, n_kv = 0, group = 0;
        int n_slots = 0;      // kv_.max_cell_slots(): the stride of the per-thread partials and weights
        int tile_tokens = 0;  // tokens of one unit
        int64_t first_index = 0;
        int64_t window = 0;  // a local layer's queries see only the window's latest tokens (0: no limit)
        float scale = 0.0f, cap = 0.0f, decay = 0.0f, old_persistence_weight = 0.0f;
        uint32_t proxy = 0;
        KvRowFormat key_format = KvRowFormat::F32, value_format = KvRowFormat::F32;
        size_t key_row = 0, value_row = 0;
        bool gather_statistics = false, fold_in_place = false;
    };
    // Which slots the tokens [t0, t1) of a tile see (find_visible).
    struct TileVisibility {
        int t0 = 0, t1 = 0, used = 0, n_unseen = 0;
        int visible[kTileQueries];  // per token: how many slots it sees
        int end[kTileQueries];      // per token: the slots from there on are all unseen by it
    };
    void store_batch(const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch, const ModelShape &shape);
    void attend_tile(const LayerAttention &a, AttentionScratch &scratch, int t0, int h);
    TileVisibility find_visible(const LayerAttention &a, const KvCache::CellView &view, int used, int t0, AttentionScratch &scratch);
    void attend_rows(const LayerAttention &a, const KvCache::CellView &view, int h, const TileVisibility &vis, AttentionScratch &scratch);
    void add_tile_statistics(const LayerAttention &a, const KvCache::CellView &view, int h, const TileVisibility &vis,
                             AttentionScratch &scratch);
    void fold_partials(const LayerAttention &a, int threads_used);

    ThreadPool pool_;
    int max_batch_;
    std::vector<std::unique_ptr<void, AlignedFree>> buffers_;
    size_t allocated_ = 0;
    std::vector<uint8_t> matmul_scratch_;
    // The adopted weights held interleaved, by their address (not counted in allocated_bytes:
    // like the mapped file, they belong to the model's sessions together).
    std::unordered_map<uintptr_t, std::shared_ptr<const uint8_t>> interleaved_weights_;

    cpu::WeightLayout layout(const Tensor &weight) const {
        return weight_is_copy(weight) ? cpu::WeightLayout::Interleaved8 : cpu::WeightLayout::Rows;
    }

    RotarySpec rope_spec_;
    std::vector<double> rope_inv_freq_;  // rope_spec_.inv_freqs()
    int fault_countdown_ = -1;           // no fault
    Status fault_;
    KvCache kv_;
    std::vector<float> attention_weights_;
    std::vector<int32_t> attention_slots_;
    std::vector<float> partial_stats_;  // AttentionScratch::partial, per thread
};

// A slot of `view` is seen by the query of stream index `query` when it holds a token not after
// it and, in a local layer (window > 0), less than `window` before it.
inline bool slot_seen(const KvCache::CellView &view, int s, int64_t query, int64_t window) {
    const int64_t stream = view.stream_index[s];
    return stream >= 0 && stream <= query && (window == 0 || stream > query - window);
}

Status CpuBackend::attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                             const ModelShape &shape) {
    H2O_TRY(injected_fault());
    store_batch(q, k, v, layer, batch, shape);
    const KvPolicyConfig &policy = kv_.config().policy;  // what attention reads of it is the same in every layer
    LayerAttention a{&out, &q, layer, batch.n_tokens};
    a.hd = shape.head_dim;
    a.n_kv = shape.n_head_kv;
    a.group = shape.n_head / a.n_kv;
    a.n_slots = kv_.max_cell_slots();
    // A unit is a tile of consecutive tokens of one kv head: its query heads and tokens read the
    // head's keys and values together (cpu::dot_kv_rows and weighted_kv_row_sum load each row once for
    // up to kTileQueries queries), which gives every query the bits it has alone.
    a.tile_tokens = std::max(1, kTileQueries / a.group);
    a.first_index = batch.first_index;
    a.window = shape.is_local(layer) ? shape.sliding_window : 0;
    a.scale = shape.attention_scale != 0.0f ? shape.attention_scale : 1.0f / std::sqrt(static_cast<float>(a.hd));
    a.cap = shape.attention_softcap;
    a.decay = policy.persistence_decay;
    a.old_persistence_weight = kv_power(a.decay, a.n);
    a.proxy = static_cast<uint32_t>(kv_proxy_queries(policy));
    a.key_format = kv_key_format(kv_.config().type);
    a.value_format = kv_value_format(kv_.config().type);
    a.key_row = kv_.key_row_bytes();
    a.value_row = kv_.value_row_bytes();
    a.gather_statistics = kv_policy_uses_statistics(policy.policy);
    // With one token, each kv head is one unit, handled by one thread: it folds its slots'
    // statistics in place. Several tokens of a head may be on several threads, which sum
    // per-thread partials that are folded afterwards. Both give the same bits (a partial of one
    // query plus zeros is that query's).
    a.fold_in_place = a.n == 1;
    const int n_tiles = (a.n + a.tile_tokens - 1) / a.tile_tokens;
    const int64_t units = static_cast<int64_t>(n_tiles) * a.n_kv;
    // q·k and the weighted sum of values.
    const int64_t work = static_cast<int64_t>(a.n) * a.n_kv * a.group * kv_.used(layer, 0) * 2 * a.hd;
    int threads_used = 1;  // small batches run on the calling thread alone
    pool_.run(
        [&](int index, int threads) {
            if (index == 0) threads_used = threads;
            AttentionScratch scratch = attention_scratch(index);
            if (a.gather_statistics && !a.fold_in_place) {
                std::fill(scratch.partial, scratch.partial + static_cast<size_t>(kStatFields) * a.n_kv * a.n_slots, 0.0f);
            }
            // Units are dealt out in turn rather than in contiguous runs: a causal prompt's later
            // tokens see more keys, and contiguous runs gave the last thread most of the work.
            for (int64_t u = index; u < units; u += threads) {
                const int t0 = static_cast<int>(u / a.n_kv) * a.tile_tokens, h = static_cast<int>(u % a.n_kv);
                attend_tile(a, scratch, t0, h);
            }
        },
        work);
    if (a.gather_statistics && !a.fold_in_place) fold_partials(a, threads_used);
    return Status::Ok();
}

// Makes room (evicting by the policy when the cache is full), then stores the batch's keys and
// values in their slots. The kv heads are independent (but for the random policy's one
// generator), and with rolling an eviction re-rotates up to a budget of keys per head: the
// threads share the heads.
void CpuBackend::store_batch(const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                             const ModelShape &shape) {
    const int n = batch.n_tokens, hd = shape.head_dim, n_kv = shape.n_head_kv;
    const int group = shape.n_head / n_kv;
    const int32_t *pos = host<const int32_t>(batch.positions);
    const KvRowFormat key_format = kv_key_format(kv_.config().type), value_format = kv_value_format(kv_.config().type);
    const size_t key_row = kv_.key_row_bytes(), value_row = kv_.value_row_bytes();
    // F16 rows (the default format) are converted by the kernels' F16C conversion, which rounds
    // as kv_store_row does; the other formats by kv_store_row.
    auto store_row = [hd](KvRowFormat format, const float *src, uint8_t *dst) {
        if (format == KvRowFormat::F16)
            cpu::floats_to_halves(src, reinterpret_cast<uint16_t *>(dst), hd);
        else
            kv_store_row(format, src, hd, dst);
    };
    auto make_room_and_store = [&](int h, int thread) {
        kv_.observe_queries(layer, h, host<const float>(q) + static_cast<int64_t>(h) * group * hd, q.cols,
                            pos + (batch.positions_per_kv_head ? h * n : 0), n, thread);
        kv_.make_room(layer, h, n, batch.first_index, thread);
        KvCache::CellView view = kv_.cell(layer, h);
        for (int t = 0; t < n; ++t) {
            const int slot = kv_.claim_slot(layer, h, batch.first_index + t, pos[batch.positions_per_kv_head ? h * n + t : t], batch.tag);
            store_row(key_format, host<const float>(k) + t * k.cols + h * hd, view.keys + slot * key_row);
            store_row(value_format, host<const float>(v) + t * v.cols + h * hd, view.values + slot * value_row);
        }
    };
    const bool evicting = kv_.free_slots(layer, 0) < n;
    if (kv_.config().policy.policy == KvPolicy::Random || !evicting) {
        for (int h = 0; h < n_kv; ++h) make_room_and_store(h, 0);
        return;
    }
    // Rough size: choosing victims and (rolling) rotating the kept keys, per kv head.
    const int64_t eviction_work = static_cast<int64_t>(n_kv) * kv_.config().slots_in(layer) * (kv_.config().rolling ? 4 * hd : 8);
    pool_.run(
        [&](int index, int threads) {
            for (int h = index; h < n_kv; h += threads) make_room_and_store(h, index);
        },
        eviction_work);
}

// One unit: the tokens [t0, t0 + tile_tokens) of kv head h.
void CpuBackend::attend_tile(const LayerAttention &a, AttentionScratch &scratch, int t0, int h) {
    const KvCache::CellView view = kv_.cell(a.layer, h);
    const TileVisibility vis = find_visible(a, view, kv_.used(a.layer, h), t0, scratch);
    attend_rows(a, view, h, vis, scratch);
    if (a.gather_statistics) add_tile_statistics(a, view, h, vis, scratch);
}

// Per token of the tile: how many slots it sees, and `end`: slots from there on are all unseen by
// it (in a prompt, usually the batch's later tokens), so every loop over them stops there, which
// changes no result. One pass over the slots finds them for the whole tile: a slot holding
// stream index first + d (d > 0; first is the tile's first query) is seen by the tile's tokens
// from d on, one holding first or less by all of them. The others, free or seen by only some
// tokens, are listed in slot order in scratch.unseen.
CpuBackend::TileVisibility CpuBackend::find_visible(const LayerAttention &a, const KvCache::CellView &view, int used, int t0,
                                                    AttentionScratch &scratch) {
    TileVisibility vis;
    vis.t0 = t0;
    vis.t1 = std::min(a.n, t0 + a.tile_tokens);
    vis.used = used;
    const int64_t first = a.first_index + t0, window = a.window;
    const int tokens = vis.t1 - t0;
    int seen_by_all = 0, seen_by_all_end = 0, n_unseen = 0;
    int seen_from[kTileQueries] = {}, seen_from_end[kTileQueries] = {};
    // In a local layer, a slot the window hides from the tile's last query is listed with the
    // others: each query then decides by slot_seen().
    const int64_t seen_by_all_after = window == 0 ? -1 : first + (tokens - 1) - window;
    for (int s = 0; s < used; ++s) {
        const int64_t stream = view.stream_index[s];
        if (stream >= 0 && stream <= first && stream > seen_by_all_after) {
            ++seen_by_all;
            seen_by_all_end = s + 1;
            continue;
        }
        scratch.unseen[n_unseen++] = s;
        if (stream > first && stream < first + tokens) {
            ++seen_from[stream - first];
            seen_from_end[stream - first] = s + 1;
        }
    }
    vis.n_unseen = n_unseen;
    if (a.gather_statistics && !a.fold_in_place) {
        // The tile's tokens that see each slot, as slot_seen() decides: stream index j is seen by
        // the tile's token tt when first + tt >= j and, in a local layer, first + tt < j + window.
        constexpr int64_t kNone = kTileQueries;
        for (int s = 0; s < used; ++s) {
            const int64_t j = view.stream_index[s];
            const int64_t from = j < 0 ? kNone : std::max<int64_t>(0, j - first);
            const int64_t to = j < 0 || window == 0 ? kNone : j + window - 1 - first;
            scratch.first_seer[s] = static_cast<int32_t>(std::min(from, kNone));
            scratch.last_seer[s] = static_cast<int32_t>(std::clamp<int64_t>(to, -1, kNone));
        }
    }
    for (int tt = 0; tt < tokens; ++tt) {
        vis.visible[tt] = (tt == 0 ? seen_by_all : vis.visible[tt - 1]) + seen_from[tt];
        vis.end[tt] = std::max(tt == 0 ? seen_by_all_end : vis.end[tt - 1], seen_from_end[tt]);
        if (window != 0) {
            // Listed slots come and go with the window: counted query by query.
            vis.visible[tt] = seen_by_all;
            vis.end[tt] = seen_by_all_end;
            for (int i = 0; i < n_unseen; ++i) {
                if (!slot_seen(view, scratch.unseen[i], a.first_index + t0 + tt, window)) continue;
                ++vis.visible[tt];
                vis.end[tt] = std::max(vis.end[tt], scratch.unseen[i] + 1);
            }
        }
        if (!a.gather_statistics || a.group == 1) continue;  // group weights feed the statistics alone
        float *group_weight = scratch.group_weight + static_cast<size_t>(tt) * a.n_slots;
        std::fill(group_weight, group_weight + used, 0.0f);
    }
    return vis;
}

// The tile's (token, query head) rows, token-major, in chunks of kTileQueries: their outputs, and
// each token's weights summed over its query heads (for the statistics).
void CpuBackend::attend_rows(const LayerAttention &a, const KvCache::CellView &view, int h, const TileVisibility &vis,
                             AttentionScratch &scratch) {
    const int group = a.group, hd = a.hd, n_slots = a.n_slots, t0 = vis.t0;
    // Locals, not a's members: the weights written below are floats too, which the compiler
    // would otherwise have to assume they alias, and reload them in every loop.
    const float scale = a.scale, cap = a.cap;
    const Tensor &q = *a.q, &out = *a.out;
    const int rows = (vis.t1 - t0) * group;
    for (int r0 = 0; r0 < rows; r0 += kTileQueries) {
        const int m = std::min(kTileQueries, rows - r0);
        const float *queries[kTileQueries];
        float *outs[kTileQueries];
        for (int j = 0; j < m; ++j) {
            const int t = t0 + (r0 + j) / group, head = h * group + (r0 + j) % group;
            queries[j] = host<const float>(q) + t * q.cols + head * hd;
            outs[j] = host<float>(out) + t * out.cols + head * hd;
            std::fill(outs[j], outs[j] + hd, 0.0f);
        }
        // The chunk's last token sees the most (in a local layer, any of its tokens may).
        int scored = vis.end[(r0 + m - 1) / group];
        for (int j = 0; a.window != 0 && j < m; j += group) scored = std::max(scored, vis.end[(r0 + j) / group]);
        // Every slot before `scored` is scored for every query, then each query's unseen ones are
        // masked. The rows are read in their stored form (kv_row_format.h).
        cpu::dot_kv_rows(a.key_format, queries, m, view.keys, a.key_row, scored, hd, scratch.weight, n_slots);
        for (int j = 0; j < m; ++j) {
            const int t = t0 + (r0 + j) / group, query_end = vis.end[t - t0];
            float *weight = scratch.weight + static_cast<size_t>(j) * n_slots;
            for (int s = 0; s < query_end; ++s) weight[s] *= scale;
            if (cap != 0.0f) {
                for (int s = 0; s < query_end; ++s) weight[s] = soft_cap(weight[s], cap);
            }
            for (int i = 0; i < vis.n_unseen && scratch.unseen[i] < query_end; ++i) {
                if (!slot_seen(view, scratch.unseen[i], a.first_index + t, a.window)) weight[scratch.unseen[i]] = -INFINITY;
            }
            cpu::softmax(weight, query_end);
            std::fill(weight + query_end, weight + scored, 0.0f);  // the weighted sum passes over them
        }
        cpu::weighted_kv_row_sum(a.value_format, outs, m, scratch.weight, n_slots, view.values, a.value_row, scored, hd);
        // Each token's weights summed over its query heads, in head order (for the statistics).
        // (A group of one query head: its weights are the group's, the rows of the one chunk.)
        for (int j = 0; a.gather_statistics && group > 1 && j < m; ++j) {
            const int t = t0 + (r0 + j) / group;
            const float *weight = scratch.weight + static_cast<size_t>(j) * n_slots;
            float *group_weight = scratch.group_weight + static_cast<size_t>(t - t0) * n_slots;
            for (int s = 0; s < vis.end[t - t0]; ++s) group_weight[s] += weight[s];
        }
    }
}

// Bookkeeping for the eviction policies, token by token: folded into the slots' statistics in
// place (one token), or added to the thread's partials (fold_partials folds them afterwards), so
// that no two threads write one slot.
void CpuBackend::add_tile_statistics(const LayerAttention &a, const KvCache::CellView &view, int h, const TileVisibility &vis,
                                     AttentionScratch &scratch) {
    const int t0 = vis.t0, n_slots = a.n_slots;
    for (int t = t0; t < vis.t1; ++t) {
        const float *group_weight = (a.group == 1 ? scratch.weight : scratch.group_weight) + static_cast<size_t>(t - t0) * n_slots;
        const float threshold = kv_importance_threshold(a.group, vis.visible[t - t0]);
        const float persistence_weight = kv_persistence_weight(a.decay, a.n, t);
        if (a.fold_in_place) {
            // kv_stats_fold of one query's kv_stats_add_query, written out: the same operations (a
            // zero query adds nothing but the persistence's decay), in a loop of locals that a
            // default session runs over every slot of a full context at each token (as kv_stats_*
            // it cost a fifth of decoding there).
            const int64_t query = a.first_index + t, oldest = a.window == 0 ? INT64_MIN : query - a.window;
            const int64_t *stream = view.stream_index;
            SlotStats *stats = view.stats;
            const float old_persistence_weight = a.old_persistence_weight;
            // Selects, not branches (whether a weight passes the threshold is a coin toss to the
            // branch predictor); an unseen slot's weight is 0, which adds nothing. s < used lies
            // within the weights' row, whatever it holds there.
            for (int s = 0; s < vis.used; ++s) {
                SlotStats st = stats[s];
                const int64_t j = stream[s];
                const bool sees = (j >= 0) & (j <= query) & (j > oldest);
                const float w = sees ? group_weight[s] : 0.0f;
                st.accumulated += w;
                st.squared += w * w;
                st.steps += sees ? 1.0f : 0.0f;
                st.last = sees ? w : st.last;
                st.persistence = st.persistence * old_persistence_weight + (w > threshold ? persistence_weight : 0.0f);
                stats[s] = st;
            }
            continue;
        }
        // kv_stats_add_query for the slots the token sees, field by field (the kernels run it on
        // vectors).
        const size_t cell = static_cast<size_t>(h) * n_slots, field = static_cast<size_t>(a.n_kv) * n_slots;
        float *partial = scratch.partial + cell;
        const cpu::QueryStats fields{partial + kAccumulated * field, partial + kSquared * field, partial + kSteps * field,
                                     partial + kLast * field, partial + kPersistence * field};
        cpu::add_query_stats(fields, group_weight, scratch.first_seer, scratch.last_seer, vis.end[t - t0], t - t0, threshold,
                             persistence_weight, kv_is_proxy_query(a.n, t, a.proxy));
    }
}

// Sums every thread's partial statistics of the batch, slot by slot, and folds them into the slots'.
void CpuBackend::fold_partials(const LayerAttention &a, int threads_used) {
    const int n_slots = a.n_slots;
    for (int h = 0; h < a.n_kv; ++h) {
        const KvCache::CellView view = kv_.cell(a.layer, h);
        const int used = kv_.used(a.layer, h);
        // Thread th's partial field f of slot s is partial[th * per_thread + f * field + s].
        const size_t field = static_cast<size_t>(n_slots) * a.n_kv, per_thread = kStatFields * field;
        const float *partial = partial_stats_.data() + static_cast<size_t>(h) * n_slots;
        auto partial_of = [&](int th, int s) {
            const float *p = partial + th * per_thread + s;
            return SlotStats{p[kAccumulated * field], p[kSquared * field], p[kSteps * field], p[kLast * field], p[kPersistence * field]};
        };
        for (int s = 0; s < used; ++s) {
            SlotStats batch_stats = partial_of(0, s);
            for (int th = 1; th < threads_used; ++th) batch_stats = kv_stats_add(batch_stats, partial_of(th, s));
            view.stats[s] = kv_stats_fold(view.stats[s], batch_stats, a.old_persistence_weight, true);
        }
    }
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads, int max_batch) { return std::make_unique<CpuBackend>(n_threads, max_batch); }

bool cpu_inject_fault(Backend &backend, int after_operations) {
    auto *cpu = dynamic_cast<CpuBackend *>(&backend);
    if (cpu) cpu->inject_fault(after_operations);
    return cpu != nullptr;
}

}  // namespace h2o
