// Chat formats (exact strings of each template), special-token parsing, end-of-generation tokens.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "chat_format.h"
#include "doctest/doctest.h"
#include "gguf.h"
#include "h2o/h2o.h"
#include "synthetic_model.h"
#include "test_util.h"
#include "tokenizer.h"

namespace {

using h2o::ChatFormat;
using h2o::ChatMessage;

std::string format(ChatFormat f, const std::vector<ChatMessage> &messages, bool add_assistant_prefix) {
    std::string out;
    REQUIRE(h2o::format_chat(f, messages, add_assistant_prefix, "<s>", "</s>", &out).ok());
    return out;
}

const std::vector<ChatMessage> kConversation = {
    {"system", "You are a helpful assistant."},
    {"user", "Hello!"},
    {"assistant", "Hi, how can I help?"},
    {"user", "Tell me a story."},
};

TEST_CASE("chat: the formats write exactly what their templates produce") {
    CHECK(format(ChatFormat::ChatML, kConversation, true) ==
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
          "<|im_start|>user\nHello!<|im_end|>\n"
          "<|im_start|>assistant\nHi, how can I help?<|im_end|>\n"
          "<|im_start|>user\nTell me a story.<|im_end|>\n"
          "<|im_start|>assistant\n");
    CHECK(format(ChatFormat::Zephyr, kConversation, true) ==
          "<|system|>\nYou are a helpful assistant.</s>\n"
          "<|user|>\nHello!</s>\n"
          "<|assistant|>\nHi, how can I help?</s>\n"
          "<|user|>\nTell me a story.</s>\n"
          "<|assistant|>\n");
    CHECK(format(ChatFormat::Llama2, kConversation, true) ==
          "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello! [/INST] Hi, how can I help? </s>"
          "<s>[INST] Tell me a story. [/INST]");
    // Without a system message, and with the whitespace Llama-2's template strips.
    CHECK(format(ChatFormat::Llama2, {{"user", "  Hi \n"}}, false) == "<s>[INST] Hi [/INST]");
    CHECK(format(ChatFormat::ChatML, {{"user", "Hi"}}, false) == "<|im_start|>user\nHi<|im_end|>\n");
    // Llama 3 trims each message; the template's leading bos_token is the tokenizer's BOS.
    CHECK(format(ChatFormat::Llama3, kConversation, true) ==
          "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nHi, how can I help?<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nTell me a story.<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(format(ChatFormat::Llama3, {{"user", " Hi\n"}}, false) == "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
    CHECK(format(ChatFormat::Phi3, kConversation, true) ==
          "<|system|>\nYou are a helpful assistant.<|end|>\n"
          "<|user|>\nHello!<|end|>\n"
          "<|assistant|>\nHi, how can I help?<|end|>\n"
          "<|user|>\nTell me a story.<|end|>\n"
          "<|assistant|>\n");
    CHECK(format(ChatFormat::Phi3, {{"user", "Hi"}}, false) == "<|user|>\nHi<|end|>\n");
    // Mistral: the system message opens the first turn; replies are trimmed and end with EOS;
    // the prompt ends with [/INST] (no assistant prefix of its own).
    CHECK(format(ChatFormat::Mistral, kConversation, true) ==
          "[INST] You are a helpful assistant.\n\nHello![/INST] Hi, how can I help?</s>"
          "[INST] Tell me a story.[/INST]");
    CHECK(format(ChatFormat::Mistral, {{"user", "a"}, {"user", "b"}, {"assistant", " c \n"}}, false) == "[INST] a[/INST]b[/INST] c</s>");
    // Gemma: the system message opens the first user turn; the assistant is the "model"; the
    // contents are trimmed.
    CHECK(format(ChatFormat::Gemma, kConversation, true) ==
          "<start_of_turn>user\nYou are a helpful assistant.\n\nHello!<end_of_turn>\n"
          "<start_of_turn>model\nHi, how can I help?<end_of_turn>\n"
          "<start_of_turn>user\nTell me a story.<end_of_turn>\n"
          "<start_of_turn>model\n");
    CHECK(format(ChatFormat::Gemma, {{"user", " Hi\n"}}, false) == "<start_of_turn>user\nHi<end_of_turn>\n");
}

TEST_CASE("chat: bad roles and out-of-order Llama-2 and Gemma turns are refused") {
    std::string out;
    CHECK(h2o::format_chat(ChatFormat::ChatML, {{"tool", "x"}}, false, "<s>", "</s>", &out).code == H2O_ERR_INVALID_ARGUMENT);
    const h2o::Status st = h2o::format_chat(ChatFormat::Llama2, {{"user", "a"}, {"user", "b"}}, false, "<s>", "</s>", &out);
    CHECK(st.code == H2O_ERR_INVALID_ARGUMENT);
    CHECK(st.message.find("in turn") != std::string::npos);
    CHECK(h2o::format_chat(ChatFormat::Gemma, {{"user", "a"}, {"user", "b"}}, false, "<bos>", "<eos>", &out).code ==
          H2O_ERR_INVALID_ARGUMENT);
    ChatFormat f;
    CHECK(h2o::chat_format_from_name("alpaca", &f).code == H2O_ERR_INVALID_ARGUMENT);
}

TEST_CASE("chat: a model's format is recognised from its chat template") {
    ChatFormat f;
    REQUIRE(h2o::chat_format_from_template("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                                           "'<|im_end|>' + '\\n'}}{% endfor %}",
                                           &f)
                .ok());
    CHECK(f == ChatFormat::ChatML);
    REQUIRE(h2o::chat_format_from_template(
                "{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + eos_token }}{% endif %}", &f)
                .ok());
    CHECK(f == ChatFormat::Zephyr);
    REQUIRE(
        h2o::chat_format_from_template("{{ bos_token + '[INST] ' + '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + message['content'] }}", &f)
            .ok());
    CHECK(f == ChatFormat::Llama2);
    // Mistral's templates (v0.1 to v0.3) have [INST] turns without Llama-2's system block.
    REQUIRE(h2o::chat_format_from_template("{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}", &f).ok());
    CHECK(f == ChatFormat::Mistral);
    REQUIRE(
        h2o::chat_format_from_template("{%- if tools %}[AVAILABLE_TOOLS]{%- endif %}{{- '[INST] ' + message['content'] + '[/INST]' }}", &f)
            .ok());
    CHECK(f == ChatFormat::Mistral);
    // Phi-3's turns end with <|end|> (Zephyr's <|user|> markers, but not its </s>).
    REQUIRE(h2o::chat_format_from_template("{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}", &f)
                .ok());
    CHECK(f == ChatFormat::Phi3);
    CHECK(h2o::chat_format_from_name("phi3", &f).ok());
    CHECK(f == ChatFormat::Phi3);
    CHECK(h2o::chat_format_from_name("mistral", &f).ok());
    CHECK(std::string(h2o::chat_format_name(f)) == "mistral");
    REQUIRE(h2o::chat_format_from_template("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}", &f).ok());
    CHECK(f == ChatFormat::Llama3);
    CHECK(h2o::chat_format_from_name("llama3", &f).ok());
    CHECK(f == ChatFormat::Llama3);
    CHECK(std::string(h2o::chat_format_name(ChatFormat::Llama3)) == "llama3");
    // Gemma's template (Gemma 2 and 3) names its turns with <start_of_turn>.
    REQUIRE(
        h2o::chat_format_from_template("{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}", &f).ok());
    CHECK(f == ChatFormat::Gemma);
    CHECK(std::string(h2o::chat_format_name(f)) == "gemma");
    CHECK(h2o::chat_format_from_template("", &f).code == H2O_ERR_UNSUPPORTED);
    CHECK(h2o::chat_format_from_template("{{ message['content'] }}", &f).code == H2O_ERR_UNSUPPORTED);
}

