// The Vulkan backend (vulkan_backend.h).
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
#include "vulkan/vulkan_backend.h"

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

namespace h2o {

namespace {

static_assert(std::endian::native == std::endian::little, "the weight repacking and stream index copies assume little-endian");
static_assert(sizeof(SlotStats) == 5 * sizeof(float), "download_kv_statistics copies 5 floats per slot");

constexpr VkDeviceSize kHostBufferBytes = VkDeviceSize{4} << 20;  // staging for uploads and downloads
constexpr VkDeviceSize kMinBlockBytes = VkDeviceSize{4} << 20;    // first device block
constexpr VkDeviceSize kMaxPoolBlockBytes = VkDeviceSize{256} << 20;
constexpr int kMatvecMaxTokens = 8;         // fewer tokens: matvec.comp; more: the tiled matmul.comp
constexpr uint32_t kMatvecMaxRows = 65535;  // workgroup count limit of one dimension
constexpr uint32_t kMatmulTileRows = 64, kMatmulTileTokens = 32;
constexpr uint32_t kElementwiseGroup = 128;  // WG of get_rows / elementwise
constexpr uint32_t kRopeGroup = 64;
constexpr uint32_t kStatsGroup = 64;
constexpr uint32_t kRopeTablePairs = 512;  // rotary dimensions up to 1024
constexpr int kMaxHeadDim = 256;           // MAX_HEAD_DIM in attention.comp
constexpr VkDeviceSize kAttentionScratchBudget = VkDeviceSize{32} << 20;
constexpr uint32_t kSetsPerPool = 64;

VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

// The weight types the kernels run: vulkan.cmake builds get_rows, matmul and matvec for each, and
// weight_row_words / repack_row / type_suffix below lay them out.
constexpr TensorType kVulkanWeightTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::Q8_0, TensorType::Q4_0,
                                             TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

bool is_k_quant(TensorType type) { return type == TensorType::Q4_K || type == TensorType::Q5_K || type == TensorType::Q6_K; }

// Words of one K-quant super-block on the device: the file's block padded to whole words.
uint32_t k_block_words(TensorType type) { return (traits(type).block_bytes + 3) / 4; }

// Words of one repacked weight row (weights.glsl).
uint32_t weight_row_words(TensorType type, int64_t cols) {
    const auto c = static_cast<uint32_t>(cols);
    switch (type) {
        case TensorType::F16:
            return (c + 1) / 2;
        case TensorType::Q8_0:
            return (c / 32) * 8 + (c / 32 + 1) / 2;
        case TensorType::Q4_0:
            return (c / 32) * 4 + (c / 32 + 1) / 2;
        case TensorType::Q4_K:
        case TensorType::Q5_K:
        case TensorType::Q6_K:
            return (c / 256) * k_block_words(type);
        default:
            return c;  // F32
    }
}

// One weight row from the file's layout into the repacked one (dst: weight_row_words words, zeroed).
void repack_row(TensorType type, const uint8_t *src, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / 32;
    switch (type) {
        case TensorType::F32:
            std::memcpy(dst, src, static_cast<size_t>(cols) * 4);
            break;
        case TensorType::F16:
            std::memcpy(dst, src, static_cast<size_t>(cols) * 2);
            break;
        case TensorType::Q8_0:
        case TensorType::Q4_0: {
            const size_t block = type == TensorType::Q8_0 ? 34 : 18, quants = block - 2;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t *blk = src + b * block;
                std::memcpy(dst + b * quants, blk + 2, quants);
                std::memcpy(dst + nb * quants + 2 * b, blk, 2);  // fp16 scale
            }
            break;
        }
        case TensorType::Q4_K:
        case TensorType::Q5_K:
        case TensorType::Q6_K: {
            const size_t block = traits(type).block_bytes, padded = 4 * size_t{k_block_words(type)};
            for (int64_t b = 0; b < cols / 256; ++b) std::memcpy(dst + b * padded, src + b * block, block);
            break;
        }
        default:
            break;
    }
}

// Words of one KV row on the device: the CPU's row (kv_format.h) padded to whole words, so that
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

const char *type_suffix(TensorType type) {
    switch (type) {
        case TensorType::F16:
            return "f16";
        case TensorType::Q8_0:
            return "q8_0";
        case TensorType::Q4_0:
            return "q4_0";
        case TensorType::Q4_K:
            return "q4_k";
        case TensorType::Q5_K:
            return "q5_k";
        case TensorType::Q6_K:
            return "q6_k";
        default:
            return "f32";
    }
}

// ---- push constants (mirror the shaders' Params blocks) -----------------------------------------

struct GetRowsPush {
    uint32_t table_off, ids_off, out_off, cols, n, row_first, row_count;
};
struct ArgmaxPush {
    uint32_t in_off, out_off, cols;
};

struct RmsNormPush {
    uint32_t in_off, weight_off, out_off, cols;
    float eps;
};
struct MatmulPush {
    uint32_t w_off, x_off, y_off, cols, rows, y_stride, row_first, n;
};
struct RopePush {
    uint32_t q_off, k_off, pos_off, table_off, n_head, n_head_kv, head_dim, pairs, n, q_stride, k_stride;
    uint32_t pos_head_stride;  // 0: one position per token; n: n per kv head, kv head after kv head
    uint32_t pairing;          // RotaryPairing
    float magnitude;           // RotarySpec::magnitude
};
struct ElementwisePush {
    uint32_t a_off, b_off, count;
    uint32_t b_cols;  // add_bias: b is one row of this many
    float value;      // scale, softcap
};
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
static_assert(sizeof(KvClaimPush) <= vk::kPushConstantBytes && sizeof(AttentionPush) <= vk::kPushConstantBytes &&
                  sizeof(StatsPush) <= vk::kPushConstantBytes && sizeof(KvRebalancePush) <= vk::kPushConstantBytes,
              "push constants are limited to 128 bytes");

void split64(int64_t v, uint32_t out[2]) {
    const auto u = static_cast<uint64_t>(v);
    out[0] = static_cast<uint32_t>(u);
    out[1] = static_cast<uint32_t>(u >> 32);
}

uint64_t handle_bits(VkBuffer b) {
    uint64_t bits = 0;
    std::memcpy(&bits, &b, sizeof b);
    return bits;
}

// Per rotary pair i, its inverse frequency (RotarySpec::inv_freq) in turns as a 64-bit
// fixed-point fraction (rotary.glsl). The frequency is computed exactly as the CPU reference
// computes it, in double precision.
std::vector<uint64_t> rope_turn_fractions(const RotarySpec &rope) {
    std::vector<uint64_t> table(static_cast<size_t>(rope.pairs()));
    const long double two_pi = 6.283185307179586476925286766559L;
    for (size_t i = 0; i < table.size(); ++i) {
        const double freq = rope.inv_freq(static_cast<int>(i));
        long double turns = static_cast<long double>(freq) / two_pi;
        turns -= std::floor(turns);
        const long double scaled = std::ldexp(turns, 64);
        table[i] = scaled >= 18446744073709551615.0L ? 0 : static_cast<uint64_t>(scaled + 0.5L);
    }
    return table;
}

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

