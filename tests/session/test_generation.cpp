// End-to-end generation on the real stories260K model: parity with independent implementations
// (../shared/golden), batched versus token-by-token processing, and seeded determinism.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "h2o/h2o.h"
#include "test_util.h"

namespace {

using h2o_test::ApiSession;
using h2o_test::append_text;

void load(const std::string &path, ApiSession *out, uint32_t n_threads = 2, uint32_t n_batch = 0, uint64_t seed = 0x5EED) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = H2O_BACKEND_CPU;  // the reference
    sp.n_threads = n_threads;
    sp.n_batch = n_batch;
    sp.seed = seed;
    REQUIRE_MESSAGE(out->open(path, sp), h2o_last_error());
}

std::string generate(h2o_session *session, const std::string &prompt, uint32_t max_tokens, float temperature = 0.0f) {
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = max_tokens;
    gen.temperature = temperature;
    std::string text;
    const h2o_status st = h2o_generate(session, prompt.data(), prompt.size(), &gen, append_text, &text);
    INFO(h2o_session_last_error(session));
    REQUIRE(st == H2O_OK);
    return text;
}

}  // namespace

TEST_CASE("greedy decoding from BOS reproduces llama2.c's output for 200 positions") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(golden_path, "golden/stories260K-greedy200-llama2c.txt");
    ApiSession m;
    load(model_path, &m);
    // llama2.c runs 200 forward passes, at positions 0 (BOS) to 199, and prints the token each
    // one predicts: 200 generated tokens.
    const std::string text = generate(m.session, "", 200);
    std::string golden = h2o_test::read_text_file(golden_path);
    while (!golden.empty() && golden.back() == '\n') golden.pop_back();
    CHECK(text == golden);
}

TEST_CASE("greedy continuations match llama.cpp for the golden prompts") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(golden_path, "golden/stories260K-greedy-llamacpp.jsonl");
    const auto cases = h2o_test::read_golden_continuations(golden_path);
    CHECK(cases.size() == 5);
    for (const auto &golden : cases) {
        ApiSession m;
        load(model_path, &m);
        const std::string text = generate(m.session, golden.prompt, 120);
        INFO("prompt: " << golden.prompt);
        CHECK(text == golden.continuation);
    }
}

TEST_CASE("batched prompt processing gives the same logits as token-by-token processing") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    ApiSession batched, single;
    load(model_path, &batched, 2, 64);
    load(model_path, &single, 1, 1);
    const char *text = "Tom and his dog went to the park. They saw a big tree and a little bird. The bird sang a song.";
    std::vector<int32_t> ids(256);
    size_t n = 0;
    REQUIRE(h2o_tokenize(batched.model, text, std::strlen(text), 1, ids.data(), ids.size(), &n) == H2O_OK);
    REQUIRE(n > 20);
    REQUIRE(h2o_session_decode(batched.session, ids.data(), n) == H2O_OK);
    for (size_t i = 0; i < n; ++i) REQUIRE(h2o_session_decode(single.session, &ids[i], 1) == H2O_OK);

    h2o_model_info info;
    info.struct_size = sizeof(info);
    REQUIRE(h2o_model_get_info(batched.model, &info) == H2O_OK);
    std::vector<float> a(info.n_vocab), b(info.n_vocab);
    REQUIRE(h2o_session_get_logits(batched.session, a.data(), a.size()) == H2O_OK);
    REQUIRE(h2o_session_get_logits(single.session, b.data(), b.size()) == H2O_OK);
    double largest = 0, max_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        largest = std::max(largest, std::fabs(static_cast<double>(b[i])));
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    // Relative to the largest logit magnitude.
    INFO("max difference " << max_diff << ", largest logit " << largest);
    CHECK(max_diff <= 1e-4 * largest);
}

TEST_CASE("the same seed gives the same text, another seed another text") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    std::string texts[3];
    const uint64_t seeds[3] = {42, 42, 7};
    for (int i = 0; i < 3; ++i) {
        ApiSession m;
        load(model_path, &m, 2, 0, seeds[i]);
        texts[i] = generate(m.session, "Once upon a time", 80, 1.0f);
    }
    CHECK(texts[0] == texts[1]);
    CHECK(texts[0] != texts[2]);
    // Reset restores the seed: the same session repeats itself.
    ApiSession m;
    load(model_path, &m, 2, 0, 42);
    const std::string first = generate(m.session, "Once upon a time", 80, 1.0f);
    REQUIRE(h2o_session_reset(m.session) == H2O_OK);
    CHECK(generate(m.session, "Once upon a time", 80, 1.0f) == first);
    CHECK(first == texts[0]);
}
