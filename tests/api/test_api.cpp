// The C API's contract: argument validation, documented status codes, error messages, and what
// state is left after each failure.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "hf_tokenizer.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace {

// The model on the CPU backend with one thread (the tests are about the API, not speed).
struct ModelAndSession : h2o_test::ApiSession {
    explicit ModelAndSession(const std::string &path, uint32_t n_ctx = 0, uint32_t overflow = H2O_KV_OVERFLOW_EVICT) {
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.backend = H2O_BACKEND_CPU;
        sp.n_threads = 1;
        sp.n_ctx = n_ctx;
        sp.kv_overflow = overflow;
        REQUIRE_MESSAGE(open(path, sp), h2o_last_error());
    }
};

int collect(const char *text, size_t length, void *user_data) {
    static_cast<std::string *>(user_data)->append(text, length);
    return 0;
}

int stop_after_first(const char *, size_t, void *user_data) {
    ++*static_cast<int *>(user_data);
    return 1;
}

}  // namespace

TEST_CASE("version and status strings") {
    CHECK(h2o_version_number() == H2O_VERSION_NUMBER);
    CHECK(std::string(h2o_version()) == "0.7.0");
    for (int code = H2O_OK; code <= H2O_ERR_BACKEND_FAILED; ++code) {
        CHECK(std::string(h2o_status_string(static_cast<h2o_status>(code))) != "unknown status");
    }
    CHECK(std::string(h2o_status_string(static_cast<h2o_status>(999))) == "unknown status");
}

