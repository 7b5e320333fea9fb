// The Vulkan backend's class, shared by the files that implement it by concern:
//   vk_backend.cpp    the device context: set-up, memory, recording and submission, counters;
//   vk_weights.cpp    weights (their device layout, adoption, upload), get_rows and matmul;
//   vk_ops.cpp        the other row operations (rms_norm, rope, element-wise, argmax);
//   vk_kv.cpp         the KV cache: its buffers, clearing, rebalancing, downloads, snapshots;
//   vk_attention.cpp  attention: make room and store a batch, attend, fold the statistics;
//   vulkan_backend.cpp  the public functions of vulkan_backend.h.
//
// Device. The Vulkan device, its pipelines and the weights on it are shared with every other
// backend on the same device (vk_shared_device.h); the backend owns the rest.
//
// Memory. Tensors are sub-allocated from a few large device-local blocks (one VkBuffer and one
// VkDeviceMemory each); Tensor::buffer is the block number + 1 and Tensor::offset the byte offset
// in it. Each weight is a block of its own whose buffer belongs to the shared weight (the backend
// holds a reference to it), so kernels reach shared and own memory alike. One host-visible buffer
// serves as the staging area of uploads and downloads: uploads issued while a command buffer is
// being recorded take consecutive pieces of it (the copy runs in order with the recorded
// kernels), and it is reused once the command buffer has completed.
//
// Execution. Every operation is recorded into one command buffer. Each tensor a kernel uses is a
// storage buffer binding covering the whole tensor (from an offset the device accepts; the rest
// of the offset is a push constant), so a descriptor set depends only on which tensors a kernel
// touches: sets are created the first time and cached, and none are written while decoding. A
// pipeline barrier is recorded only when an operation touches memory that an operation since the
// last barrier wrote (or writes memory one read). The command buffer is submitted when the host
// needs a result (download, synchronize): once per decoded token.
//
// Weights are repacked at upload so every row starts on a 4-byte boundary (weights.glsl); so are
// the rows of the KV cache, in every KvType (kv_row.glsl), which the kernels encode exactly as the
// CPU does and read in place.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include "kv_cache.h"
#include "log.h"
#include "vulkan/shaders/kv_meta_layout.h"
#include "vulkan/vk_context.h"
#include "vulkan/vk_shared_device.h"
#include "vulkan/vulkan_backend.h"

namespace h2o {

static_assert(std::endian::native == std::endian::little, "the weight repacking and stream index copies assume little-endian");

constexpr VkDeviceSize kHostBufferBytes = VkDeviceSize{4} << 20;  // staging for uploads and downloads
constexpr uint32_t kElementwiseGroup = 128;                       // WG of get_rows / elementwise
constexpr uint32_t kRopeTablePairs = 512;                         // rotary dimensions up to 1024
constexpr uint32_t kSetsPerPool = 64;

inline VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

// A signed 64-bit value as the two words the shaders read (low, high).
inline void split64(int64_t v, uint32_t out[2]) {
    const auto u = static_cast<uint64_t>(v);
    out[0] = static_cast<uint32_t>(u);
    out[1] = static_cast<uint32_t>(u >> 32);
}

// Words of one repacked weight row (weights.glsl; vk_weights.cpp).
uint32_t weight_row_words(TensorType type, int64_t cols);

class VulkanBackend final : public Backend, public KvStore {
public:
    KvStore &kv_store() override { return *this; }
    VulkanBackend(std::shared_ptr<vk::SharedDevice> device, int max_batch)
        : device_(std::move(device)), ctx_(device_->context()), vk_(ctx_.vk()), max_batch_(max_batch) {}
    ~VulkanBackend() override;

    Status init();

    const char *name() const override { return "vulkan"; }

    Status alloc(TensorType type, int64_t cols, int64_t rows, Tensor *out) override;
    Status adopt_weight(TensorType type, int64_t cols, int64_t rows, const void *host_data, Tensor *out) override;
    Status upload(const Tensor &dst, const void *src, size_t bytes) override;
    Status download(const Tensor &src, void *dst, size_t bytes) override;
    Status synchronize() override {
        flush();
        return error_;
    }
    // The backend's own tensors and staging: not the weights, which belong to the model's
    // sessions on the device together (as the CPU backend does not count the model file).
    size_t allocated_bytes() const override {
        return static_cast<size_t>(tensor_bytes_ + kHostBufferBytes) +
               sizeof(uint32_t) * (rebalance_layers_.capacity() + rebalance_counts_.capacity());
    }

