// A Vulkan instance and logical device with one compute queue, the shared pipeline layout, and
// the compute pipelines (created on first use). One per device, shared by every backend on it
// through vk::SharedDevice (vk_shared_device.h), which also guards the queue.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "status.h"
#include "vulkan/vk_loader.h"
#include "vulkan/vulkan_backend.h"

namespace h2o::vk {

// Storage buffers in the one descriptor set layout every kernel uses (kernels use a prefix).
constexpr uint32_t kBindings = 8;
// Push constant bytes every kernel may use (the guaranteed minimum of maxPushConstantsSize).
constexpr uint32_t kPushConstantBytes = 128;

// Whether the environment variable `name` is set to `value`.
bool env_is(const char *name, const char *value);

// The device make_vulkan_backend(-1) runs on, as list_vulkan_devices numbers them: the first
// discrete one, else integrated, virtual, CPU, any other.
Status best_device_index(int *out);

class Context {
public:
    // device_index: as list_vulkan_devices numbers them. validation: with
    // VK_LAYER_KHRONOS_validation when it is installed (H2O_VULKAN_VALIDATION=1).
    static Status create(int device_index, bool validation, std::unique_ptr<Context> *out);
    ~Context();
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;

    const InstanceFunctions &vki() const { return vki_; }
    const DeviceFunctions &vk() const { return vk_; }
    VkPhysicalDevice physical_device() const { return physical_; }
    VkDevice device() const { return device_; }
    VkQueue queue() const { return queue_; }
    uint32_t queue_family() const { return queue_family_; }
    const VkPhysicalDeviceProperties &properties() const { return properties_; }
    const VkPhysicalDeviceLimits &limits() const { return properties_.limits; }
    const VkPhysicalDeviceMemoryProperties &memory_properties() const { return memory_; }
    // Largest single allocation the driver accepts.
    VkDeviceSize max_allocation() const { return max_allocation_; }
    // Subgroup arithmetic in compute shaders (Vulkan 1.1), for the reductions.
    bool subgroup_arithmetic() const { return subgroup_arithmetic_; }
    VkDescriptorSetLayout set_layout() const { return set_layout_; }
    VkPipelineLayout pipeline_layout() const { return pipeline_layout_; }

    // The pipeline of an embedded shader variant, compiled the first time it is asked for.
    // Null (after logging why) if it cannot be created. Any thread.
    VkPipeline pipeline(const std::string &name);

    bool validation() const { return messenger_ != VK_NULL_HANDLE; }
    uint64_t validation_messages() const { return validation_messages_.load(); }

private:
    Context() = default;
    Status create_device(int device_index);

    static VKAPI_ATTR VkBool32 VKAPI_CALL debug_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                         VkDebugUtilsMessageTypeFlagsEXT types,
                                                         const VkDebugUtilsMessengerCallbackDataEXT *data, void *user);

    InstanceFunctions vki_;
    DeviceFunctions vk_;
    VkInstance instance_ = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
    VkPhysicalDevice physical_ = VK_NULL_HANDLE;
    VkDevice device_ = VK_NULL_HANDLE;
    VkQueue queue_ = VK_NULL_HANDLE;
    uint32_t queue_family_ = 0;
    VkPhysicalDeviceProperties properties_{};
    VkPhysicalDeviceMemoryProperties memory_{};
    VkDeviceSize max_allocation_ = 0;
    bool subgroup_arithmetic_ = false;
    VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
    VkPipelineLayout pipeline_layout_ = VK_NULL_HANDLE;
    std::mutex pipelines_mutex_;  // backends on several threads ask for pipelines
    std::map<std::string, VkPipeline> pipelines_;
    std::atomic<uint64_t> validation_messages_{0};
};

}  // namespace h2o::vk
