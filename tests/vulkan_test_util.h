// Helpers of the Vulkan tests: backends and sessions run with VK_LAYER_KHRONOS_validation when it
// is installed, and are skipped without a usable device unless CI requires one.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "backend.h"
#include "status.h"
#include "vulkan/vulkan_backend.h"

#include "test_util.h"

#ifdef H2O_TEST_ASAN
#include <dlfcn.h>
#endif

namespace h2o_test {

// Keeps the validation layer loaded once the loader lets it go, so that LeakSanitizer can name it
// (see the suppression in test_vulkan.cpp).
inline void keep_validation_layer_loaded() {
#ifdef H2O_TEST_ASAN
    static void *const layer = dlopen("libVkLayer_khronos_validation.so", RTLD_NOW | RTLD_NODELETE);
    (void)layer;
#endif
}

// Vulkan devices created from now on run the validation layer (unless H2O_VULKAN_VALIDATION is
// set otherwise).
inline void request_vulkan_validation() {
    setenv("H2O_VULKAN_VALIDATION", "1", /*overwrite=*/0);
    keep_validation_layer_loaded();
}

// CI sets H2O_REQUIRE_VULKAN=1: there, a missing device or validation layer is a failure, so that
// the backend is really exercised rather than skipped.
inline bool vulkan_required() {
    const char *v = std::getenv("H2O_REQUIRE_VULKAN");
    return v && std::string(v) == "1";
}

// True when making a Vulkan backend or session failed for want of a usable device and none is
// required; then the reason goes to *why, or without `why` is printed with the skip marker.
inline bool skip_without_vulkan(const h2o::Status &made, std::string *why = nullptr) {
    if (made.code != H2O_ERR_BACKEND_UNAVAILABLE || vulkan_required()) return false;
    const std::string reason = "no usable Vulkan device: " + made.message;
    if (why) {
        *why = reason;
    } else {
        std::printf("H2O-SKIP: %s\n", reason.c_str());
    }
    return true;
}

inline h2o::VulkanCounters counters_of(const h2o::Backend &b) {
    h2o::VulkanCounters c;
    REQUIRE(h2o::vulkan_counters(b, &c));
    return c;
}

// No validation layer message so far.
inline void check_validation_clean(const h2o::Backend &b) { CHECK(counters_of(b).validation_messages == 0); }

// A Vulkan backend with validation on, or null: when there is no usable device (after printing the
// skip marker, or giving the reason to *no_device), after failing the test when creating it failed
// otherwise. subgroups=false forces the shared-memory reductions.
inline std::unique_ptr<h2o::Backend> make_vk(int max_batch, bool subgroups = true, std::string *no_device = nullptr) {
    request_vulkan_validation();
    std::unique_ptr<h2o::Backend> backend;
    h2o::Status st;
    {
        const ScopedEnv reductions("H2O_VULKAN_SUBGROUPS", subgroups ? "1" : "0");
        st = h2o::make_vulkan_backend(-1, max_batch, &backend);
    }
    if (skip_without_vulkan(st, no_device)) return nullptr;
    if (!st.ok()) FAIL_CHECK("creating the Vulkan backend failed: " << st.message);
    if (backend && vulkan_required()) REQUIRE_MESSAGE(counters_of(*backend).validation, "the Vulkan validation layer is not active");
    return backend;
}

}  // namespace h2o_test

#define VULKAN_OR_SKIP(var, ...)               \
    auto var = h2o_test::make_vk(__VA_ARGS__); \
    if (!var) return
