// Constrained generation through the C API (h2o_generate_params.grammar, .json_schema,
// .logit_bias; h2o_grammar_*), and the mask over a real 128k-token vocabulary.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "grammar_matcher.h"
#include "h2o/h2o.h"
#include "hf_tokenizer.h"
#include "json_schema.h"
#include "json_value.h"
#include "synthetic_model.h"
#include "test_util.h"
#include "tokenizer.h"

namespace {

h2o_session_params cpu_params() {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = H2O_BACKEND_CPU;
    sp.n_threads = 1;
    return sp;
}

h2o_generate_params gen_params(uint32_t n, float temperature) {
    h2o_generate_params g;
    h2o_generate_params_init(&g, sizeof g);
    g.max_tokens = n;
    g.temperature = temperature;
    return g;
}

// Generates from a fresh session of the model; returns the status, the text and the stop reason.
h2o_status generate(h2o_model *model, const char *prompt, const h2o_generate_params &gen, std::string *text, uint32_t *stop = nullptr,
                    uint64_t seed = 1) {
    h2o_session_params sp = cpu_params();
    sp.seed = seed;
    h2o_session *session = nullptr;
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    text->clear();
    const h2o_status st = h2o_generate(session, prompt, std::strlen(prompt), &gen, h2o_test::append_text, text);
    if (stop) {
        h2o_generate_stats stats;
        stats.struct_size = sizeof stats;
        REQUIRE(h2o_session_get_stats(session, &stats) == H2O_OK);
        *stop = stats.stop_reason;
    }
    if (st != H2O_OK) MESSAGE(std::string(h2o_session_last_error(session)));
    h2o_session_free(session);
    return st;
}

}  // namespace

TEST_CASE("constrained generation: a grammar shapes greedy and sampled replies, and ends them where it must") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    const std::string grammar = R"(root ::= " there was a " [a-z]+ " named " [A-Z] [a-z]{1,12} ".")";
    const std::regex shape(R"( there was a [a-z]+ named [A-Z][a-z]{1,12}\.)");
    for (float temperature : {0.0f, 0.8f, 1.5f}) {
        for (uint64_t seed = 1; seed <= (temperature == 0.0f ? 1u : 5u); ++seed) {
            CAPTURE(temperature);
            CAPTURE(seed);
            h2o_generate_params gen = gen_params(80, temperature);
            gen.grammar = grammar.data();
            gen.grammar_len = grammar.size();
            std::string text;
            uint32_t stop = 0;
            REQUIRE(generate(model, "Once upon a time,", gen, &text, &stop, seed) == H2O_OK);
            CHECK_MESSAGE(std::regex_match(text, shape), text);
            CHECK(stop == H2O_STOP_GRAMMAR);  // nothing may follow the "."
        }
    }
    // A grammar that may go on: an end-of-generation token only where it may end.
    const std::string open = R"(root ::= [a-z ]+ "." ([a-z ]+ ".")*)";
    h2o_generate_params gen = gen_params(60, 0.8f);
    gen.grammar = open.data();
    gen.grammar_len = open.size();
    for (uint64_t seed = 1; seed <= 5; ++seed) {
        std::string text;
        uint32_t stop = 0;
        REQUIRE(generate(model, "Once upon a time", gen, &text, &stop, seed) == H2O_OK);
        CHECK_MESSAGE(std::regex_match(text, std::regex(R"([a-z ]+\.([a-z ]+\.)*[a-z ]*)")), text);
        if (stop == H2O_STOP_EOS) CHECK(text.back() == '.');
    }
    // Errors, before anything is processed.
    const std::string broken = "root ::= [a-";
    gen.grammar = broken.data();
    gen.grammar_len = broken.size();
    std::string text;
    CHECK(generate(model, "x", gen, &text) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).empty() == false);
    const std::string schema = R"({"type": "string"})";
    gen.grammar = open.data();
    gen.grammar_len = open.size();
    gen.json_schema = schema.data();
    gen.json_schema_len = schema.size();
    CHECK(generate(model, "x", gen, &text) == H2O_ERR_INVALID_ARGUMENT);
    h2o_model_free(model);
}

