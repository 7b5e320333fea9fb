// The C ABI contract that bindings rely on: struct layouts, struct_size versioning, name
// functions, model lifetime, log callbacks, cancellation, load progress and pull-style generation.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "doctest/doctest.h"
#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace {

// Every public struct's size and field offsets on LP64 (Linux/macOS x86-64 and ARM64). A change
// here breaks every binding that declares these structs: append fields, never move them.
TEST_CASE("abi: public struct layouts are pinned") {
    static_assert(sizeof(void *) == 8, "the pinned layouts are those of 64-bit platforms");
    CHECK(sizeof(h2o_model_params) == 48);  // ABI 1: 40 bytes, prefix_cache_policy appended in 0.8
    CHECK(offsetof(h2o_model_params, prefix_cache_bytes) == 32);
    CHECK(offsetof(h2o_model_params, prefix_cache_policy) == 40);
    CHECK(sizeof(h2o_prefix_cache_stats) == 32);
    CHECK(offsetof(h2o_model_params, tokenizer_path) == 8);
    CHECK(offsetof(h2o_model_params, progress) == 16);
    CHECK(offsetof(h2o_model_params, progress_user_data) == 24);

    CHECK(sizeof(h2o_model_info) == 64);
    CHECK(offsetof(h2o_model_info, n_vocab) == 4);
    CHECK(offsetof(h2o_model_info, head_dim) == 32);
    CHECK(offsetof(h2o_model_info, bos_token) == 36);
    CHECK(offsetof(h2o_model_info, eos_token) == 40);
    CHECK(offsetof(h2o_model_info, n_params) == 48);
    CHECK(offsetof(h2o_model_info, weight_bytes) == 56);

    CHECK(sizeof(h2o_backend_info) == 168);
    CHECK(offsetof(h2o_backend_info, kind) == 4);
    CHECK(offsetof(h2o_backend_info, device_index) == 8);
    CHECK(offsetof(h2o_backend_info, name) == 12);
    CHECK(offsetof(h2o_backend_info, device_type) == 140);
    CHECK(offsetof(h2o_backend_info, memory_bytes) == 160);

    CHECK(sizeof(h2o_session_params) == 216);  // ABI 1: 208 bytes, kv_overflow appended in 0.8
    CHECK(offsetof(h2o_session_params, kv_overflow) == 208);
    CHECK(offsetof(h2o_session_params, n_ctx) == 4);
    CHECK(offsetof(h2o_session_params, n_threads) == 8);
    CHECK(offsetof(h2o_session_params, n_batch) == 12);
    CHECK(offsetof(h2o_session_params, seed) == 16);
    CHECK(offsetof(h2o_session_params, kv_budget) == 24);
    CHECK(offsetof(h2o_session_params, kv_policy) == 28);
    CHECK(offsetof(h2o_session_params, kv_recent) == 32);
    CHECK(offsetof(h2o_session_params, kv_recent_ratio) == 36);
    CHECK(offsetof(h2o_session_params, kv_sinks) == 40);
    CHECK(offsetof(h2o_session_params, position_rolling) == 44);
    CHECK(offsetof(h2o_session_params, backend) == 48);
    CHECK(offsetof(h2o_session_params, device_index) == 52);
    CHECK(offsetof(h2o_session_params, kv_type) == 56);
    CHECK(offsetof(h2o_session_params, max_memory_bytes) == 64);
    CHECK(offsetof(h2o_session_params, kv_horizon) == 72);
    CHECK(offsetof(h2o_session_params, experimental) == 80);
    CHECK(H2O_EXPERIMENTAL_CAPACITY == 16);

    CHECK(sizeof(h2o_kv_layout) == 52);  // ABI 1
    CHECK(offsetof(h2o_kv_layout, heavy) == 20);
    CHECK(offsetof(h2o_kv_layout, position_rolling) == 24);
    CHECK(offsetof(h2o_kv_layout, type) == 28);
    CHECK(offsetof(h2o_kv_layout, n_ctx) == 32);
    CHECK(offsetof(h2o_kv_layout, horizon) == 36);
    CHECK(offsetof(h2o_kv_layout, min_layer_budget) == 40);
    CHECK(offsetof(h2o_kv_layout, max_layer_budget) == 44);
    CHECK(offsetof(h2o_kv_layout, min_head_budget) == 48);

    CHECK(sizeof(h2o_kv_policy_info) == 40);  // 0.7
    CHECK(offsetof(h2o_kv_policy_info, policy) == 4);
    CHECK(offsetof(h2o_kv_policy_info, name) == 8);
    CHECK(offsetof(h2o_kv_policy_info, gathers_statistics) == 16);
    CHECK(offsetof(h2o_kv_policy_info, has_recent_window) == 20);
    CHECK(offsetof(h2o_kv_policy_info, keeps_sinks) == 24);
    CHECK(offsetof(h2o_kv_policy_info, default_recent_ratio) == 28);
    CHECK(offsetof(h2o_kv_policy_info, default_horizon) == 32);

    CHECK(sizeof(h2o_device_traffic) == 40);
    CHECK(sizeof(h2o_memory_report) == 32);

    CHECK(sizeof(h2o_span_info) == 48);  // 0.3
    CHECK(offsetof(h2o_span_info, min_share) == 8);
    CHECK(offsetof(h2o_span_info, n_tokens) == 16);
    CHECK(offsetof(h2o_span_info, kept_min) == 24);
    CHECK(offsetof(h2o_span_info, kept_mean) == 32);
    CHECK(offsetof(h2o_span_info, attention_share) == 40);

    CHECK(sizeof(h2o_generate_params) == 112);  // ABI 1: 56 bytes, the constraints appended in 0.8
    CHECK(offsetof(h2o_generate_params, temperature) == 8);
    CHECK(offsetof(h2o_generate_params, repeat_last_n) == 28);
    CHECK(offsetof(h2o_generate_params, stop_strings) == 32);
    CHECK(offsetof(h2o_generate_params, n_stop_strings) == 40);
    CHECK(offsetof(h2o_generate_params, stop_at_eos) == 48);
    CHECK(offsetof(h2o_generate_params, grammar) == 56);
    CHECK(offsetof(h2o_generate_params, grammar_len) == 64);
    CHECK(offsetof(h2o_generate_params, json_schema) == 72);
    CHECK(offsetof(h2o_generate_params, json_schema_len) == 80);
    CHECK(offsetof(h2o_generate_params, logit_bias_tokens) == 88);
    CHECK(offsetof(h2o_generate_params, logit_bias_values) == 96);
    CHECK(offsetof(h2o_generate_params, n_logit_bias) == 104);

    CHECK(sizeof(h2o_kv_usage) == 56);  // 0.8
    CHECK(offsetof(h2o_kv_usage, capacity) == 4);
    CHECK(offsetof(h2o_kv_usage, n_past) == 8);
    CHECK(offsetof(h2o_kv_usage, n_held) == 16);
    CHECK(offsetof(h2o_kv_usage, n_evicted) == 24);
    CHECK(offsetof(h2o_kv_usage, n_pinned) == 32);
    CHECK(offsetof(h2o_kv_usage, evicting_since) == 40);
    CHECK(offsetof(h2o_kv_usage, evicts) == 48);

    CHECK(sizeof(h2o_generate_stats) == 40);
    CHECK(offsetof(h2o_generate_stats, stop_reason) == 12);
    CHECK(offsetof(h2o_generate_stats, n_past) == 16);
    CHECK(offsetof(h2o_generate_stats, prompt_seconds) == 24);
}

