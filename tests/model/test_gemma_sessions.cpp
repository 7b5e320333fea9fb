// Sessions of a Gemma model: its local layers keep a sliding window in fixed memory beside the
// global layers' budget, and pins, rolling, snapshots and forks work across both kinds of layer.
#include <cstdlib>
#include <string>
#include <vector>

#include "doctest/doctest.h"
#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "gemma_test_model.h"
#include "test_util.h"

namespace {

h2o_session_params budget_params(uint32_t n_ctx, uint32_t backend = H2O_BACKEND_CPU) {
    h2o_session_params p;
    h2o_session_params_init(&p, sizeof p);
    p.backend = backend;
    p.n_threads = 2;
    p.n_ctx = n_ctx;
    p.kv_budget = 24;
    p.n_batch = 6;
    p.position_rolling = 1;
    p.kv_type = H2O_KV_TYPE_F32;
    return p;
}

h2o_memory_report memory_of(const h2o_session *session) {
    h2o_memory_report m{};
    m.struct_size = sizeof m;
    REQUIRE(h2o_session_memory(session, &m) == H2O_OK);
    return m;
}

int32_t vocab_size(const h2o_model *model) {
    h2o_model_info info{};
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(model, &info) == H2O_OK);
    return static_cast<int32_t>(info.n_vocab);
}

// n greedy tokens, each decoded after it is chosen.
std::vector<int32_t> greedy(h2o_session *session, int n, int32_t n_vocab) {
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    std::vector<int32_t> tokens;
    for (int i = 0; i < n; ++i) {
        REQUIRE(h2o_session_get_logits(session, logits.data(), logits.size()) == H2O_OK);
        int32_t best = 0;
        for (int32_t t = 1; t < n_vocab; ++t) best = logits[static_cast<size_t>(t)] > logits[static_cast<size_t>(best)] ? t : best;
        tokens.push_back(best);
        REQUIRE(h2o_session_decode(session, &tokens.back(), 1) == H2O_OK);
    }
    return tokens;
}

// A snapshot loaded into a new session and a fork each continue with the session's next n greedy
// tokens.
void check_continuations(h2o_model *model, h2o_session *session, const h2o_session_params &p, int n, int32_t n_vocab) {
    size_t bytes = 0;
    REQUIRE(h2o_session_state_size(session, &bytes) == H2O_OK);
    std::vector<unsigned char> state(bytes);
    size_t written = 0;
    REQUIRE(h2o_session_save_to_buffer(session, state.data(), state.size(), &written) == H2O_OK);
    h2o_session *forked = nullptr, *loaded = nullptr;
    REQUIRE(h2o_session_fork(session, &forked) == H2O_OK);
    REQUIRE_MESSAGE(h2o_session_load_from_buffer(model, state.data(), written, &p, &loaded) == H2O_OK, h2o_last_error());
    const std::vector<int32_t> expected = greedy(session, n, n_vocab);
    CHECK(greedy(forked, n, n_vocab) == expected);
    CHECK(greedy(loaded, n, n_vocab) == expected);
    h2o_session_free(loaded);
    h2o_session_free(forked);
}

}  // namespace

// On `backend`: false when it has no device here.
bool check_gemma_session(h2o_model *model, uint32_t backend) {
    const int32_t n_vocab = vocab_size(model);

    // The cache's memory depends on the budget and the window, never on the stream's length.
    h2o_session_params p = budget_params(64, backend);
    h2o_session *session = nullptr;
    const h2o_status created = h2o_session_create(model, &p, &session);
    if (created == H2O_ERR_BACKEND_UNAVAILABLE) return false;
    REQUIRE_MESSAGE(created == H2O_OK, h2o_last_error());
    h2o_session_params longer = budget_params(60000, backend);
    h2o_session *other = nullptr;
    REQUIRE(h2o_session_create(model, &longer, &other) == H2O_OK);
    const h2o_memory_report before = memory_of(session);
    CHECK(memory_of(other).kv_bytes == before.kv_bytes);
    h2o_session_free(other);
    // Each local layer holds its window and a batch (8 + 6 - 1 slots), each global one the budget;
    // the policy's numbers are the global layers'.
    h2o_kv_layout layout{};
    layout.struct_size = sizeof layout;
    REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
    CHECK(layout.min_layer_budget == 24);
    CHECK(layout.max_layer_budget == 24);
    CHECK(layout.min_head_budget == 24);

    // A pinned instruction longer than the window: the global layers keep it, the local ones
    // let it slide out like any token.
    const std::string instruction = "Remember Lily.";
    std::vector<int32_t> ids(64);
    size_t n_ids = 0;
    REQUIRE(h2o_tokenize(model, instruction.data(), instruction.size(), H2O_TOKENIZE_ADD_BOS, ids.data(), ids.size(), &n_ids) == H2O_OK);
    REQUIRE(n_ids > 8);   // longer than the window
    REQUIRE(n_ids < 24);  // within what the budget may pin
    REQUIRE(h2o_session_add_text(session, instruction.data(), instruction.size(), H2O_TEXT_PIN) == H2O_OK);
    const std::string story = "Once upon a time there was a little fox who lived by the river and loved to sing.";
    REQUIRE(h2o_session_add_text(session, story.data(), story.size(), 0) == H2O_OK);
    greedy(session, 150, n_vocab);  // far past the budget and the window: both kinds evict
    CHECK(memory_of(session).kv_bytes == before.kv_bytes);

    // A snapshot, a load and a fork each continue exactly as the session does.
    check_continuations(model, session, p, 40, n_vocab);
    h2o_session_free(session);
    return true;
}

