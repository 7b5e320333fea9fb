#include "vulkan/vk_context.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "log.h"
#include "vulkan/vk_shaders.h"

namespace h2o {

const char *vulkan_device_type_name(VulkanDeviceType type) {
    switch (type) {
        case VulkanDeviceType::Discrete:
            return "discrete";
        case VulkanDeviceType::Integrated:
            return "integrated";
        case VulkanDeviceType::Virtual:
            return "virtual";
        case VulkanDeviceType::Cpu:
            return "cpu";
        default:
            return "other";
    }
}

namespace vk {

bool env_is(const char *name, const char *value) {
    const char *v = std::getenv(name);
    return v && std::strcmp(v, value) == 0;
}

namespace {

Status unavailable(const std::string &why) { return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "Vulkan backend unavailable: " + why); }

VulkanDeviceType device_type(VkPhysicalDeviceType type) {
    switch (type) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
            return VulkanDeviceType::Discrete;
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
            return VulkanDeviceType::Integrated;
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
            return VulkanDeviceType::Virtual;
        case VK_PHYSICAL_DEVICE_TYPE_CPU:
            return VulkanDeviceType::Cpu;
        default:
            return VulkanDeviceType::Other;
    }
}

// Preference when no device is named: discrete, integrated, virtual, CPU, anything else.
int preference(VulkanDeviceType type) {
    switch (type) {
        case VulkanDeviceType::Discrete:
            return 4;
        case VulkanDeviceType::Integrated:
            return 3;
        case VulkanDeviceType::Virtual:
            return 2;
        case VulkanDeviceType::Cpu:
            return 1;
        default:
            return 0;
    }
}

uint64_t largest_device_local_heap(const VkPhysicalDeviceMemoryProperties &memory) {
    uint64_t best = 0;
    for (uint32_t i = 0; i < memory.memoryHeapCount; ++i) {
        if (memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) best = std::max<uint64_t>(best, memory.memoryHeaps[i].size);
    }
    return best;
}

bool has_layer(const GlobalFunctions &g, const char *name) {
    uint32_t count = 0;
    if (g.vkEnumerateInstanceLayerProperties(&count, nullptr) != VK_SUCCESS) return false;
    std::vector<VkLayerProperties> layers(count);
    if (g.vkEnumerateInstanceLayerProperties(&count, layers.data()) != VK_SUCCESS) return false;
    for (const VkLayerProperties &l : layers) {
        if (std::strcmp(l.layerName, name) == 0) return true;
    }
    return false;
}

bool has_instance_extension(const GlobalFunctions &g, const char *layer, const char *name) {
    uint32_t count = 0;
    if (g.vkEnumerateInstanceExtensionProperties(layer, &count, nullptr) != VK_SUCCESS) return false;
    std::vector<VkExtensionProperties> extensions(count);
    if (g.vkEnumerateInstanceExtensionProperties(layer, &count, extensions.data()) != VK_SUCCESS) return false;
    for (const VkExtensionProperties &e : extensions) {
        if (std::strcmp(e.extensionName, name) == 0) return true;
    }
    return false;
}

// Instance API version to ask for: 1.1 (subgroup properties) when the loader has it.
uint32_t instance_api_version(const GlobalFunctions &g) {
    uint32_t version = VK_API_VERSION_1_0;
    if (g.vkEnumerateInstanceVersion && g.vkEnumerateInstanceVersion(&version) != VK_SUCCESS) version = VK_API_VERSION_1_0;
    return version >= VK_API_VERSION_1_1 ? VK_API_VERSION_1_1 : VK_API_VERSION_1_0;
}

// A plain instance (no layers), for listing devices.
Status create_plain_instance(const GlobalFunctions &g, VkInstance *instance, InstanceFunctions *vki) {
    auto app = make<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
    app.pApplicationName = "h2o";
    app.pEngineName = "h2o";
    app.apiVersion = instance_api_version(g);
    auto info = make<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
    info.pApplicationInfo = &app;
    const VkResult r = g.vkCreateInstance(&info, nullptr, instance);
    if (r != VK_SUCCESS) return unavailable(std::string("vkCreateInstance failed (") + result_name(r) + ")");
    std::string missing;
    if (!vki->load(g, *instance, &missing)) {
        auto destroy = reinterpret_cast<PFN_vkDestroyInstance>(g.vkGetInstanceProcAddr(*instance, "vkDestroyInstance"));
        if (destroy) destroy(*instance, nullptr);
        *instance = VK_NULL_HANDLE;
        return unavailable("the Vulkan instance lacks " + missing);
    }
    return Status::Ok();
}

std::vector<VkPhysicalDevice> physical_devices(const InstanceFunctions &vki, VkInstance instance) {
    uint32_t count = 0;
    if (vki.vkEnumeratePhysicalDevices(instance, &count, nullptr) != VK_SUCCESS) return {};
    std::vector<VkPhysicalDevice> devices(count);
    if (vki.vkEnumeratePhysicalDevices(instance, &count, devices.data()) != VK_SUCCESS) return {};
    devices.resize(count);
    return devices;
}

}  // namespace