TEST_CASE("abi: params init writes exactly struct_size bytes and refuses sizes below the first version") {
    // A caller's struct: the bytes past it are never written.
    struct {
        h2o_session_params params;
        unsigned char guard[16];
    } older;
    std::memset(&older, 0xAB, sizeof(older));
    REQUIRE(h2o_session_params_init(&older.params, sizeof(older.params)) == H2O_OK);
    CHECK(older.params.struct_size == sizeof(older.params));
    CHECK(older.params.kv_policy == H2O_KV_SCISSORHANDS);
    for (unsigned char b : older.guard) CHECK(b == 0xAB);
    // ABI 1's first h2o_session_params is its whole struct: a struct of ABI 0 (96 bytes, the
    // research settings as fields) is refused.
    CHECK(h2o_session_params_init(&older.params, 96) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("struct_size") != std::string::npos);

    h2o_generate_params gen;
    CHECK(h2o_generate_params_init(&gen, 8) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("struct_size") != std::string::npos);
    CHECK(h2o_model_params_init(nullptr, sizeof(h2o_model_params)) == H2O_ERR_INVALID_ARGUMENT);

    // A newer caller's larger struct: known fields get defaults, the unknown tail becomes zero.
    struct {
        h2o_generate_params params;
        unsigned char newer_fields[24];
    } newer;
    std::memset(&newer, 0xCD, sizeof(newer));
    REQUIRE(h2o_generate_params_init(&newer.params, sizeof(newer)) == H2O_OK);
    CHECK(newer.params.struct_size == sizeof(newer));
    CHECK(newer.params.max_tokens == 256);
    for (unsigned char b : newer.newer_fields) CHECK(b == 0);
}