TEST_CASE(
    "gemma sessions: local layers hold their window in fixed memory, and pins, rolling, snapshots and forks cross both kinds, on "
    "the CPU, Vulkan and CUDA") {
    const std::string path = h2o_test::write_small_gemma3("gemma3-sessions.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    CHECK(check_gemma_session(model, H2O_BACKEND_CPU));
    if (!check_gemma_session(model, H2O_BACKEND_VULKAN)) {
        if (std::getenv("H2O_REQUIRE_VULKAN")) FAIL("no Vulkan device");
        MESSAGE("not run on Vulkan: no device");
    }
    if (!check_gemma_session(model, H2O_BACKEND_CUDA)) MESSAGE("not run on CUDA: no device");
    h2o_model_free(model);
}

// A session whose budgets move between the global layers (a slope) and their kv heads (a share),
// moved every 4 tokens.
h2o_session_params moving_params(uint32_t backend) {
    h2o_session_params p = budget_params(64, backend);
    p.kv_budget = 48;
    p.kv_horizon = H2O_KV_HORIZON_NONE;  // stale tokens, evicted first, would leave the heads' shares even
    REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_LAYER_SLOPE, 0.5) == H2O_OK);
    REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_HEAD_SHARE, 0.25) == H2O_OK);
    REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_REBALANCE_INTERVAL, 4) == H2O_OK);
    return p;
}

TEST_CASE("gemma sessions: budgets move between the global layers and their heads, and local layers keep their windows") {
    const std::string path = h2o_test::write_small_gemma3("gemma3-moving.gguf", 2);
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    const int32_t n_vocab = vocab_size(model);
    // The slope spreads 2 x 48 slots over the two global layers (layers 2 and 5): 24 and 72; a
    // quarter of each moves between its two kv heads.
    h2o_session_params p = moving_params(H2O_BACKEND_CPU);
    h2o_session *session = nullptr;
    REQUIRE_MESSAGE(h2o_session_create(model, &p, &session) == H2O_OK, h2o_last_error());
    h2o_kv_layout layout{};
    layout.struct_size = sizeof layout;
    REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
    CHECK(layout.min_layer_budget == 24);
    CHECK(layout.max_layer_budget == 72);
    CHECK(layout.min_head_budget == 18);
    h2o_session_params fixed = budget_params(64);
    fixed.kv_budget = 48;
    h2o_session *uniform = nullptr;
    REQUIRE(h2o_session_create(model, &fixed, &uniform) == H2O_OK);
    // The same slots; rebalancing adds its working lists (a layer's slots and cells).
    CHECK(memory_of(session).kv_bytes > memory_of(uniform).kv_bytes);
    CHECK(memory_of(session).kv_bytes < memory_of(uniform).kv_bytes + 4096);
    h2o_session_free(uniform);

    const std::string instruction = "Remember Lily.";
    REQUIRE(h2o_session_add_text(session, instruction.data(), instruction.size(), H2O_TEXT_PIN) == H2O_OK);
    const std::string story = "Once upon a time there was a little fox who lived by the river and loved to sing.";
    REQUIRE(h2o_session_add_text(session, story.data(), story.size(), 0) == H2O_OK);
    const h2o_memory_report before = memory_of(session);
    greedy(session, 150, n_vocab);
    CHECK(memory_of(session).kv_bytes == before.kv_bytes);

    // A snapshot, a load and a fork continue exactly, between rebalancings as at them.
    for (int step = 0; step < 2; ++step) {
        CAPTURE(step);
        check_continuations(model, session, p, 21, n_vocab);
    }
    h2o_session_free(session);
    session = nullptr;

    // Sharing across layers would pool the global layers' cells, which lie between local ones.
    REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_SHARE_ACROSS_LAYERS, 1) == H2O_OK);
    CHECK(h2o_session_create(model, &p, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("sliding-window") != std::string::npos);
    CHECK(session == nullptr);
    h2o_model_free(model);
}

TEST_CASE("gemma sessions: budgets that move give the same tokens on Vulkan as on the CPU") {
    const std::string path = h2o_test::write_small_gemma3("gemma3-moving-vulkan.gguf", 2);
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    const int32_t n_vocab = vocab_size(model);
    std::vector<std::vector<int32_t>> tokens;
    for (uint32_t backend : {uint32_t{H2O_BACKEND_CPU}, uint32_t{H2O_BACKEND_VULKAN}}) {
        const h2o_session_params p = moving_params(backend);
        h2o_session *session = nullptr;
        const h2o_status created = h2o_session_create(model, &p, &session);
        if (created == H2O_ERR_BACKEND_UNAVAILABLE && !std::getenv("H2O_REQUIRE_VULKAN")) {
            MESSAGE("not run on Vulkan: no device");
            break;
        }
        REQUIRE_MESSAGE(created == H2O_OK, h2o_last_error());
        const std::string story = "Once upon a time there was a little fox who lived by the river and loved to sing.";
        REQUIRE(h2o_session_add_text(session, story.data(), story.size(), 0) == H2O_OK);
        tokens.push_back(greedy(session, 60, n_vocab));  // past the global layers' budgets: they rebalance
        h2o_session_free(session);
    }
    if (tokens.size() == 2) CHECK(tokens[0] == tokens[1]);
    h2o_model_free(model);
}
