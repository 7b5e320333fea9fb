// The llama (Llama 3 style), qwen2, qwen3, phi3, gemma2 and gemma3 graphs, with synthetic and real
// vocabularies, against llama.cpp: the goldens of tests/data/architecture_goldens (see its README
// for the models and the command that made them), on the CPU and, where there is a device, on
// Vulkan and CUDA.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "doctest/doctest.h"
#include "h2o/h2o.h"
#include "hf_tokenizer.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace {

// One line of a golden file.
struct Golden {
    std::string prompt;
    bool parse_special = false;  // the prompt's control-token texts are those tokens
    std::string chat_user;       // non-empty: the prompt is this user message in the model's chat format
    std::vector<int32_t> prompt_ids, continuation_ids;
    std::vector<std::pair<int32_t, double>> top_logits;
};

// The numbers of the JSON array `field` holds (nested arrays flattened), in order.
std::vector<double> numbers_of(const std::string &line, const std::string &field) {
    const std::string key = "\"" + field + "\":[";
    size_t i = line.find(key);
    if (i == std::string::npos) throw std::runtime_error("no field '" + field + "' in: " + line);
    i += key.size();
    std::vector<double> out;
    for (int depth = 1; depth > 0 && i < line.size();) {
        const char c = line[i];
        if (c == '[') {
            ++depth;
            ++i;
        } else if (c == ']') {
            --depth;
            ++i;
        } else if (c == ',' || c == ' ') {
            ++i;
        } else {
            size_t used = 0;
            out.push_back(std::stod(line.substr(i), &used));
            i += used;
        }
    }
    return out;
}

// The JSON string `field` holds, or "" when the line has no such field.
std::string string_field(const std::string &line, const std::string &field) {
    // llama_golden writes the JSON escapes json_string_field reads, without its space after ':'.
    const std::string key = "\"" + field + "\":\"";
    const size_t at = line.find(key);
    if (at == std::string::npos) return "";
    std::string spaced = line;
    spaced.insert(at + key.size() - 1, " ");
    return h2o_test::json_string_field(spaced, field);
}

std::vector<Golden> read_goldens(const std::string &path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::vector<Golden> goldens;
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        Golden g;
        if (line.find("\"prompt\":\"") == std::string::npos) throw std::runtime_error("no prompt in: " + line);
        g.prompt = string_field(line, "prompt");
        g.chat_user = string_field(line, "chat_user");
        g.parse_special = line.find("\"parse_special\":true") != std::string::npos;
        for (double v : numbers_of(line, "prompt_ids")) g.prompt_ids.push_back(static_cast<int32_t>(v));
        for (double v : numbers_of(line, "continuation_ids")) g.continuation_ids.push_back(static_cast<int32_t>(v));
        const std::vector<double> pairs = numbers_of(line, "top_logits");
        for (size_t k = 0; k + 1 < pairs.size(); k += 2) g.top_logits.push_back({static_cast<int32_t>(pairs[k]), pairs[k + 1]});
        goldens.push_back(std::move(g));
    }
    return goldens;
}

// The models of the README, written by the same code with the same settings as h2o-synth's.
h2o::SyntheticModelSpec golden_model(const std::string &name) {
    h2o::SyntheticModelSpec s;  // h2o-synth's defaults: seed 1, context 2048
    s.type = h2o::TensorType::F32;
    s.n_embd = 256;
    s.n_layer = 4;
    s.n_ff = 512;
    s.n_vocab = 2000;
    if (name == "llama3") {
        s.architecture = "llama";
        s.n_head = 8;
        s.n_head_kv = 2;
        s.tied_output = true;
        s.embedding_scale = 0.0625f;
        s.rope_freqs = true;
        s.rope_freq_base = 500000.0f;
    } else if (name == "qwen2") {
        s.architecture = "qwen2";
        s.n_head = 4;
        s.n_head_kv = 2;
        s.rope_freq_base = 1000000.0f;
    } else if (name == "phi3") {
        // Fused projections, rotation of the first 16 of 32 dimensions.
        s.architecture = "phi3";
        s.n_head = 8;
        s.n_head_kv = 2;
        s.rope_dims = 16;
        s.n_ctx = 4096;
    } else if (name == "phi3-longrope") {
        // LongRoPE: short factors within 256 tokens of context, long ones beyond, the attention factor.
        s.architecture = "phi3";
        s.n_head = 8;
        s.n_head_kv = 4;
        s.tied_output = true;
        s.embedding_scale = 0.0625f;
        s.n_ctx = 4096;
        s.long_rope_context = 256;
        s.seed = 7;
    } else if (name == "gemma3") {
        // Local layers of an 8-token window (two of every three), per-head norms of q and k,
        // one kv head, heads wider than the embedding's share.
        s.architecture = "gemma3";
        s.n_layer = 6;
        s.n_head = 4;
        s.n_head_kv = 1;
        s.head_dim = 64;
        s.tied_output = true;
        s.embedding_scale = 0.0625f;
        s.rope_freq_base = 1000000.0f;
        s.sliding_window = 8;
        s.sliding_window_pattern = 3;
    } else if (name == "gemma2") {
        // Every other layer local (8 tokens), attention scores and logits soft-capped at values
        // the random weights reach.
        s.architecture = "gemma2";
        s.n_head = 8;
        s.n_head_kv = 4;
        s.head_dim = 32;
        s.tied_output = true;
        s.embedding_scale = 0.0625f;
        s.sliding_window = 8;
        s.attention_softcap = 1.5f;
        s.output_softcap = 2.0f;
    } else {
        s.architecture = "qwen3";
        s.n_head = 8;
        s.n_head_kv = 4;
        s.head_dim = 64;
        s.tied_output = true;
        s.embedding_scale = 0.0625f;
        s.rope_freq_base = 1000000.0f;
    }
    return s;
}