    // The device's cache and a host image of it (allocated for kv_), one into the other.
    Status cache_to_image(KvImage &image);
    Status cache_from_image(const KvImage &image);
    // The bookkeeping words [0, layout_.batch_slot) of the meta buffer and an image's bookkeeping,
    // one into the other (rows aside).
    void meta_words_to_image(const uint32_t *meta, KvImage &image) const;
    void image_to_meta_words(const KvImage &image, uint32_t *meta) const;

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

// ---- set-up -------------------------------------------------------------------------------------

Status VulkanBackend::init() {
    const VkPhysicalDeviceLimits &limits = ctx_.limits();
    alignment_ = std::max<VkDeviceSize>({256, limits.minStorageBufferOffsetAlignment, limits.nonCoherentAtomSize});
    binding_limit_ = limits.maxStorageBufferRange;
    // Test hook: a smaller binding limit, so small tensors exercise the paths that split weights
    // larger than one binding.
    if (const char *limit = std::getenv("H2O_VULKAN_BINDING_LIMIT"); limit && *limit) {
        binding_limit_ = std::clamp<VkDeviceSize>(std::strtoull(limit, nullptr, 10), 4096, binding_limit_);
    }
    subgroups_ = ctx_.subgroup_arithmetic() && !vk::env_is("H2O_VULKAN_SUBGROUPS", "0");

    H2O_TRY(device_->create_buffer(kHostBufferBytes, true, &host_));
    void *mapped = nullptr;
    VkResult r = vk_.vkMapMemory(ctx_.device(), host_.memory, 0, VK_WHOLE_SIZE, 0, &mapped);
    if (r != VK_SUCCESS) return make_error(H2O_ERR_OUT_OF_MEMORY, std::string("vkMapMemory: ") + vk::result_name(r));
    host_ptr_ = static_cast<uint8_t *>(mapped);

    auto pool_info = vk::make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    pool_info.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    pool_info.queueFamilyIndex = ctx_.queue_family();
    r = vk_.vkCreateCommandPool(ctx_.device(), &pool_info, nullptr, &command_pool_);
    if (r != VK_SUCCESS) return make_error(H2O_ERR_OUT_OF_MEMORY, std::string("vkCreateCommandPool: ") + vk::result_name(r));
    auto cmd_info = vk::make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    cmd_info.commandPool = command_pool_;
    cmd_info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cmd_info.commandBufferCount = 1;
    r = vk_.vkAllocateCommandBuffers(ctx_.device(), &cmd_info, &cmd_);
    if (r != VK_SUCCESS) return make_error(H2O_ERR_OUT_OF_MEMORY, std::string("vkAllocateCommandBuffers: ") + vk::result_name(r));
    auto fence_info = vk::make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    r = vk_.vkCreateFence(ctx_.device(), &fence_info, nullptr, &fence_);
    if (r != VK_SUCCESS) return make_error(H2O_ERR_OUT_OF_MEMORY, std::string("vkCreateFence: ") + vk::result_name(r));

    return allocate(kRopeSlots * kRopeTablePairs * sizeof(uint64_t), &rope_table_);
}

VulkanBackend::~VulkanBackend() {
    VkDevice device = ctx_.device();
    if (recording_) {
        vk_.vkEndCommandBuffer(cmd_);
        recording_ = false;
    }
    // Only this backend's own work is waited for: the device and its queue are shared, and
    // vkDeviceWaitIdle would need every other backend's submissions held off.
    if (in_flight_) vk_.vkWaitForFences(device, 1, &fence_, VK_TRUE, UINT64_MAX);
    for (VkDescriptorPool pool : descriptor_pools_) vk_.vkDestroyDescriptorPool(device, pool, nullptr);
    if (fence_) vk_.vkDestroyFence(device, fence_, nullptr);
    if (command_pool_) vk_.vkDestroyCommandPool(device, command_pool_, nullptr);
    if (host_ptr_) vk_.vkUnmapMemory(device, host_.memory);
    device_->destroy_buffer(host_);
    // Shared weights are let go with blocks_, and freed by the last backend holding them.
    for (const Block &b : blocks_) device_->destroy_buffer(b.owned);
}

// ---- memory -------------------------------------------------------------------------------------

Status VulkanBackend::allocate(VkDeviceSize bytes, Tensor *out) {
    bytes = round_up(std::max<VkDeviceSize>(bytes, 4), 4);
    const VkDeviceSize range = binding_limit_;
    if (pool_block_ != 0) {
        Block &b = blocks_[pool_block_ - 1];
        const VkDeviceSize at = round_up(b.used, alignment_);
        if (at + bytes <= b.size) {
            b.used = at + bytes;
            tensor_bytes_ += bytes;
            *out = Tensor{pool_block_, static_cast<size_t>(at), TensorType::F32, static_cast<int64_t>(bytes / 4), 1};
            return Status::Ok();
        }
    }
    if (bytes > ctx_.max_allocation()) {
        return make_error(H2O_ERR_OUT_OF_MEMORY, "Vulkan device '" + std::string(ctx_.properties().deviceName) + "': a tensor of " +
                                                     std::to_string(bytes >> 20) + " MiB exceeds the largest allocation (" +
                                                     std::to_string(ctx_.max_allocation() >> 20) + " MiB)");
    }
    // Pooled blocks grow with what is allocated so far (small models stay small) and stay
    // within one storage buffer binding, so kernels bind them whole; a tensor larger than the
    // next pooled block gets a block of its own.
    const VkDeviceSize pool_limit = std::min({kMaxPoolBlockBytes, static_cast<VkDeviceSize>(range), ctx_.max_allocation()});
    const VkDeviceSize pooled_size = std::min(pool_limit, std::max(kMinBlockBytes, device_bytes_));
    Block b;
    b.pooled = bytes <= pooled_size / 2;
    b.size = b.pooled ? pooled_size : bytes;
    H2O_TRY(device_->create_buffer(b.size, false, &b.owned));
    b.buffer = b.owned.buffer;
    b.used = bytes;
    device_bytes_ += b.owned.size;
    blocks_.push_back(std::move(b));
    if (blocks_.back().pooled) pool_block_ = blocks_.size();
    tensor_bytes_ += bytes;
    *out = Tensor{blocks_.size(), 0, TensorType::F32, static_cast<int64_t>(bytes / 4), 1};
    return Status::Ok();
}

int64_t VulkanBackend::rows_per_binding(const Tensor &w, VkDeviceSize row_bytes) const {
    // A binding starts up to one offset alignment before the first row.
    const VkDeviceSize range = binding_limit_;
    const VkDeviceSize slack = std::max<VkDeviceSize>(4, ctx_.limits().minStorageBufferOffsetAlignment);
    const VkDeviceSize usable = range > slack ? range - slack : 0;
    return std::min<int64_t>(w.rows, static_cast<int64_t>(usable / row_bytes));
}

Status VulkanBackend::alloc(TensorType type, int64_t cols, int64_t rows, Tensor *out) {
    // Activations are F32 or I32; other types are meant for adopt_weight, which repacks them.
    const Tensor shape{0, 0, type, cols, rows};
    const VkDeviceSize bytes = extent(shape);
    H2O_TRY(allocate(bytes, out));
    out->type = type;
    out->cols = cols;
    out->rows = rows;
    // Zeroed, as the CPU backend's tensors are.
    record_fill(block(*out).buffer, out->offset, bytes, 0);
    return Status::Ok();
}

Status VulkanBackend::adopt_weight(TensorType type, int64_t cols, int64_t rows, const void *host_data, Tensor *out) {
    H2O_TRY(vulkan_runs_weight_type(type));
    if (cols <= 0 || rows <= 0) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "empty weight (" + std::to_string(rows) + " rows of " + std::to_string(cols) + ")");
    }
    // The kernels read whole blocks (K-quants: 256-element super-blocks).
    const int64_t block = traits(type).block_elements;
    if (cols % block != 0) {
        return make_error(H2O_ERR_UNSUPPORTED, std::string(type_name(type)) + " weight rows must be a multiple of " +
                                                   std::to_string(block) + " long on the Vulkan backend, not " + std::to_string(cols));
    }
    const Tensor shape{0, 0, type, cols, rows};
    const VkDeviceSize row_out = 4 * VkDeviceSize{weight_row_words(type, cols)};
    if (rows_per_binding(shape, row_out) < 1) {
        return make_error(H2O_ERR_UNSUPPORTED, "a weight row is longer than the device's storage buffer range");
    }
    if (row_out > kHostBufferBytes) return make_error(H2O_ERR_UNSUPPORTED, "a weight row is larger than the staging buffer");
    H2O_TRY(error_);
    // Uploaded by the first backend on the device to adopt it; the others find it.
    const VkDeviceSize bytes = round_up(std::max<VkDeviceSize>(extent(shape), 4), 4);
    const auto upload = [&](VkBuffer dst) { return upload_weight(dst, type, cols, rows, host_data); };
    std::shared_ptr<const vk::SharedWeight> weight;
    H2O_TRY(device_->shared_weight({host_data, type, rows, cols}, bytes, upload, &weight));
    // One block per weight held, found again if the weight is adopted twice.
    auto held = std::ranges::find(blocks_, weight, &Block::weight);
    if (held == blocks_.end()) {
        Block b;
        b.buffer = weight->buffer();
        b.size = b.used = bytes;
        b.weight = weight;
        shared_weight_bytes_ += weight->memory_bytes();
        blocks_.push_back(std::move(b));
        held = blocks_.end() - 1;
    }
    *out = Tensor{static_cast<uintptr_t>(held - blocks_.begin()) + 1, 0, type, cols, rows};
    return Status::Ok();
}

