#include "bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "gguf.h"
#include "kv_format.h"
#include "tensor_types.h"

namespace h2o_tools {

namespace {

// Two 64-bit lanes: plain vector loads on every target (SSE2, NEON).
typedef uint64_t Lanes __attribute__((vector_size(16)));

// Reads a thread's part as the decoding kernels read weights: as several streams at once (their
// row groups), each fetched ahead in software. One plain stream reads far less than a core can:
// on an Intel Xeon with 2 threads, 21-22 GB/s, against 26-27 with the prefetch and 32-33 as 4
// prefetched streams; the decoding kernels themselves moved 31 GB/s (Q8_0, TinyLlama shape). A
// probe below what the kernels reach would make every share look better than it is.
constexpr size_t kStreams = 4;
constexpr size_t kPrefetchLanes = 2048 / sizeof(Lanes);  // 2 KiB ahead, as the kernels

uint64_t sum_words(const Lanes *words, size_t count) {
    Lanes a = {0, 0}, b = a, c = a, d = a;
    const size_t per_stream = count / kStreams / 4 * 4;
    for (size_t i = 0; i < per_stream; i += 4) {
        for (size_t k = 0; k < kStreams; ++k) {
            const Lanes *w = words + k * per_stream + i;
            __builtin_prefetch(w + kPrefetchLanes, 0, 3);
            a += w[0];
            b += w[1];
            c += w[2];
            d += w[3];
        }
    }
    for (size_t i = kStreams * per_stream; i < count; ++i) a += words[i];
    const Lanes s = a + b + c + d;
    return s[0] + s[1];
}

}  // namespace

double probe_read_bandwidth(int threads, size_t bytes, int passes) {
    threads = std::max(1, threads);
    const size_t count = bytes / sizeof(Lanes);
    std::unique_ptr<Lanes[]> buffer(new Lanes[count]);
    std::memset(static_cast<void *>(buffer.get()), 1, count * sizeof(Lanes));  // every page mapped before timing
    double best = 0.0;
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    for (int pass = 0; pass < passes; ++pass) {
        std::vector<std::thread> workers;
        const auto t0 = std::chrono::steady_clock::now();
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                const size_t begin = count * static_cast<size_t>(t) / static_cast<size_t>(threads);
                const size_t end = count * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
                sums[static_cast<size_t>(t)] = sum_words(buffer.get() + begin, end - begin);
            });
        }
        for (std::thread &w : workers) w.join();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, static_cast<double>(count * sizeof(Lanes)) / seconds);
    }
    // The sums are stored where the compiler must assume they are read, so the reads stay.
    static volatile uint64_t sink;
    for (uint64_t s : sums) sink = sink + s;
    return best;
}

double probe_read_bandwidth_apart(int threads) {
    int fds[2];
    if (pipe(fds) != 0) return 0.0;
    const pid_t child = fork();
    if (child < 0) {
        close(fds[0]);
        close(fds[1]);
        return 0.0;
    }
    if (child == 0) {
        close(fds[0]);
        const double rate = probe_read_bandwidth(threads);
        const ssize_t written = write(fds[1], &rate, sizeof rate);
        _exit(written == static_cast<ssize_t>(sizeof rate) ? 0 : 1);
    }
    close(fds[1]);
    double rate = 0.0;
    const ssize_t got = read(fds[0], &rate, sizeof rate);
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return got == static_cast<ssize_t>(sizeof rate) && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? rate : 0.0;
}

uint64_t decode_weight_bytes(const std::string &path, std::string *error) {
    std::unique_ptr<h2o::GgufFile> file;
    const h2o::Status st = h2o::GgufFile::open(path, &file);
    if (!st.ok()) {
        *error = st.message;
        return 0;
    }
    uint64_t total = 0;
    for (const h2o::GgufTensor &t : file->tensors()) total += t.n_bytes;
    const h2o::GgufTensor *embd = file->find_tensor("token_embd.weight");
    if (embd && file->find_tensor("output.weight")) total -= embd->n_bytes - h2o::row_bytes(embd->type, embd->ne[0]);
    return total;
}

uint64_t kv_bytes_per_cached_token(uint32_t kv_type, uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim) {
    const auto type = static_cast<h2o::KvType>(kv_type);
    const size_t row = h2o::kv_row_bytes(h2o::kv_key_format(type), static_cast<int>(head_dim)) +
                       h2o::kv_row_bytes(h2o::kv_value_format(type), static_cast<int>(head_dim));
    return static_cast<uint64_t>(row) * n_layer * n_head_kv;
}

}  // namespace h2o_tools