Context::~Context() {
    if (device_) {
        vk_.vkDeviceWaitIdle(device_);
        for (auto &[name, pipeline] : pipelines_) vk_.vkDestroyPipeline(device_, pipeline, nullptr);
        if (pipeline_layout_) vk_.vkDestroyPipelineLayout(device_, pipeline_layout_, nullptr);
        if (set_layout_) vk_.vkDestroyDescriptorSetLayout(device_, set_layout_, nullptr);
        vk_.vkDestroyDevice(device_, nullptr);
    }
    if (messenger_) vki_.vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
    if (instance_) vki_.vkDestroyInstance(instance_, nullptr);
}

VKAPI_ATTR VkBool32 VKAPI_CALL Context::debug_callback(VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
                                                       const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        static_cast<Context *>(user)->validation_messages_.fetch_add(1);
        log(severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT ? H2O_LOG_ERROR : H2O_LOG_WARN,
            std::string("vulkan validation: ") + (data && data->pMessage ? data->pMessage : "(no message)"));
    }
    return VK_FALSE;  // never abort the call
}

Status best_device_index(int *out) {
    std::vector<VulkanDeviceInfo> devices;
    H2O_TRY(list_vulkan_devices(&devices));
    if (devices.empty()) return unavailable("no Vulkan device is present");
    *out = 0;
    for (const VulkanDeviceInfo &d : devices) {
        if (preference(d.type) > preference(devices[*out].type)) *out = d.index;
    }
    return Status::Ok();
}

Status Context::create(int device_index, bool want_validation, std::unique_ptr<Context> *out) {
    std::string error;
    const GlobalFunctions *g = vulkan_loader(&error);
    if (!g) return unavailable(error);
    std::unique_ptr<Context> c(new Context());

    // Validation (tests, debugging): the Khronos layer with synchronization checks, reporting
    // through a debug messenger that also covers instance creation itself.
    const char *kLayer = "VK_LAYER_KHRONOS_validation";
    const bool validation = want_validation && has_layer(*g, kLayer) &&
                            (has_instance_extension(*g, nullptr, VK_EXT_DEBUG_UTILS_EXTENSION_NAME) ||
                             has_instance_extension(*g, kLayer, VK_EXT_DEBUG_UTILS_EXTENSION_NAME));
    if (want_validation && !validation) {
        log(H2O_LOG_WARN, "H2O_VULKAN_VALIDATION=1 but VK_LAYER_KHRONOS_validation or VK_EXT_debug_utils is not installed");
    }
    std::vector<const char *> layers, extensions;
    auto messenger_info = make<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
    messenger_info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    messenger_info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                                 VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    messenger_info.pfnUserCallback = debug_callback;
    messenger_info.pUserData = c.get();
    const VkValidationFeatureEnableEXT kSyncValidation = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
    auto features = make<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
    features.enabledValidationFeatureCount = 1;
    features.pEnabledValidationFeatures = &kSyncValidation;
    if (validation) {
        layers.push_back(kLayer);
        extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
        if (has_instance_extension(*g, kLayer, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME)) {
            extensions.push_back(VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME);
            messenger_info.pNext = &features;
        }
    }

    auto app = make<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
    app.pApplicationName = "h2o";
    app.pEngineName = "h2o";
    app.apiVersion = instance_api_version(*g);
    auto info = make<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
    info.pApplicationInfo = &app;
    info.enabledLayerCount = static_cast<uint32_t>(layers.size());
    info.ppEnabledLayerNames = layers.data();
    info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
    info.ppEnabledExtensionNames = extensions.data();
    if (validation) info.pNext = &messenger_info;
    VkResult r = g->vkCreateInstance(&info, nullptr, &c->instance_);
    if (r != VK_SUCCESS) {
        c->instance_ = VK_NULL_HANDLE;
        return unavailable(std::string("vkCreateInstance failed (") + result_name(r) + ")");
    }
    std::string missing;
    if (!c->vki_.load(*g, c->instance_, &missing)) {
        auto destroy = reinterpret_cast<PFN_vkDestroyInstance>(g->vkGetInstanceProcAddr(c->instance_, "vkDestroyInstance"));
        if (destroy) destroy(c->instance_, nullptr);
        c->instance_ = VK_NULL_HANDLE;
        return unavailable("the Vulkan instance lacks " + missing);
    }
    if (validation && c->vki_.vkCreateDebugUtilsMessengerEXT) {
        messenger_info.pNext = nullptr;
        if (c->vki_.vkCreateDebugUtilsMessengerEXT(c->instance_, &messenger_info, nullptr, &c->messenger_) != VK_SUCCESS) {
            c->messenger_ = VK_NULL_HANDLE;
        }
    }
    H2O_TRY(c->create_device(device_index));
    *out = std::move(c);
    return Status::Ok();
}