Status VulkanBackend::upload_weight(VkBuffer dst, TensorType type, int64_t cols, int64_t rows, const void *host_data) {
    // Repacked straight into the staging buffer, as many rows per copy as fit.
    const auto *src = static_cast<const uint8_t *>(host_data);
    const size_t row_in = row_bytes(type, cols);
    const VkDeviceSize row_out = 4 * VkDeviceSize{weight_row_words(type, cols)};
    const int64_t rows_per_copy = std::max<int64_t>(1, static_cast<int64_t>(kHostBufferBytes / row_out));
    for (int64_t r0 = 0; r0 < rows && !failed(); r0 += rows_per_copy) {
        const int64_t count = std::min(rows_per_copy, rows - r0);
        VkDeviceSize at = 0;
        if (!reserve_host(row_out * count, &at)) break;
        std::memset(host_ptr_ + at, 0, row_out * count);
        for (int64_t r = 0; r < count; ++r) repack_row(type, src + (r0 + r) * row_in, cols, host_ptr_ + at + r * row_out);
        const VkDeviceSize offset = row_out * r0;
        const Access accesses[] = {{dst, offset, row_out * count, true}};
        track(accesses, 1, VK_PIPELINE_STAGE_TRANSFER_BIT);
        const VkBufferCopy copy{at, offset, row_out * count};
        vk_.vkCmdCopyBuffer(cmd_, host_.buffer, dst, 1, &copy);
        bytes_to_device_ += row_out * count;
        weight_bytes_to_device_ += row_out * count;
    }
    // Other backends read the weight in their own submissions, after this returns: its copies
    // must have completed (the fence wait orders them before anything submitted later).
    flush();
    return error_;
}

// ---- recording ----------------------------------------------------------------------------------

void VulkanBackend::fail(const std::string &what, h2o_status code) {
    if (failed()) return;
    log(H2O_LOG_ERROR, "vulkan backend: " + what + "; further operations are refused");
    error_ = make_error(code, "vulkan backend: " + what);
}

bool VulkanBackend::begin() {
    if (failed()) return false;
    if (recording_) return true;
    auto info = vk::make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    info.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    const VkResult r = vk_.vkBeginCommandBuffer(cmd_, &info);
    if (r != VK_SUCCESS) {
        fail(std::string("vkBeginCommandBuffer: ") + vk::result_name(r));
        return false;
    }
    recording_ = true;
    return true;
}

void VulkanBackend::flush() {
    if (!recording_) return;
    recording_ = false;
    pending_.clear();
    pending_stages_ = 0;
    pending_writes_ = 0;
    host_used_ = 0;
    VkResult r = vk_.vkEndCommandBuffer(cmd_);
    if (r == VK_SUCCESS && fail_next_submission_) {
        fail_next_submission_ = false;
        vk_.vkResetCommandPool(ctx_.device(), command_pool_, 0);
        device_->mark_lost();  // as a real loss would: the backend made next gets a new device
        fail("vkQueueSubmit: VK_ERROR_DEVICE_LOST (injected)");
        return;
    }
    if (r == VK_SUCCESS) {
        r = device_->submit(cmd_, fence_);
        ++submissions_;
        in_flight_ = r == VK_SUCCESS;
    }
    if (r == VK_SUCCESS) r = vk_.vkWaitForFences(ctx_.device(), 1, &fence_, VK_TRUE, UINT64_MAX);
    if (r == VK_SUCCESS) in_flight_ = false;
    if (r == VK_SUCCESS) r = vk_.vkResetFences(ctx_.device(), 1, &fence_);
    if (r == VK_SUCCESS) r = vk_.vkResetCommandPool(ctx_.device(), command_pool_, 0);
    if (r == VK_ERROR_DEVICE_LOST) device_->mark_lost();
    if (r != VK_SUCCESS) fail(std::string("submitting work failed: ") + vk::result_name(r));
}

