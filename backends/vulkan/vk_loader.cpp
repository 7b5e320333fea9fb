#include "vulkan/vk_loader.h"

#include <dlfcn.h>

#include <mutex>

namespace h2o::vk {

namespace {

struct LoaderState {
    GlobalFunctions functions;
    std::string error;
    bool ok = false;
};

LoaderState open_loader() {
    LoaderState state;
    // The versioned name is the loader's ABI; plain libvulkan.so is only in development packages.
    void *library = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) library = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        const char *why = dlerror();
        state.error = std::string("the Vulkan loader (libvulkan.so.1) is not installed") + (why ? std::string(": ") + why : "");
        return state;
    }
    GlobalFunctions &f = state.functions;
    f.vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(library, "vkGetInstanceProcAddr"));
    if (!f.vkGetInstanceProcAddr) {
        state.error = "the Vulkan loader does not export vkGetInstanceProcAddr";
        return state;
    }
    f.vkEnumerateInstanceVersion =
        reinterpret_cast<PFN_vkEnumerateInstanceVersion>(f.vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkEnumerateInstanceVersion"));
#define H2O_VK_LOAD(name)                                                                  \
    f.name = reinterpret_cast<PFN_##name>(f.vkGetInstanceProcAddr(VK_NULL_HANDLE, #name)); \
    if (!f.name) {                                                                         \
        state.error = "the Vulkan loader lacks " #name;                                    \
        return state;                                                                      \
    }
    H2O_VK_GLOBAL_FUNCTIONS(H2O_VK_LOAD)
#undef H2O_VK_LOAD
    // The library is deliberately never closed.
    state.ok = true;
    return state;
}

}  // namespace

const GlobalFunctions *vulkan_loader(std::string *error) {
    static const LoaderState state = open_loader();
    if (!state.ok) {
        if (error) *error = state.error;
        return nullptr;
    }
    return &state.functions;
}

bool InstanceFunctions::load(const GlobalFunctions &global, VkInstance instance, std::string *missing) {
#define H2O_VK_LOAD(name)                                                               \
    name = reinterpret_cast<PFN_##name>(global.vkGetInstanceProcAddr(instance, #name)); \
    if (!name) {                                                                        \
        *missing = #name;                                                               \
        return false;                                                                   \
    }
    H2O_VK_INSTANCE_FUNCTIONS(H2O_VK_LOAD)
#undef H2O_VK_LOAD
#define H2O_VK_LOAD_OPTIONAL(name) name = reinterpret_cast<PFN_##name>(global.vkGetInstanceProcAddr(instance, #name));
    H2O_VK_OPTIONAL_INSTANCE_FUNCTIONS(H2O_VK_LOAD_OPTIONAL)
#undef H2O_VK_LOAD_OPTIONAL
    return true;
}

bool DeviceFunctions::load(const InstanceFunctions &instance, VkDevice device, std::string *missing) {
#define H2O_VK_LOAD(name)                                                             \
    name = reinterpret_cast<PFN_##name>(instance.vkGetDeviceProcAddr(device, #name)); \
    if (!name) {                                                                      \
        *missing = #name;                                                             \
        return false;                                                                 \
    }
    H2O_VK_DEVICE_FUNCTIONS(H2O_VK_LOAD)
#undef H2O_VK_LOAD
    return true;
}

const char *result_name(VkResult result) {
    switch (result) {
        case VK_SUCCESS:
            return "VK_SUCCESS";
        case VK_NOT_READY:
            return "VK_NOT_READY";
        case VK_TIMEOUT:
            return "VK_TIMEOUT";
        case VK_INCOMPLETE:
            return "VK_INCOMPLETE";
        case VK_ERROR_OUT_OF_HOST_MEMORY:
            return "VK_ERROR_OUT_OF_HOST_MEMORY";
        case VK_ERROR_OUT_OF_DEVICE_MEMORY:
            return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
        case VK_ERROR_INITIALIZATION_FAILED:
            return "VK_ERROR_INITIALIZATION_FAILED";
        case VK_ERROR_DEVICE_LOST:
            return "VK_ERROR_DEVICE_LOST";
        case VK_ERROR_MEMORY_MAP_FAILED:
            return "VK_ERROR_MEMORY_MAP_FAILED";
        case VK_ERROR_LAYER_NOT_PRESENT:
            return "VK_ERROR_LAYER_NOT_PRESENT";
        case VK_ERROR_EXTENSION_NOT_PRESENT:
            return "VK_ERROR_EXTENSION_NOT_PRESENT";
        case VK_ERROR_FEATURE_NOT_PRESENT:
            return "VK_ERROR_FEATURE_NOT_PRESENT";
        case VK_ERROR_INCOMPATIBLE_DRIVER:
            return "VK_ERROR_INCOMPATIBLE_DRIVER";
        case VK_ERROR_TOO_MANY_OBJECTS:
            return "VK_ERROR_TOO_MANY_OBJECTS";
        case VK_ERROR_OUT_OF_POOL_MEMORY:
            return "VK_ERROR_OUT_OF_POOL_MEMORY";
        default:
            return "VkResult error";
    }
}

}  // namespace h2o::vk