TEST_CASE("chat: special tokens are parsed on request, with llama.cpp's spacing") {
    H2O_SHARED_FILE_OR_SKIP(path, "vocab/ggml-vocab-llama-spm.gguf");
    std::unique_ptr<h2o::GgufFile> file;
    REQUIRE(h2o::GgufFile::open(path, &file).ok());
    std::unique_ptr<h2o::Tokenizer> tok;
    REQUIRE(h2o::Tokenizer::from_gguf(*file, &tok).ok());
    std::vector<int32_t> special, plain, expected;
    REQUIRE(tok->encode_special("<s>[INST] Hi [/INST] Hello </s>", true, &special).ok());
    // BOS once, the text between as if encoded alone (each piece with its own leading space), EOS.
    expected = {tok->bos()};
    REQUIRE(tok->encode("[INST] Hi [/INST] Hello ", false, &plain).ok());
    expected.insert(expected.end(), plain.begin(), plain.end());
    expected.push_back(tok->eos());
    CHECK(special == expected);
    // Without parsing, "<s>" is just text.
    REQUIRE(tok->encode("<s>", false, &plain).ok());
    CHECK(plain.size() > 1);
    CHECK(std::find(plain.begin(), plain.end(), tok->bos()) == plain.end());
    CHECK(tok->is_end_of_generation(tok->eos()));
    CHECK_FALSE(tok->is_end_of_generation(tok->bos()));
}