void VulkanBackend::track(const Access *accesses, size_t count, VkPipelineStageFlags stage) {
    auto overlaps = [](const Access &a, const Access &b) {
        return a.buffer == b.buffer && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
    };
    bool hazard = false;
    for (size_t i = 0; i < count && !hazard; ++i) {
        for (const Access &p : pending_) {
            // Read after write, write after write, write after read.
            if ((p.write || accesses[i].write) && overlaps(accesses[i], p)) {
                hazard = true;
                break;
            }
        }
    }
    const bool compute = stage == VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
    if (hazard) {
        // The barrier orders everything recorded so far before every later kernel and copy (not
        // just the one at hand), so what it covered can be forgotten.
        auto barrier = vk::make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
        barrier.srcAccessMask = pending_writes_;
        barrier.dstAccessMask =
            VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
        vk_.vkCmdPipelineBarrier(cmd_, pending_stages_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                                 &barrier, 0, nullptr, 0, nullptr);
        ++barriers_;
        pending_.clear();
        pending_stages_ = 0;
        pending_writes_ = 0;
    }
    for (size_t i = 0; i < count; ++i) {
        pending_.push_back(accesses[i]);
        if (accesses[i].write) pending_writes_ |= compute ? VK_ACCESS_SHADER_WRITE_BIT : VK_ACCESS_TRANSFER_WRITE_BIT;
    }
    pending_stages_ |= stage;
}

VulkanBackend::Bound VulkanBackend::bind_range(VkBuffer buffer, VkDeviceSize offset, VkDeviceSize bytes, bool write) {
    // Binding offsets must be multiples of minStorageBufferOffsetAlignment: start at the aligned
    // offset below and pass the rest to the kernel as a word offset.
    const VkDeviceSize align = std::max<VkDeviceSize>(4, ctx_.limits().minStorageBufferOffsetAlignment);
    const VkDeviceSize base = offset / align * align;
    Bound b;
    b.access = Access{buffer, base, std::max<VkDeviceSize>(offset + bytes - base, 4), write};
    b.word = static_cast<uint32_t>((offset - base) / 4);
    if (b.access.bytes > binding_limit_ || (offset - base) % 4 != 0) {
        fail("a tensor of " + std::to_string(bytes) + " bytes does not fit one storage buffer binding");
    }
    return b;
}

VkDescriptorSet VulkanBackend::descriptor_set(const Bound *bound, size_t count) {
    // Unused bindings repeat the first buffer: every binding of the set must be valid.
    DescriptorKey key;
    for (uint32_t i = 0; i < vk::kBindings; ++i) {
        const Bound &b = bound[i < count ? i : 0];
        key[3 * i] = handle_bits(b.access.buffer);
        key[3 * i + 1] = b.access.offset;
        key[3 * i + 2] = b.access.bytes;
    }
    if (auto it = descriptor_sets_.find(key); it != descriptor_sets_.end()) return it->second;

    VkDevice device = ctx_.device();
    if (sets_in_last_pool_ == kSetsPerPool) {
        const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * vk::kBindings};
        auto info = vk::make<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
        info.maxSets = kSetsPerPool;
        info.poolSizeCount = 1;
        info.pPoolSizes = &size;
        VkDescriptorPool pool = VK_NULL_HANDLE;
        const VkResult r = vk_.vkCreateDescriptorPool(device, &info, nullptr, &pool);
        if (r != VK_SUCCESS) {
            fail(std::string("vkCreateDescriptorPool: ") + vk::result_name(r));
            return VK_NULL_HANDLE;
        }
        descriptor_pools_.push_back(pool);
        sets_in_last_pool_ = 0;
    }
    const VkDescriptorSetLayout layout = ctx_.set_layout();
    auto alloc = vk::make<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    alloc.descriptorPool = descriptor_pools_.back();
    alloc.descriptorSetCount = 1;
    alloc.pSetLayouts = &layout;
    VkDescriptorSet set = VK_NULL_HANDLE;
    const VkResult r = vk_.vkAllocateDescriptorSets(device, &alloc, &set);
    if (r != VK_SUCCESS) {
        fail(std::string("vkAllocateDescriptorSets: ") + vk::result_name(r));
        return VK_NULL_HANDLE;
    }
    ++sets_in_last_pool_;
    VkDescriptorBufferInfo infos[vk::kBindings];
    VkWriteDescriptorSet writes[vk::kBindings];
    for (uint32_t i = 0; i < vk::kBindings; ++i) {
        const Bound &b = bound[i < count ? i : 0];
        infos[i] = VkDescriptorBufferInfo{b.access.buffer, b.access.offset, b.access.bytes};
        writes[i] = vk::make<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
        writes[i].dstSet = set;
        writes[i].dstBinding = i;
        writes[i].descriptorCount = 1;
        writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        writes[i].pBufferInfo = &infos[i];
    }
    vk_.vkUpdateDescriptorSets(device, vk::kBindings, writes, 0, nullptr);
    descriptor_sets_.emplace(key, set);
    return set;
}

void VulkanBackend::dispatch(const std::string &kernel, std::initializer_list<Bound> bound, const void *push, size_t push_bytes,
                             uint32_t gx, uint32_t gy, uint32_t gz) {
    if (failed() || gx == 0 || gy == 0 || gz == 0) return;
    const VkPipeline pipeline = ctx_.pipeline(kernel);
    if (!pipeline) {
        fail("the kernel " + kernel + " is unavailable", H2O_ERR_INTERNAL);
        return;
    }
    const VkDescriptorSet set = descriptor_set(bound.begin(), bound.size());
    if (!set || !begin()) return;
    std::array<Access, vk::kBindings> accesses;
    size_t count = 0;
    for (const Bound &b : bound) accesses[count++] = b.access;
    track(accesses.data(), count, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
    vk_.vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    vk_.vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, ctx_.pipeline_layout(), 0, 1, &set, 0, nullptr);
    vk_.vkCmdPushConstants(cmd_, ctx_.pipeline_layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, static_cast<uint32_t>(push_bytes), push);
    vk_.vkCmdDispatch(cmd_, gx, gy, gz);
    ++dispatches_;
}

void VulkanBackend::grid_1d(uint64_t count, uint32_t group, uint32_t *gx, uint32_t *gy) const {
    const uint64_t groups = (count + group - 1) / group;
    const uint64_t x = std::min<uint64_t>(groups, 65535);
    *gx = static_cast<uint32_t>(x);
    *gy = static_cast<uint32_t>(x == 0 ? 0 : (groups + x - 1) / x);
}