TEST_CASE("abi: a newer caller's input struct is accepted when its unknown fields are zero") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    struct {
        h2o_session_params params;
        uint64_t newer_field;
    } newer;
    REQUIRE(h2o_session_params_init(&newer.params, sizeof(newer)) == H2O_OK);
    newer.params.n_threads = 1;
    h2o_session *session = nullptr;
    CHECK(h2o_session_create(model, &newer.params, &session) == H2O_OK);
    h2o_session_free(session);
    session = nullptr;
    newer.newer_field = 7;  // a setting this library cannot honour
    CHECK(h2o_session_create(model, &newer.params, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("does not know") != std::string::npos);
    CHECK(session == nullptr);
    h2o_model_free(model);
}

TEST_CASE("abi: output structs are written up to the caller's struct_size") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));

    // An older (smaller) info struct gets its prefix; nothing beyond it is touched.
    struct {
        h2o_model_info info;
        unsigned char guard[8];
    } small;
    std::memset(&small, 0xEE, sizeof(small));
    const uint32_t first_version = offsetof(h2o_model_info, weight_bytes) + sizeof(uint64_t);
    small.info.struct_size = first_version;
    REQUIRE(h2o_model_get_info(m.model, &small.info) == H2O_OK);
    CHECK(small.info.n_vocab == 512);
    for (unsigned char b : small.guard) CHECK(b == 0xEE);
    small.info.struct_size = 12;
    CHECK(h2o_model_get_info(m.model, &small.info) == H2O_ERR_INVALID_ARGUMENT);

    // A newer (larger) stats struct: the fields this library does not know read 0.
    struct {
        h2o_generate_stats stats;
        uint64_t newer_field;
    } large;
    large.stats.struct_size = sizeof(large);
    large.newer_field = 99;
    REQUIRE(h2o_session_get_stats(m.session, &large.stats) == H2O_OK);
    CHECK(large.stats.struct_size == sizeof(large));
    CHECK(large.newer_field == 0);

    h2o_kv_layout layout;
    layout.struct_size = sizeof(layout);
    REQUIRE(h2o_session_get_kv_layout(m.session, &layout) == H2O_OK);
    CHECK(layout.n_ctx == 2048);  // the model's own context, under the default cap of 4096
}

