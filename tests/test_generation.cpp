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

struct Loaded {
    h2o_model *model = nullptr;
    h2o_session *session = nullptr;
    ~Loaded() {
        h2o_session_free(session);
        h2o_model_free(model);
    }
};

bool load(const std::string &path, Loaded *out, uint32_t n_threads = 2, uint32_t n_batch = 0, uint64_t seed = 0x5EED) {
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &out->model) == H2O_OK);
    h2o_session_params sp = h2o_session_params_default();
    sp.n_threads = n_threads;
    sp.n_batch = n_batch;
    sp.seed = seed;
    REQUIRE(h2o_session_create(out->model, &sp, &out->session) == H2O_OK);
    return true;
}

int append_text(const char *text, size_t length, void *user_data) {
    static_cast<std::string *>(user_data)->append(text, length);
    return 0;
}

std::string generate(h2o_session *session, const std::string &prompt, uint32_t max_tokens, float temperature = 0.0f) {
    h2o_generate_params gen = h2o_generate_params_default();
    gen.max_tokens = max_tokens;
    gen.temperature = temperature;
    std::string text;
    const h2o_status st = h2o_generate(session, prompt.c_str(), &gen, append_text, &text);
    INFO(h2o_session_last_error(session));
    REQUIRE(st == H2O_OK);
    return text;
}

std::string read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The value of a string field in a one-line JSON object (handles the escapes JSON allows).
std::string json_string_field(const std::string &line, const std::string &field) {
    const std::string key = "\"" + field + "\": \"";
    size_t i = line.find(key);
    REQUIRE(i != std::string::npos);
    i += key.size();
    std::string out;
    while (i < line.size() && line[i] != '"') {
        char c = line[i++];
        if (c != '\\') {
            out += c;
            continue;
        }
        c = line[i++];
        switch (c) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'u': {
                const unsigned cp = static_cast<unsigned>(std::stoul(line.substr(i, 4), nullptr, 16));
                i += 4;
                REQUIRE(cp < 0xD800);  // the golden files hold no surrogate pairs
                if (cp < 0x80) {
                    out += static_cast<char>(cp);
                } else if (cp < 0x800) {
                    out += static_cast<char>(0xC0 | (cp >> 6));
                    out += static_cast<char>(0x80 | (cp & 0x3F));
                } else {
                    out += static_cast<char>(0xE0 | (cp >> 12));
                    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                    out += static_cast<char>(0x80 | (cp & 0x3F));
                }
                break;
            }
            default: out += c;  // \" \\ \/
        }
    }
    return out;
}

}  // namespace

TEST_CASE("greedy decoding from BOS reproduces llama2.c's output for 200 positions") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(golden_path, "golden/stories260K-greedy200-llama2c.txt");
    Loaded m;
    load(model_path, &m);
    // llama2.c runs 200 forward passes, at positions 0 (BOS) to 199, and prints the token each
    // one predicts: 200 generated tokens.
    const std::string text = generate(m.session, "", 200);
    std::string golden = read_file(golden_path);
    while (!golden.empty() && golden.back() == '\n') golden.pop_back();
    CHECK(text == golden);
}

TEST_CASE("greedy continuations match llama.cpp for the golden prompts") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(golden_path, "golden/stories260K-greedy-llamacpp.jsonl");
    std::ifstream in(golden_path);
    std::string line;
    int cases = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        const std::string prompt = json_string_field(line, "prompt");
        const std::string expected = json_string_field(line, "continuation");
        Loaded m;
        load(model_path, &m);
        const std::string text = generate(m.session, prompt, 120);
        INFO("prompt: " << prompt);
        CHECK(text == expected);
        ++cases;
    }
    CHECK(cases == 5);
}

TEST_CASE("batched prompt processing gives the same logits as token-by-token processing") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    Loaded batched, single;
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
        Loaded m;
        load(model_path, &m, 2, 0, seeds[i]);
        texts[i] = generate(m.session, "Once upon a time", 80, 1.0f);
    }
    CHECK(texts[0] == texts[1]);
    CHECK(texts[0] != texts[2]);
    // Reset restores the seed: the same session repeats itself.
    Loaded m;
    load(model_path, &m, 2, 0, 42);
    const std::string first = generate(m.session, "Once upon a time", 80, 1.0f);
    REQUIRE(h2o_session_reset(m.session) == H2O_OK);
    CHECK(generate(m.session, "Once upon a time", 80, 1.0f) == first);
    CHECK(first == texts[0]);
}
