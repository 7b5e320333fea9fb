// Many sessions on one model, each on its own thread: the model (weights, tokenizer, shared
// tables) must be safe to share, and a session's output must not depend on what runs beside it.
// CI also runs this file's test under ThreadSanitizer (scripts/ci-matrix.sh).
#include <cstring>
#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "h2o/h2o.h"
#include "test_util.h"

namespace {

using h2o_test::append_text;

struct Run {
    uint32_t policy;
    uint32_t budget;
    int rolling;
    uint32_t n_threads;  // compute threads of the session itself
    const char *pinned;  // added with H2O_TEXT_PIN first, or nullptr
    const char *prompt;
};

// Small budgets so that every session evicts, both eviction policies named in the issue,
// rolling on some, and some sessions with a worker pool of their own.
const Run kRuns[8] = {
    {H2O_KV_SCISSORHANDS, 24, 1, 1, nullptr, "Once upon a time"},
    {H2O_KV_H2O, 24, 1, 2, "A story about a cat.", "The cat"},
    {H2O_KV_SCISSORHANDS, 32, 0, 1, nullptr, "Lily and Tom went to the park"},
    {H2O_KV_H2O, 32, 0, 1, nullptr, "One day, a little bird"},
    {H2O_KV_SCISSORHANDS, 16, 1, 2, "Be kind.", "Tim had a red ball"},
    {H2O_KV_H2O, 16, 1, 1, nullptr, "The sun was hot"},
    {H2O_KV_SCISSORHANDS, 20, 0, 1, nullptr, "Mom said"},
    {H2O_KV_H2O, 20, 1, 1, "Sue likes cake.", "Sue"},
};

struct Output {
    std::string error, text;
};

// What one session produces; threads return errors rather than assert.
Output run_session(h2o_model *model, const Run &run, uint64_t seed) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = H2O_BACKEND_CPU;
    sp.n_ctx = 256;
    sp.n_threads = run.n_threads;
    sp.n_batch = 8;
    sp.seed = seed;
    sp.kv_budget = run.budget;
    sp.kv_policy = run.policy;
    sp.position_rolling = run.rolling;
    h2o_session *session = nullptr;
    if (h2o_session_create(model, &sp, &session) != H2O_OK) return {h2o_last_error(), ""};
    Output out;
    if (run.pinned && h2o_session_add_text(session, run.pinned, std::strlen(run.pinned), H2O_TEXT_PIN) != H2O_OK) {
        out.error = h2o_session_last_error(session);
    } else {
        h2o_generate_params gen;
        h2o_generate_params_init(&gen, sizeof gen);
        gen.max_tokens = 64;  // several times the budget: eviction runs throughout
        gen.temperature = 0.8f;
        gen.stop_at_eos = 0;
        if (h2o_generate(session, run.prompt, std::strlen(run.prompt), &gen, append_text, &out.text) != H2O_OK) {
            out.error = h2o_session_last_error(session);
        }
    }
    h2o_session_free(session);
    return out;
}

}  // namespace

TEST_CASE("eight threads with their own evicting sessions on one model match single-threaded runs") {
    H2O_SHARED_FILE_OR_SKIP(model_path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE_MESSAGE(h2o_model_load(model_path.c_str(), nullptr, &model) == H2O_OK, h2o_last_error());

    std::vector<Output> expected(8), got(8);
    for (size_t i = 0; i < 8; ++i) expected[i] = run_session(model, kRuns[i], 1000 + i);

    std::vector<std::thread> threads;
    for (size_t i = 0; i < 8; ++i) {
        threads.emplace_back([&, i] { got[i] = run_session(model, kRuns[i], 1000 + i); });
    }
    for (auto &t : threads) t.join();
    h2o_model_free(model);

    for (size_t i = 0; i < 8; ++i) {
        INFO("session " << i << ": " << expected[i].error << got[i].error << expected[i].text);
        CHECK(expected[i].error.empty());
        CHECK(got[i].error.empty());
        CHECK(expected[i].text.size() > 100);  // 64 tokens of a story
        CHECK(got[i].text == expected[i].text);
    }
}