TEST_CASE("abi: name functions list and parse every policy, KV type and backend") {
    using NameOf = const char *(*)(uint32_t);
    using FromName = h2o_status (*)(const char *, uint32_t *);
    const std::pair<NameOf, FromName> tables[] = {{h2o_kv_policy_name, h2o_kv_policy_from_name},
                                                  {h2o_kv_type_name, h2o_kv_type_from_name},
                                                  {h2o_backend_kind_name, h2o_backend_kind_from_name},
                                                  {h2o_experimental_name, h2o_experimental_from_name}};
    for (auto [name_of, from_name] : tables) {
        uint32_t count = 0;
        for (; name_of(count); ++count) {
            uint32_t value = 999;
            REQUIRE(from_name(name_of(count), &value) == H2O_OK);
            CHECK(value == count);
        }
        CHECK(count >= 4);
        uint32_t value = 999;
        CHECK(from_name("no-such-name", &value) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_last_error()).find("known:") != std::string::npos);
        CHECK(value == 999);
        CHECK(from_name(nullptr, &value) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(name_of(0xFFFFFFFFu) == nullptr);
    }
    CHECK(std::string(h2o_kv_policy_name(H2O_KV_SCISSORHANDS)) == "scissorhands");
    CHECK(std::string(h2o_kv_type_name(H2O_KV_TYPE_K8V4)) == "k8v4");
    CHECK(std::string(h2o_backend_kind_name(H2O_BACKEND_VULKAN)) == "vulkan");
}

TEST_CASE("abi: h2o_experimental_bounds gives the values each research setting accepts, and the documented ones") {
    h2o_session_params params;
    REQUIRE(h2o_session_params_init(&params, sizeof params) == H2O_OK);
    for (uint32_t key = 0; h2o_experimental_name(key); ++key) {
        CAPTURE(h2o_experimental_name(key));
        double min = 1, max = 0;
        REQUIRE(h2o_experimental_bounds(key, &min, &max) == H2O_OK);
        REQUIRE(min <= max);
        // The ends are accepted and what lies just outside them is not.
        CHECK(h2o_session_params_set_experimental(&params, key, min) == H2O_OK);
        CHECK(h2o_session_params_set_experimental(&params, key, max) == H2O_OK);
        const double step = std::max(1.0, std::abs(max)) * 1e-6;
        CHECK(h2o_session_params_set_experimental(&params, key, max + step) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(h2o_session_params_set_experimental(&params, key, min - step) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_last_error()).find(h2o_experimental_name(key)) != std::string::npos);
    }
    // Two of the header's documented ranges, as it states them.
    double min = 0, max = 0;
    REQUIRE(h2o_experimental_bounds(H2O_EXP_KV_LAYER_SLOPE, &min, &max) == H2O_OK);
    // Held as a float, as the session holds the setting.
    CHECK(static_cast<float>(min) == -0.9f);
    CHECK(static_cast<float>(max) == 0.9f);
    REQUIRE(h2o_experimental_bounds(H2O_EXP_KV_PROMPT_PROXY, &min, &max) == H2O_OK);
    CHECK(min == 0);
    CHECK(max == 4096);
    CHECK(h2o_experimental_bounds(0xFFFFFFFFu, &min, &max) == H2O_ERR_UNSUPPORTED);
    CHECK(h2o_experimental_bounds(H2O_EXP_KV_HEAD_SHARE, nullptr, &max) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_experimental_bounds(H2O_EXP_KV_HEAD_SHARE, &min, nullptr) == H2O_ERR_INVALID_ARGUMENT);
}

TEST_CASE("abi: out-of-range status and log level values are handled without undefined behaviour") {
    CHECK(std::string(h2o_status_string(-1)) == "unknown status");
    CHECK(std::string(h2o_status_string(1000)) == "unknown status");
    CHECK(std::string(h2o_status_string(H2O_ERR_CANCELLED)) == "cancelled");
    CHECK(h2o_set_log_callback(nullptr, nullptr, 99) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_set_log_callback(nullptr, nullptr, -1) == H2O_ERR_INVALID_ARGUMENT);
    // Restore the default (stderr, warnings and up) for the other tests.
    CHECK(h2o_set_log_callback(nullptr, nullptr, H2O_LOG_WARN) == H2O_OK);
}

