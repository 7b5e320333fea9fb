// The Vulkan device as every backend on it shares it: the vk::Context (instance, device, queue,
// pipelines), the device's memory, and the weights uploaded to it.
//
// Ownership. Every backend on a device holds its SharedDevice by shared_ptr; a process-wide
// registry keeps weak pointers, so the second backend on a device gets the first one's and the
// Vulkan device is created once. It is destroyed with the last backend (or weight) holding it.
// A backend owns only what one session needs alone: its KV cache, activations and scratch, its
// staging buffer, command pool and buffer, fence and descriptor pools.
//
// Weights. A weight matrix adopted by several backends (the sessions of one model) is uploaded
// once: each SharedWeight is held by shared_ptr by every backend that adopted it and found
// through the device's map of weak pointers, keyed by the weight's bytes in the mapped model file
// (which stay valid and unchanged while any session of the model lives, see
// Backend::adopt_weight), type and shape. It is freed with the last backend holding it. Two loads
// of one file map it at two addresses, so sessions of different models share the device but never
// weights.
//
// Threads. Sessions of one model may run on different threads at once, each on its own backend.
// What the backends share is guarded here: vkQueueSubmit takes queue_mutex_ (Vulkan requires the
// queue to be externally synchronized), Context::pipeline locks its own map, the memory counter
// is atomic, and weights_mutex_ covers the weight map and the upload of a new weight, so that two
// backends adopting one weight at once upload it once between them. Nothing waits for the whole
// device while backends live (each waits for its own fence); the Context's vkDeviceWaitIdle runs
// when the last holder lets go, when no backend is left to use the queue.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "status.h"
#include "tensor_types.h"
#include "vulkan/vk_context.h"

namespace h2o::vk {

// A buffer and the memory bound to it.
struct Buffer {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkDeviceSize size = 0;      // bytes of memory allocated
    bool device_local = false;  // counted in SharedDevice::device_bytes()
};

class SharedDevice;

// A weight matrix in device memory (repacked as weights.glsl reads it), in a buffer of its own so
// that it is freed exactly when its last holder lets go.
class SharedWeight {
public:
    SharedWeight(std::shared_ptr<SharedDevice> device, const Buffer &buffer) : device_(std::move(device)), buffer_(buffer) {}
    ~SharedWeight();
    SharedWeight(const SharedWeight &) = delete;
    SharedWeight &operator=(const SharedWeight &) = delete;

    VkBuffer buffer() const { return buffer_.buffer; }
    // Device memory it takes.
    VkDeviceSize memory_bytes() const { return buffer_.size; }

private:
    std::shared_ptr<SharedDevice> device_;
    Buffer buffer_;
};

class SharedDevice : public std::enable_shared_from_this<SharedDevice> {
public:
    // The device `device_index` (as list_vulkan_devices numbers them; -1: best_device_index()),
    // created on the first request and shared with every later one while any holder lives.
    // H2O_VULKAN_VALIDATION is read here: a backend that asks for validation gets a device with
    // the layer. A device marked lost is never handed out again: the next request creates a new one.
    static Status get(int device_index, std::shared_ptr<SharedDevice> *out);
    ~SharedDevice() = default;
    SharedDevice(const SharedDevice &) = delete;
    SharedDevice &operator=(const SharedDevice &) = delete;

    Context &context() { return *context_; }
    const Context &context() const { return *context_; }

    // ---- memory
    // A storage buffer of `bytes` in device-local memory, or in host-visible memory (coherent,
    // cached when possible) for staging. Device-local memory is counted in device_bytes() and
    // refused with H2O_ERR_OUT_OF_MEMORY past its heap. Errors: H2O_ERR_OUT_OF_MEMORY,
    // H2O_ERR_BACKEND_UNAVAILABLE (no host-visible memory).
    Status create_buffer(VkDeviceSize bytes, bool host_visible, Buffer *out);
    void destroy_buffer(const Buffer &buffer);
    // Whether host-visible buffers need no flush or invalidate.
    bool host_coherent() const { return host_coherent_; }
    // Device-local memory allocated on this device now: every backend's own and the shared weights.
    uint64_t device_bytes() const { return device_bytes_.load(); }

    // ---- queue
    // vkQueueSubmit of one command buffer, signalling `fence`. Any thread.
    VkResult submit(VkCommandBuffer cmd, VkFence fence);
    // After a lost device (or a simulated one): no later get() hands this device out.
    void mark_lost() { lost_.store(true); }
    bool lost() const { return lost_.load(); }

    // ---- weights
    using WeightKey = std::tuple<const void *, TensorType, int64_t, int64_t>;  // file bytes, type, rows, cols
    // Uploads a new weight into `dst`; the upload must have completed on the device when it returns
    // (other backends read the weight in their own submissions).
    using UploadWeight = std::function<Status(VkBuffer dst)>;
    // The weight `key`: the one a backend on this device already holds, or else a new buffer of
    // `bytes` filled by `upload`. Errors: those of create_buffer and upload; a failed upload
    // leaves nothing behind.
    Status shared_weight(const WeightKey &key, VkDeviceSize bytes, const UploadWeight &upload, std::shared_ptr<const SharedWeight> *out);

private:
    SharedDevice() = default;
    // Chooses the memory types of device-local and staging buffers.
    Status init();

    std::unique_ptr<Context> context_;
    uint32_t device_memory_type_ = 0, host_memory_type_ = 0;
    uint32_t device_heap_ = 0;
    bool has_host_memory_ = false, host_coherent_ = true;
    std::atomic<uint64_t> device_bytes_{0};
    std::atomic<bool> lost_{false};

    std::mutex queue_mutex_;

    std::mutex weights_mutex_;
    std::map<WeightKey, std::weak_ptr<const SharedWeight>> weights_;
};

}  // namespace h2o::vk