    Status get_rows(const Tensor &out, const Tensor &table, const Tensor &ids, int n) override;
    Status rms_norm(const Tensor &out, const Tensor &in, const Tensor &weight, int n, float eps) override;
    Status matmul(const Tensor &out, const Tensor &weight, const Tensor &in, int n) override;
    Status rope(const Tensor &q, const Tensor &k, const Tensor &positions, int n, const ModelShape &shape, bool per_kv_head) override;
    Status swiglu(const Tensor &gate, const Tensor &up, int n) override;
    Status geglu(const Tensor &gate, const Tensor &up, int n) override;
    Status scale(const Tensor &x, float factor, int n) override;
    Status softcap(const Tensor &x, float cap, int n) override;
    Status add(const Tensor &acc, const Tensor &x, int n) override;
    Status add_bias(const Tensor &acc, const Tensor &bias, int n) override;
    Status argmax(const Tensor &out, const Tensor &in, int n) override;
    // value: the operation's number (scale, softcap).
    Status elementwise(const char *pipeline, const Tensor &out, const Tensor &in, int n, float value = 0.0f);

    Status create_kv(const KvConfig &config) override;
    Status clear_kv() override;
    size_t kv_bytes() const override { return static_cast<size_t>(kv_bytes_); }
    Status download_kv_stream_indices(int64_t *out) override;
    Status download_kv_statistics(SlotStats *out) override;
    Status download_kv_tags(uint8_t *out) override;
    Status download_kv_cell_slots(int32_t *out) override;
    Status rebalance_kv(int64_t next_index, int incoming, int floor, int32_t *held, int32_t *slots) override;
    Status set_kv_span_minimums(const int32_t *minimums) override;
    // Snapshots go through a host image of the cache (kv_image.h), whose codec defines the format
    // and checks it.
    Status save_kv(ByteWriter &out) override;
    Status load_kv(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) override;
    Status attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                     const ModelShape &shape) override;

    // Test hook (vulkan_fail_next_submission): the next submission fails as a lost device would.
    void fail_next_submission() { fail_next_submission_ = true; }

    VulkanCounters counters() const;

    Traffic traffic() const override {
        const VulkanCounters c = counters();
        return Traffic{c.bytes_to_device, c.bytes_to_host, c.submissions, c.device_memory_bytes};
    }

private:
    // A buffer tensors live in: one of the backend's own (`owned`), or a weight shared with the
    // other backends on the device (`weight` owns the buffer).
    struct Block {
        VkBuffer buffer = VK_NULL_HANDLE;
        VkDeviceSize size = 0, used = 0;  // of the buffer
        bool pooled = false;              // shared by many tensors (else: one large tensor)
        vk::Buffer owned;
        std::shared_ptr<const vk::SharedWeight> weight;
    };
    // A range of a buffer an operation reads or writes.
    struct Access {
        VkBuffer buffer = VK_NULL_HANDLE;
        VkDeviceSize offset = 0, bytes = 0;
        bool write = false;
    };
    // A storage buffer binding: the range `access` of a buffer, starting at an offset the device
    // accepts; the kernel finds the data `word` words in.
    struct Bound {
        Access access;  // [binding start, binding end): what the kernel may touch
        uint32_t word = 0;
    };

    // ---- memory
    Status allocate(VkDeviceSize bytes, Tensor *out);
    // Repacks a weight into `dst` through the staging buffer and waits until the copies are done.
    Status upload_weight(VkBuffer dst, TensorType type, int64_t cols, int64_t rows, const void *host_data);
    const Block &block(const Tensor &t) const { return blocks_[t.buffer - 1]; }
    // Bytes of a tensor in device memory (weights as repacked; F32/I32 as row_bytes says).
    static VkDeviceSize extent(const Tensor &t) {
        return VkDeviceSize{4} * weight_row_words(t.type, t.cols) * static_cast<VkDeviceSize>(t.rows);
    }
    // Rows of a weight tensor that fit one storage buffer binding.
    int64_t rows_per_binding(const Tensor &w, VkDeviceSize row_bytes) const;