TEST_CASE("model loading rejects bad arguments and paths with clear errors") {
    h2o_model *model = nullptr;
    CHECK(h2o_model_load(nullptr, nullptr, &model) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("path is NULL") != std::string::npos);
    CHECK(h2o_model_load("x.gguf", nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_model_load("/nonexistent/model.gguf", nullptr, &model) == H2O_ERR_IO);
    CHECK(std::string(h2o_last_error()).find("/nonexistent/model.gguf") != std::string::npos);
    CHECK(model == nullptr);

    const std::string dir = h2o_test::temp_path("a_directory.gguf");
    std::filesystem::create_directories(dir);
    CHECK(h2o_model_load(dir.c_str(), nullptr, &model) == H2O_ERR_IO);
    CHECK(std::string(h2o_last_error()).find("directory") != std::string::npos);
    CHECK(model == nullptr);

    h2o_model_params mp;
    h2o_model_params_init(&mp, sizeof mp);
    mp.struct_size = 4;
    CHECK(h2o_model_load("x.gguf", &mp, &model) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("struct_size") != std::string::npos);
    // A newer caller's struct with a field this library does not know set.
    struct {
        h2o_model_params params;
        uint64_t newer_field;
    } newer;
    h2o_model_params_init(&newer.params, sizeof newer);
    newer.newer_field = 1;
    CHECK(h2o_model_load("x.gguf", &newer.params, &model) == H2O_ERR_INVALID_ARGUMENT);
    // A cache policy that is none, refused by name before the file is opened.
    h2o_model_params_init(&mp, sizeof mp);
    CHECK(mp.prefix_cache_policy == H2O_CACHE_POLICY_REUSE);
    mp.prefix_cache_policy = 7;
    CHECK(h2o_model_load("x.gguf", &mp, &model) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("prefix_cache_policy is 7") != std::string::npos);
    CHECK(model == nullptr);
}

TEST_CASE("calls with NULL handles fail with H2O_ERR_INVALID_ARGUMENT") {
    h2o_session *session = nullptr;
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    size_t n = 0;
    int32_t ids[4];
    char text[8];
    float logits[4];
    CHECK(h2o_session_create(nullptr, nullptr, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_reset(nullptr) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_generate(nullptr, "", std::strlen(""), &gen, nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_tokenize(nullptr, "a", 1, 1, ids, 4, &n) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_detokenize(nullptr, ids, 0, text, sizeof(text), &n) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_decode(nullptr, ids, 1) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_logits(nullptr, logits, 4) == H2O_ERR_INVALID_ARGUMENT);
    h2o_model_info info;
    info.struct_size = sizeof(info);
    CHECK(h2o_model_get_info(nullptr, &info) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_session_last_error(nullptr)).empty());
    h2o_session_free(nullptr);
    h2o_model_free(nullptr);
}

TEST_CASE("session and generation parameters are validated") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    ModelAndSession m(path);

    SUBCASE("struct_size too small, or a newer struct with an unknown field set") {
        struct {
            h2o_session_params params;
            uint32_t newer_field;
        } sp;
        h2o_session_params_init(&sp.params, sizeof sp);
        h2o_session *other = nullptr;
        sp.params.struct_size = 8;
        CHECK(h2o_session_create(m.model, &sp.params, &other) == H2O_ERR_INVALID_ARGUMENT);
        sp.params.struct_size = sizeof sp;
        sp.newer_field = 7;
        CHECK(h2o_session_create(m.model, &sp.params, &other) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_last_error()).find("does not know") != std::string::npos);
        CHECK(other == nullptr);

        h2o_generate_params gen;
        h2o_generate_params_init(&gen, sizeof gen);
        gen.struct_size = 3;
        CHECK(h2o_generate(m.session, "hi", std::strlen("hi"), &gen, nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_session_last_error(m.session)).find("struct_size") != std::string::npos);
    }
    SUBCASE("zero max tokens and out-of-range sampling values") {
        h2o_generate_params gen;
        h2o_generate_params_init(&gen, sizeof gen);
        gen.max_tokens = 0;
        CHECK(h2o_generate(m.session, "hi", std::strlen("hi"), &gen, nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_session_last_error(m.session)).find("max_tokens") != std::string::npos);
        h2o_generate_params_init(&gen, sizeof gen);
        gen.top_p = 0.0f;
        CHECK(h2o_generate(m.session, "hi", std::strlen("hi"), &gen, nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
        h2o_generate_params_init(&gen, sizeof gen);
        gen.temperature = -1.0f;
        CHECK(h2o_generate(m.session, "hi", std::strlen("hi"), &gen, nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
        h2o_generate_params_init(&gen, sizeof gen);
        gen.n_stop_strings = 1;
        CHECK(h2o_generate(m.session, "hi", std::strlen("hi"), &gen, nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
        // Nothing was added to the session by the failed calls.
        h2o_generate_stats stats;
        stats.struct_size = sizeof(stats);
        REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
        CHECK(stats.n_past == 0);
    }
    SUBCASE("out-of-range real numbers are written as people write them, not as raw floats") {
        auto refusal = [&](void (*set)(h2o_session_params *)) {
            h2o_session_params sp;
            h2o_session_params_init(&sp, sizeof sp);
            sp.backend = H2O_BACKEND_CPU;
            sp.kv_budget = 32;
            set(&sp);
            h2o_session *other = nullptr;
            CHECK(h2o_session_create(m.model, &sp, &other) == H2O_ERR_INVALID_ARGUMENT);
            CHECK(other == nullptr);
            return std::string(h2o_last_error());
        };
        CHECK(refusal([](h2o_session_params *sp) { sp->experimental[H2O_EXP_KV_HEAD_SHARE] = 2.0f; }) ==
              "kv_head_share 2 must lie in [0, 0.9]");
        CHECK(refusal([](h2o_session_params *sp) { sp->experimental[H2O_EXP_KV_LAYER_SLOPE] = 1.5f; }) ==
              "kv_layer_slope 1.5 must lie in [-0.9, 0.9]");
        CHECK(refusal([](h2o_session_params *sp) { sp->experimental[H2O_EXP_KV_PROMPT_RANDOM_SHARE] = 1.25f; }) ==
              "kv_prompt_random_share 1.25 must lie in [0, 1]");
        CHECK(h2o_session_add_span_text(m.session, 1, 1.5f, "hi", 2, 0) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_session_last_error(m.session)) == "a retention span's min_share must lie in [0, 1], not 1.5");
    }
    SUBCASE("a NULL prompt is an error, invalid UTF-8 is H2O_ERR_INVALID_TEXT and adds nothing") {
        h2o_generate_params gen;
        h2o_generate_params_init(&gen, sizeof gen);
        CHECK(h2o_generate(m.session, nullptr, 1, &gen, nullptr, nullptr) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(h2o_generate(m.session, "bad \xC3\x28 text", std::strlen("bad \xC3\x28 text"), &gen, nullptr, nullptr) ==
              H2O_ERR_INVALID_TEXT);
        CHECK(std::string(h2o_session_last_error(m.session)).find("UTF-8") != std::string::npos);
        h2o_generate_stats stats;
        stats.struct_size = sizeof(stats);
        REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
        CHECK(stats.n_past == 0);
    }
    SUBCASE("out-of-vocabulary ids are rejected before anything is processed") {
        const int32_t ids[3] = {1, 5, 100000};
        CHECK(h2o_session_decode(m.session, ids, 3) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_session_last_error(m.session)).find("100000") != std::string::npos);
        float logits[512];
        CHECK(h2o_session_get_logits(m.session, logits, 512) == H2O_ERR_INVALID_ARGUMENT);  // nothing processed
        CHECK(h2o_session_get_logits(m.session, logits, 10) == H2O_ERR_BUFFER_TOO_SMALL);
    }
}

TEST_CASE("an empty prompt is valid and generates from BOS alone") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    ModelAndSession m(path);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 10;
    gen.temperature = 0.0f;
    std::string text;
    REQUIRE(h2o_generate(m.session, "", std::strlen(""), &gen, collect, &text) == H2O_OK);
    CHECK(text.rfind("Once upon a time", 0) == 0);
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
    CHECK(stats.n_prompt_tokens == 1);
    CHECK(stats.n_generated_tokens == 10);
    CHECK(stats.stop_reason == H2O_STOP_MAX_TOKENS);
}

TEST_CASE("a callback returning non-zero stops generation cleanly") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    ModelAndSession m(path);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 50;
    int calls = 0;
    REQUIRE(h2o_generate(m.session, "Once", std::strlen("Once"), &gen, stop_after_first, &calls) == H2O_OK);
    CHECK(calls == 1);
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
    CHECK(stats.stop_reason == H2O_STOP_CALLBACK);
    // The session continues afterwards.
    std::string more;
    REQUIRE(h2o_generate(m.session, "", std::strlen(""), &gen, collect, &more) == H2O_OK);
    CHECK(!more.empty());
}

TEST_CASE("stop strings end generation and are not delivered") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    ModelAndSession m(path);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 100;
    gen.temperature = 0.0f;
    const char *stops[] = {"Lily"};
    gen.stop_strings = stops;
    gen.n_stop_strings = 1;
    std::string text;
    REQUIRE(h2o_generate(m.session, "Once upon a time", std::strlen("Once upon a time"), &gen, collect, &text) == H2O_OK);
    // Greedy: ", there was a little girl named Lily. ..." stops right before "Lily".
    CHECK(text == ", there was a little girl named ");
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
    CHECK(stats.stop_reason == H2O_STOP_STRING);
}

TEST_CASE("with kv_overflow = error, a full context returns H2O_ERR_CONTEXT_FULL and keeps what was processed") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    ModelAndSession m(path, 16, H2O_KV_OVERFLOW_ERROR);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 100;
    gen.temperature = 0.0f;
    std::string text;
    CHECK(h2o_generate(m.session, "Once upon a time", std::strlen("Once upon a time"), &gen, collect, &text) == H2O_ERR_CONTEXT_FULL);
    CHECK(std::string(h2o_session_last_error(m.session)).find("full") != std::string::npos);
    CHECK(!text.empty());
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
    CHECK(stats.n_past == 16);
    // A prompt that cannot fit is refused whole.
    CHECK(h2o_generate(m.session, "more text here", std::strlen("more text here"), &gen, collect, &text) == H2O_ERR_CONTEXT_FULL);
    REQUIRE(h2o_session_reset(m.session) == H2O_OK);
    REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
    CHECK(stats.n_past == 0);
}

TEST_CASE("H2O_TOKENIZE_VOCAB_BOS prepends BOS exactly when the vocabulary asks for one") {
    // Both ways a vocabulary says: sentencepiece's default (stories260K: yes) and GPT-2's
    // byte-level BPE without tokenizer.ggml.add_bos_token (llama.cpp's default for it: no).
    H2O_SHARED_FILE_OR_SKIP(sentencepiece, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(gpt2_vocabulary, "vocab/ggml-vocab-gpt-2.gguf");
    h2o::SyntheticModelSpec spec;
    spec.n_embd = 32;
    spec.n_layer = 1;
    spec.n_head = spec.n_head_kv = 2;
    spec.n_ff = 32;
    int32_t n_tokens = 0;
    REQUIRE(h2o::read_vocabulary(gpt2_vocabulary, &n_tokens, &spec.write_vocabulary).ok());
    spec.n_vocab = n_tokens;
    const std::string gpt2 = h2o_test::temp_path("vocab-bos-gpt2.gguf");
    REQUIRE(h2o::write_synthetic_model(spec, gpt2).ok());
    struct Case {
        std::string path;
        bool vocabulary_adds_bos;
    };
    for (const Case &c : {Case{sentencepiece, true}, Case{gpt2, false}}) {
        INFO(c.path);
        h2o_model *model = nullptr;
        REQUIRE(h2o_model_load(c.path.c_str(), nullptr, &model) == H2O_OK);
        h2o_model_info info;
        info.struct_size = sizeof info;
        REQUIRE(h2o_model_get_info(model, &info) == H2O_OK);
        REQUIRE(info.bos_token >= 0);
        const auto tokenize = [&](uint32_t flags) {
            std::vector<int32_t> ids(64);
            size_t n = 0;
            REQUIRE(h2o_tokenize(model, "Once upon a time", 16, flags, ids.data(), ids.size(), &n) == H2O_OK);
            ids.resize(n);
            return ids;
        };
        const std::vector<int32_t> plain = tokenize(0), with_bos = tokenize(H2O_TOKENIZE_ADD_BOS);
        CHECK(with_bos.front() == info.bos_token);
        CHECK(tokenize(H2O_TOKENIZE_VOCAB_BOS) == (c.vocabulary_adds_bos ? with_bos : plain));
        CHECK(tokenize(H2O_TOKENIZE_VOCAB_BOS | H2O_TOKENIZE_ADD_BOS) == with_bos);
        size_t n = 0;
        CHECK(h2o_tokenize(model, "a", 1, 8u, nullptr, 0, &n) == H2O_ERR_INVALID_ARGUMENT);
        h2o_model_free(model);
    }
    std::remove(gpt2.c_str());
}

TEST_CASE("tokenize and detokenize report needed sizes") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    ModelAndSession m(path);
    const char *text = "Once upon a time";
    size_t n = 0;
    CHECK(h2o_tokenize(m.model, text, std::strlen(text), 1, nullptr, 0, &n) == H2O_ERR_BUFFER_TOO_SMALL);
    REQUIRE(n > 1);
    std::vector<int32_t> ids(n);
    REQUIRE(h2o_tokenize(m.model, text, std::strlen(text), 1, ids.data(), ids.size(), &n) == H2O_OK);
    CHECK(ids[0] == 1);
    size_t bytes = 0;
    CHECK(h2o_detokenize(m.model, ids.data(), ids.size(), nullptr, 0, &bytes) == H2O_ERR_BUFFER_TOO_SMALL);
    std::vector<char> out(bytes + 1);
    REQUIRE(h2o_detokenize(m.model, ids.data(), ids.size(), out.data(), out.size(), &bytes) == H2O_OK);
    CHECK(std::string(out.data()) == text);
    const int32_t bad = 4096;
    CHECK(h2o_detokenize(m.model, &bad, 1, out.data(), out.size(), &bytes) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_tokenize(m.model, "\xFF", 1, 0, ids.data(), ids.size(), &n) == H2O_ERR_INVALID_TEXT);

    h2o_model_info info;
    info.struct_size = sizeof(info);
    REQUIRE(h2o_model_get_info(m.model, &info) == H2O_OK);
    CHECK(info.n_vocab == 512);
    CHECK(info.n_layer == 5);
    CHECK(info.n_head == 8);
    CHECK(info.n_head_kv == 4);
    CHECK(info.n_embd == 64);
    CHECK(info.head_dim == 8);
    CHECK(info.n_ff == 172);
    CHECK(info.n_ctx_train == 2048);
    CHECK(info.bos_token == 1);
    CHECK(info.eos_token == 2);
    // embeddings + output + final norm + 5 layers of (q, o: 64x64; k, v: 64x32; 2 norms; 3 FFN: 64x172)
    const uint64_t params = 512 * 64 * 2 + 64 + 5 * (2 * 64 * 64 + 2 * 64 * 32 + 2 * 64 + 3 * 64 * 172);
    CHECK(info.n_params == params);
    CHECK(info.weight_bytes == params * 4);  // all F32
    info.struct_size = 12;
    CHECK(h2o_model_get_info(m.model, &info) == H2O_ERR_INVALID_ARGUMENT);
}

TEST_CASE("backends are listed, selected explicitly or automatically, and unavailable ones refused") {
    size_t count = 0;
    REQUIRE(h2o_backend_count(&count) == H2O_OK);
    REQUIRE(count >= 1);
    CHECK(h2o_backend_count(nullptr) == H2O_ERR_INVALID_ARGUMENT);
    h2o_backend_info info;
    info.struct_size = sizeof(info);
    REQUIRE(h2o_backend_get_info(0, &info) == H2O_OK);
    CHECK(info.kind == H2O_BACKEND_CPU);
    CHECK(std::string(info.device_type) == "cpu");
    CHECK(h2o_backend_get_info(count, &info) == H2O_ERR_INVALID_ARGUMENT);
    info.struct_size = 8;
    CHECK(h2o_backend_get_info(0, &info) == H2O_ERR_INVALID_ARGUMENT);

    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    h2o_session *session = nullptr;

    sp.backend = H2O_BACKEND_CUDA;
    CHECK(h2o_session_create(model, &sp, &session) == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(std::string(h2o_last_error()).find("CUDA") != std::string::npos);
    sp.backend = H2O_BACKEND_VULKAN;
    sp.device_index = 99;
    CHECK(h2o_session_create(model, &sp, &session) == H2O_ERR_BACKEND_UNAVAILABLE);
    const uint32_t unknown_backend = 42;  // as a C caller could store it
    std::memcpy(&sp.backend, &unknown_backend, sizeof(unknown_backend));
    CHECK(h2o_session_create(model, &sp, &session) == H2O_ERR_INVALID_ARGUMENT);
    sp.backend = H2O_BACKEND_AUTO;
    sp.device_index = 0;
    CHECK(h2o_session_create(model, &sp, &session) == H2O_ERR_INVALID_ARGUMENT);  // a device needs a backend
    CHECK(session == nullptr);

    // Auto always gives a session; which backend it chose is reported.
    sp.device_index = -1;
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    h2o_backend_info chosen;
    chosen.struct_size = sizeof(chosen);
    REQUIRE(h2o_session_get_backend(session, &chosen) == H2O_OK);
    CHECK((chosen.kind == H2O_BACKEND_CPU || chosen.kind == H2O_BACKEND_VULKAN));
    CHECK(std::strlen(chosen.name) > 0);
    h2o_session_free(session);

    sp.backend = H2O_BACKEND_CPU;
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    REQUIRE(h2o_session_get_backend(session, &chosen) == H2O_OK);
    CHECK(chosen.kind == H2O_BACKEND_CPU);
    // The CPU backend works in host memory: nothing is transferred.
    h2o_device_traffic traffic;
    traffic.struct_size = sizeof(traffic);
    REQUIRE(h2o_generate(session, "Once", std::strlen("Once"), nullptr, nullptr, nullptr) == H2O_OK);
    REQUIRE(h2o_session_get_device_traffic(session, &traffic) == H2O_OK);
    CHECK(traffic.bytes_to_device == 0);
    CHECK(traffic.submissions == 0);
    traffic.struct_size = 3;
    CHECK(h2o_session_get_device_traffic(session, &traffic) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_device_traffic(nullptr, &traffic) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_backend(nullptr, &chosen) == H2O_ERR_INVALID_ARGUMENT);
    h2o_session_free(session);
    h2o_model_free(model);
}

TEST_CASE("the resolved KV layout is reported, and bad arguments are refused") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = H2O_BACKEND_CPU;
    sp.kv_budget = 64;
    sp.kv_type = H2O_KV_TYPE_K8V4;
    h2o_test::ApiSession m;
    REQUIRE_MESSAGE(m.open(path, sp), h2o_last_error());
    h2o_kv_layout layout;
    layout.struct_size = sizeof(layout);
    REQUIRE(h2o_session_get_kv_layout(m.session, &layout) == H2O_OK);
    CHECK(layout.budget == 64);
    CHECK(layout.policy == H2O_KV_SCISSORHANDS);
    CHECK(layout.recent == 56);  // the default 7/8 of the budget
    CHECK(layout.type == H2O_KV_TYPE_K8V4);
    CHECK(h2o_session_get_kv_layout(nullptr, &layout) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_kv_layout(m.session, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    layout.struct_size = 2;
    CHECK(h2o_session_get_kv_layout(m.session, &layout) == H2O_ERR_INVALID_ARGUMENT);

    h2o_generate_stats stats;
    stats.struct_size = 2;
    CHECK(h2o_session_get_stats(m.session, &stats) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_stats(m.session, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_stats(nullptr, &stats) == H2O_ERR_INVALID_ARGUMENT);

    h2o_session_params bad;
    h2o_session_params_init(&bad, sizeof bad);
    const uint32_t unknown = 99;
    std::memcpy(&bad.kv_type, &unknown, sizeof(unknown));
    h2o_session *session = nullptr;
    CHECK(h2o_session_create(m.model, &bad, &session) == H2O_ERR_INVALID_ARGUMENT);
    h2o_session_params_init(&bad, sizeof bad);
    std::memcpy(&bad.kv_policy, &unknown, sizeof(unknown));
    CHECK(h2o_session_create(m.model, &bad, &session) == H2O_ERR_INVALID_ARGUMENT);
    h2o_session_params_init(&bad, sizeof bad);
    bad.kv_recent_ratio = 1.5f;
    CHECK(h2o_session_create(m.model, &bad, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(session == nullptr);
}
