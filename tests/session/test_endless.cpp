// The default session never runs out (kv_overflow = H2O_KV_OVERFLOW_EVICT): what it computes
// before its cache is full, how it goes on after, what it reports, and the old contract on request.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "h2o/h2o.h"
#include "test_util.h"

namespace {

h2o_session_params params(uint32_t n_ctx, uint32_t backend = H2O_BACKEND_CPU, uint32_t overflow = H2O_KV_OVERFLOW_EVICT) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = backend;
    sp.n_threads = 1;
    sp.n_ctx = n_ctx;
    sp.n_batch = 32;
    sp.kv_overflow = overflow;
    return sp;
}

h2o_kv_usage usage_of(const h2o_session *session) {
    h2o_kv_usage usage;
    usage.struct_size = sizeof usage;
    REQUIRE(h2o_session_get_kv_usage(session, &usage) == H2O_OK);
    return usage;
}

h2o_generate_params greedy(uint32_t n) {
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = n;
    gen.temperature = 0.0f;
    gen.stop_at_eos = 0;
    return gen;
}

struct Events {
    int count = 0;
    h2o_kv_usage first{};
};

void on_event(uint32_t event, const h2o_kv_usage *usage, void *user_data) {
    auto *events = static_cast<Events *>(user_data);
    if (event != H2O_EVENT_KV_FULL) return;
    if (events->count++ == 0) events->first = *usage;
}

std::vector<float> logits_of(h2o_session *session, size_t n_vocab) {
    std::vector<float> logits(n_vocab);
    REQUIRE(h2o_session_get_logits(session, logits.data(), logits.size()) == H2O_OK);
    return logits;
}

}  // namespace

TEST_CASE("endless: the default session runs far past its context in the memory it was made with, and says when eviction began") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_test::ApiSession m;
    REQUIRE_MESSAGE(m.open(path, params(128)), h2o_last_error());
    h2o_kv_layout layout;
    layout.struct_size = sizeof layout;
    REQUIRE(h2o_session_get_kv_layout(m.session, &layout) == H2O_OK);
    CHECK(layout.policy == H2O_KV_SCISSORHANDS);  // the default policy, waiting for a full cache
    CHECK(layout.position_rolling == 1);
    CHECK(layout.budget == 128);
    h2o_memory_report before;
    before.struct_size = sizeof before;
    REQUIRE(h2o_session_memory(m.session, &before) == H2O_OK);

    Events events;
    REQUIRE(h2o_session_set_event_callback(m.session, on_event, &events) == H2O_OK);
    h2o_kv_usage usage = usage_of(m.session);
    CHECK(usage.capacity == 128);
    CHECK(usage.n_past == 0);
    CHECK(usage.evicting_since == 0);
    CHECK(usage.evicts == 1);

    const h2o_generate_params gen = greedy(1500);
    std::string text;
    REQUIRE_MESSAGE(h2o_generate(m.session, "Once upon a time", 16, &gen, h2o_test::append_text, &text) == H2O_OK,
                    h2o_session_last_error(m.session));
    REQUIRE(h2o_generate(m.session, "", 0, &gen, h2o_test::append_text, &text) == H2O_OK);
    usage = usage_of(m.session);
    CHECK(usage.n_past > 3000);
    CHECK(usage.n_held == 128);
    CHECK(usage.n_evicted == usage.n_past - 128);
    CHECK(usage.evicting_since == 128);
    // Once, with the usage of the moment the cache filled.
    CHECK(events.count == 1);
    CHECK(events.first.n_past <= 128);
    CHECK(events.first.evicting_since == 128);
    CHECK(events.first.n_evicted == 0);
    h2o_memory_report after;
    after.struct_size = sizeof after;
    REQUIRE(h2o_session_memory(m.session, &after) == H2O_OK);
    CHECK(after.kv_bytes == before.kv_bytes);
    CHECK(after.scratch_bytes == before.scratch_bytes);

    // A snapshot of a session that has evicted continues without announcing it again.
    size_t state_size = 0;
    REQUIRE(h2o_session_state_size(m.session, &state_size) == H2O_OK);
    std::vector<uint8_t> state(state_size);
    size_t written = 0;
    REQUIRE(h2o_session_save_to_buffer(m.session, state.data(), state.size(), &written) == H2O_OK);
    h2o_session *loaded = nullptr;
    REQUIRE(h2o_session_load_from_buffer(m.model, state.data(), written, nullptr, &loaded) == H2O_OK);
    Events loaded_events;
    REQUIRE(h2o_session_set_event_callback(loaded, on_event, &loaded_events) == H2O_OK);
    CHECK(usage_of(loaded).n_evicted == usage.n_evicted);
    CHECK(usage_of(loaded).evicting_since == 128);
    REQUIRE(h2o_generate(loaded, "", 0, &gen, nullptr, nullptr) == H2O_OK);
    CHECK(loaded_events.count == 0);
    h2o_session_free(loaded);

    // A new conversation fills again and says so again.
    REQUIRE(h2o_session_reset(m.session) == H2O_OK);
    CHECK(usage_of(m.session).evicting_since == 0);
    REQUIRE(h2o_generate(m.session, "Once upon a time", 16, &gen, nullptr, nullptr) == H2O_OK);
    CHECK(events.count == 2);
    REQUIRE(h2o_session_set_event_callback(m.session, nullptr, nullptr) == H2O_OK);
    CHECK(h2o_session_set_event_callback(nullptr, on_event, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_kv_usage(nullptr, &usage) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_kv_usage(m.session, nullptr) == H2O_ERR_INVALID_ARGUMENT);
}