    // ---- the KV cache (vk_kv.cpp)
    // The sizes of kv_rebalance.comp's work buffer for a cache (rebalance_layout_ and the rest).
    struct RebalancePlan {
        KvRebalanceWork work{};
        uint32_t sort_size = 1, area_moves = 0, move_groups = 0;
    };
    static RebalancePlan plan_rebalancing(const KvConfig &config);
    Status upload_rollback_table(const KvConfig &config);
    // The device's cache and a host image of it (allocated for kv_), one into the other.
    Status cache_to_image(KvImage &image);
    Status cache_from_image(const KvImage &image);
    // The bookkeeping words [0, layout_.batch_slot) of the meta buffer and an image's bookkeeping,
    // one into the other (rows aside).
    void meta_words_to_image(const uint32_t *meta, KvImage &image) const;
    void image_to_meta_words(const KvImage &image, uint32_t *meta) const;

    // ---- attention (vk_attention.cpp): one layer's cells, as every kernel of attention() finds them
    struct LayerCells {
        uint32_t layer = 0, n_kv = 0, n_cells = 0, head_dim = 0, group = 0;
        uint32_t n_slots = 0;                      // the most slots a cell of the layer may hold: the scratch's stride
        int pool = 0;                              // the layer's pool, whose key and value rows hold its cells
        uint32_t first_slot = 0, total_slots = 0;  // the pool's first slot; the cache's slots
        uint32_t window = 0;                       // a local layer's sliding window (0: global)
        uint32_t formats = 0;                      // key format | value format << 8
        KvPolicyConfig policy;
        Bound keys, values, meta;  // bound for writing
    };
    LayerCells layer_cells(int layer, const ModelShape &shape);
    void expect_queries(const LayerCells &cells, const Tensor &q, const AttentionBatch &batch);
    void claim_slots(const LayerCells &cells, const Tensor &k, const Tensor &v, const AttentionBatch &batch);
    void attend_chunk(const LayerCells &cells, const Tensor &out, const Tensor &q, int64_t first_index, uint32_t t0, uint32_t chunk,
                      float scale, float softcap);
    void fold_statistics(const LayerCells &cells, const AttentionBatch &batch, uint32_t t0, uint32_t chunk);

    // ---- recording
    bool begin();
    void flush();
    // Records the backend's first error: it stays, and every later operation returns it.
    void fail(const std::string &what, h2o_status code = H2O_ERR_BACKEND_FAILED);
    bool failed() const { return !error_.ok(); }
    // Records the barrier `accesses` need against what was recorded since the last one.
    void track(const Access *accesses, size_t count, VkPipelineStageFlags stage);
    // Bindings cover whole tensors (so descriptor sets do not depend on the batch size, and the
    // validation layer sees the ranges the hazard tracking assumes), or a window of weight rows.
    Bound bind(const Tensor &t, bool write) { return bind_range(block(t).buffer, t.offset, extent(t), write); }
    Bound bind_rows(const Tensor &w, int64_t first, int64_t count) {
        const VkDeviceSize row = extent(w) / static_cast<VkDeviceSize>(w.rows);
        return bind_range(block(w).buffer, w.offset + row * first, row * count, false);
    }
    Bound bind_range(VkBuffer buffer, VkDeviceSize offset, VkDeviceSize bytes, bool write);
    VkDescriptorSet descriptor_set(const Bound *bound, size_t count);
    void dispatch(const std::string &kernel, std::initializer_list<Bound> bound, const void *push, size_t push_bytes, uint32_t gx,
                  uint32_t gy = 1, uint32_t gz = 1);
    // A 1-D problem of `count` invocations as a grid of at most 65535 x N workgroups.
    void grid_1d(uint64_t count, uint32_t group, uint32_t *gx, uint32_t *gy) const;
    std::string reduction_kernel(const std::string &name) const { return subgroups_ ? name : name + "_shared"; }
    // A piece of the host buffer for this command buffer (flushing first if it is full).
    bool reserve_host(VkDeviceSize bytes, VkDeviceSize *offset);
    void record_upload(VkBuffer dst, VkDeviceSize dst_offset, const void *src, VkDeviceSize bytes);
    void record_fill(VkBuffer dst, VkDeviceSize offset, VkDeviceSize bytes, uint32_t value);
    Status download_range(VkBuffer src, VkDeviceSize offset, void *dst, VkDeviceSize bytes);
    void ensure_rope_table(int slot, const RotarySpec &rope);