TEST_CASE("constrained generation: a JSON schema's replies parse and fit it, greedy and sampled") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    const std::string schema = R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}, "happy": {"type": "boolean"},
        "friends": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "mood": {"enum": ["sad", "glad"]}}, "required": ["name", "age", "happy"]})";
    for (uint64_t seed = 0; seed < 20; ++seed) {
        CAPTURE(seed);
        h2o_generate_params gen = gen_params(400, seed == 0 ? 0.0f : 1.0f);
        gen.json_schema = schema.data();
        gen.json_schema_len = schema.size();
        std::string text;
        uint32_t stop = 0;
        REQUIRE(generate(model, "Lily", gen, &text, &stop, seed) == H2O_OK);
        CHECK((stop == H2O_STOP_GRAMMAR || stop == H2O_STOP_EOS));
        h2o::JsonValue v;
        const h2o::Status parsed = h2o::parse_json(text, "reply", &v);
        REQUIRE_MESSAGE(parsed.ok(), parsed.message << "\n" << text);
        REQUIRE(v.is(h2o::JsonValue::kObject));
        REQUIRE(v.find("name"));
        CHECK(v.find("name")->text.size() <= 12 * 4);
        CHECK(v.find("age")->is(h2o::JsonValue::kNumber));
        CHECK(v.find("age")->text.find('.') == std::string::npos);
        CHECK(v.find("happy")->is(h2o::JsonValue::kBool));
        if (const h2o::JsonValue *mood = v.find("mood")) CHECK((mood->text == "sad" || mood->text == "glad"));
    }
    char grammar[4096];
    size_t n = 0;
    REQUIRE(h2o_json_schema_to_grammar(schema.data(), schema.size(), grammar, sizeof grammar, &n) == H2O_OK);
    CHECK(std::string(grammar, n).rfind("root ::= ", 0) == 0);
    CHECK(h2o_json_schema_to_grammar(schema.data(), schema.size(), grammar, 8, &n) == H2O_ERR_BUFFER_TOO_SMALL);
    CHECK(h2o_json_schema_to_grammar("{\"pattern\": \"a\"}", 16, grammar, sizeof grammar, &n) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("'pattern' is not supported") != std::string::npos);
    h2o_model_free(model);
}

TEST_CASE("constrained generation: logit_bias bans and forces tokens, and is checked") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    std::string plain;
    REQUIRE(generate(model, "Once upon a time", gen_params(20, 0.0f), &plain) == H2O_OK);
    // Ban the token that greedy decoding starts with: the reply changes, and never has it.
    int32_t ids[64];
    size_t n_ids = 0;
    REQUIRE(h2o_tokenize(model, plain.data(), plain.size(), 0, ids, 64, &n_ids) == H2O_OK);
    const int32_t banned[] = {ids[0]};
    const float minus_infinity[] = {-INFINITY};
    h2o_generate_params gen = gen_params(20, 0.0f);
    gen.logit_bias_tokens = banned;
    gen.logit_bias_values = minus_infinity;
    gen.n_logit_bias = 1;
    std::string text;
    REQUIRE(generate(model, "Once upon a time", gen, &text) == H2O_OK);
    CHECK(text != plain);
    // A large bias forces a token every step.
    const int32_t forced[] = {ids[1]};
    const float plus[] = {100.0f};
    gen.logit_bias_tokens = forced;
    gen.logit_bias_values = plus;
    REQUIRE(generate(model, "Once upon a time", gen, &text) == H2O_OK);
    char piece[64];
    size_t piece_len = 0;
    REQUIRE(h2o_detokenize(model, forced, 1, piece, sizeof piece, &piece_len) == H2O_OK);
    std::string repeated;
    for (int i = 0; i < 20; ++i) repeated += std::string(piece, piece_len);
    CHECK(text.find(std::string(piece, piece_len) + std::string(piece, piece_len)) != std::string::npos);
    // Checked: ids in the vocabulary, values numbers or -infinity, arrays present.
    const int32_t outside[] = {100000};
    gen.logit_bias_tokens = outside;
    CHECK(generate(model, "x", gen, &text) == H2O_ERR_INVALID_ARGUMENT);
    const float nan[] = {NAN};
    gen.logit_bias_tokens = forced;
    gen.logit_bias_values = nan;
    CHECK(generate(model, "x", gen, &text) == H2O_ERR_INVALID_ARGUMENT);
    gen.logit_bias_values = nullptr;
    CHECK(generate(model, "x", gen, &text) == H2O_ERR_INVALID_ARGUMENT);
    h2o_model_free(model);
}

TEST_CASE("constrained generation: h2o_grammar_* drives a custom sampler") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_grammar *g = nullptr;
    const std::string text = R"(root ::= "yes" | "no")";
    REQUIRE(h2o_grammar_create(model, text.data(), text.size(), nullptr, 0, &g) == H2O_OK);
    h2o_model_free(model);  // the grammar keeps it alive
    CHECK(h2o_grammar_state(g) == 0);
    std::vector<float> logits(512, 0.0f);
    CHECK(h2o_grammar_apply(g, logits.data(), 100) == H2O_ERR_INVALID_ARGUMENT);
    REQUIRE(h2o_grammar_apply(g, logits.data(), logits.size()) == H2O_OK);
    size_t finite = 0;
    int32_t first = -1;
    for (int32_t t = 0; t < 512; ++t) {
        if (std::isfinite(logits[static_cast<size_t>(t)])) {
            ++finite;
            if (first < 0) first = t;
        }
    }
    CHECK(finite > 0);
    CHECK(finite < 40);
    REQUIRE(h2o_grammar_accept(g, first) == H2O_OK);
    CHECK(h2o_grammar_accept(g, 1) == H2O_ERR_INVALID_ARGUMENT);  // BOS is no text of the grammar
    REQUIRE(h2o_grammar_reset(g) == H2O_OK);
    CHECK(h2o_grammar_state(g) == 0);
    CHECK(h2o_grammar_state(nullptr) == -1);
    h2o_grammar_free(g);
    h2o_grammar *none = nullptr;
    CHECK(h2o_grammar_create(nullptr, text.data(), text.size(), nullptr, 0, &none) == H2O_ERR_INVALID_ARGUMENT);
}

