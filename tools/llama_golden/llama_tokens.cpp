// llama_tokens: the token ids llama.cpp gives each input of a case file, for
// tests/data/tokenizer_parity (its README and make_cases.py say how they are made). Not part of
// h2o's build: it links a llama.cpp build through its public llama.h API.
//
// usage: llama_tokens -m VOCAB.gguf -f CASES.inp [--special]
// CASES.inp holds inputs in llama.cpp's test-vector layout (each followed by
// "\n__ggml_vocab_test__\n"); stdout gets one line of space-separated ids per input, without BOS,
// special tokens parsed only with --special.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char **argv) {
    std::string model_path, cases_path;
    bool special = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-m" && i + 1 < argc) {
            model_path = argv[++i];
        } else if (a == "-f" && i + 1 < argc) {
            cases_path = argv[++i];
        } else if (a == "--special") {
            special = true;
        } else {
            model_path.clear();
            break;
        }
    }
    if (model_path.empty() || cases_path.empty()) {
        std::fprintf(stderr, "usage: llama_tokens -m VOCAB.gguf -f CASES.inp [--special]\n");
        return 2;
    }
    std::ifstream in(cases_path, std::ios::binary);
    const std::string cases((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in && !in.eof()) {
        std::fprintf(stderr, "cannot read %s\n", cases_path.c_str());
        return 1;
    }

    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model *model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", model_path.c_str());
        return 1;
    }
    const llama_vocab *vocab = llama_model_get_vocab(model);

    const std::string separator = "\n__ggml_vocab_test__\n";
    size_t pos = 0;
    for (size_t next; (next = cases.find(separator, pos)) != std::string::npos; pos = next + separator.size()) {
        const std::string text = cases.substr(pos, next - pos);
        std::vector<llama_token> ids(text.size() + 8);
        int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(), static_cast<int32_t>(ids.size()),
                               /*add_special=*/false, special);
        if (n < 0) {
            ids.resize(static_cast<size_t>(-n));
            n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(), static_cast<int32_t>(ids.size()), false,
                               special);
        }
        if (n < 0) {
            std::fprintf(stderr, "llama_tokenize failed on case %zu\n", pos);
            return 1;
        }
        for (int i = 0; i < n; ++i) std::printf(i ? " %d" : "%d", ids[static_cast<size_t>(i)]);
        std::printf("\n");
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
