// Sessions sharing a Vulkan device: the device is created once, the weights of a model are
// uploaded once for all of its sessions on the device and freed with the last of them, sessions
// of another model share the device but not the weights, and sessions on two threads at once
// generate what each generates alone. As in test_vulkan.cpp, the validation layer (its
// thread-safety and synchronization checks included) watches every session when installed.
#include <doctest/doctest.h>

#include <cstdio>

#ifndef H2O_HAVE_VULKAN

TEST_CASE("vulkan sharing: sessions share a device") { std::printf("H2O-SKIP: built without the Vulkan backend (H2O_VULKAN=OFF)\n"); }

#else

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "model.h"
#include "session.h"
#include "test_util.h"
#include "vulkan/vulkan_backend.h"
#include "vulkan_test_util.h"

using namespace h2o;

namespace {

const char *const kPrompt = "Once upon a time, there was a little dog named Max.";

SessionSettings vulkan_settings(KvPolicy policy = KvPolicy::H2O, int budget = 64) {
    SessionSettings s;
    s.backend = H2O_BACKEND_VULKAN;
    s.n_ctx = 256;
    s.kv_budget = budget;
    s.policy.policy = policy;
    s.policy.recent = budget / 2;
    s.n_batch = 16;
    return s;
}

// A session of `model` with validation on, or null after printing the skip marker when there is
// no usable Vulkan device.
std::unique_ptr<Session> vulkan_session(const Model &model, const SessionSettings &settings = vulkan_settings()) {
    h2o_test::request_vulkan_validation();
    std::unique_ptr<Session> session;
    const Status made = Session::create(model, settings, &session);
    if (h2o_test::skip_without_vulkan(made)) return nullptr;
    REQUIRE_MESSAGE(made.ok(), made.message);
    return session;
}

#define SESSION_OR_SKIP(var, ...)           \
    auto var = vulkan_session(__VA_ARGS__); \
    if (!var) return

std::unique_ptr<Model> load_model(const std::string &path) {
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    return model;
}

using h2o_test::counters_of;
VulkanCounters counters_of(const Session &s) { return counters_of(s.backend()); }

// n greedy tokens after `prompt` in a fresh conversation, or the error. Any thread.
std::string greedy_text(Session &session, const char *prompt, uint32_t n) {
    GenerateSettings g;
    g.max_tokens = n;
    g.sampler.temperature = 0.0f;
    g.stop_at_eos = false;
    const auto append = [](const char *text, size_t length, void *out) {
        static_cast<std::string *>(out)->append(text, length);
        return false;
    };
    std::string text;
    Status st = session.reset();
    if (st.ok()) st = session.generate(prompt, g, append, &text);
    return st.ok() ? text : "error: " + st.message;
}

}  // namespace

TEST_CASE("vulkan sharing: a second session of a model uploads no weights and allocates only its own memory") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const std::unique_ptr<Model> model = load_model(path);
    SESSION_OR_SKIP(first, *model);
    const VulkanCounters a = counters_of(*first);
    // Nothing else is on the device: it holds the first session's own memory and the weights.
    CHECK(a.weight_bytes_to_device > 0);
    CHECK(a.shared_weight_bytes >= a.weight_bytes_to_device);
    CHECK(a.device_total_bytes == a.device_memory_bytes + a.shared_weight_bytes);

    SESSION_OR_SKIP(second, *model);
    const VulkanCounters b = counters_of(*second);
    MESSAGE("first session: " << a.bytes_to_device << " bytes to the device (" << a.weight_bytes_to_device << " of weights), "
                              << a.device_memory_bytes << " bytes of device memory of its own; second session: " << b.bytes_to_device
                              << " bytes to the device (" << b.weight_bytes_to_device << " of weights), " << b.device_memory_bytes
                              << " of its own; shared weights " << b.shared_weight_bytes << " bytes; the device: " << a.device_total_bytes
                              << " bytes, then " << b.device_total_bytes);
    // The second makes the same uploads as the first but for the weights, and the device grows by
    // its own memory (KV cache, activations, scratch) alone.
    CHECK(b.weight_bytes_to_device == 0);
    CHECK(b.bytes_to_device == a.bytes_to_device - a.weight_bytes_to_device);
    CHECK(b.shared_weight_bytes == a.shared_weight_bytes);
    CHECK(b.device_memory_bytes == a.device_memory_bytes);
    CHECK(b.device_total_bytes == a.device_total_bytes + b.device_memory_bytes);
    // h2o_session_get_device_traffic reports the same figures.
    const Backend::Traffic traffic = second->backend().traffic();
    CHECK(traffic.bytes_to_device == b.bytes_to_device);
    CHECK(traffic.device_memory_bytes == b.device_memory_bytes);

    // Both compute with the one copy, as the CPU does, and the second keeps it after the first
    // is gone; the first's own memory goes with it.
    SessionSettings cpu_settings = vulkan_settings();
    cpu_settings.backend = H2O_BACKEND_CPU;
    std::unique_ptr<Session> cpu;
    REQUIRE(Session::create(*model, cpu_settings, &cpu).ok());
    const std::string expected = greedy_text(*cpu, kPrompt, 32);
    CHECK(greedy_text(*first, kPrompt, 32) == expected);
    CHECK(greedy_text(*second, kPrompt, 32) == expected);
    first = nullptr;
    CHECK(counters_of(*second).device_total_bytes == b.device_total_bytes - a.device_memory_bytes);
    CHECK(greedy_text(*second, kPrompt, 32) == expected);
    h2o_test::check_validation_clean(second->backend());
}