TEST_CASE("abi: a session keeps its model alive after h2o_model_free") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session *a = nullptr, *b = nullptr;
    REQUIRE(h2o_session_create(model, nullptr, &a) == H2O_OK);
    REQUIRE(h2o_session_create(model, nullptr, &b) == H2O_OK);
    h2o_model_free(model);  // both sessions still run; ASan checks that nothing was freed early
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 8;
    CHECK(h2o_generate(a, "Once", 4, &gen, nullptr, nullptr) == H2O_OK);
    h2o_session_free(a);
    CHECK(h2o_generate(b, "Once", 4, &gen, nullptr, nullptr) == H2O_OK);
    h2o_session_free(b);
}

// A log callback that calls back into the library, as a real one may (it used to deadlock).
struct ReentrantLog {
    int calls = 0;
};

void reentrant_log(h2o_log_level, const char *, void *user_data) {
    auto *state = static_cast<ReentrantLog *>(user_data);
    ++state->calls;
    size_t count = 0;
    h2o_backend_count(&count);                                      // any call at all
    h2o_set_log_callback(reentrant_log, user_data, H2O_LOG_DEBUG);  // even this one
}

TEST_CASE("abi: the log callback may call into the library") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    ReentrantLog state;
    REQUIRE(h2o_set_log_callback(reentrant_log, &state, H2O_LOG_DEBUG) == H2O_OK);
    h2o_model *model = nullptr;
    h2o_session *session = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    CHECK(h2o_session_create(model, nullptr, &session) == H2O_OK);  // logs the backend choice
    h2o_set_log_callback(nullptr, nullptr, H2O_LOG_WARN);
    CHECK(state.calls > 0);
    h2o_session_free(session);
    h2o_model_free(model);
}

TEST_CASE("abi: load progress rises from 0 to 1, and a non-zero return cancels the load") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    struct Progress {
        std::vector<float> seen;
        size_t stop_after = SIZE_MAX;
    };
    auto record = [](float fraction, void *user_data) -> int {
        auto *p = static_cast<Progress *>(user_data);
        p->seen.push_back(fraction);
        return p->seen.size() > p->stop_after ? 1 : 0;
    };
    Progress progress;
    h2o_model_params mp;
    h2o_model_params_init(&mp, sizeof mp);
    mp.progress = record;
    mp.progress_user_data = &progress;
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), &mp, &model) == H2O_OK);
    h2o_model_free(model);
    REQUIRE(progress.seen.size() >= 3);
    CHECK(progress.seen.front() == 0.0f);
    CHECK(progress.seen.back() == 1.0f);
    for (size_t i = 1; i < progress.seen.size(); ++i) CHECK(progress.seen[i] >= progress.seen[i - 1]);

    for (size_t stop_after : {size_t{0}, size_t{2}, progress.seen.size() - 1}) {
        Progress cancelling;
        cancelling.stop_after = stop_after;
        mp.progress_user_data = &cancelling;
        model = nullptr;
        CHECK(h2o_model_load(path.c_str(), &mp, &model) == H2O_ERR_CANCELLED);
        CHECK(model == nullptr);
        CHECK(std::string(h2o_last_error()).find("cancelled") != std::string::npos);
    }
}

// Text of a whole generation through the pull-style API.
std::string pull_all(h2o_session *session, const char *prompt, const h2o_generate_params &gen, uint32_t *reason) {
    REQUIRE(h2o_generate_begin(session, prompt, std::strlen(prompt), &gen) == H2O_OK);
    std::string text;
    *reason = H2O_STOP_NONE;
    while (*reason == H2O_STOP_NONE) {
        const char *piece = nullptr;
        size_t length = 0;
        REQUIRE(h2o_generate_next(session, &piece, &length, reason) == H2O_OK);
        text.append(piece, length);
    }
    return text;
}

