// The CUDA backend's class (cuda_backend.h), shared by the files that implement it by concern:
//   cuda_backend.cu    the device context (memory, copies, errors: inline here) and the public functions;
//   cuda_ops.cu        the row operations and matmul, with their kernels;
//   cuda_kv.cu         the KV cache: its arrays, clearing, rebalancing between kv heads, snapshots;
//   cuda_attention.cu  attention: make room and store a batch (kv_claim_kernel), attend, fold the statistics.
// Compiled by nvcc only. Kernels stay in the file that launches them (no relocatable device code).
#pragma once

#include "cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kv_cache.h"
#include "kv_policy.h"
#include "kv_policy_spec.h"
#include "kv_row_codec.h"
#include "kv_victim_rules.h"
#include "activation.h"
#include "online_softmax.h"
#include "rotary.h"
#include "weight_element.h"

namespace h2o {

constexpr TensorType kCudaWeightTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::Q8_0, TensorType::Q4_0,
                                           TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

constexpr int kBlock = 256;       // threads of the reduction and eviction kernels
constexpr int kMatmulTokens = 8;  // matmul: the most tokens the matrix-vector kernel takes
// Attention scores of one chunk of queries: as many tokens as fit in this.
constexpr size_t kAttentionScratchBudget = size_t{64} << 20;
// Split attention: a chunk with fewer (query, head) pairs than this reads each head's slots in
// ranges of at least kBlock slots, one block each, up to about this many blocks in all.
constexpr int kAttentionSplitBlocks = 1024;

// The ranges each (query, head) block of a chunk of `pairs` reads its n_slots slots in.
inline int attention_splits(int pairs, int n_slots) {
    const int by_length = (n_slots + kBlock - 1) / kBlock, by_device = (kAttentionSplitBlocks + pairs - 1) / pairs;
    return std::max(1, std::min(by_length, by_device));
}

inline std::string cuda_error_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

// ---- the KV cache on the device ------------------------------------------------------------------

// The device's KV cache. A cell is one (layer, kv head); slot arrays are [cell][slot], cell c
// holding cell_slots[c] slots from cell_first[c]: KvConfig::slots_in(l) from
// KvConfig::uniform_cell_first until the heads' budgets move (kv_head_budgets.h). The per-kv-head
// scratch is laid out by the most slots a cell may hold (KvConfig::max_cell_slots: the stride).
struct KvDevice {
    uint8_t *keys = nullptr, *values = nullptr;  // rows of key_row / value_row bytes
    int64_t *stream = nullptr;                   // stream index, -1: free
    int32_t *position = nullptr;
    uint8_t *tag = nullptr;         // kv_make_tag: pinned, retention span
    SlotStats *stats = nullptr;     // null when the policy reads none
    SlotStats *partial = nullptr;   // [n_kv][stride]: the current batch's statistics
    int32_t *free_list = nullptr;   // per cell, a stack of slots freed by eviction
    int32_t *used = nullptr;        // [cell]: slots [0, used) have held a token
    int32_t *free_count = nullptr;  // [cell]
    int64_t *cell_first = nullptr;  // [cell]: the cell's first slot (KvImage::cell_first_slot)
    int32_t *cell_slots = nullptr;  // [cell]: its slots
    uint64_t *rng = nullptr;        // the random policy's xorshift64* state
    int32_t *batch_slot = nullptr;  // [n_kv][stride]: the slot of each token of the batch
    int64_t *victims = nullptr;     // [n_kv][stride]: stream indices evicted for the batch
    int32_t *candidates = nullptr;  // [stride]: the random policy's shuffle
    float *key_scores = nullptr;    // [n_kv][stride][2]: the key scorers' scores and key norms (or logits)
    float *query_stats = nullptr;   // [cell][kv_query_stats_floats]: Expected Attention's (KvImage::query_stats)
    double *inv_freq = nullptr;     // rotary inverse frequencies (rolling, Expected Attention)
    float *scores = nullptr;        // [chunk][n_head][stride]: a chunk's attention weights
    int32_t *visible = nullptr;     // [chunk][n_kv]: slots each query of the chunk sees
};

struct ClaimArgs {
    KvDevice kv;
    int layer, n_kv, stride, head_dim, n, pairs;  // stride: of the per-kv-head scratch
    RotaryPairing pairing;
    KvRowFormat key_format, value_format;
    size_t key_row, value_row;
    uint32_t policy;
    int64_t first_index, recent_from, stale_before, sinks;
    uint8_t tag;  // the batch's
    bool rolling, random;
    bool positions_per_kv_head;  // positions holds n per kv head (AttentionBatch)
    bool by_proxy;               // kv_ranks_by_proxy: rank by kv_prompt_priority
    float prompt_share;
    uint32_t prompt_seed;
    int32_t span_min[KV_MAX_SPANS];  // each retention span's minimum per cell
    const float *k, *v;
    int64_t k_cols, v_cols;
    const int32_t *positions;
};

// Rolls the key row back by `shift` positions: decoded, its rotary pairs turned by -shift times
// each pair's frequency, encoded again (KvCache::rotate_back's arithmetic).
inline __device__ void roll_key_back(uint8_t *row, int shift, KvRowFormat format, int head_dim, const double *inv_freq,
                                     RotaryPairing pairing, int pairs) {
    float key[kCudaMaxHeadDim];
    kv_decode_row(format, row, head_dim, key);
    for (int i = 0; i < pairs; ++i) {
        float c, sn;
        rotary_cos_sin(-shift, inv_freq[i], &c, &sn);
        rotate_head_pair(key, pairing, i, pairs, c, sn);
    }
    kv_encode_row(format, key, head_dim, row);
}

// ---- the backend --------------------------------------------------------------------------------

class CudaBackend final : public Backend, public KvStore {
public:
    KvStore &kv_store() override { return *this; }
    CudaBackend(int device, int max_batch) : device_(device), max_batch_(std::max(1, max_batch)) {}