// Bit for bit: the same prompt batches and single tokens, read by the default session and by a
// plain full cache (kv_overflow = error), until the default one's slots are full.
TEST_CASE("endless: before its first eviction the default session gives a full cache's logits bit for bit, on the CPU and Vulkan") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_model_info info;
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(model, &info) == H2O_OK);
    for (uint32_t backend : {uint32_t{H2O_BACKEND_CPU}, uint32_t{H2O_BACKEND_VULKAN}}) {
        CAPTURE(backend);
        h2o_session *endless = nullptr, *full = nullptr;
        const h2o_session_params sp = params(256, backend);
        const h2o_status made = h2o_session_create(model, &sp, &endless);
        if (made == H2O_ERR_BACKEND_UNAVAILABLE && backend == H2O_BACKEND_VULKAN && !std::getenv("H2O_REQUIRE_VULKAN")) {
            MESSAGE("not run on Vulkan: " << h2o_last_error());
            continue;
        }
        REQUIRE_MESSAGE(made == H2O_OK, h2o_last_error());
        const h2o_session_params old = params(256, backend, H2O_KV_OVERFLOW_ERROR);
        REQUIRE(h2o_session_create(model, &old, &full) == H2O_OK);
        h2o_kv_layout layout;
        layout.struct_size = sizeof layout;
        REQUIRE(h2o_session_get_kv_layout(full, &layout) == H2O_OK);
        CHECK(layout.policy == H2O_KV_FULL);

        // A prompt of 100 tokens in batches, then single tokens up to the 256th.
        std::vector<int32_t> tokens(256);
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(1 + (i * 37 + i / 7) % (info.n_vocab - 1));
        REQUIRE(h2o_session_decode(endless, tokens.data(), 100) == H2O_OK);
        REQUIRE(h2o_session_decode(full, tokens.data(), 100) == H2O_OK);
        CHECK(logits_of(endless, info.n_vocab) == logits_of(full, info.n_vocab));
        size_t differing = 0;
        for (size_t i = 100; i < tokens.size(); ++i) {
            REQUIRE(h2o_session_decode(endless, &tokens[i], 1) == H2O_OK);
            REQUIRE(h2o_session_decode(full, &tokens[i], 1) == H2O_OK);
            if (logits_of(endless, info.n_vocab) != logits_of(full, info.n_vocab)) ++differing;
        }
        CHECK(differing == 0);
        CHECK(usage_of(endless).n_evicted == 0);
        // One more: the full cache refuses it, the default one evicts and goes on.
        CHECK(h2o_session_decode(full, tokens.data(), 1) == H2O_ERR_CONTEXT_FULL);
        CHECK(h2o_session_decode(endless, tokens.data(), 1) == H2O_OK);
        CHECK(usage_of(endless).n_evicted == 1);
        CHECK(usage_of(endless).evicting_since == 256);
        h2o_session_free(endless);
        h2o_session_free(full);
    }
    h2o_model_free(model);
}

TEST_CASE("endless: kv_overflow is checked, an older caller's params get the default, and H2O_KV_FULL never evicts") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session *session = nullptr;
    h2o_session_params sp = params(64);
    sp.kv_overflow = 2;
    CHECK(h2o_session_create(model, &sp, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_overflow 2") != std::string::npos);

    // A caller built against 0.7's header (208 bytes, no kv_overflow): the session never runs out.
    sp = params(64);
    sp.struct_size = 208;
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    const h2o_generate_params gen = greedy(200);
    CHECK(h2o_generate(session, "Once", 4, &gen, nullptr, nullptr) == H2O_OK);
    CHECK(usage_of(session).n_evicted > 0);
    h2o_session_free(session);

    // The policy that never evicts, under the default overflow: the cache ends at n_ctx.
    sp = params(64);
    sp.kv_policy = H2O_KV_FULL;
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    CHECK(h2o_generate(session, "Once", 4, &gen, nullptr, nullptr) == H2O_ERR_CONTEXT_FULL);
    CHECK(usage_of(session).evicts == 0);
    CHECK(usage_of(session).n_evicted == 0);
    h2o_session_free(session);

    // The old contract asked for: the stream ends at n_ctx, with a message that says how not to.
    sp = params(64, H2O_BACKEND_CPU, H2O_KV_OVERFLOW_ERROR);
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    CHECK(h2o_generate(session, "Once", 4, &gen, nullptr, nullptr) == H2O_ERR_CONTEXT_FULL);
    CHECK(std::string(h2o_session_last_error(session)).find("the default evicts and rolls") != std::string::npos);
    h2o_session_free(session);
    // ... and with a smaller budget it evicts within the n_ctx positions, then ends.
    sp.kv_budget = 32;
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    CHECK(h2o_generate(session, "Once", 4, &gen, nullptr, nullptr) == H2O_ERR_CONTEXT_FULL);
    CHECK(usage_of(session).n_past == 64);
    CHECK(usage_of(session).n_evicted == 32);
    CHECK(usage_of(session).evicting_since == 32);
    h2o_session_free(session);
    h2o_model_free(model);
}