int collect(const char *text, size_t length, void *user_data) {
    static_cast<std::string *>(user_data)->append(text, length);
    return 0;
}

TEST_CASE("abi: pull-style generation produces exactly what h2o_generate produces") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    for (float temperature : {0.0f, 0.9f}) {
        CAPTURE(temperature);
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.n_threads = 1;
        sp.kv_budget = 48;  // evicting
        h2o_test::ApiSession pushed, pulled;
        REQUIRE(pushed.open(path, sp));
        REQUIRE(pulled.open(path, sp));
        h2o_generate_params gen;
        h2o_generate_params_init(&gen, sizeof gen);
        gen.max_tokens = 80;
        gen.temperature = temperature;
        gen.stop_at_eos = 0;
        for (const char *prompt : {"Once upon a time", " And then"}) {  // two turns of one conversation
            std::string expected;
            REQUIRE(h2o_generate(pushed.session, prompt, std::strlen(prompt), &gen, collect, &expected) == H2O_OK);
            uint32_t reason = H2O_STOP_NONE;
            CHECK(pull_all(pulled.session, prompt, gen, &reason) == expected);
            CHECK(reason == H2O_STOP_MAX_TOKENS);
        }
        const char *piece = nullptr;
        size_t length = 0;
        uint32_t reason = 0;
        CHECK(h2o_generate_next(pulled.session, &piece, &length, &reason) == H2O_ERR_INVALID_ARGUMENT);
    }
}

TEST_CASE("abi: a cancel from the token callback stops generation at the next token and the session continues") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    h2o_test::ApiSession cancelled, reference;
    REQUIRE(cancelled.open(path, sp));
    REQUIRE(reference.open(path, sp));
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.temperature = 0.0f;
    gen.stop_at_eos = 0;
    gen.max_tokens = 60;

    struct CancelAfter {
        h2o_session *session;
        int pieces = 0;
        std::string text;
    } state{cancelled.session, 0, {}};
    auto cancel_after_five = [](const char *text, size_t length, void *user_data) -> int {
        auto *s = static_cast<CancelAfter *>(user_data);
        s->text.append(text, length);
        if (++s->pieces == 5) h2o_session_cancel(s->session);
        return 0;
    };
    CHECK(h2o_generate(cancelled.session, "Once", 4, &gen, cancel_after_five, &state) == H2O_ERR_CANCELLED);
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    REQUIRE(h2o_session_get_stats(cancelled.session, &stats) == H2O_OK);
    CHECK(stats.n_generated_tokens < 60);
    // Continuing the cancelled conversation gives the same text as one uninterrupted greedy run.
    std::string rest;
    gen.max_tokens = 60 - stats.n_generated_tokens;
    REQUIRE(h2o_generate(cancelled.session, "", 0, &gen, collect, &rest) == H2O_OK);
    std::string whole;
    gen.max_tokens = 60;
    REQUIRE(h2o_generate(reference.session, "Once", 4, &gen, collect, &whole) == H2O_OK);
    CHECK(state.text + rest == whole);
}

TEST_CASE("abi: h2o_session_set_seed samples as a session created with that seed, and keeps the conversation") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    sp.seed = 99;
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 24;
    gen.temperature = 1.0f;
    const std::string prompt = "Once upon a time";
    h2o_test::ApiSession seeded;
    REQUIRE(seeded.open(path, sp));
    std::string expected;
    REQUIRE(h2o_generate(seeded.session, prompt.data(), prompt.size(), &gen, collect, &expected) == H2O_OK);

    sp.seed = 7;
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));
    REQUIRE(h2o_session_add_text(m.session, prompt.data(), prompt.size(), 0) == H2O_OK);
    h2o_session *other = nullptr;
    REQUIRE(h2o_session_fork(m.session, &other) == H2O_OK);
    REQUIRE(h2o_session_set_seed(m.session, 99) == H2O_OK);
    std::string text;
    REQUIRE(h2o_generate(m.session, "", 0, &gen, collect, &text) == H2O_OK);
    CHECK(text == expected);
    // The fork kept seed 7's generator: another text from the same state.
    std::string unseeded;
    REQUIRE(h2o_generate(other, "", 0, &gen, collect, &unseeded) == H2O_OK);
    CHECK(unseeded != expected);
    h2o_session_free(other);
    CHECK(h2o_session_set_seed(nullptr, 1) == H2O_ERR_INVALID_ARGUMENT);
}

