// Times llama.cpp's llama_tokenize on a file, one thread, without BOS and with special tokens not
// parsed: the counterpart of h2o_tokenize_time.cpp, built against a llama.cpp build by
// scripts/bench-tokenizer.sh (llama.cpp is not part of this repository).
//
//   llama_tokenize_time VOCAB.gguf FILE RUNS
//
// Prints one line per run: wall milliseconds, this thread's CPU milliseconds, the token count.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s VOCAB.gguf FILE RUNS\n", argv[0]);
        return 2;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    llama_model *model = llama_model_load_from_file(argv[1], params);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    std::ifstream in(argv[2], std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<llama_token> ids(text.size() + 16);
    for (int run = 0; run < std::atoi(argv[3]); ++run) {
        timespec cpu0, cpu1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
        const auto t0 = std::chrono::steady_clock::now();
        const int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(), static_cast<int32_t>(ids.size()),
                                     /*add_special=*/false, /*parse_special=*/false);
        const auto t1 = std::chrono::steady_clock::now();
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
        if (n < 0) {
            std::fprintf(stderr, "llama_tokenize failed (%d)\n", n);
            return 1;
        }
        const double cpu_ms = (cpu1.tv_sec - cpu0.tv_sec) * 1e3 + (cpu1.tv_nsec - cpu0.tv_nsec) / 1e6;
        std::printf("%.3f %.3f %d\n", std::chrono::duration<double, std::milli>(t1 - t0).count(), cpu_ms, n);
    }
    llama_model_free(model);
    return 0;
}