bool VulkanBackend::reserve_host(VkDeviceSize bytes, VkDeviceSize *offset) {
    if (bytes > kHostBufferBytes) {
        fail("a transfer larger than the staging buffer");
        return false;
    }
    VkDeviceSize at = round_up(host_used_, 16);
    if (at + bytes > kHostBufferBytes) {
        flush();  // the pieces handed out so far are in use until this command buffer completes
        at = 0;
    }
    if (!begin()) return false;
    host_used_ = at + bytes;
    *offset = at;
    return true;
}

void VulkanBackend::record_upload(VkBuffer dst, VkDeviceSize dst_offset, const void *src, VkDeviceSize bytes) {
    for (VkDeviceSize done = 0; done < bytes && !failed();) {
        const VkDeviceSize piece = std::min(bytes - done, kHostBufferBytes);
        VkDeviceSize at = 0;
        if (!reserve_host(piece, &at)) return;
        std::memcpy(host_ptr_ + at, static_cast<const uint8_t *>(src) + done, piece);
        const Access a{dst, dst_offset + done, piece, true};
        track(&a, 1, VK_PIPELINE_STAGE_TRANSFER_BIT);
        const VkBufferCopy copy{at, dst_offset + done, piece};
        vk_.vkCmdCopyBuffer(cmd_, host_.buffer, dst, 1, &copy);
        bytes_to_device_ += piece;
        done += piece;
    }
}

void VulkanBackend::record_fill(VkBuffer dst, VkDeviceSize offset, VkDeviceSize bytes, uint32_t value) {
    if (bytes == 0 || !begin()) return;
    const Access a{dst, offset, bytes, true};
    track(&a, 1, VK_PIPELINE_STAGE_TRANSFER_BIT);
    vk_.vkCmdFillBuffer(cmd_, dst, offset, bytes, value);
}

Status VulkanBackend::download_range(VkBuffer src, VkDeviceSize offset, void *dst, VkDeviceSize bytes) {
    for (VkDeviceSize done = 0; done < bytes;) {
        const VkDeviceSize piece = std::min(bytes - done, kHostBufferBytes);
        VkDeviceSize at = 0;
        if (failed() || !reserve_host(piece, &at)) return error_;
        const Access a{src, offset + done, piece, false};
        track(&a, 1, VK_PIPELINE_STAGE_TRANSFER_BIT);
        const VkBufferCopy copy{offset + done, at, piece};
        vk_.vkCmdCopyBuffer(cmd_, src, host_.buffer, 1, &copy);
        // Make the copy visible to host reads once the fence has signalled.
        auto barrier = vk::make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
        barrier.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
        barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
        vk_.vkCmdPipelineBarrier(cmd_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier, 0, nullptr, 0, nullptr);
        flush();
        H2O_TRY(error_);
        if (!device_->host_coherent()) {
            auto range = vk::make<VkMappedMemoryRange>(VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE);
            range.memory = host_.memory;
            range.offset = 0;
            range.size = VK_WHOLE_SIZE;
            vk_.vkInvalidateMappedMemoryRanges(ctx_.device(), 1, &range);
        }
        std::memcpy(static_cast<uint8_t *>(dst) + done, host_ptr_ + at, piece);
        bytes_to_host_ += piece;
        done += piece;
    }
    return error_;
}

Status VulkanBackend::upload(const Tensor &dst, const void *src, size_t bytes) {
    if (failed() || bytes == 0) return error_;
    record_upload(block(dst).buffer, dst.offset, src, bytes);
    return error_;
}

Status VulkanBackend::download(const Tensor &src, void *dst, size_t bytes) {
    if (bytes == 0) return error_;
    return download_range(block(src).buffer, src.offset, dst, bytes);
}

// ---- operations ---------------------------------------------------------------------------------

Status VulkanBackend::get_rows(const Tensor &out, const Tensor &table, const Tensor &ids, int n) {
    if (failed() || n <= 0) return error_;
    const VkDeviceSize row_out = 4 * static_cast<VkDeviceSize>(weight_row_words(table.type, table.cols));
    const int64_t window = rows_per_binding(table, row_out);
    // A table larger than one binding is looked up window by window; each id is in one of them.
    for (int64_t r0 = 0; r0 < table.rows; r0 += window) {
        const int64_t count = std::min(window, table.rows - r0);
        const Bound t = bind_rows(table, r0, count);
        const Bound i = bind(ids, false);
        const Bound o = bind(out, true);
        const GetRowsPush push{t.word,
                               i.word,
                               o.word,
                               static_cast<uint32_t>(table.cols),
                               static_cast<uint32_t>(n),
                               static_cast<uint32_t>(r0),
                               static_cast<uint32_t>(count)};
        // One invocation per element, or per 32-element run of a K-quant row (get_rows.comp).
        const int64_t per_invocation = is_k_quant(table.type) ? 32 : 1;
        uint32_t gx, gy;
        grid_1d(static_cast<uint64_t>(n) * (table.cols / per_invocation), kElementwiseGroup, &gx, &gy);
        dispatch(std::string("get_rows_") + type_suffix(table.type), {t, i, o}, &push, sizeof push, gx, gy);
    }
    return error_;
}

Status VulkanBackend::rms_norm(const Tensor &out, const Tensor &in, const Tensor &weight, int n, float eps) {
    if (failed() || n <= 0) return error_;
    const Bound w = bind(weight, false);
    // One workgroup a row, at most 65535 rows a dispatch (the per-head norms of a batch have
    // tokens x heads rows).
    constexpr int kRowsPerDispatch = 65535;
    for (int r0 = 0; r0 < n; r0 += kRowsPerDispatch) {
        const int count = std::min(kRowsPerDispatch, n - r0);
        const Bound i = bind(in.slice_rows(r0, count), false);
        const Bound o = bind(out.slice_rows(r0, count), true);
        const RmsNormPush push{i.word, w.word, o.word, static_cast<uint32_t>(in.cols), eps};
        dispatch(reduction_kernel("rms_norm"), {i, w, o}, &push, sizeof push, static_cast<uint32_t>(count));
    }
    return error_;
}

