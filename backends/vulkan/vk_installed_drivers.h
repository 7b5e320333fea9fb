// Whether AUTO need load the Vulkan drivers at all, decided from what is installed without loading
// any. Creating a Vulkan instance opens every installed driver, and Mesa's bring LLVM with them:
// on a machine whose only Vulkan device is lavapipe, which AUTO passes over as a CPU
// implementation, h2o-cli on stories260K peaked at 64 MiB resident with the default backend
// against 11 MiB with --backend cpu. Two kinds of driver can be ruled out unopened: CPU
// implementations (lavapipe, SwiftShader), and Mesa's GPU drivers on a machine without a GPU
// device node (they find their GPUs through the kernel's DRM render nodes). Any other driver, or
// drivers named by environment variables, are loaded and asked.
#pragma once

#include <string>
#include <vector>

#include "status.h"

namespace h2o::vk {

// What is installed, as the Vulkan loader would find it (Linux).
struct InstalledDrivers {
    // The loader is told which drivers to use (VK_DRIVER_FILES, VK_ICD_FILENAMES or
    // VK_ADD_DRIVER_FILES): only loading them tells what they are.
    bool named_by_environment = false;
    std::vector<std::string> manifests;  // the driver manifests' file names, "lvp_icd.x86_64.json"
    std::vector<std::string> gpu_nodes;  // GPU device nodes present, "/dev/dri/renderD128"
};

// Scans the folders the loader reads driver manifests from, and /dev.
InstalledDrivers find_installed_drivers();

// Ok when an installed driver may offer a device that AUTO would use (or nothing can be told
// without loading them); otherwise H2O_ERR_BACKEND_UNAVAILABLE saying why none can.
Status drivers_may_offer_gpu(const InstalledDrivers &drivers);

}  // namespace h2o::vk