TEST_CASE("chat: a Phi-3 conversation's markers are Phi-3's control tokens, and <|end|> ends a reply") {
    H2O_SHARED_FILE_OR_SKIP(path, "vocab/ggml-vocab-phi-3.gguf");
    std::unique_ptr<h2o::GgufFile> file;
    REQUIRE(h2o::GgufFile::open(path, &file).ok());
    std::unique_ptr<h2o::Tokenizer> tok;
    REQUIRE(h2o::Tokenizer::from_gguf(*file, &tok).ok());
    std::string text;
    REQUIRE(h2o::format_chat(ChatFormat::Phi3, {{"user", "Hi"}}, true, tok->piece(tok->bos()), tok->piece(tok->eos()), &text).ok());
    std::vector<int32_t> ids, marker;
    REQUIRE(tok->encode_special(text, false, &ids).ok());
    for (const char *piece : {"<|user|>", "<|end|>", "<|assistant|>"}) {
        CAPTURE(piece);
        REQUIRE(tok->encode_special(piece, false, &marker).ok());
        REQUIRE(marker.size() == 1);
        CHECK(std::count(ids.begin(), ids.end(), marker[0]) == 1);
        CHECK(tok->is_end_of_generation(marker[0]) == (std::string(piece) == "<|end|>"));
    }
}

TEST_CASE("chat: the C API formats, tokenizes with special tokens and generates a reply") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, sp));
    const h2o_chat_message messages[] = {{"system", 6, "Be kind.", 8}, {"user", 4, "Tell a story.", 13}};
    size_t needed = 0;
    // stories260K has no chat template: a format must be named.
    CHECK(h2o_chat_format(m.model, nullptr, messages, 2, 1, nullptr, 0, &needed) == H2O_ERR_UNSUPPORTED);
    CHECK(h2o_chat_format(m.model, "zephyr", messages, 2, 1, nullptr, 0, &needed) == H2O_ERR_BUFFER_TOO_SMALL);
    std::string text(needed, '\0');
    REQUIRE(h2o_chat_format(m.model, "zephyr", messages, 2, 1, text.data(), text.size(), &needed) == H2O_OK);
    CHECK(text == "<|system|>\nBe kind.</s>\n<|user|>\nTell a story.</s>\n<|assistant|>\n");
    const h2o_chat_message bad_role[] = {{"robot", 5, "x", 1}};
    CHECK(h2o_chat_format(m.model, "chatml", bad_role, 1, 0, nullptr, 0, &needed) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_chat_format(m.model, "nope", messages, 2, 0, nullptr, 0, &needed) == H2O_ERR_INVALID_ARGUMENT);

    // "</s>" parsed as the EOS token only on request.
    std::vector<int32_t> ids(64);
    size_t n = 0;
    REQUIRE(h2o_tokenize(m.model, "a</s>", 5, H2O_TOKENIZE_SPECIAL, ids.data(), ids.size(), &n) == H2O_OK);
    CHECK(ids[n - 1] == 2);
    REQUIRE(h2o_tokenize(m.model, "a</s>", 5, 0, ids.data(), ids.size(), &n) == H2O_OK);
    CHECK(ids[n - 1] != 2);
    CHECK(h2o_tokenize(m.model, "a", 1, 0x80, ids.data(), ids.size(), &n) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_token_is_end_of_generation(m.model, 2) == 1);
    CHECK(h2o_token_is_end_of_generation(m.model, 100) == 0);
    char piece[16];
    REQUIRE(h2o_token_to_piece(m.model, 2, piece, sizeof piece, &n) == H2O_OK);
    CHECK(std::string(piece, n) == "</s>");
    CHECK(h2o_token_to_piece(m.model, 512, piece, sizeof piece, &n) == H2O_ERR_INVALID_ARGUMENT);

    REQUIRE(h2o_session_add_text(m.session, text.data(), text.size(), H2O_TEXT_PIN | H2O_TEXT_SPECIAL) == H2O_OK);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 30;
    CHECK(h2o_generate(m.session, "", 0, &gen, nullptr, nullptr) == H2O_OK);
}

}  // namespace