TEST_CASE("abi: a cancel between two pull-style steps stops the next one, and the conversation goes on") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 50;
    REQUIRE(h2o_generate_begin(m.session, "Once", 4, &gen) == H2O_OK);
    const char *piece = nullptr;
    size_t length = 0;
    uint32_t reason = 0;
    REQUIRE(h2o_generate_next(m.session, &piece, &length, &reason) == H2O_OK);
    REQUIRE(h2o_session_cancel(m.session) == H2O_OK);
    CHECK(h2o_generate_next(m.session, &piece, &length, &reason) == H2O_ERR_CANCELLED);
    CHECK(h2o_generate_next(m.session, &piece, &length, &reason) == H2O_ERR_INVALID_ARGUMENT);  // it has ended
    CHECK(h2o_generate(m.session, " Then", 5, &gen, nullptr, nullptr) == H2O_OK);
}

TEST_CASE("abi: a cancel from another thread stops a long prompt between batches and keeps what was stored") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(text_path, "data/tinystories_val.txt");
    const std::string text = h2o_test::read_text_file(text_path).substr(0, 12000);
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    sp.n_batch = 8;
    sp.kv_budget = 64;
    sp.position_rolling = 1;
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));

    std::atomic<bool> started{false};
    std::thread canceller([&] {
        while (!started.load()) std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        h2o_session_cancel(m.session);
    });
    started = true;
    const h2o_status st = h2o_session_add_text(m.session, text.data(), text.size(), 0);
    canceller.join();
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
    if (st == H2O_OK) {
        MESSAGE("the prompt finished before the cancel arrived; nothing to check");
        return;
    }
    REQUIRE(st == H2O_ERR_CANCELLED);
    size_t total = 0;
    REQUIRE(h2o_tokenize(m.model, text.data(), text.size(), 1, nullptr, 0, &total) == H2O_ERR_BUFFER_TOO_SMALL);
    CHECK(stats.n_past < total);
    CHECK(stats.n_past % 8 == 0);  // whole batches only
    // The session goes on from where it stopped.
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 10;
    CHECK(h2o_generate(m.session, " The end.", 9, &gen, nullptr, nullptr) == H2O_OK);
    CHECK(h2o_session_cancel(nullptr) == H2O_ERR_INVALID_ARGUMENT);
}

// A synthetic model whose metadata claims a context length.
std::string model_with_context(uint32_t n_ctx, const std::string &name) {
    h2o::SyntheticModelSpec spec;
    spec.n_embd = 32;
    spec.n_layer = 1;
    spec.n_head = 2;
    spec.n_head_kv = 2;
    spec.n_ff = 64;
    spec.n_vocab = 300;
    spec.n_ctx = static_cast<int>(n_ctx);
    spec.type = h2o::TensorType::F32;
    const std::string path = h2o_test::temp_path(name);
    REQUIRE(h2o::write_synthetic_model(spec, path).ok());
    return path;
}

