// llama_golden: the parity goldens of tests/data/architecture_goldens, made by llama.cpp through its
// public llama.h API. Not part of h2o's build: it links a llama.cpp build (see README.md here).
//
// For each prompt of a file (one a line): the prompt's token ids (BOS added as the vocabulary says),
// the whole prompt decoded as one batch, the k largest logits of its last position, then n greedy
// tokens (argmax, the lowest id on ties), one at a time. One JSON object a line on stdout.
//
// A line "chat:TEXT" is one user message TEXT written by the model's own chat template
// (tokenizer.chat_template, through llama_chat_apply_template; or the built-in template
// --chat-template names) with the assistant's opening; its special tokens are parsed. Other lines are parsed for special tokens only with --special.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

struct Options {
    std::string model, prompts, chat_template;  // chat_template: empty for the model's own
    int n_predict = 32, top_k = 16, n_ctx = 512;
    bool escapes = false, special = false, kv_f32 = false;
};

[[noreturn]] void usage() {
    std::fprintf(stderr,
                 "usage: llama_golden -m MODEL.gguf -f PROMPTS.txt [-n 32] [-k 16] [-c 512] [--kv-type f32|f16] [--escapes] "
                 "[--special] [--chat-template NAME]\n"
                 "  --escapes   \\n, \\t and \\\\ in a prompt line are a newline, a tab and a backslash\n"
                 "  --special   parse special tokens in every prompt (\"chat:\" lines always are)\n"
                 "  --chat-template NAME  write \"chat:\" lines by llama.cpp's built-in template NAME, not the model's\n");
    std::exit(2);
}

Options parse(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage();
            return argv[++i];
        };
        if (a == "-m") {
            o.model = value();
        } else if (a == "-f") {
            o.prompts = value();
        } else if (a == "-n") {
            o.n_predict = std::atoi(value().c_str());
        } else if (a == "-k") {
            o.top_k = std::atoi(value().c_str());
        } else if (a == "-c") {
            o.n_ctx = std::atoi(value().c_str());
        } else if (a == "--kv-type") {
            const std::string t = value();
            if (t != "f32" && t != "f16") usage();
            o.kv_f32 = t == "f32";
        } else if (a == "--escapes") {
            o.escapes = true;
        } else if (a == "--chat-template") {
            o.chat_template = value();
        } else if (a == "--special") {
            o.special = true;
        } else {
            usage();
        }
    }
    if (o.model.empty() || o.prompts.empty() || o.n_predict < 0 || o.top_k < 2 || o.n_ctx < 16) usage();
    return o;
}

std::string unescape(const std::string &s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 1 < s.size()) {
            const char c = s[++i];
            out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
        } else {
            out += s[i];
        }
    }
    return out;
}

// The length of the well-formed UTF-8 sequence at s[i], or 0 when it is not one.
size_t utf8_length(const std::string &s, size_t i) {
    const auto byte = [&](size_t j) { return static_cast<unsigned char>(s[j]); };
    const unsigned char c = byte(i);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (size_t j = 1; j < n; ++j) {
        if ((byte(i + j) & 0xc0) != 0x80) return 0;
    }
    return n;
}

// A JSON string literal: quotes, backslashes and control bytes escaped, each byte outside a
// well-formed UTF-8 sequence (a byte token's piece) as U+FFFD; other text as it is.
std::string json_string(const std::string &s) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t n = utf8_length(s, i);
        if (n == 0) {
            out += "\\ufffd";
        } else if (n > 1) {
            out += s.substr(i, n);
            i += n - 1;
        } else if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

std::string json_ids(const std::vector<llama_token> &ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
    return out + "]";
}

std::vector<llama_token> tokenize(const llama_vocab *vocab, const std::string &text, bool add_special, bool parse_special) {
    std::vector<llama_token> ids(text.size() + 16);
    int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(), static_cast<int32_t>(ids.size()), add_special,
                           parse_special);
    if (n < 0) {
        ids.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(), static_cast<int32_t>(ids.size()), add_special,
                           parse_special);
    }
    if (n < 0) {
        std::fprintf(stderr, "llama_golden: cannot tokenize: %s\n", text.c_str());
        std::exit(1);
    }
    ids.resize(static_cast<size_t>(n));
    return ids;
}