int32_t argmax(const std::vector<float> &v) { return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()); }

// Each golden prompt through a session on `backend`: the same prompt ids, last logits and greedy
// tokens. False when the backend has no device here.
// n_batch: 512 reads the whole prompt as one batch, as llama.cpp ran it. rolling: positions are
// ranks in the cache (which equal the stream's while the cache evicts nothing, and keep the
// distances within a sliding window when it does).
bool check_goldens(const std::string &path, const std::vector<Golden> &goldens, uint32_t backend, uint32_t n_ctx, uint32_t n_batch = 512,
                   bool rolling = false) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = backend;
    sp.n_threads = 2;
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    sp.position_rolling = rolling ? 1 : 0;
    sp.kv_type = H2O_KV_TYPE_F32;
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_model_info info;
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(model, &info) == H2O_OK);
    for (const Golden &g : goldens) {
        INFO("prompt: " << g.prompt);
        std::vector<int32_t> ids(4 * g.prompt.size() + 8);  // bytes fall back to byte tokens, after a word marker
        size_t n_ids = 0;
        // BOS as the vocabulary asks, as llama.cpp's add_special.
        const uint32_t flags = H2O_TOKENIZE_VOCAB_BOS | (g.parse_special ? H2O_TOKENIZE_SPECIAL : 0u);
        REQUIRE(h2o_tokenize(model, g.prompt.data(), g.prompt.size(), flags, ids.data(), ids.size(), &n_ids) == H2O_OK);
        ids.resize(n_ids);
        CHECK(ids == g.prompt_ids);

        h2o_session *session = nullptr;
        const h2o_status created = h2o_session_create(model, &sp, &session);
        if (created == H2O_ERR_BACKEND_UNAVAILABLE) {
            h2o_model_free(model);
            return false;
        }
        REQUIRE_MESSAGE(created == H2O_OK, std::string(h2o_last_error()));
        REQUIRE(h2o_session_decode(session, g.prompt_ids.data(), g.prompt_ids.size()) == H2O_OK);
        std::vector<float> logits(info.n_vocab);
        REQUIRE(h2o_session_get_logits(session, logits.data(), logits.size()) == H2O_OK);
        // The largest logits, within 1e-3 of the largest (relative); the top token where
        // llama.cpp's margin over the second is clear of that.
        const double tolerance = 1e-3 * std::fabs(g.top_logits.front().second);
        for (const auto &top : g.top_logits) {
            INFO("token " << top.first);
            CHECK(std::fabs(logits[static_cast<size_t>(top.first)] - top.second) <= tolerance);
        }
        if (g.top_logits[0].second - g.top_logits[1].second > 2 * tolerance) CHECK(argmax(logits) == g.top_logits[0].first);
        std::vector<int32_t> continuation;
        for (size_t i = 0; i < g.continuation_ids.size(); ++i) {
            continuation.push_back(argmax(logits));
            REQUIRE(h2o_session_decode(session, &continuation.back(), 1) == H2O_OK);
            REQUIRE(h2o_session_get_logits(session, logits.data(), logits.size()) == H2O_OK);
        }
        CHECK(continuation == g.continuation_ids);
        h2o_session_free(session);
    }
    h2o_model_free(model);
    return true;
}