// The walk over the sorted pieces gives what checking each token gives, on Llama 3's vocabulary,
// in the states a JSON reply passes through.
TEST_CASE("constrained generation: on a real vocabulary the mask equals token-by-token checks in every state of a JSON reply") {
    const std::string dir = h2o_test::shared_file("vocab/llama3/tokenizer.json");
    if (dir.empty()) return;
    h2o::HfVocabulary hf;
    REQUIRE(h2o::read_hf_tokenizer(h2o_test::shared_dir() + "/vocab/llama3", 0, &hf).ok());
    std::unique_ptr<h2o::Tokenizer> tok;
    REQUIRE(h2o::Tokenizer::from_vocab(h2o::to_vocab_spec(hf), &tok).ok());
    const auto vocab = h2o::TokenSurfaces::build(*tok);
    std::string text;
    REQUIRE(h2o::json_schema_to_grammar(R"({"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "number"},
        "list": {"type": "array", "items": {"type": "boolean"}}}, "required": ["a", "n", "list"]})",
                                        &text)
                .ok());
    auto g = std::make_shared<h2o::Grammar>();
    REQUIRE(h2o::parse_grammar(text, g.get()).ok());
    h2o::GrammarMatcher m(g, vocab);
    std::vector<int32_t> reply;
    REQUIRE(tok->encode(R"({"a": "h\u00e9llo wörld", "n": -1.5e3, "list": [true, false]})", false, &reply).ok());
    std::vector<uint8_t> mask;
    size_t checked = 0;
    for (size_t i = 0; i <= reply.size(); ++i) {
        REQUIRE(m.mask(&mask));
        size_t differ = 0, allowed = 0;
        for (int32_t t = 0; t < tok->n_vocab(); ++t) {
            differ += static_cast<bool>(mask[static_cast<size_t>(t)]) != m.allows(t);
            allowed += mask[static_cast<size_t>(t)];
        }
        CHECK(differ == 0);
        CHECK(allowed > 0);
        ++checked;
        if (i == reply.size()) break;
        REQUIRE_MESSAGE(m.allows(reply[i]), "token " << i << " of the reply");
        REQUIRE(m.accept(reply[i]).ok());
    }
    CHECK(m.can_end());
    CHECK(checked == reply.size() + 1);
}

TEST_CASE("constrained generation: a control token the grammar spells may be generated, and is delivered as its spelling") {
    // Mistral's [TOOL_CALLS] is such a token; here one of Llama 3's reserved control tokens.
    if (h2o_test::shared_file("vocab/llama3/tokenizer.json").empty()) return;
    h2o::SyntheticModelSpec spec;
    spec.n_embd = 32;
    spec.n_layer = 1;
    spec.n_head = spec.n_head_kv = 2;
    spec.n_ff = 32;
    int32_t n_tokens = 0;
    REQUIRE(h2o::read_vocabulary(h2o_test::shared_dir() + "/vocab/llama3", &n_tokens, &spec.write_vocabulary).ok());
    spec.n_vocab = n_tokens;
    const std::string path = h2o_test::temp_path("spelled-control.gguf");
    REQUIRE(h2o::write_synthetic_model(spec, path).ok());
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    const int32_t control = 128010;  // <|reserved_special_token_5|>
    const std::string spelling = "<|reserved_special_token_5|>";
    const float push = 100.0f;
    h2o_generate_params gen = gen_params(1, 0.0f);
    gen.logit_bias_tokens = &control;
    gen.logit_bias_values = &push;
    gen.n_logit_bias = 1;
    // Spelled by the grammar: the token itself (one token gives the whole spelling).
    const std::string spelled = "root ::= \"" + spelling + "\" [a-z]{1,3}";
    gen.grammar = spelled.data();
    gen.grammar_len = spelled.size();
    std::string text;
    REQUIRE(generate(model, "Hi", gen, &text) == H2O_OK);
    CHECK(text == spelling);
    // Not spelled: never, however strongly it is pushed (the grammar's "<" comes from text tokens).
    const std::string other = "root ::= \"<\" [a-z]{1,3}";
    gen.grammar = other.data();
    gen.grammar_len = other.size();
    gen.max_tokens = 4;
    REQUIRE(generate(model, "Hi", gen, &text) == H2O_OK);
    CHECK(text.find(spelling) == std::string::npos);
    CHECK(text.starts_with("<"));
    h2o_model_free(model);
    std::remove(path.c_str());
}