namespace {

// A copy of the model at `path` with a tokenizer.chat_template added (or replaced).
void write_with_chat_template(const std::string &path, const std::string &chat_template, const std::string &out) {
    std::unique_ptr<h2o::GgufFile> file;
    REQUIRE(h2o::GgufFile::open(path, &file).ok());
    h2o::GgufWriter writer;
    for (const h2o::GgufKeyValue &kv : file->metadata()) {
        if (kv.key != "tokenizer.chat_template") writer.add_copy(kv);
    }
    writer.add_string("tokenizer.chat_template", chat_template);
    for (const h2o::GgufTensor &t : file->tensors()) {
        writer.add_tensor(std::string(t.name), t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                          std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }
    REQUIRE(writer.write(out).ok());
}

// h2o_model_get_text's value, or the status when it fails.
std::string model_text(const h2o_model *model, uint32_t what, h2o_status *status) {
    char text[64];
    size_t n = 0;
    *status = h2o_model_get_text(model, what, text, sizeof text, &n);
    return *status == H2O_OK ? std::string(text, n) : std::string();
}

}  // namespace

TEST_CASE("chat: h2o_model_get_text gives the architecture, the name and the chat format the template describes") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_status st;
    CHECK(model_text(model, H2O_MODEL_TEXT_NAME, &st) == "llama");  // the converter's general.name
    CHECK(st == H2O_OK);
    CHECK(model_text(model, H2O_MODEL_TEXT_ARCHITECTURE, &st) == "llama");
    CHECK(st == H2O_OK);
    // No template: the reason, as h2o_chat_format gives it for a NULL format.
    model_text(model, H2O_MODEL_TEXT_CHAT_FORMAT, &st);
    CHECK(st == H2O_ERR_UNSUPPORTED);
    CHECK(std::string(h2o_last_error()).find("no chat template") != std::string::npos);
    // Sizes first, as the other text calls.
    size_t n = 0;
    CHECK(h2o_model_get_text(model, H2O_MODEL_TEXT_NAME, nullptr, 0, &n) == H2O_ERR_BUFFER_TOO_SMALL);
    CHECK(n == 5);
    char small[5];
    CHECK(h2o_model_get_text(model, H2O_MODEL_TEXT_NAME, small, sizeof small, &n) == H2O_OK);  // no room for the NUL
    CHECK(std::string(small, n) == "llama");
    CHECK(h2o_model_get_text(model, 3, small, sizeof small, &n) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_model_get_text(model, H2O_MODEL_TEXT_NAME, small, sizeof small, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_model_get_text(nullptr, H2O_MODEL_TEXT_NAME, small, sizeof small, &n) == H2O_ERR_INVALID_ARGUMENT);
    h2o_model_free(model);

    const std::string with_template = h2o_test::temp_path("chat_template_chatml.gguf");
    write_with_chat_template(
        path, "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}", with_template);
    REQUIRE(h2o_model_load(with_template.c_str(), nullptr, &model) == H2O_OK);
    CHECK(model_text(model, H2O_MODEL_TEXT_CHAT_FORMAT, &st) == "chatml");
    CHECK(st == H2O_OK);
    h2o_model_free(model);
    std::remove(with_template.c_str());

    // The architecture is the file's: a synthetic Qwen3.
    h2o::SyntheticModelSpec spec;
    spec.architecture = "qwen3";
    spec.n_embd = 64;
    spec.n_layer = 1;
    spec.n_head = 2;
    spec.n_head_kv = 2;
    spec.n_ff = 128;
    spec.n_vocab = 300;
    spec.type = h2o::TensorType::F32;
    const std::string qwen3 = h2o_test::temp_path("get_text_qwen3.gguf");
    REQUIRE(h2o::write_synthetic_model(spec, qwen3).ok());
    REQUIRE_MESSAGE(h2o_model_load(qwen3.c_str(), nullptr, &model) == H2O_OK, h2o_last_error());
    CHECK(model_text(model, H2O_MODEL_TEXT_ARCHITECTURE, &st) == "qwen3");
    CHECK(st == H2O_OK);
    h2o_model_free(model);
    std::remove(qwen3.c_str());
}