Status VulkanBackend::matmul(const Tensor &out, const Tensor &weight, const Tensor &in, int n) {
    if (failed() || n <= 0) return error_;
    const VkDeviceSize row_out = 4 * static_cast<VkDeviceSize>(weight_row_words(weight.type, weight.cols));
    const bool few_tokens = n < kMatvecMaxTokens;
    int64_t window = rows_per_binding(weight, row_out);
    if (few_tokens) window = std::min<int64_t>(window, kMatvecMaxRows);  // one workgroup per row
    const Bound x = bind(in, false);
    const Bound y = bind(out, true);
    for (int64_t r0 = 0; r0 < weight.rows; r0 += window) {
        const int64_t count = std::min(window, weight.rows - r0);
        const Bound w = bind_rows(weight, r0, count);
        const MatmulPush push{w.word,
                              x.word,
                              y.word,
                              static_cast<uint32_t>(weight.cols),
                              static_cast<uint32_t>(count),
                              static_cast<uint32_t>(out.cols),
                              static_cast<uint32_t>(r0),
                              static_cast<uint32_t>(n)};
        const std::string type = type_suffix(weight.type);
        if (few_tokens) {
            dispatch(reduction_kernel("matvec_" + type), {w, x, y}, &push, sizeof push, static_cast<uint32_t>(count),
                     static_cast<uint32_t>(n));
        } else {
            dispatch("matmul_" + type, {w, x, y}, &push, sizeof push,
                     static_cast<uint32_t>((count + kMatmulTileRows - 1) / kMatmulTileRows),
                     static_cast<uint32_t>((n + kMatmulTileTokens - 1) / kMatmulTileTokens));
        }
    }
    return error_;
}

void VulkanBackend::ensure_rope_table(int slot, const RotarySpec &rope) {
    if (rope_spec_[slot] == rope) return;
    const std::vector<uint64_t> table = rope_turn_fractions(rope);
    record_upload(block(rope_table_).buffer, rope_table_.offset + slot * kRopeTablePairs * sizeof(uint64_t), table.data(),
                  table.size() * sizeof(uint64_t));
    rope_spec_[slot] = rope;
}

int VulkanBackend::rope_slot(const RotarySpec &rope) {
    int slot = rope_spec_[last_forward_slot_] == rope ? last_forward_slot_ : 2 - last_forward_slot_;
    ensure_rope_table(slot, rope);
    last_forward_slot_ = slot;
    return slot;
}

Status VulkanBackend::rope(const Tensor &q, const Tensor &k, const Tensor &positions, int n, const ModelShape &shape, bool per_kv_head) {
    const int pairs = shape.rope.pairs();
    if (failed() || n <= 0 || pairs <= 0) return error_;
    if (pairs > static_cast<int>(kRopeTablePairs)) {
        fail("rotary dimensions " + std::to_string(shape.rope.dims) + " are more than supported (" + std::to_string(2 * kRopeTablePairs) +
                 ")",
             H2O_ERR_INTERNAL);
        return error_;
    }
    const int slot = rope_slot(shape.rope);
    const Bound bq = bind(q, true);
    const Bound bk = bind(k, true);
    const Bound bp = bind(positions, false);
    const Bound bt = bind(rope_table_, false);
    const RopePush push{bq.word,
                        bk.word,
                        bp.word,
                        bt.word / 2 + static_cast<uint32_t>(slot) * kRopeTablePairs,
                        static_cast<uint32_t>(shape.n_head),
                        static_cast<uint32_t>(shape.n_head_kv),
                        static_cast<uint32_t>(shape.head_dim),
                        static_cast<uint32_t>(pairs),
                        static_cast<uint32_t>(n),
                        static_cast<uint32_t>(q.cols),
                        static_cast<uint32_t>(k.cols),
                        per_kv_head ? static_cast<uint32_t>(n) : 0u,
                        static_cast<uint32_t>(shape.rope.pairing),
                        shape.rope.magnitude};
    uint32_t gx, gy;
    grid_1d(static_cast<uint64_t>(n) * (shape.n_head + shape.n_head_kv) * pairs, kRopeGroup, &gx, &gy);
    dispatch("rope", {bq, bk, bp, bt}, &push, sizeof push, gx, gy);
    return error_;
}

Status VulkanBackend::swiglu(const Tensor &gate, const Tensor &up, int n) { return elementwise("swiglu", gate, up, n); }

Status VulkanBackend::geglu(const Tensor &gate, const Tensor &up, int n) { return elementwise("geglu", gate, up, n); }

// The one-operand operations bind x as both operands (b unread).
Status VulkanBackend::scale(const Tensor &x, float factor, int n) { return elementwise("scale", x, x, n, factor); }

Status VulkanBackend::softcap(const Tensor &x, float cap, int n) { return elementwise("softcap", x, x, n, cap); }

Status VulkanBackend::add(const Tensor &acc, const Tensor &x, int n) { return elementwise("add", acc, x, n); }

Status VulkanBackend::add_bias(const Tensor &acc, const Tensor &bias, int n) { return elementwise("add_bias", acc, bias, n); }

Status VulkanBackend::argmax(const Tensor &out, const Tensor &in, int n) {
    if (failed() || n <= 0) return error_;
    const Bound i = bind(in, false);
    const Bound o = bind(out, true);
    const ArgmaxPush push{i.word, o.word, static_cast<uint32_t>(in.cols)};
    dispatch(reduction_kernel("argmax"), {i, o}, &push, sizeof push, static_cast<uint32_t>(n));
    return error_;
}

// out[t] = op(out[t], in[t]) over the first n rows: the shaders of elementwise.comp.
Status VulkanBackend::elementwise(const char *pipeline, const Tensor &out, const Tensor &in, int n, float value) {
    if (failed() || n <= 0) return error_;
    const uint64_t count = static_cast<uint64_t>(out.cols) * n;
    const Bound a = bind(out, true);
    const Bound b = bind(in, false);
    const ElementwisePush push{a.word, b.word, static_cast<uint32_t>(count), static_cast<uint32_t>(in.cols), value};
    uint32_t gx, gy;
    grid_1d(count, kElementwiseGroup, &gx, &gy);
    dispatch(pipeline, {a, b}, &push, sizeof push, gx, gy);
    return error_;
}