Status Context::create_device(int device_index) {
    const std::vector<VkPhysicalDevice> devices = physical_devices(vki_, instance_);
    if (devices.empty()) return unavailable("no Vulkan device is present");
    if (device_index < 0 || device_index >= static_cast<int>(devices.size())) {
        return unavailable("device index " + std::to_string(device_index) + " is out of range (" + std::to_string(devices.size()) +
                           " devices)");
    }
    physical_ = devices[device_index];
    vki_.vkGetPhysicalDeviceProperties(physical_, &properties_);
    vki_.vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);
    const std::string name = properties_.deviceName;

    uint32_t family_count = 0;
    vki_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &family_count, nullptr);
    std::vector<VkQueueFamilyProperties> families(family_count);
    vki_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &family_count, families.data());
    bool found = false;
    for (uint32_t i = 0; i < family_count && !found; ++i) {
        if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            queue_family_ = i;
            found = true;
        }
    }
    if (!found) return unavailable("device '" + name + "' has no compute queue");
    const VkPhysicalDeviceLimits &l = properties_.limits;
    if (l.maxPerStageDescriptorStorageBuffers < kBindings || l.maxBoundDescriptorSets < 1 || l.maxPushConstantsSize < kPushConstantBytes ||
        l.maxComputeSharedMemorySize < 16384) {
        return unavailable("device '" + name + "' has too few storage buffer bindings or too little shared memory");
    }

    // Subgroup arithmetic (Vulkan 1.1) for the reductions, and the largest allocation.
    max_allocation_ = VkDeviceSize{1} << 30;  // the guaranteed minimum when it cannot be queried
    if (properties_.apiVersion >= VK_API_VERSION_1_1 && vki_.vkGetPhysicalDeviceProperties2) {
        auto subgroup = make<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
        auto maintenance3 = make<VkPhysicalDeviceMaintenance3Properties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES);
        subgroup.pNext = &maintenance3;
        auto props2 = make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
        props2.pNext = &subgroup;
        vki_.vkGetPhysicalDeviceProperties2(physical_, &props2);
        const VkSubgroupFeatureFlags needed = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
        subgroup_arithmetic_ = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                               (subgroup.supportedOperations & needed) == needed && subgroup.subgroupSize >= 1;
        if (maintenance3.maxMemoryAllocationSize > 0) max_allocation_ = maintenance3.maxMemoryAllocationSize;
    }

    const float priority = 1.0f;
    auto queue_info = make<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
    queue_info.queueFamilyIndex = queue_family_;
    queue_info.queueCount = 1;
    queue_info.pQueuePriorities = &priority;
    auto device_info = make<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
    device_info.queueCreateInfoCount = 1;
    device_info.pQueueCreateInfos = &queue_info;
    VkResult r = vki_.vkCreateDevice(physical_, &device_info, nullptr, &device_);
    if (r != VK_SUCCESS) {
        device_ = VK_NULL_HANDLE;
        if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) {
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot create the Vulkan device '" + name + "': " + result_name(r));
        }
        return unavailable("cannot create the device '" + name + "' (" + result_name(r) + ")");
    }
    std::string missing;
    if (!vk_.load(vki_, device_, &missing)) {
        auto destroy = reinterpret_cast<PFN_vkDestroyDevice>(vki_.vkGetDeviceProcAddr(device_, "vkDestroyDevice"));
        if (destroy) destroy(device_, nullptr);
        device_ = VK_NULL_HANDLE;
        return unavailable("the device '" + name + "' lacks " + missing);
    }
    vk_.vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

    // One layout for every kernel: kBindings storage buffers and 128 bytes of push constants.
    VkDescriptorSetLayoutBinding bindings[kBindings];
    for (uint32_t i = 0; i < kBindings; ++i) {
        bindings[i] = VkDescriptorSetLayoutBinding{i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    }
    auto set_info = make<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
    set_info.bindingCount = kBindings;
    set_info.pBindings = bindings;
    r = vk_.vkCreateDescriptorSetLayout(device_, &set_info, nullptr, &set_layout_);
    if (r != VK_SUCCESS) {
        set_layout_ = VK_NULL_HANDLE;
        return make_error(H2O_ERR_OUT_OF_MEMORY, std::string("vkCreateDescriptorSetLayout: ") + result_name(r));
    }
    const VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
    auto layout_info = make<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
    layout_info.setLayoutCount = 1;
    layout_info.pSetLayouts = &set_layout_;
    layout_info.pushConstantRangeCount = 1;
    layout_info.pPushConstantRanges = &range;
    r = vk_.vkCreatePipelineLayout(device_, &layout_info, nullptr, &pipeline_layout_);
    if (r != VK_SUCCESS) {
        pipeline_layout_ = VK_NULL_HANDLE;
        return make_error(H2O_ERR_OUT_OF_MEMORY, std::string("vkCreatePipelineLayout: ") + result_name(r));
    }
    return Status::Ok();
}

