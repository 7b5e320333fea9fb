#include "vulkan/vk_installed_drivers.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string_view>
#include <system_error>

namespace h2o::vk {

namespace {

namespace fs = std::filesystem;

// An environment variable's value, empty when unset.
std::string env(const char *name) {
    const char *value = std::getenv(name);
    return value ? value : "";
}

// The folders the loader reads driver manifests from on Linux, in its order: the XDG
// configuration folders, /etc, then the XDG data folders, each with vulkan/icd.d below.
std::vector<std::string> manifest_folders() {
    std::vector<std::string> roots;
    const auto add = [&roots](const std::string &list) {  // a colon-separated list
        size_t start = 0;
        while (start < list.size()) {
            size_t end = list.find(':', start);
            if (end == std::string::npos) end = list.size();
            if (end > start) roots.push_back(list.substr(start, end - start));
            start = end + 1;
        }
    };
    const auto value_or = [](const std::string &value, const std::string &fallback) { return value.empty() ? fallback : value; };
    const std::string home = env("HOME");
    add(value_or(env("XDG_CONFIG_HOME"), home.empty() ? "" : home + "/.config"));
    add(value_or(env("XDG_CONFIG_DIRS"), "/etc/xdg"));
    add("/etc");
    add(value_or(env("XDG_DATA_HOME"), home.empty() ? "" : home + "/.local/share"));
    add(value_or(env("XDG_DATA_DIRS"), "/usr/local/share:/usr/share"));
    for (std::string &root : roots) root += "/vulkan/icd.d";
    return roots;
}

// The names of the entries of a folder, none when it cannot be read.
std::vector<std::string> entries(const std::string &folder) {
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
        names.push_back(it->path().filename().string());
    }
    return names;
}

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> list) {
    return std::find(list.begin(), list.end(), name) != list.end();
}

// The driver a manifest names, from its file name as Mesa and SwiftShader install them
// ("<driver>_icd.<arch>.json", "<driver>_icd.json"); empty for other names.
std::string_view driver_name(std::string_view manifest) {
    const size_t at = manifest.find("_icd.");
    return at == std::string_view::npos ? std::string_view() : manifest.substr(0, at);
}

// "a, b and c"
std::string join(const std::vector<std::string> &names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) {
        if (i > 0) out += i + 1 == names.size() ? " and " : ", ";
        out += names[i];
    }
    return out;
}

}  // namespace

InstalledDrivers find_installed_drivers() {
    InstalledDrivers found;
    found.named_by_environment = !env("VK_DRIVER_FILES").empty() || !env("VK_ICD_FILENAMES").empty() || !env("VK_ADD_DRIVER_FILES").empty();
    for (const std::string &folder : manifest_folders()) {
        for (std::string &name : entries(folder)) {
            if (name.size() > 5 && name.ends_with(".json")) found.manifests.push_back(std::move(name));
        }
    }
    // The device nodes GPU drivers reach their GPUs through: the kernel's DRM nodes (Mesa, and
    // NVIDIA's with nvidia-drm), NVIDIA's own, WSL's, and Qualcomm's and Arm's vendor drivers'.
    for (const std::string &name : entries("/dev/dri")) found.gpu_nodes.push_back("/dev/dri/" + name);
    for (const std::string &name : entries("/dev")) {
        for (std::string_view prefix : {"nvidia", "dxg", "kgsl", "mali"}) {
            if (name.starts_with(prefix)) found.gpu_nodes.push_back("/dev/" + name);
        }
    }
    return found;
}

Status drivers_may_offer_gpu(const InstalledDrivers &drivers) {
    // No manifest where the loader usually looks: a system may configure other folders.
    if (drivers.named_by_environment || drivers.manifests.empty()) return Status::Ok();
    std::vector<std::string> cpu_implementations, needing_drm;
    for (const std::string &manifest : drivers.manifests) {
        const std::string_view name = driver_name(manifest);
        if (is_one_of(name, {"lvp", "vk_swiftshader"})) {
            cpu_implementations.emplace_back(name);
        } else if (is_one_of(name, {"radeon", "intel", "intel_hasvk", "nouveau", "freedreno", "panfrost", "broadcom", "asahi", "virtio",
                                    "powervr_mesa"})) {
            // Mesa's GPU drivers, which find their GPUs through the DRM render nodes.
            needing_drm.emplace_back(name);
        } else {
            return Status::Ok();
        }
    }
    if (!needing_drm.empty() && !drivers.gpu_nodes.empty()) return Status::Ok();
    // The same driver may be installed in several folders (and once per architecture).
    for (std::vector<std::string> *names : {&cpu_implementations, &needing_drm}) {
        std::sort(names->begin(), names->end());
        names->erase(std::unique(names->begin(), names->end()), names->end());
    }
    std::string why;
    if (!cpu_implementations.empty()) why = join(cpu_implementations) + ": a CPU implementation";
    if (!needing_drm.empty()) why += (why.empty() ? "" : "; ") + join(needing_drm) + ": no GPU device node in /dev";
    return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "its drivers were not loaded, as none offers a GPU here (" + why + ")");
}

}  // namespace h2o::vk