// ---- KV cache -----------------------------------------------------------------------------------

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
    // Rebalancing's work buffer (kv_rebalance.comp), when the heads' budgets move: sorted over the
    // next power of two of the largest pool, rows moved in chunks of up to 2048 slots.
    uint32_t sort_size = 1, area_moves = 0, move_groups = 0;
    KvRebalanceWork work{};
    VkDeviceSize work_bytes = 0;
    if (config.head_share > 0.0f) {
        while (sort_size < config.max_pool_slots()) sort_size <<= 1;
        int64_t chunk = 2048;
        // Test hook: fewer moves per chunk, so that small caches take the order of large pools'.
        if (const char *moves = std::getenv("H2O_VULKAN_REBALANCE_CHUNK"); moves && *moves)
            chunk = std::clamp<int64_t>(std::strtoll(moves, nullptr, 10), 1, chunk);
        area_moves = static_cast<uint32_t>(std::min(config.max_pool_slots(), chunk));
        const uint32_t slot_words =
            kv_row_words(key_format, config.head_dim) + kv_row_words(value_format, config.head_dim) + KV_TOKEN_WORDS;
        work = kv_rebalance_work(static_cast<uint32_t>(config.n_layer), n_cells, sort_size, area_moves * slot_words);
        work_bytes = VkDeviceSize{4} * work.end;
        // The moves' passes: a workgroup of 64 per 64 words of a chunk, at most 64 (they loop).
        move_groups = static_cast<uint32_t>(std::min<uint64_t>(64, (uint64_t{area_moves} * slot_words + 63) / 64));
    }
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
    if (config.rolling) {
        // Rolled keys rotate back by the host's own cosines and sines (kv_rotate_back_table), so
        // that they keep the CPU's bits: the global layers' table, then the local layers'.
        std::vector<float> table;
        try {
            table = kv_rotate_back_table(config.rope, static_cast<int>(max_slots));
            if (!config.layer_window.empty()) {
                const std::vector<float> local = kv_rotate_back_table(config.local_rope, static_cast<int>(max_slots));
                table.insert(table.end(), local.begin(), local.end());
            }
        } catch (const std::bad_alloc &) {
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's rotation table");
        }
        local_rollback_off_ = config.layer_window.empty() ? 0 : static_cast<uint32_t>(table.size() / 4);  // in (cos, sin) pairs
        H2O_TRY(allocate(sizeof(float) * table.size(), &rollback_table_));
        record_upload(block(rollback_table_).buffer, rollback_table_.offset, table.data(), sizeof(float) * table.size());
    }
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
    rebalance_layout_ = work;
    rebalance_sort_size_ = sort_size;
    rebalance_area_moves_ = area_moves;
    rebalance_move_groups_ = move_groups;
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

Status VulkanBackend::attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer,
                                const AttentionBatch &batch, const ModelShape &shape) {
    const int n = batch.n_tokens;
    if (failed() || n <= 0) return error_;
    if (!has_kv_ || n > max_batch_ || shape.head_dim != kv_.head_dim || shape.n_head_kv != kv_.n_head_kv ||
        shape.n_head % shape.n_head_kv != 0) {
        fail("attention called without a matching KV cache or with more than max_batch tokens", H2O_ERR_INTERNAL);
        return error_;
    }
    // n_slots: the most slots a cell of this layer may hold, the stride of the attention scratch.
    const auto n_kv = static_cast<uint32_t>(kv_.n_head_kv), n_slots = static_cast<uint32_t>(kv_.max_cell_slots(layer));
    // first_slot: the first slot of the layer's pool, whose rows its keys and values hold.
    const int pool = kv_.pool_first_layer(layer);
    const auto first_slot = static_cast<uint32_t>(kv_.first_slot_of(pool)), total_slots = static_cast<uint32_t>(kv_.total_slots());
    const auto hd = static_cast<uint32_t>(kv_.head_dim);
    const auto n_cells = static_cast<uint32_t>(kv_.n_layer) * n_kv;
    const uint32_t group = static_cast<uint32_t>(shape.n_head) / n_kv;
    const KvPolicyConfig policy = kv_.policy_in(layer);
    const auto window = static_cast<uint32_t>(shape.is_local(layer) ? shape.sliding_window : 0);

    const Bound bkeys = bind(keys_[pool], true);
    const Bound bvalues = bind(values_[pool], true);
    const Bound bmeta = bind(meta_, true);

    // 0. Expected Attention: the batch's queries into the cells' statistics, then every held
    // slot's score (kv_expect.comp), which the claim below ranks by.
    if (policy.policy == KvPolicy::ExpectedAttention) {
        const Bound bq = bind(q, false);
        const Bound bp = bind(batch.positions, false);
        const Bound bt = bind(rope_table_, false);
        KvExpectPush push{};
        push.q_off = bq.word;
        push.q_stride = static_cast<uint32_t>(q.cols);
        push.pos_off = bp.word;
        push.keys_off = bkeys.word;
        push.values_off = bvalues.word;
        push.table_off = bt.word / 2 + kRopeTablePairs;  // slot 1 (create_kv), in uvec2 units
        push.meta_off = bmeta.word;
        push.n_cells = n_cells;
        push.total_slots = total_slots;
        push.n_kv = n_kv;
        push.max_batch = static_cast<uint32_t>(max_batch_);
        push.first_slot = first_slot;
        push.query_off = bmeta.word + query_first_;
        push.layer = static_cast<uint32_t>(layer);
        push.head_dim = hd;
        push.group = static_cast<uint32_t>(kv_.query_group);
        push.n = static_cast<uint32_t>(n);
        push.pairs = static_cast<uint32_t>(kv_.rope.pairs());
        push.flags = (batch.positions_per_kv_head ? kKvClaimPositionsPerKvHead : 0) |
                     (kv_.rope.pairing == RotaryPairing::Halves ? kKvClaimHalvesPairing : 0);
        push.formats = static_cast<uint32_t>(kv_key_format(kv_.type)) | static_cast<uint32_t>(kv_value_format(kv_.type)) << 8;
        push.scale = kv_.attention_scale;
        dispatch("kv_expect", {bq, bp, bkeys, bvalues, bmeta, bt}, &push, sizeof push, n_kv);
    }

    // 1. Make room, take slots, store the batch's keys and values.
    {
        const Bound bk = bind(k, false);
        const Bound bv = bind(v, false);
        const Bound bp = bind(batch.positions, false);
        // (Without rolling nothing rolls back: any buffer fills the table's binding.)
        const Bound bt = bind(kv_.rolling ? rollback_table_ : rope_table_, false);
        KvClaimPush push{};
        split64(batch.first_index, push.first_index);
        // The recent window counts the incoming tokens (KvCache::make_room).
        split64(kv_recent_from(policy, batch.first_index, n), push.recent_from);
        split64(kv_stale_before(policy, batch.first_index, n), push.stale_before);
        push.k_off = bk.word;
        push.v_off = bv.word;
        push.pos_off = bp.word;
        push.k_stride = static_cast<uint32_t>(k.cols);
        push.v_stride = static_cast<uint32_t>(v.cols);
        push.keys_off = bkeys.word;
        push.values_off = bvalues.word;
        push.table_off = bt.word / 2 + (kv_.is_window_layer(layer) ? local_rollback_off_ : 0);  // in (cos, sin) pairs
        push.meta_off = bmeta.word;
        push.n_cells = n_cells;
        push.n_slots = n_slots;
        push.first_slot = first_slot;
        push.total_slots = total_slots;
        push.n_kv = n_kv;
        push.max_batch = static_cast<uint32_t>(max_batch_);
        push.layer = static_cast<uint32_t>(layer);
        push.head_dim = hd;
        push.n = static_cast<uint32_t>(n);
        push.tag = batch.tag;
        push.policy = static_cast<uint32_t>(policy.policy);
        push.sinks = static_cast<uint32_t>(std::max(0, policy.sinks));
        push.pairs = static_cast<uint32_t>(kv_.rope.pairs());
        push.flags = (kv_.rolling ? kKvClaimRolling : 0) | (kv_ranks_by_proxy(policy, n) ? kKvClaimByProxy : 0) |
                     (batch.positions_per_kv_head ? kKvClaimPositionsPerKvHead : 0) |
                     (kv_.rope.pairing == RotaryPairing::Halves ? kKvClaimHalvesPairing : 0);
        push.formats = static_cast<uint32_t>(kv_key_format(kv_.type)) | static_cast<uint32_t>(kv_value_format(kv_.type)) << 8;
        push.prompt_share = policy.prompt_random_share;
        push.prompt_seed = kv_prompt_seed(policy);
        // The random policy draws from one generator in (layer, kv head) order: one workgroup.
        const uint32_t groups = policy.policy == KvPolicy::Random ? 1 : n_kv;
        dispatch("kv_claim", {bk, bv, bp, bkeys, bvalues, bmeta, bt}, &push, sizeof push, groups);
    }

    // 2. Attention and statistics, a chunk of queries at a time (the scratch holds one chunk).
    const Bound bq = bind(q, false);
    const Bound bo = bind(out, true);
    const Bound bscratch = bind(scratch_, true);
    for (uint32_t t0 = 0; t0 < static_cast<uint32_t>(n); t0 += chunk_capacity_) {
        const uint32_t chunk = std::min<uint32_t>(chunk_capacity_, static_cast<uint32_t>(n) - t0);
        AttentionPush push{};
        split64(batch.first_index + t0, push.first_index);
        push.q_off = bq.word + t0 * static_cast<uint32_t>(q.cols);
        push.q_stride = static_cast<uint32_t>(q.cols);
        push.out_off = bo.word + t0 * static_cast<uint32_t>(out.cols);
        push.out_stride = static_cast<uint32_t>(out.cols);
        push.keys_off = bkeys.word;
        push.values_off = bvalues.word;
        push.meta_off = bmeta.word;
        push.scratch_off = bscratch.word;
        push.n_cells = n_cells;
        push.n_slots = n_slots;
        push.first_slot = first_slot;
        push.total_slots = total_slots;
        push.n_kv = n_kv;
        push.max_batch = static_cast<uint32_t>(max_batch_);
        push.layer = static_cast<uint32_t>(layer);
        push.head_dim = hd;
        push.group = group;
        push.chunk_capacity = chunk_capacity_;
        push.scale = shape.attention_scale != 0.0f ? shape.attention_scale : 1.0f / std::sqrt(static_cast<float>(hd));
        push.window = window;
        push.softcap = shape.attention_softcap;
        push.key_format = static_cast<uint32_t>(kv_key_format(kv_.type));
        push.value_format = static_cast<uint32_t>(kv_value_format(kv_.type));
        Bound read_keys = bkeys, read_values = bvalues, read_meta = bmeta;
        read_keys.access.write = read_values.access.write = read_meta.access.write = false;
        dispatch(reduction_kernel("attention"), {bq, bo, read_keys, read_values, read_meta, bscratch}, &push, sizeof push, n_kv, chunk);

        // Policies that never read the statistics (full, window, sinks, random) skip them, as
        // the CPU backend does; claimed slots still start from zero.
        if (!kv_policy_uses_statistics(policy.policy)) continue;
        StatsPush stats{};
        split64(batch.first_index + t0, stats.first_index);
        stats.meta_off = bmeta.word;
        stats.n_cells = n_cells;
        stats.n_slots = n_slots;
        stats.first_slot = first_slot;
        stats.total_slots = total_slots;
        stats.n_kv = n_kv;
        stats.max_batch = static_cast<uint32_t>(max_batch_);
        stats.layer = static_cast<uint32_t>(layer);
        stats.scratch_off = bscratch.word;
        stats.chunk_capacity = chunk_capacity_;
        stats.chunk_tokens = chunk;
        stats.t0 = t0;
        stats.n = static_cast<uint32_t>(n);
        stats.group = group;
        stats.decay = policy.persistence_decay;
        stats.proxy = static_cast<uint32_t>(kv_proxy_queries(policy));
        stats.window = window;
        Bound read_scratch = bscratch;
        read_scratch.access.write = false;
        dispatch("attention_stats", {bmeta, read_scratch}, &stats, sizeof stats, (n_slots + kStatsGroup - 1) / kStatsGroup, n_kv);
    }
    return error_;
}

