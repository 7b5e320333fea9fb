// Times the library's tokenizer on a file, one thread: Tokenizer::encode without BOS, special
// tokens not parsed (as llama_tokenize_time.cpp times llama.cpp's). Built and run by
// scripts/bench-tokenizer.sh.
//
//   h2o_tokenize_time VOCAB.gguf FILE RUNS
//
// Prints one line per run: wall milliseconds, this thread's CPU milliseconds, the token count.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "gguf.h"
#include "tokenizer.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s VOCAB.gguf FILE RUNS\n", argv[0]);
        return 2;
    }
    std::unique_ptr<h2o::GgufFile> file;
    h2o::Status st = h2o::GgufFile::open(argv[1], &file);
    std::unique_ptr<h2o::Tokenizer> tok;
    if (st.ok()) st = h2o::Tokenizer::from_gguf(*file, &tok);
    if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.message.c_str());
        return 1;
    }
    std::ifstream in(argv[2], std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<int32_t> ids;
    for (int run = 0; run < std::atoi(argv[3]); ++run) {
        timespec cpu0, cpu1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
        const auto t0 = std::chrono::steady_clock::now();
        st = tok->encode(text, false, &ids);
        const auto t1 = std::chrono::steady_clock::now();
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
        if (!st.ok()) {
            std::fprintf(stderr, "%s\n", st.message.c_str());
            return 1;
        }
        const double cpu_ms = (cpu1.tv_sec - cpu0.tv_sec) * 1e3 + (cpu1.tv_nsec - cpu0.tv_nsec) / 1e6;
        std::printf("%.3f %.3f %zu\n", std::chrono::duration<double, std::milli>(t1 - t0).count(), cpu_ms, ids.size());
    }
    return 0;
}
