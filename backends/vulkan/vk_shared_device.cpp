#include "vulkan/vk_shared_device.h"

#include <iterator>
#include <string>
#include <utility>

namespace h2o::vk {

namespace {

using DeviceKey = std::pair<int, bool>;  // device index, validation layer requested

struct Registry {
    std::mutex mutex;
    std::map<DeviceKey, std::weak_ptr<SharedDevice>> devices;
};

Registry &registry() {
    static Registry r;
    return r;
}

// The index -1 stands for. Finding the best device creates a Vulkan instance, which is slow; the
// devices of a machine do not change while a process runs, so it is found once.
Status resolve_index(int requested, int *out) {
    if (requested >= 0) {
        *out = requested;
        return Status::Ok();
    }
    static const std::pair<Status, int> best = [] {
        int index = 0;
        const Status st = best_device_index(&index);
        return std::make_pair(st, index);
    }();
    *out = best.second;
    return best.first;
}

constexpr VkBufferUsageFlags kUsage =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

}  // namespace

SharedWeight::~SharedWeight() { device_->destroy_buffer(buffer_); }

Status SharedDevice::get(int device_index, std::shared_ptr<SharedDevice> *out) {
    int index = 0;
    H2O_TRY(resolve_index(device_index, &index));
    const DeviceKey key{index, env_is("H2O_VULKAN_VALIDATION", "1")};
    Registry &r = registry();
    // Held while creating, so that two backends made at once create one device between them.
    std::lock_guard<std::mutex> lock(r.mutex);
    if (auto found = r.devices.find(key); found != r.devices.end()) {
        if (std::shared_ptr<SharedDevice> existing = found->second.lock(); existing && !existing->lost()) {
            *out = std::move(existing);
            return Status::Ok();
        }
    }
    for (auto it = r.devices.begin(); it != r.devices.end();) it = it->second.expired() ? r.devices.erase(it) : std::next(it);
    std::shared_ptr<SharedDevice> device(new SharedDevice());
    H2O_TRY(Context::create(index, key.second, &device->context_));
    H2O_TRY(device->init());
    r.devices[key] = device;  // in place of a lost one
    *out = std::move(device);
    return Status::Ok();
}

Status SharedDevice::init() {
    // Memory types: device-local for tensors and weights; host-visible and coherent (cached if
    // possible) for staging. Every buffer has the same usage, so a probe's requirements say which
    // types any of them may use.
    const DeviceFunctions &vk = context_->vk();
    auto probe = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
    probe.size = 4096;
    probe.usage = kUsage;
    VkBuffer probe_buffer = VK_NULL_HANDLE;
    const VkResult r = vk.vkCreateBuffer(context_->device(), &probe, nullptr, &probe_buffer);
    if (r != VK_SUCCESS) return make_error(H2O_ERR_OUT_OF_MEMORY, std::string("vkCreateBuffer: ") + result_name(r));
    VkMemoryRequirements req;
    vk.vkGetBufferMemoryRequirements(context_->device(), probe_buffer, &req);
    vk.vkDestroyBuffer(context_->device(), probe_buffer, nullptr);

    const VkPhysicalDeviceMemoryProperties &mem = context_->memory_properties();
    int device_type = -1;
    for (uint32_t i = 0; i < mem.memoryTypeCount && device_type < 0; ++i) {
        if ((req.memoryTypeBits & (1u << i)) && (mem.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) {
            device_type = static_cast<int>(i);
        }
    }
    for (uint32_t i = 0; i < mem.memoryTypeCount && device_type < 0; ++i) {
        if (req.memoryTypeBits & (1u << i)) device_type = static_cast<int>(i);
    }
    if (device_type < 0) return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "Vulkan: no memory type can hold storage buffers");
    device_memory_type_ = static_cast<uint32_t>(device_type);
    device_heap_ = mem.memoryTypes[device_memory_type_].heapIndex;

    int best_score = -1;
    for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
        const VkMemoryPropertyFlags f = mem.memoryTypes[i].propertyFlags;
        if (!(req.memoryTypeBits & (1u << i)) || !(f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) continue;
        const int score = ((f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) ? 2 : 0) + ((f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) ? 1 : 0);
        if (score > best_score) {
            host_memory_type_ = i;
            best_score = score;
        }
    }
    has_host_memory_ = best_score >= 0;
    host_coherent_ = has_host_memory_ && (mem.memoryTypes[host_memory_type_].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    return Status::Ok();
}

Status SharedDevice::create_buffer(VkDeviceSize bytes, bool host_visible, Buffer *out) {
    const DeviceFunctions &vk = context_->vk();
    VkDevice device = context_->device();
    const std::string device_name = context_->properties().deviceName;
    if (host_visible && !has_host_memory_) {
        return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "Vulkan device '" + device_name + "' has no host-visible memory");
    }
    Buffer b;
    auto info = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
    info.size = bytes;
    info.usage = kUsage;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VkResult r = vk.vkCreateBuffer(device, &info, nullptr, &b.buffer);
    if (r != VK_SUCCESS) {
        return make_error(H2O_ERR_OUT_OF_MEMORY, "Vulkan device '" + device_name + "': cannot create a buffer of " + std::to_string(bytes) +
                                                     " bytes (" + result_name(r) + ")");
    }
    VkMemoryRequirements req;
    vk.vkGetBufferMemoryRequirements(device, b.buffer, &req);
    b.size = req.size;
    b.device_local = !host_visible;
    // Counted before allocating, so that backends allocating at once on several threads do not
    // pass the heap's size together.
    const uint64_t before = b.device_local ? device_bytes_.fetch_add(b.size) : 0;
    // Stay within the heap: some drivers accept allocations past it and fail later.
    const VkDeviceSize heap = context_->memory_properties().memoryHeaps[device_heap_].size;
    if (b.device_local && before + b.size > heap) {
        destroy_buffer(b);
        return make_error(H2O_ERR_OUT_OF_MEMORY, "Vulkan device '" + device_name + "': not enough device memory for " +
                                                     std::to_string(req.size >> 20) + " MiB more (" + std::to_string(before >> 20) +
                                                     " MiB allocated, heap of " + std::to_string(heap >> 20) + " MiB)");
    }
    auto alloc = make<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
    alloc.allocationSize = req.size;
    alloc.memoryTypeIndex = host_visible ? host_memory_type_ : device_memory_type_;
    r = vk.vkAllocateMemory(device, &alloc, nullptr, &b.memory);
    if (r != VK_SUCCESS) b.memory = VK_NULL_HANDLE;
    if (r == VK_SUCCESS) r = vk.vkBindBufferMemory(device, b.buffer, b.memory, 0);
    if (r != VK_SUCCESS) {
        destroy_buffer(b);
        return make_error(H2O_ERR_OUT_OF_MEMORY, "Vulkan device '" + device_name + "': cannot allocate " + std::to_string(req.size >> 20) +
                                                     " MiB of " + (host_visible ? "host-visible" : "device") + " memory (" +
                                                     result_name(r) + "; " + std::to_string(before >> 20) + " MiB already allocated)");
    }
    *out = b;
    return Status::Ok();
}

void SharedDevice::destroy_buffer(const Buffer &b) {
    const DeviceFunctions &vk = context_->vk();
    if (b.buffer) vk.vkDestroyBuffer(context_->device(), b.buffer, nullptr);
    if (b.memory) vk.vkFreeMemory(context_->device(), b.memory, nullptr);
    if (b.device_local) device_bytes_.fetch_sub(b.size);
}

VkResult SharedDevice::submit(VkCommandBuffer cmd, VkFence fence) {
    auto submit = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cmd;
    std::lock_guard<std::mutex> lock(queue_mutex_);
    return context_->vk().vkQueueSubmit(context_->queue(), 1, &submit, fence);
}

Status SharedDevice::shared_weight(const WeightKey &key, VkDeviceSize bytes, const UploadWeight &upload,
                                   std::shared_ptr<const SharedWeight> *out) {
    // Held through the upload, so that two backends adopting one weight at once upload it once,
    // and none reads a weight before its upload has completed.
    std::lock_guard<std::mutex> lock(weights_mutex_);
    if (auto found = weights_.find(key); found != weights_.end()) {
        if (std::shared_ptr<const SharedWeight> existing = found->second.lock()) {
            *out = std::move(existing);
            return Status::Ok();
        }
    }
    // Forget the weights no backend holds any more, so that a process loading many models over
    // its life does not collect their keys.
    for (auto it = weights_.begin(); it != weights_.end();) it = it->second.expired() ? weights_.erase(it) : std::next(it);
    Buffer buffer;
    H2O_TRY(create_buffer(bytes, false, &buffer));
    auto weight = std::make_shared<const SharedWeight>(shared_from_this(), buffer);
    H2O_TRY(upload(weight->buffer()));
    weights_[key] = weight;
    *out = std::move(weight);
    return Status::Ok();
}

}  // namespace h2o::vk
