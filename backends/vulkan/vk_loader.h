// The Vulkan loader, opened at run time with dlopen("libvulkan.so.1"), so the library loads and
// runs (with the CPU backend) on machines without Vulkan, and reports the Vulkan backend as
// unavailable there instead of failing to start. Every entry point is fetched through
// vkGetInstanceProcAddr / vkGetDeviceProcAddr into the tables below.
#pragma once

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>

#include <string>

namespace h2o::vk {

// Functions callable without an instance.
#define H2O_VK_GLOBAL_FUNCTIONS(X)            \
    X(vkCreateInstance)                       \
    X(vkEnumerateInstanceExtensionProperties) \
    X(vkEnumerateInstanceLayerProperties)

#define H2O_VK_INSTANCE_FUNCTIONS(X)            \
    X(vkDestroyInstance)                        \
    X(vkEnumeratePhysicalDevices)               \
    X(vkGetPhysicalDeviceProperties)            \
    X(vkGetPhysicalDeviceFeatures)              \
    X(vkGetPhysicalDeviceMemoryProperties)      \
    X(vkGetPhysicalDeviceQueueFamilyProperties) \
    X(vkCreateDevice)                           \
    X(vkGetDeviceProcAddr)

// Optional instance functions (Vulkan 1.1 / extensions): null when absent.
#define H2O_VK_OPTIONAL_INSTANCE_FUNCTIONS(X) \
    X(vkGetPhysicalDeviceProperties2)         \
    X(vkCreateDebugUtilsMessengerEXT)         \
    X(vkDestroyDebugUtilsMessengerEXT)

#define H2O_VK_DEVICE_FUNCTIONS(X)    \
    X(vkDestroyDevice)                \
    X(vkGetDeviceQueue)               \
    X(vkDeviceWaitIdle)               \
    X(vkAllocateMemory)               \
    X(vkFreeMemory)                   \
    X(vkMapMemory)                    \
    X(vkUnmapMemory)                  \
    X(vkInvalidateMappedMemoryRanges) \
    X(vkFlushMappedMemoryRanges)      \
    X(vkCreateBuffer)                 \
    X(vkDestroyBuffer)                \
    X(vkGetBufferMemoryRequirements)  \
    X(vkBindBufferMemory)             \
    X(vkCreateShaderModule)           \
    X(vkDestroyShaderModule)          \
    X(vkCreateDescriptorSetLayout)    \
    X(vkDestroyDescriptorSetLayout)   \
    X(vkCreatePipelineLayout)         \
    X(vkDestroyPipelineLayout)        \
    X(vkCreateComputePipelines)       \
    X(vkDestroyPipeline)              \
    X(vkCreateDescriptorPool)         \
    X(vkDestroyDescriptorPool)        \
    X(vkAllocateDescriptorSets)       \
    X(vkUpdateDescriptorSets)         \
    X(vkCreateCommandPool)            \
    X(vkDestroyCommandPool)           \
    X(vkResetCommandPool)             \
    X(vkAllocateCommandBuffers)       \
    X(vkBeginCommandBuffer)           \
    X(vkEndCommandBuffer)             \
    X(vkCreateFence)                  \
    X(vkDestroyFence)                 \
    X(vkResetFences)                  \
    X(vkWaitForFences)                \
    X(vkQueueSubmit)                  \
    X(vkCmdBindPipeline)              \
    X(vkCmdBindDescriptorSets)        \
    X(vkCmdPushConstants)             \
    X(vkCmdDispatch)                  \
    X(vkCmdPipelineBarrier)           \
    X(vkCmdCopyBuffer)                \
    X(vkCmdFillBuffer)

#define H2O_VK_DECLARE(name) PFN_##name name = nullptr;

struct GlobalFunctions {
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
    PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion = nullptr;  // null on a Vulkan 1.0 loader
    H2O_VK_GLOBAL_FUNCTIONS(H2O_VK_DECLARE)
};

struct InstanceFunctions {
    H2O_VK_INSTANCE_FUNCTIONS(H2O_VK_DECLARE)
    H2O_VK_OPTIONAL_INSTANCE_FUNCTIONS(H2O_VK_DECLARE)
    // False (naming the missing function) if a required function is absent.
    bool load(const GlobalFunctions &global, VkInstance instance, std::string *missing);
};

struct DeviceFunctions {
    H2O_VK_DEVICE_FUNCTIONS(H2O_VK_DECLARE)
    bool load(const InstanceFunctions &instance, VkDevice device, std::string *missing);
};

#undef H2O_VK_DECLARE

// A Vulkan structure with its sType set and every other member zeroed.
template <typename T>
T make(VkStructureType type) {
    T t{};
    t.sType = type;
    return t;
}

// Opens the loader once per process (it stays loaded: drivers may keep threads alive).
// Returns null, with the reason in *error, when there is no usable loader.
const GlobalFunctions *vulkan_loader(std::string *error);

// "VK_ERROR_OUT_OF_DEVICE_MEMORY" and so on.
const char *result_name(VkResult result);

}  // namespace h2o::vk