TEST_CASE("vulkan sharing: weights go with their model's last session, and another model shares the device but not the weights") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    // One file loaded twice is two models, at two addresses.
    const std::unique_ptr<Model> model = load_model(path), other_model = load_model(path);
    SESSION_OR_SKIP(other, *other_model);  // keeps the device alive throughout
    const VulkanCounters o = counters_of(*other);
    SESSION_OR_SKIP(s1, *model);
    const VulkanCounters c1 = counters_of(*s1);
    // The model's first session uploads every weight again, onto the same device.
    CHECK(c1.weight_bytes_to_device == o.weight_bytes_to_device);
    CHECK(c1.device_total_bytes == o.device_total_bytes + c1.device_memory_bytes + c1.shared_weight_bytes);
    SESSION_OR_SKIP(s2, *model);
    const VulkanCounters c2 = counters_of(*s2);
    CHECK(c2.weight_bytes_to_device == 0);
    CHECK(c2.device_total_bytes == c1.device_total_bytes + c2.device_memory_bytes);

    // Gone with both sessions, though the device lives on: a third session uploads them anew.
    s1 = nullptr;
    s2 = nullptr;
    CHECK(counters_of(*other).device_total_bytes == o.device_total_bytes);
    SESSION_OR_SKIP(s3, *model);
    const VulkanCounters c3 = counters_of(*s3);
    CHECK(c3.weight_bytes_to_device == c1.weight_bytes_to_device);
    CHECK(c3.device_total_bytes == c1.device_total_bytes);
    CHECK(greedy_text(*s3, kPrompt, 24) == greedy_text(*other, kPrompt, 24));
    h2o_test::check_validation_clean(other->backend());
}

TEST_CASE("vulkan sharing: two sessions of one model on two threads generate what each generates alone") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const std::unique_ptr<Model> model = load_model(path);
    // Two conversations unlike each other: other prompts, policies and cache sizes.
    const char *const prompts[2] = {kPrompt, "Lily and Tom went to the park to play with a big red ball."};
    const SessionSettings settings[2] = {vulkan_settings(KvPolicy::H2O, 64), vulkan_settings(KvPolicy::Scissorhands, 48)};
    constexpr uint32_t kTokens = 40;
    constexpr int kRounds = 3;

    std::string alone[2];
    uint64_t weight_bytes = 0;
    for (int i = 0; i < 2; ++i) {
        SESSION_OR_SKIP(session, *model, settings[i]);
        alone[i] = greedy_text(*session, prompts[i], kTokens);
        weight_bytes = counters_of(*session).weight_bytes_to_device;
    }

    // Each thread makes its session (the two adopt the weights at once) and generates several
    // times over, so that the two sessions' submissions interleave on the one queue.
    std::string together[2][kRounds];
    VulkanCounters counters[2];
    const auto run = [&](int i) {
        std::unique_ptr<Session> session;
        const Status made = Session::create(*model, settings[i], &session);
        if (!made.ok()) {
            together[i][0] = "error: " + made.message;
            return;
        }
        for (std::string &text : together[i]) text = greedy_text(*session, prompts[i], kTokens);
        if (!vulkan_counters(session->backend(), &counters[i])) together[i][0] = "error: not a Vulkan backend";
    };
    std::thread first(run, 0), second(run, 1);
    first.join();
    second.join();

    for (int i = 0; i < 2; ++i) {
        INFO("session " << i);
        for (const std::string &text : together[i]) CHECK(text == alone[i]);
        CHECK(counters[i].validation_messages == 0);
    }
    // One upload of the weights between the two.
    CHECK(counters[0].weight_bytes_to_device + counters[1].weight_bytes_to_device == weight_bytes);
    CHECK(counters[0].shared_weight_bytes == counters[1].shared_weight_bytes);
}

TEST_CASE("vulkan sharing: two backends on one device submit from two threads at once") {
    // Many small submissions each (an upload and a download), so that the two threads meet in
    // vkQueueSubmit often: the validation layer reports a queue used by two threads at once.
    VULKAN_OR_SKIP(a, 1);
    VULKAN_OR_SKIP(b, 1);
    CHECK(counters_of(*a).device_total_bytes == counters_of(*b).device_total_bytes);  // one device
    constexpr int kRounds = 2000;
    const auto run = [](Backend *backend, int *mismatches) {
        Tensor t;
        if (!backend->alloc(TensorType::F32, 64, 1, &t).ok()) {
            *mismatches = kRounds;
            return;
        }
        float values[64], back[64];
        for (int r = 0; r < kRounds; ++r) {
            for (int i = 0; i < 64; ++i) values[i] = static_cast<float>(r * 64 + i);
            if (!backend->upload(t, values, sizeof values).ok() || !backend->download(t, back, sizeof back).ok() ||
                !std::equal(values, values + 64, back)) {
                ++*mismatches;
            }
        }
    };
    int mismatches[2] = {0, 0};
    std::thread first(run, a.get(), &mismatches[0]), second(run, b.get(), &mismatches[1]);
    first.join();
    second.join();
    CHECK(mismatches[0] == 0);
    CHECK(mismatches[1] == 0);
    CHECK(counters_of(*a).submissions >= kRounds);
    h2o_test::check_validation_clean(*a);
}

#endif  // H2O_HAVE_VULKAN