    ~CudaBackend() override {
        if (cudaSetDevice(device_) != cudaSuccess) return;
        for (void *p : allocations_) (void)cudaFree(p);
        if (stream_) (void)cudaStreamDestroy(stream_);
    }

    Status init() {
        H2O_TRY(check(cudaSetDevice(device_), "cudaSetDevice"));
        H2O_TRY(check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
        return Status::Ok();
    }

    const char *name() const override { return "cuda"; }

    Status alloc(TensorType type, int64_t cols, int64_t rows, Tensor *out) override {
        H2O_TRY(failed_);
        void *p = nullptr;
        H2O_TRY(device_alloc(row_bytes(type, cols) * static_cast<size_t>(rows), &p));
        H2O_TRY(check(cudaMemsetAsync(p, 0, row_bytes(type, cols) * static_cast<size_t>(rows), stream_), "cudaMemsetAsync"));
        *out = Tensor{reinterpret_cast<uintptr_t>(p), 0, type, cols, rows};
        return Status::Ok();
    }

    Status adopt_weight(TensorType type, int64_t cols, int64_t rows, const void *host_data, Tensor *out) override {
        H2O_TRY(failed_);
        H2O_TRY(cuda_runs_weight_type(type));
        const size_t bytes = row_bytes(type, cols) * static_cast<size_t>(rows);
        void *p = nullptr;
        H2O_TRY(device_alloc(bytes, &p));
        H2O_TRY(check(cudaMemcpyAsync(p, host_data, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (weights)"));
        traffic_.bytes_to_device += bytes;
        *out = Tensor{reinterpret_cast<uintptr_t>(p), 0, type, cols, rows};
        return Status::Ok();
    }

    bool weight_is_copy(const Tensor &) const override { return true; }

    Status upload(const Tensor &dst, const void *src, size_t bytes) override {
        H2O_TRY(failed_);
        H2O_TRY(check(cudaMemcpyAsync(device_ptr<uint8_t>(dst), src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)"));
        traffic_.bytes_to_device += bytes;
        return Status::Ok();
    }

    Status download(const Tensor &src, void *dst, size_t bytes) override {
        H2O_TRY(failed_);
        H2O_TRY(
            check(cudaMemcpyAsync(dst, device_ptr<uint8_t>(src), bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)"));
        traffic_.bytes_to_host += bytes;
        return synchronize();
    }

    Status synchronize() override {
        H2O_TRY(failed_);
        ++traffic_.submissions;
        return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }

    size_t allocated_bytes() const override {
        return allocated_ + rebalance_books_.bytes() + rebalance_entries_.capacity() * sizeof(int64_t);
    }

    Traffic traffic() const override {
        Traffic t = traffic_;
        t.device_memory_bytes = allocated_;
        return t;
    }

    Status get_rows(const Tensor &out, const Tensor &table, const Tensor &ids, int n) override;
    Status rms_norm(const Tensor &out, const Tensor &in, const Tensor &weight, int n, float eps) override;
    Status matmul(const Tensor &out, const Tensor &weight, const Tensor &in, int n) override;
    Status rope(const Tensor &q, const Tensor &k, const Tensor &positions, int n, const ModelShape &shape, bool per_kv_head) override;
    Status swiglu(const Tensor &gate, const Tensor &up, int n) override;
    Status geglu(const Tensor &gate, const Tensor &up, int n) override;

    Status scale(const Tensor &x, float factor, int n) override { return scale_or_cap(x, factor, false, n, "scale"); }
    Status softcap(const Tensor &x, float cap, int n) override { return scale_or_cap(x, cap, true, n, "softcap"); }
    Status scale_or_cap(const Tensor &x, float value, bool cap, int n, const char *what);

    Status add(const Tensor &acc, const Tensor &x, int n) override;
    Status add_bias(const Tensor &acc, const Tensor &bias, int n) override;
    Status argmax(const Tensor &out, const Tensor &in, int n) override;

    Status create_kv(const KvConfig &config) override;
    Status clear_kv() override;
    size_t kv_bytes() const override { return has_kv_ ? KvCache::planned_bytes(kv_config_) : 0; }
    Status download_kv_stream_indices(int64_t *out) override {
        H2O_TRY(failed_);
        if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
        return download_raw(kv_.stream, out, slot_count() * sizeof(int64_t));
    }
    Status download_kv_statistics(SlotStats *out) override {
        H2O_TRY(failed_);
        if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
        if (!kv_.stats) {
            std::fill(out, out + slot_count(), kv_stats_zero());
            return Status::Ok();
        }
        return download_raw(kv_.stats, out, slot_count() * sizeof(SlotStats));
    }
    Status download_kv_cell_slots(int32_t *out) override {
        H2O_TRY(failed_);
        if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
        return download_raw(kv_.cell_slots, out, static_cast<size_t>(kv_config_.n_layer) * kv_config_.n_head_kv * sizeof(int32_t));
    }
    // The rule of kv_head_budgets.h on a host copy of the bookkeeping (no rows): it comes down,
    // the rule records what it does to the rows, the device does the same to its rows
    // (kv_rebalance_*_kernel) and the bookkeeping goes back up. The rows never cross.
    Status rebalance_kv(int64_t next_index, int incoming, int floor, int32_t *held, int32_t *slots) override;
    Status download_kv_tags(uint8_t *out) override {
        H2O_TRY(failed_);
        if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
        std::vector<int64_t> stream(slot_count());
        H2O_TRY(download_raw(kv_.tag, out, slot_count()));
        H2O_TRY(download_raw(kv_.stream, stream.data(), slot_count() * sizeof(int64_t)));
        // A freed slot keeps its last token's tag on the device.
        for (size_t i = 0; i < stream.size(); ++i) out[i] = stream[i] >= 0 ? out[i] : 0;
        return Status::Ok();
    }
    // Passed to every eviction by value (ClaimArgs), so they take effect with the next batch.
    Status set_kv_span_minimums(const int32_t *minimums) override {
        H2O_TRY(failed_);
        std::copy(minimums, minimums + KV_MAX_SPANS, span_min_);
        return Status::Ok();
    }
    // Snapshots (and forks) through a host image of the cache (kv_image.h): the device keeps the
    // image's arrays, array for array, so each is one copy.
    Status save_kv(ByteWriter &out) override;
    Status load_kv(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) override;
    Status attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                     const ModelShape &shape) override;

private:
    // ---- attention's steps (attention())
    Status ensure_attention_scratch(const ModelShape &shape);
    ClaimArgs claim_args(const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch, const ModelShape &shape,
                         const KvPolicyConfig &policy, int stride) const;
    Status expect_queries(const ClaimArgs &c, const Tensor &q, const ModelShape &shape);
    Status attend_chunk(const Tensor &out, const Tensor &q, int layer, const AttentionBatch &batch, const ModelShape &shape,
                        const ClaimArgs &c, int t0, int count);

    // One array of the cache on the device and in a host image (save_kv, load_kv).
    struct ImageArray {
        void *device;
        void *host;
        size_t bytes;
    };
    // The whole image, or its bookkeeping only (no rows, no Expected Attention statistics: what
    // the rule of kv_head_budgets.h reads and writes).
    enum class ImagePart {
        Whole,
        Bookkeeping
    };
    std::vector<ImageArray> image_arrays(KvImage &image, ImagePart part = ImagePart::Whole);

    template <typename T>
    static T *device_ptr(const Tensor &t) {
        return reinterpret_cast<T *>(t.buffer + t.offset);
    }

    static unsigned grid_for(int64_t count) { return static_cast<unsigned>(std::min<int64_t>((count + kBlock - 1) / kBlock, 65535)); }

    size_t slot_count() const { return static_cast<size_t>(kv_config_.total_slots()); }

    // A device error: the backend stays failed, and says which call failed and how.
    Status check(cudaError_t e, const char *what) {
        if (e == cudaSuccess) return Status::Ok();
        if (failed_.ok()) {
            // (member-wise: nvcc reports the assignment operator's [[nodiscard]] Status& result)
            failed_.code = H2O_ERR_BACKEND_FAILED;
            failed_.message = std::string("CUDA device error in ") + what + ": " + cuda_error_text(e);
        }
        return failed_;
    }

    Status launched(const char *kernel) { return check(cudaGetLastError(), (std::string(kernel) + " kernel launch").c_str()); }

    // Device memory. Running out is H2O_ERR_OUT_OF_MEMORY and leaves the backend usable.
    Status device_alloc(size_t bytes, void **out) {
        const cudaError_t e = cudaMalloc(out, std::max<size_t>(bytes, 1));
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();  // not sticky: clear it
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes >> 20) + " MiB of CUDA device memory");
        }
        H2O_TRY(check(e, "cudaMalloc"));
        allocations_.push_back(*out);
        allocated_ += bytes;
        return Status::Ok();
    }

    template <typename T>
    Status device_array(size_t count, T **out) {
        void *p = nullptr;
        H2O_TRY(device_alloc(count * sizeof(T), &p));
        *out = static_cast<T *>(p);
        return Status::Ok();
    }

    // A copy in stream order that has finished when this returns.
    Status copy_to_device_now(void *dst, const void *src, size_t bytes) {
        if (bytes == 0) return Status::Ok();
        H2O_TRY(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync"));
        traffic_.bytes_to_device += bytes;
        return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }

    Status download_raw(const void *src, void *dst, size_t bytes) {
        H2O_TRY(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)"));
        traffic_.bytes_to_host += bytes;
        return synchronize();
    }

    // The rotary inverse frequencies of `rope` on the device (RotarySpec computes them on the host).
    // Two tables, for a model's global and local layers (which rotate differently): the one that
    // holds `rope`, else the one used less recently, filled now.
    Status rope_table(const RotarySpec &rope, const double **out) {
        const int slot = rope_inv_freq_[last_rope_slot_] && rope_spec_[last_rope_slot_] == rope ? last_rope_slot_ : 1 - last_rope_slot_;
        double *&table_on_device = rope_inv_freq_[slot];
        if (!table_on_device || !(rope_spec_[slot] == rope)) {
            const std::vector<double> table = rope.inv_freqs();
            if (!table_on_device || rope_spec_[slot].pairs() < rope.pairs()) H2O_TRY(device_array(table.size(), &table_on_device));
            // In stream order (earlier kernels read the old table), waited for: the host table goes
            // out of scope.
            H2O_TRY(copy_to_device_now(table_on_device, table.data(), table.size() * sizeof(double)));
            rope_spec_[slot] = rope;
        }
        last_rope_slot_ = slot;
        *out = table_on_device;
        return Status::Ok();
    }

    int device_;
    int max_batch_;
    cudaStream_t stream_ = nullptr;
    Status failed_;  // the first device error; every later operation returns it
    std::vector<void *> allocations_;
    size_t allocated_ = 0;
    Traffic traffic_;
    double *rope_inv_freq_[2] = {nullptr, nullptr};
    RotarySpec rope_spec_[2];  // what each of rope_inv_freq_ holds
    int last_rope_slot_ = 0;
    double *local_inv_freq_ = nullptr;  // rolling: the local layers' (KvConfig::local_rope), or null
    // When the heads' budgets move (rebalance_kv): the bookkeeping the rule runs on, and a chunk of
    // its edits of the rows on the host and the device, with the rows a chunk of moves carries.
    static constexpr size_t kRebalanceChunk = 4096;
    KvCache rebalance_books_;
    std::vector<int64_t> rebalance_entries_;
    int64_t *rebalance_edits_ = nullptr;
    uint8_t *rebalance_rows_ = nullptr;

    bool has_kv_ = false;
    int32_t span_min_[KV_MAX_SPANS] = {};  // set_kv_span_minimums
    KvConfig kv_config_;
    KvDevice kv_;
    size_t key_row_ = 0, value_row_ = 0;
    int chunk_ = 1;  // query tokens whose attention weights the scratch holds
    int scratch_heads_ = 0;
    SoftmaxState *split_state_ = nullptr;  // split attention's scratch (AttentionArgs)
    int32_t *split_visible_ = nullptr;
    float *partial_out_ = nullptr;
};

}  // namespace h2o