VulkanCounters VulkanBackend::counters() const {
    VulkanCounters c;
    c.device_name = ctx_.properties().deviceName;
    c.subgroups = subgroups_;
    c.validation = ctx_.validation();
    c.bytes_to_device = bytes_to_device_;
    c.bytes_to_host = bytes_to_host_;
    c.submissions = submissions_;
    c.dispatches = dispatches_;
    c.barriers = barriers_;
    c.device_memory_bytes = device_bytes_;
    c.weight_bytes_to_device = weight_bytes_to_device_;
    c.shared_weight_bytes = shared_weight_bytes_;
    c.device_total_bytes = device_->device_bytes();
    c.host_memory_bytes = kHostBufferBytes;
    c.validation_messages = ctx_.validation_messages();
    return c;
}

}  // namespace

std::span<const TensorType> vulkan_weight_types() { return kVulkanWeightTypes; }

Status vulkan_runs_weight_type(TensorType type) {
    if (std::ranges::find(kVulkanWeightTypes, type) == std::end(kVulkanWeightTypes)) {
        return make_error(H2O_ERR_UNSUPPORTED, std::string("the Vulkan backend does not support ") + type_name(type) + " weights");
    }
    return Status::Ok();
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

Status make_vulkan_backend(int device_index, int max_batch, std::unique_ptr<Backend> *out) {
    if (max_batch <= 0) return make_error(H2O_ERR_INVALID_ARGUMENT, "max_batch must be positive");
    std::shared_ptr<vk::SharedDevice> device;
    H2O_TRY(vk::SharedDevice::get(device_index, &device));
    auto backend = std::make_unique<VulkanBackend>(std::move(device), max_batch);
    H2O_TRY(backend->init());
    *out = std::move(backend);
    return Status::Ok();
}

bool vulkan_fail_next_submission(Backend &backend) {
    auto *vulkan = dynamic_cast<VulkanBackend *>(&backend);
    if (vulkan) vulkan->fail_next_submission();
    return vulkan != nullptr;
}

bool vulkan_counters(const Backend &backend, VulkanCounters *out) {
    const auto *vulkan = dynamic_cast<const VulkanBackend *>(&backend);
    if (!vulkan) return false;
    *out = vulkan->counters();
    return true;
}

}  // namespace h2o