std::string piece(const llama_vocab *vocab, llama_token id) {
    char buf[256];
    const int n = llama_token_to_piece(vocab, id, buf, sizeof buf, 0, true);
    return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

// The user message `text` as the chat template writes it (the model's, or the built-in one named
// `name`), with the assistant's opening.
std::string chat_prompt(const llama_model *model, const std::string &name, const std::string &text) {
    const char *tmpl = name.empty() ? llama_model_chat_template(model, nullptr) : name.c_str();
    if (tmpl == nullptr) {
        std::fprintf(stderr, "llama_golden: a chat: line, but the model has no chat template\n");
        std::exit(1);
    }
    const llama_chat_message message = {"user", text.c_str()};
    std::vector<char> buf(4 * text.size() + 512);
    int n = llama_chat_apply_template(tmpl, &message, 1, true, buf.data(), static_cast<int32_t>(buf.size()));
    if (n > static_cast<int>(buf.size())) {
        buf.resize(static_cast<size_t>(n));
        n = llama_chat_apply_template(tmpl, &message, 1, true, buf.data(), static_cast<int32_t>(buf.size()));
    }
    if (n < 0) {
        std::fprintf(stderr, "llama_golden: llama.cpp does not know the model's chat template\n");
        std::exit(1);
    }
    return std::string(buf.data(), static_cast<size_t>(n));
}

// Index of the largest value, the lowest index on ties.
llama_token argmax(const float *logits, int n) { return static_cast<llama_token>(std::max_element(logits, logits + n) - logits); }

}  // namespace

int main(int argc, char **argv) {
    const Options o = parse(argc, argv);
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model *model = llama_model_load_from_file(o.model.c_str(), mp);
    if (model == nullptr) {
        std::fprintf(stderr, "llama_golden: cannot load %s\n", o.model.c_str());
        return 1;
    }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::ifstream in(o.prompts);
    if (!in) {
        std::fprintf(stderr, "llama_golden: cannot read %s\n", o.prompts.c_str());
        return 1;
    }
    for (std::string line; std::getline(in, line);) {
        const bool chat = line.rfind("chat:", 0) == 0;
        std::string chat_user;
        std::string prompt = o.escapes ? unescape(chat ? line.substr(5) : line) : (chat ? line.substr(5) : line);
        if (chat) {
            chat_user = prompt;
            prompt = chat_prompt(model, o.chat_template, chat_user);
        }
        const bool add_special = true, parse_special = chat || o.special;
        const std::vector<llama_token> prompt_ids = tokenize(vocab, prompt, add_special, parse_special);
        if (prompt_ids.empty()) {  // an empty line, and a vocabulary that adds no BOS: nothing to decode
            std::fprintf(stderr, "llama_golden: skipped the empty prompt (the vocabulary adds no BOS)\n");
            continue;
        }

        // A fresh context per prompt: nothing of the last prompt remains.
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = static_cast<uint32_t>(o.n_ctx);
        cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(o.n_ctx);
        cp.n_threads = cp.n_threads_batch = 2;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.type_k = cp.type_v = o.kv_f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
        cp.swa_full = true;
        llama_context *ctx = llama_init_from_model(model, cp);
        if (ctx == nullptr) {
            std::fprintf(stderr, "llama_golden: cannot create a context\n");
            return 1;
        }
        std::vector<llama_token> batch_ids = prompt_ids;
        if (llama_decode(ctx, llama_batch_get_one(batch_ids.data(), static_cast<int32_t>(batch_ids.size()))) != 0) {
            std::fprintf(stderr, "llama_golden: decoding the prompt failed\n");
            return 1;
        }
        const float *logits = llama_get_logits_ith(ctx, -1);
        std::vector<llama_token> order(static_cast<size_t>(n_vocab));
        for (int i = 0; i < n_vocab; ++i) order[static_cast<size_t>(i)] = i;
        const size_t k = std::min<size_t>(static_cast<size_t>(o.top_k), order.size());
        std::partial_sort(order.begin(), order.begin() + static_cast<long>(k), order.end(),
                          [&](llama_token a, llama_token b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
        std::string top = "[";
        for (size_t i = 0; i < k; ++i) {
            char buf[64];
            std::snprintf(buf, sizeof buf, "%s[%d,%.9g]", i ? "," : "", order[i], static_cast<double>(logits[order[i]]));
            top += buf;
        }
        top += "]";

        std::vector<llama_token> continuation;
        std::string text;
        for (int i = 0; i < o.n_predict; ++i) {
            llama_token next = argmax(logits, n_vocab);
            continuation.push_back(next);
            text += piece(vocab, next);
            if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
                std::fprintf(stderr, "llama_golden: decoding failed\n");
                return 1;
            }
            logits = llama_get_logits_ith(ctx, -1);
        }
        std::printf(
            "{\"prompt\":%s,%s\"add_special\":%s,\"parse_special\":%s,\"prompt_ids\":%s,\"n_vocab\":%d,\"continuation_ids\":%s,"
            "\"continuation\":%s,\"top_logits\":%s}\n",
            json_string(prompt).c_str(), chat ? ("\"chat_user\":" + json_string(chat_user) + ",").c_str() : "",
            add_special ? "true" : "false", parse_special ? "true" : "false", json_ids(prompt_ids).c_str(), n_vocab,
            json_ids(continuation).c_str(), json_string(text).c_str(), top.c_str());
        llama_free(ctx);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