// The chat-formatted goldens' prompts are what h2o_chat_format writes for their user message, in
// the format `format_name` (NULL: the model's template), with the assistant's opening.
void check_chat_prompts(const std::string &path, const std::vector<Golden> &goldens, const char *format_name) {
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    int chat_prompts = 0;
    for (const Golden &g : goldens) {
        if (g.chat_user.empty()) continue;
        ++chat_prompts;
        const h2o_chat_message user = {"user", 4, g.chat_user.data(), g.chat_user.size()};
        std::vector<char> text(4 * g.prompt.size() + 64);
        size_t n = 0;
        REQUIRE(h2o_chat_format(model, format_name, &user, 1, 1, text.data(), text.size(), &n) == H2O_OK);
        CHECK(std::string(text.data(), n) == g.prompt);
    }
    CHECK(chat_prompts == 1);
    h2o_model_free(model);
}

TEST_CASE(
    "architecture goldens: llama (Llama 3 style), qwen2, qwen3 and phi3 equal llama.cpp's logits and greedy tokens, on the CPU and "
    "Vulkan") {
    // Golden file, model, and the context of llama.cpp's run (which chooses LongRoPE's factors).
    struct Case {
        const char *golden, *model;
        uint32_t n_ctx;
    };
    const Case cases[] = {{"llama3", "llama3", 512},
                          {"qwen2", "qwen2", 512},
                          {"qwen3", "qwen3", 512},
                          {"phi3", "phi3", 512},
                          {"phi3-longrope-256", "phi3-longrope", 256},
                          {"phi3-longrope-512", "phi3-longrope", 512}};
    for (const Case &c : cases) {
        INFO("golden " << c.golden);
        const std::vector<Golden> goldens = read_goldens(std::string(H2O_TEST_DATA_DIR) + "/architecture_goldens/" + c.golden + ".jsonl");
        REQUIRE(goldens.size() == 6);
        const std::string path = h2o_test::temp_path(std::string("golden-") + c.model + ".gguf");
        REQUIRE(h2o::write_synthetic_model(golden_model(c.model), path).ok());
        INFO("cpu");
        CHECK(check_goldens(path, goldens, H2O_BACKEND_CPU, c.n_ctx));
        // Under AddressSanitizer the software Vulkan device is 3-4 times slower: two models there
        // (the host code they exercise is the same for all).
        if (h2o_test::kAddressSanitized && std::string(c.golden) != "qwen3" && std::string(c.golden) != "phi3-longrope-512") continue;
        if (!check_goldens(path, goldens, H2O_BACKEND_VULKAN, c.n_ctx)) {
            if (std::getenv("H2O_REQUIRE_VULKAN")) FAIL("no Vulkan device");
            MESSAGE("not run on Vulkan: no device");
        }
    }
}

TEST_CASE(
    "architecture goldens: gemma2 and gemma3 equal llama.cpp's on the CPU, Vulkan and CUDA, read in one batch or several, with "
    "and without rolling") {
    for (const char *name : {"gemma3", "gemma2"}) {
        INFO("golden " << name);
        const std::vector<Golden> goldens = read_goldens(std::string(H2O_TEST_DATA_DIR) + "/architecture_goldens/" + name + ".jsonl");
        REQUIRE(goldens.size() == 6);
        const std::string path = h2o_test::temp_path(std::string("golden-") + name + ".gguf");
        REQUIRE(h2o::write_synthetic_model(golden_model(name), path).ok());
        for (uint32_t backend :
             {static_cast<uint32_t>(H2O_BACKEND_CPU), static_cast<uint32_t>(H2O_BACKEND_VULKAN), static_cast<uint32_t>(H2O_BACKEND_CUDA)}) {
            INFO("backend " << backend);
            if (!check_goldens(path, goldens, backend, 512)) {
                if (backend == H2O_BACKEND_VULKAN && std::getenv("H2O_REQUIRE_VULKAN")) FAIL("no Vulkan device");
                MESSAGE("not run on " << std::string(h2o_backend_kind_name(backend)) << ": no device");
                continue;
            }
            // Batches of 5 tokens: a local layer's 8-token window then spans batches, and its
            // cells (8 + 5 - 1 slots) evict while the prompt is read.
            INFO("batches of 5");
            CHECK(check_goldens(path, goldens, backend, 512, 5));
            INFO("rolling");
            CHECK(check_goldens(path, goldens, backend, 512, 5, true));
        }
    }
}