    // First: the blocks of shared weights and everything else below need the device.
    std::shared_ptr<vk::SharedDevice> device_;
    vk::Context &ctx_;
    const vk::DeviceFunctions &vk_;
    int max_batch_;
    bool subgroups_ = false;  // subgroup-arithmetic kernels in use
    bool subgroup_rows_ = false;  // matvec by whole rows per subgroup (init)
    Status error_;            // the first error (see fail)
    bool fail_next_submission_ = false;

    std::vector<Block> blocks_;
    size_t pool_block_ = 0;                 // the pooled block new tensors go to (block number + 1), 0: none
    VkDeviceSize device_bytes_ = 0;         // VkDeviceMemory of the backend's own blocks
    VkDeviceSize tensor_bytes_ = 0;         // sub-allocated from them
    VkDeviceSize shared_weight_bytes_ = 0;  // device memory of the shared weights held
    VkDeviceSize alignment_ = 256;
    VkDeviceSize binding_limit_ = 0;  // bytes one storage buffer binding may cover

    vk::Buffer host_;
    uint8_t *host_ptr_ = nullptr;
    VkDeviceSize host_used_ = 0;

    VkCommandPool command_pool_ = VK_NULL_HANDLE;
    VkCommandBuffer cmd_ = VK_NULL_HANDLE;
    VkFence fence_ = VK_NULL_HANDLE;
    bool recording_ = false;
    bool in_flight_ = false;  // submitted, and the fence not yet seen signalled

    std::vector<VkDescriptorPool> descriptor_pools_;
    uint32_t sets_in_last_pool_ = kSetsPerPool;
    // Key: (buffer, offset, range) of every binding.
    using DescriptorKey = std::array<uint64_t, 3 * vk::kBindings>;
    std::map<DescriptorKey, VkDescriptorSet> descriptor_sets_;

    // Accesses recorded since the last barrier.
    std::vector<Access> pending_;
    VkPipelineStageFlags pending_stages_ = 0;
    VkAccessFlags pending_writes_ = 0;

    uint64_t bytes_to_device_ = 0, bytes_to_host_ = 0, submissions_ = 0, dispatches_ = 0, barriers_ = 0;
    uint64_t weight_bytes_to_device_ = 0;  // of bytes_to_device_: weights this backend uploaded

    // Rotary tables: slots 0 and 2 for rope() (a model's global and local layers rotate
    // differently: rope_slot), slot 1 for Expected Attention's queries (kv_expect.comp); what
    // each holds. Rolled keys rotate back by the host's table instead (rollback_table_).
    static constexpr int kRopeSlots = 3;
    Tensor rope_table_;
    RotarySpec rope_spec_[kRopeSlots];
    int last_forward_slot_ = 0;  // rope()'s most recently used slot
    // The slot rope() rotates `rope` by: one of 0 and 2 holding it, else the one used less
    // recently, filled now.
    int rope_slot(const RotarySpec &rope);

    // KV cache.
    bool has_kv_ = false;
    KvConfig kv_;
    KvLayout layout_{};                  // kv_meta_layout.h
    uint32_t query_first_ = 0;           // Expected Attention's query statistics: the words after layout_'s
    std::vector<Tensor> keys_, values_;  // per pool of layers, at its first layer: its cells' regions of rows (kv_row.glsl)
    Tensor meta_, scratch_;
    uint32_t chunk_capacity_ = 0;  // tokens whose attention weights the scratch holds
    VkDeviceSize kv_bytes_ = 0;
    // When the heads' budgets move: kv_rebalance.comp's work buffer (kv_meta_layout.h), sized for
    // the largest pool (rebalance_sort_size_ slots) and a chunk of rebalance_area_moves_ moves
    // (its regions: rebalance_layout_), which rebalance_move_groups_ workgroups make; on the
    // host, the layers' parameters going up and the cells' counts coming back.
    Tensor rebalance_work_;
    KvRebalanceWork rebalance_layout_{};
    uint32_t rebalance_sort_size_ = 0, rebalance_area_moves_ = 0, rebalance_move_groups_ = 0;
    std::vector<uint32_t> rebalance_layers_, rebalance_counts_;
    // With rolling: kv_rotate_back_table of the global layers, then (from local_rollback_off_, in
    // (cos, sin) pairs) of the local ones, for kv_claim.comp and kv_rebalance.comp.
    Tensor rollback_table_;
    uint32_t local_rollback_off_ = 0;
};

}  // namespace h2o
