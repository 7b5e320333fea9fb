// The Vulkan backend's device context (vk_backend.h): set-up, memory, recording and submission.
#include "vulkan/vk_backend.h"

namespace h2o {

namespace {

constexpr VkDeviceSize kMinBlockBytes = VkDeviceSize{4} << 20;  // first device block
constexpr VkDeviceSize kMaxPoolBlockBytes = VkDeviceSize{256} << 20;

uint64_t handle_bits(VkBuffer b) {
    uint64_t bits = 0;
    std::memcpy(&bits, &b, sizeof b);
    return bits;
}

}  // namespace

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
    // Whole matvec rows per subgroup (matvec.comp's SUBGROUP_ROWS): measured and tested on CPU
    // devices only, so GPUs keep a workgroup per row unless H2O_VULKAN_MATVEC_ROWS=1 asks (for
    // the parity suite on a GPU; =0 turns it off everywhere).
    const bool cpu_device = ctx_.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    subgroup_rows_ = subgroups_ && !vk::env_is("H2O_VULKAN_MATVEC_ROWS", "0") && (cpu_device || vk::env_is("H2O_VULKAN_MATVEC_ROWS", "1"));

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

}  // namespace h2o
