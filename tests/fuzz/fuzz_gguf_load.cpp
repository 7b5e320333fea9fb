// Fuzz target: the GGUF loader end to end. The input is a model file: it is written to a
// temporary file (the loader maps files; it has no in-memory path), loaded, and every model that
// loads runs sessions with small and hostile parameters that generate a few tokens.
//
// The session context is always given explicitly and small (n_ctx <= 64): a hostile
// llama.context_length must not decide how much memory the target allocates.
#include <cstring>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz_common.h"

namespace {

constexpr char kPrompt[] = "Once upon a time, there was a little girl named Lily.";

// One temporary file per process, so parallel fuzzing jobs do not share it; removed at exit.
// In $TMPDIR, else in /dev/shm: a memory-backed file system costs far less per run than a disk.
const std::string &model_path() {
    static const std::string path = [] {
        const char *env = std::getenv("TMPDIR");
        const std::string dir = env && *env ? env : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        std::string p = dir + "/h2o-fuzz-gguf-" + std::to_string(getpid()) + ".gguf";
        std::atexit([] { std::remove(model_path().c_str()); });
        return p;
    }();
    return path;
}

void write_file(const std::string &path, const uint8_t *data, size_t size) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) h2o_fuzz::fail("cannot create the temporary model file", path.c_str());
    const bool written = std::fwrite(data, 1, size, f) == size;
    if (std::fclose(f) != 0 || !written) h2o_fuzz::fail("cannot write the temporary model file", path.c_str());
}

struct SessionCase {
    uint32_t n_ctx, kv_budget;
    uint32_t policy;
    int rolling;
    uint32_t kv_type;
};

// Tiny budgets that force eviction from the first prompt, a full cache that runs into
// H2O_ERR_CONTEXT_FULL, and every KV format.
constexpr SessionCase kCases[] = {
    {64, 8, H2O_KV_SCISSORHANDS, 1, H2O_KV_TYPE_F32}, {16, 0, H2O_KV_FULL, 0, H2O_KV_TYPE_F16}, {32, 5, H2O_KV_H2O, 0, H2O_KV_TYPE_K8V4},
    {48, 6, H2O_KV_SINK_WINDOW, 1, H2O_KV_TYPE_Q4},   {64, 16, H2O_KV_TOVA, 1, H2O_KV_TYPE_Q8},
};

void run_session(h2o_model *model, const SessionCase &c, uint64_t seed) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_ctx = c.n_ctx;
    sp.n_threads = 1;
    sp.n_batch = 4;  // several batches per prompt
    sp.seed = seed;
    sp.kv_budget = c.kv_budget;
    sp.kv_policy = c.policy;
    sp.position_rolling = c.rolling;
    sp.kv_type = c.kv_type;
    sp.backend = H2O_BACKEND_CPU;
    h2o_session *session = nullptr;
    const h2o_status st = h2o_session_create(model, &sp, &session);
    h2o_fuzz::check_expected_status(st, "h2o_session_create");
    if (!h2o_fuzz::ok_or_explained(st, h2o_last_error())) return;

    h2o_generate_params gp;

    h2o_generate_params_init(&gp, sizeof gp);
    gp.max_tokens = 3;
    gp.temperature = (seed & 1) ? 0.0f : 0.8f;
    gp.stop_at_eos = 0;
    // Longer than a small budget or context: eviction, batching and CONTEXT_FULL all run.
    const h2o_status g = h2o_generate(session, kPrompt, std::strlen(kPrompt), &gp, nullptr, nullptr);
    h2o_fuzz::check_expected_status(g, "h2o_generate");
    h2o_fuzz::ok_or_explained(g, h2o_session_last_error(session));

    // The extreme ids of the vocabulary, and one past it (must be refused).
    h2o_model_info info{};
    info.struct_size = sizeof(info);
    h2o_fuzz::check(h2o_model_get_info(model, &info) == H2O_OK, "h2o_model_get_info on a loaded model");
    const int32_t ids[] = {0, static_cast<int32_t>(info.n_vocab) - 1};
    const h2o_status d = h2o_session_decode(session, ids, 2);
    h2o_fuzz::check_expected_status(d, "h2o_session_decode");
    h2o_fuzz::ok_or_explained(d, h2o_session_last_error(session));
    const int32_t past_end = static_cast<int32_t>(info.n_vocab);
    h2o_fuzz::check(h2o_session_decode(session, &past_end, 1) == H2O_ERR_INVALID_ARGUMENT, "decode accepted an id past the vocabulary");
    h2o_session_free(session);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    h2o_set_log_callback(nullptr, nullptr, H2O_LOG_NONE);  // rejected files are the normal case
    write_file(model_path(), data, size);
    h2o_model *model = nullptr;
    const h2o_status st = h2o_model_load(model_path().c_str(), nullptr, &model);
    h2o_fuzz::check_expected_status(st, "h2o_model_load");
    if (!h2o_fuzz::ok_or_explained(st, h2o_last_error())) {
        h2o_fuzz::check(model == nullptr, "a failed load returned a model");
        return 0;
    }
    // Which sessions run depends on the input, so that each file does not cost all five.
    uint64_t seed = size;
    for (size_t i = 0; i < size && i < 64; ++i) seed = seed * 31 + data[size - 1 - i];
    run_session(model, kCases[seed % 5], seed);
    run_session(model, kCases[(seed / 5) % 5], seed / 5);
    h2o_model_free(model);
    return 0;
}
