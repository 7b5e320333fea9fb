// Helpers for tests that drive the internal Session class directly.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "backend_registry.h"
#include "doctest/doctest.h"
#include "model.h"
#include "session.h"

namespace h2o_test {

// Greedy decoding of n tokens that does not stop at the end of a story.
inline h2o::GenerateSettings greedy(uint32_t n) {
    h2o::GenerateSettings g;
    g.max_tokens = n;
    g.sampler.temperature = 0.0f;
    g.stop_at_eos = false;
    return g;
}

// Creates a session, or prints the skip marker and returns null when its backend is not on this
// machine (unless CI requires that device backend: H2O_REQUIRE_VULKAN=1, H2O_REQUIRE_CUDA=1).
inline std::unique_ptr<h2o::Session> session_or_skip(const h2o::Model &model, const h2o::SessionSettings &settings) {
    std::unique_ptr<h2o::Session> session;
    const h2o::Status created = h2o::Session::create(model, settings, &session);
    const char *required = settings.backend == H2O_BACKEND_CUDA ? "H2O_REQUIRE_CUDA" : "H2O_REQUIRE_VULKAN";
    if (created.code == H2O_ERR_BACKEND_UNAVAILABLE && !std::getenv(required)) {
        std::printf("H2O-SKIP: %s\n", created.message.c_str());
        return nullptr;
    }
    REQUIRE_MESSAGE(created.ok(), created.message);
    return session;
}

// A backend of a kind on its first device, or null after printing the skip marker when this build
// or machine has none (unless CI requires that device backend, as session_or_skip).
inline std::unique_ptr<h2o::Backend> backend_or_skip(h2o_backend_kind kind, int max_batch) {
    const char *required = kind == H2O_BACKEND_CUDA ? "H2O_REQUIRE_CUDA" : "H2O_REQUIRE_VULKAN";
    const h2o::BackendEntry *entry = h2o::find_backend(kind);
    std::vector<h2o::BackendDevice> devices;
    const h2o::Status listed = entry ? entry->devices(&devices) : h2o::Status::Ok();
    if (!entry || !listed.ok() || devices.empty()) {
        REQUIRE_MESSAGE(!std::getenv(required), "no device of the required backend: ", listed.message);
        std::printf("H2O-SKIP: no %s device: %s\n", h2o::backend_kind_title(kind), listed.message.c_str());
        return nullptr;
    }
    h2o::BackendOptions options;
    options.max_batch = max_batch;
    std::unique_ptr<h2o::Backend> backend;
    h2o::BackendDevice running;
    const h2o::Status created = entry->create(devices[0], options, &backend, &running);
    REQUIRE_MESSAGE(created.ok(), created.message);
    return backend;
}

}  // namespace h2o_test