TEST_CASE(
    "architecture goldens with real vocabularies: gemma3 and gemma2 with Gemma 3's tokenizer, phi3 with Phi-3's, and Phi-4-mini's "
    "shape with GPT-4o's equal llama.cpp's on the CPU, Vulkan and CUDA, chat prompt included") {
    // Golden (and model), the vocabulary under shared/, the chat format its chat prompt was
    // written in (NULL: the model's template; GPT-4o's tokenizer has none). Each model is one of
    // the synthetic-vocabulary models above made narrower (its width, feed-forward, heads, kv
    // heads, head size and rotated dimensions; 0 keeps the base's), so that the 32k-262k-row
    // output matrix stays small; a tied one's embeddings in +-1/sqrt(width), as the base's.
    struct Case {
        const char *name, *base, *vocabulary, *chat_format;
        size_t n_prompts;  // GPT-4o's vocabulary adds no BOS: its empty prompt has nothing to decode
        int n_embd, n_ff, n_head, n_head_kv, head_dim, rope_dims;
    };
    const Case cases[] = {{"gemma3-real", "gemma3", "vocab/gemma3", nullptr, 6, 64, 128, 0, 0, 32, 0},
                          {"gemma2-real", "gemma2", "vocab/gemma3", nullptr, 6, 64, 128, 4, 2, 16, 0},
                          {"phi3-real", "phi3", "vocab/ggml-vocab-phi-3.gguf", nullptr, 6, 128, 256, 4, 0, 0, 0},
                          {"phi4mini-real", "phi3-longrope", "vocab/gpt4o", "phi3", 5, 64, 128, 4, 2, 0, 12}};
    for (const Case &c : cases) {
        INFO("golden " << std::string(c.name));
        H2O_SHARED_FILE_OR_SKIP(vocabulary, c.vocabulary);
        const std::vector<Golden> goldens = read_goldens(std::string(H2O_TEST_DATA_DIR) + "/architecture_goldens/" + c.name + ".jsonl");
        REQUIRE(goldens.size() == c.n_prompts);
        h2o::SyntheticModelSpec spec = golden_model(c.base);
        for (auto [field, value] : {std::pair{&spec.n_embd, c.n_embd},
                                    {&spec.n_ff, c.n_ff},
                                    {&spec.n_head, c.n_head},
                                    {&spec.n_head_kv, c.n_head_kv},
                                    {&spec.head_dim, c.head_dim},
                                    {&spec.rope_dims, c.rope_dims}}) {
            if (value != 0) *field = value;
        }
        if (spec.tied_output) spec.embedding_scale = 1.0f / std::sqrt(static_cast<float>(spec.n_embd));
        int32_t n_tokens = 0;
        const h2o::Status read = h2o::read_vocabulary(vocabulary, &n_tokens, &spec.write_vocabulary);
        REQUIRE_MESSAGE(read.ok(), read.message);
        spec.n_vocab = n_tokens;
        const std::string path = h2o_test::temp_path(std::string("golden-") + c.name + ".gguf");
        REQUIRE(h2o::write_synthetic_model(spec, path).ok());
        check_chat_prompts(path, goldens, c.chat_format);
        // The software Vulkan device reads these 16-64 MiB output matrices at well under 1 GB/s: it
        // runs the chat prompt alone (the other prompts meet Vulkan with the synthetic vocabulary
        // above), and not at all under AddressSanitizer.
        std::vector<Golden> chat_golden;
        for (const Golden &g : goldens) {
            if (!g.chat_user.empty()) chat_golden.push_back(g);
        }
        for (uint32_t backend :
             {static_cast<uint32_t>(H2O_BACKEND_CPU), static_cast<uint32_t>(H2O_BACKEND_VULKAN), static_cast<uint32_t>(H2O_BACKEND_CUDA)}) {
            INFO("backend " << backend);
            if (backend == H2O_BACKEND_VULKAN && h2o_test::kAddressSanitized) continue;
            if (!check_goldens(path, backend == H2O_BACKEND_VULKAN ? chat_golden : goldens, backend, 512)) {
                if (backend == H2O_BACKEND_VULKAN && std::getenv("H2O_REQUIRE_VULKAN")) FAIL("no Vulkan device");
                MESSAGE("not run on " << std::string(h2o_backend_kind_name(backend)) << ": no device");
            }
        }
        std::remove(path.c_str());
    }
}

}  // namespace
