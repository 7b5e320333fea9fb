// The Vulkan backend's weights (vk_backend.h): their device layout, adoption and upload, and the
// operations that read them: get_rows and matmul.
#include "vulkan/vk_backend.h"

namespace h2o {

namespace {

constexpr int kMatvecMaxTokens = 8;          // fewer tokens: matvec.comp; more: the tiled matmul.comp
constexpr uint32_t kMatvecMaxRows = 65535;   // workgroup count limit of one dimension
constexpr uint32_t kMatvecRowsPerGroup = 8;  // ROWS in matvec.comp (matvec_rows_*; else one row per workgroup)
constexpr uint32_t kMatmulTileRows = 64, kMatmulTileTokens = 32;

// The weight types the kernels run: vulkan.cmake builds get_rows, matmul and matvec for each, and
// weight_row_words / repack_row / type_suffix below lay them out.
constexpr TensorType kVulkanWeightTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::Q8_0, TensorType::Q4_0,
                                             TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

bool is_k_quant(TensorType type) { return type == TensorType::Q4_K || type == TensorType::Q5_K || type == TensorType::Q6_K; }

// Words of one K-quant super-block on the device: the file's block padded to whole words.
uint32_t k_block_words(TensorType type) { return (traits(type).block_bytes + 3) / 4; }

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

struct GetRowsPush {
    uint32_t table_off, ids_off, out_off, cols, n, row_first, row_count;
};
struct MatmulPush {
    uint32_t w_off, x_off, y_off, cols, rows, y_stride, row_first, n;
};

}  // namespace

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

Status VulkanBackend::matmul(const Tensor &out, const Tensor &weight, const Tensor &in, int n) {
    if (failed() || n <= 0) return error_;
    const VkDeviceSize row_out = 4 * static_cast<VkDeviceSize>(weight_row_words(weight.type, weight.cols));
    const bool few_tokens = n < kMatvecMaxTokens;
    int64_t window = rows_per_binding(weight, row_out);
    if (few_tokens) window = std::min<int64_t>(window, kMatvecMaxRows);  // at most one workgroup per row
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
            const int64_t rows_per_group = subgroup_rows_ ? kMatvecRowsPerGroup : 1;
            dispatch(subgroup_rows_ ? "matvec_rows_" + type : reduction_kernel("matvec_" + type), {w, x, y}, &push, sizeof push,
                     static_cast<uint32_t>((count + rows_per_group - 1) / rows_per_group), static_cast<uint32_t>(n));
        } else {
            dispatch("matmul_" + type, {w, x, y}, &push, sizeof push,
                     static_cast<uint32_t>((count + kMatmulTileRows - 1) / kMatmulTileRows),
                     static_cast<uint32_t>((n + kMatmulTileTokens - 1) / kMatmulTileTokens));
        }
    }
    return error_;
}

std::span<const TensorType> vulkan_weight_types() { return kVulkanWeightTypes; }

Status vulkan_runs_weight_type(TensorType type) {
    if (std::ranges::find(kVulkanWeightTypes, type) == std::end(kVulkanWeightTypes)) {
        return make_error(H2O_ERR_UNSUPPORTED, std::string("the Vulkan backend does not support ") + type_name(type) + " weights");
    }
    return Status::Ok();
}

}  // namespace h2o
