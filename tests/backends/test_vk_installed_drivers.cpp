// The installed Vulkan drivers (backends/vulkan/vk_installed_drivers.h): which installations let
// AUTO leave them unloaded, and where their manifests are found. That an AUTO session then loads
// no Vulkan library: tests/backends/test_backend_registry.cpp.
#include <doctest/doctest.h>

#ifdef H2O_HAVE_VULKAN

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "test_util.h"
#include "vulkan/vk_installed_drivers.h"

using namespace h2o;
using namespace h2o::vk;
using h2o_test::ScopedEnv;

namespace {

InstalledDrivers installed(std::vector<std::string> manifests, std::vector<std::string> gpu_nodes = {}) {
    InstalledDrivers d;
    d.manifests = std::move(manifests);
    d.gpu_nodes = std::move(gpu_nodes);
    return d;
}

}  // namespace

TEST_CASE("vulkan drivers: CPU implementations, and Mesa's GPU drivers without a GPU device node, are left unloaded") {
    Status st = drivers_may_offer_gpu(installed({"lvp_icd.x86_64.json"}));
    CHECK(st.code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(st.message == "its drivers were not loaded, as none offers a GPU here (lvp: a CPU implementation)");
    // A CPU implementation offers no GPU, whatever device nodes there are.
    CHECK(drivers_may_offer_gpu(installed({"lvp_icd.x86_64.json"}, {"/dev/dri/renderD128"})).code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(drivers_may_offer_gpu(installed({"vk_swiftshader_icd.json"})).code == H2O_ERR_BACKEND_UNAVAILABLE);

    // Debian 12's mesa-vulkan-drivers on a machine without a GPU, lavapipe found in two folders
    // and for two architectures.
    st = drivers_may_offer_gpu(installed({"radeon_icd.x86_64.json", "lvp_icd.x86_64.json", "intel_icd.x86_64.json",
                                          "intel_hasvk_icd.x86_64.json", "lvp_icd.x86_64.json", "lvp_icd.i686.json"}));
    CHECK(st.code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(st.message ==
          "its drivers were not loaded, as none offers a GPU here (lvp: a CPU implementation; intel, intel_hasvk and radeon: no GPU "
          "device node in /dev)");
}

TEST_CASE("vulkan drivers: with a GPU device node, another driver, or drivers named by the environment, they are loaded") {
    // Mesa's GPU drivers with a render node; NVIDIA's, AMD's and unknown drivers anywhere.
    CHECK(drivers_may_offer_gpu(installed({"radeon_icd.x86_64.json", "lvp_icd.x86_64.json"}, {"/dev/dri/renderD128"})).ok());
    CHECK(drivers_may_offer_gpu(installed({"nvidia_icd.json", "lvp_icd.x86_64.json"})).ok());
    CHECK(drivers_may_offer_gpu(installed({"amd_icd64.json"})).ok());
    CHECK(drivers_may_offer_gpu(installed({"lvp_icd.x86_64.json", "vendor.json"})).ok());
    // No manifest in the usual folders: the system may configure others.
    CHECK(drivers_may_offer_gpu(installed({})).ok());
    InstalledDrivers named = installed({"lvp_icd.x86_64.json"});
    named.named_by_environment = true;
    CHECK(drivers_may_offer_gpu(named).ok());
}

TEST_CASE("vulkan drivers: the manifests are found in the loader's XDG folders, and the environment's driver files noticed") {
    namespace fs = std::filesystem;
    const fs::path root = h2o_test::temp_path("vk_installed_drivers");
    fs::remove_all(root);
    const auto manifest = [&](const std::string &folder, const std::string &name) {
        fs::create_directories(root / folder / "vulkan/icd.d");
        std::ofstream(root / folder / "vulkan/icd.d" / name) << "{}\n";
    };
    manifest("config_home", "h2o_config_home_icd.json");
    manifest("config_dir", "h2o_config_dir_icd.json");
    manifest("data_home", "h2o_data_home_icd.json");
    manifest("data_dir_a", "h2o_data_a_icd.json");
    manifest("data_dir_b", "h2o_data_b_icd.json");
    manifest("data_dir_b", "README.txt");  // only .json files are manifests
    const ScopedEnv config_home("XDG_CONFIG_HOME", (root / "config_home").string());
    const ScopedEnv config_dirs("XDG_CONFIG_DIRS", (root / "config_dir").string());
    const ScopedEnv data_home("XDG_DATA_HOME", (root / "data_home").string());
    const ScopedEnv data_dirs("XDG_DATA_DIRS", (root / "data_dir_a").string() + ":" + (root / "data_dir_b").string());
    const ScopedEnv no_files("VK_DRIVER_FILES", "");
    const ScopedEnv no_icds("VK_ICD_FILENAMES", "");
    const ScopedEnv no_added("VK_ADD_DRIVER_FILES", "");

    InstalledDrivers found = find_installed_drivers();
    CAPTURE(found.manifests.size());
    const auto has = [&](const std::string &name) {
        return std::find(found.manifests.begin(), found.manifests.end(), name) != found.manifests.end();
    };
    for (const char *name :
         {"h2o_config_home_icd.json", "h2o_config_dir_icd.json", "h2o_data_home_icd.json", "h2o_data_a_icd.json", "h2o_data_b_icd.json"}) {
        CAPTURE(name);
        CHECK(has(name));
    }
    CHECK_FALSE(has("README.txt"));
    CHECK_FALSE(found.named_by_environment);
    // Drivers unknown by name are loaded.
    CHECK(drivers_may_offer_gpu(found).ok());

    const ScopedEnv added("VK_ADD_DRIVER_FILES", (root / "data_dir_a/vulkan/icd.d/h2o_data_a_icd.json").string());
    CHECK(find_installed_drivers().named_by_environment);
    fs::remove_all(root);
}

#endif  // H2O_HAVE_VULKAN