TEST_CASE("abi: a file's context length does not size a default session") {
    const std::string path = model_with_context(4194305, "huge_context.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session *session = nullptr;
    REQUIRE(h2o_session_create(model, nullptr, &session) == H2O_OK);
    h2o_kv_layout layout;
    layout.struct_size = sizeof(layout);
    REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
    CHECK(layout.n_ctx == 4096);
    CHECK(layout.budget == 4096);
    h2o_memory_report mem;
    mem.struct_size = sizeof(mem);
    REQUIRE(h2o_session_memory(session, &mem) == H2O_OK);
    CHECK(mem.kv_bytes < 8u << 20);
    h2o_session_free(session);
    h2o_model_free(model);
}

TEST_CASE("abi: absurd context lengths in the metadata are refused by name") {
    for (uint32_t n_ctx : {(1u << 24) + 1, 1u << 31, 0xFFFFFFFFu}) {
        const std::string path = model_with_context(n_ctx, "absurd_context.gguf");
        h2o_model *model = nullptr;
        CHECK(h2o_model_load(path.c_str(), nullptr, &model) == H2O_ERR_MODEL_FORMAT);
        CHECK(std::string(h2o_last_error()).find("llama.context_length") != std::string::npos);
        CHECK(model == nullptr);
    }
}

TEST_CASE("abi: precise messages for small budgets and contexts") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    h2o_session *session = nullptr;
    sp.kv_budget = 2;  // the default policy has no sinks: this is a valid, tiny cache
    CHECK(h2o_session_create(model, &sp, &session) == H2O_OK);
    h2o_session_free(session);
    session = nullptr;
    sp.kv_policy = H2O_KV_SINK_WINDOW;  // 4 sinks do not fit in 2 slots
    CHECK(h2o_session_create(model, &sp, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_sinks") != std::string::npos);
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 1;
    CHECK(h2o_session_create(model, &sp, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("n_ctx") != std::string::npos);
    CHECK(session == nullptr);
    h2o_model_free(model);
}

TEST_CASE("abi: the session memory cap refuses a session that needs more, naming both sizes") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    sp.kv_budget = 256;
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));
    h2o_memory_report mem;
    mem.struct_size = sizeof(mem);
    REQUIRE(h2o_session_memory(m.session, &mem) == H2O_OK);
    const uint64_t used = mem.kv_bytes + mem.scratch_bytes;

    h2o_session *session = nullptr;
    sp.max_memory_bytes = used;  // exactly enough
    CHECK(h2o_session_create(m.model, &sp, &session) == H2O_OK);
    h2o_session_free(session);
    session = nullptr;
    for (uint64_t cap : {used - 1, mem.kv_bytes / 2}) {
        sp.max_memory_bytes = cap;
        CHECK(h2o_session_create(m.model, &sp, &session) == H2O_ERR_OUT_OF_MEMORY);
        const std::string message = h2o_last_error();
        CHECK(message.find("max_memory_bytes allows " + std::to_string(cap)) != std::string::npos);
        CHECK(session == nullptr);
    }
}

TEST_CASE("abi: detokenize answers a size query without a buffer") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    const int32_t ids[] = {1, 400, 401};
    size_t needed = 0;
    const h2o_status st = h2o_detokenize(model, ids, 3, nullptr, 0, &needed);
    CHECK((st == H2O_OK || st == H2O_ERR_BUFFER_TOO_SMALL));
    const int32_t bos_only[] = {1};  // renders as nothing: the NULL buffer is never touched
    CHECK(h2o_detokenize(model, bos_only, 1, nullptr, 0, &needed) == H2O_OK);
    CHECK(needed == 0);
    h2o_model_free(model);
}

}  // namespace

namespace {

TEST_CASE("abi: a model file's errors name its path once") {
    const std::string path = h2o_test::temp_path("empty_model.gguf");
    std::ofstream(path, std::ios::binary).close();
    h2o_model *model = nullptr;
    CHECK(h2o_model_load(path.c_str(), nullptr, &model) == H2O_ERR_MODEL_FORMAT);
    const std::string message = h2o_last_error();
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find(path, message.find(path) + 1) == std::string::npos);
    CHECK(message.find("empty file") != std::string::npos);
}

}  // namespace