VkPipeline Context::pipeline(const std::string &name) {
    std::lock_guard<std::mutex> lock(pipelines_mutex_);
    if (auto it = pipelines_.find(name); it != pipelines_.end()) return it->second;
    const ShaderBlob *blob = find_shader(name.c_str());
    if (!blob) {
        log(H2O_LOG_ERROR, "vulkan: no embedded shader named " + name);
        return VK_NULL_HANDLE;
    }
    auto module_info = make<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
    module_info.codeSize = blob->bytes;
    module_info.pCode = blob->words;
    VkShaderModule module = VK_NULL_HANDLE;
    VkResult r = vk_.vkCreateShaderModule(device_, &module_info, nullptr, &module);
    if (r != VK_SUCCESS) {
        log(H2O_LOG_ERROR, "vulkan: cannot create the shader module " + name + ": " + result_name(r));
        return VK_NULL_HANDLE;
    }
    auto info = make<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
    info.stage = make<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
    info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    info.stage.module = module;
    info.stage.pName = "main";
    info.layout = pipeline_layout_;
    VkPipeline pipeline = VK_NULL_HANDLE;
    r = vk_.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &info, nullptr, &pipeline);
    vk_.vkDestroyShaderModule(device_, module, nullptr);
    if (r != VK_SUCCESS) {
        log(H2O_LOG_ERROR, "vulkan: cannot create the pipeline " + name + ": " + result_name(r));
        return VK_NULL_HANDLE;
    }
    pipelines_.emplace(name, pipeline);
    return pipeline;
}

}  // namespace vk

Status list_vulkan_devices(std::vector<VulkanDeviceInfo> *out) {
    out->clear();
    std::string error;
    const vk::GlobalFunctions *g = vk::vulkan_loader(&error);
    if (!g) return vk::unavailable(error);
    VkInstance instance = VK_NULL_HANDLE;
    vk::InstanceFunctions vki;
    H2O_TRY(vk::create_plain_instance(*g, &instance, &vki));
    const std::vector<VkPhysicalDevice> devices = vk::physical_devices(vki, instance);
    for (size_t i = 0; i < devices.size(); ++i) {
        VkPhysicalDeviceProperties p;
        vki.vkGetPhysicalDeviceProperties(devices[i], &p);
        VkPhysicalDeviceMemoryProperties memory;
        vki.vkGetPhysicalDeviceMemoryProperties(devices[i], &memory);
        VulkanDeviceInfo info;
        info.index = static_cast<int>(i);
        info.name = p.deviceName;
        info.type = vk::device_type(p.deviceType);
        info.device_local_bytes = vk::largest_device_local_heap(memory);
        info.api_version = p.apiVersion;
        out->push_back(std::move(info));
    }
    vki.vkDestroyInstance(instance, nullptr);
    return Status::Ok();
}

}  // namespace h2o
