// Retention spans (h2o_session_add_span_text): a span keeps its minimum in every (layer, kv
// head), competes for the rest, is checked before anything changes, and travels with snapshots
// and forks. The eviction rule itself is checked slot by slot against the specification in
// test_kv_policy_spec.cpp and across backends in the device suites.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "doctest/doctest.h"
#include "h2o/h2o.h"
#include "test_util.h"

namespace {

const char *const kInstruction = "Always rhyme. Pip is a blue bird.";
const char *const kStory =
    "Once upon a time there was a little girl named Lily. She liked to play in the park with her "
    "dog. One day they found a big red ball under a tree. Lily threw the ball and the dog ran after "
    "it. They played all day until the sun went down, and then they went home to eat soup.";

h2o_session_params span_session(uint32_t policy, int rolling = 1) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 1;
    sp.backend = H2O_BACKEND_CPU;
    sp.kv_budget = 32;
    sp.n_ctx = 512;
    sp.n_batch = 16;
    sp.kv_policy = policy;
    sp.position_rolling = rolling;
    // Without rolling, the stream ends at n_ctx: the contract of kv_overflow = error.
    if (!rolling) sp.kv_overflow = H2O_KV_OVERFLOW_ERROR;
    sp.seed = 99;
    return sp;
}

h2o_span_info span_info(h2o_session *session, uint32_t id) {
    h2o_span_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    REQUIRE(h2o_session_get_span_info(session, id, &info) == H2O_OK);
    return info;
}

bool has_span(h2o_session *session, uint32_t id) {
    h2o_span_info info;
    info.struct_size = sizeof info;
    return h2o_session_get_span_info(session, id, &info) == H2O_OK;
}

std::string greedy(h2o_session *session, const char *prompt, uint32_t n) {
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = n;
    gen.temperature = 0.0f;
    gen.stop_at_eos = 0;
    std::string text;
    REQUIRE(h2o_generate(session, prompt, std::strlen(prompt), &gen, h2o_test::append_text, &text) == H2O_OK);
    return text;
}

h2o_status add_span(h2o_session *session, uint32_t id, float share, const char *text, uint32_t flags = 0) {
    return h2o_session_add_span_text(session, id, share, text, std::strlen(text), flags);
}

}  // namespace

TEST_CASE("retention spans: a span keeps its minimum in every (layer, kv head), and loses it without one") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    for (uint32_t policy : {H2O_KV_WINDOW, H2O_KV_SCISSORHANDS, H2O_KV_H2O, H2O_KV_RANDOM}) {
        CAPTURE(policy);
        for (float share : {0.0f, 0.25f}) {
            CAPTURE(share);
            h2o_test::ApiSession m;
            REQUIRE(m.open(path, span_session(policy)));
            REQUIRE(add_span(m.session, 7, share, kInstruction) == H2O_OK);
            const h2o_span_info before = span_info(m.session, 7);
            CHECK(before.span_id == 7);
            CHECK(before.min_share == share);
            CHECK(before.min_tokens == static_cast<int32_t>(std::floor(share * 32)));
            CHECK(before.n_tokens >= 10);  // BOS and the instruction's tokens, all held so far
            CHECK(before.kept_min == before.n_tokens);
            CHECK(before.kept_max == before.n_tokens);
            // Five times the budget of other text, a prompt and a generation.
            for (int i = 0; i < 2; ++i) REQUIRE(h2o_session_add_text(m.session, kStory, std::strlen(kStory), 0) == H2O_OK);
            greedy(m.session, " The end.", 40);
            const h2o_span_info after = span_info(m.session, 7);
            CHECK(after.n_tokens == before.n_tokens);
            CHECK(after.kept_max <= after.n_tokens);
            if (share > 0.0f) {
                CHECK(after.kept_min >= 8);  // every cell keeps the minimum; a policy may keep more
            }
            if (policy == H2O_KV_WINDOW) {
                // The window evicts the oldest first: the span down to its minimum, or entirely.
                CHECK(after.kept_max == (share > 0.0f ? 8 : 0));
                CHECK(after.kept_mean == doctest::Approx(share > 0.0f ? 8.0 : 0.0));
            }
            if (policy == H2O_KV_WINDOW || policy == H2O_KV_RANDOM) {
                CHECK(after.attention_share == -1.0);  // these policies gather no statistics
            } else {
                CHECK(after.attention_share >= 0.0);
                CHECK(after.attention_share <= 1.0);
            }
        }
    }
}

TEST_CASE("retention spans: pins and minimums share kv_budget - 1, and a refused call changes nothing") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_test::ApiSession m, twin;
    REQUIRE(m.open(path, span_session(H2O_KV_SCISSORHANDS)));
    REQUIRE(twin.open(path, span_session(H2O_KV_SCISSORHANDS)));
    for (h2o_session *s : {m.session, twin.session}) REQUIRE(add_span(s, 1, 0.5f, kInstruction) == H2O_OK);  // 16 slots

    // 16 reserved: 15 more (pinned or held) fit, 16 do not.
    CHECK(add_span(m.session, 2, 0.5f, "More.") == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_budget - 1") != std::string::npos);
    CHECK_FALSE(has_span(m.session, 2));
    CHECK(add_span(m.session, 1, 1.0f, "More.") == H2O_ERR_INVALID_ARGUMENT);  // raising the span's own
    CHECK(span_info(m.session, 1).min_share == 0.5f);
    CHECK(h2o_session_add_text(m.session, kStory, std::strlen(kStory), H2O_TEXT_PIN) == H2O_ERR_INVALID_ARGUMENT);
    // Bad arguments.
    CHECK(add_span(m.session, 0, 0.1f, "x") == H2O_ERR_INVALID_ARGUMENT);
    CHECK(add_span(m.session, 3, -0.1f, "x") == H2O_ERR_INVALID_ARGUMENT);
    CHECK(add_span(m.session, 3, 1.5f, "x") == H2O_ERR_INVALID_ARGUMENT);
    CHECK(add_span(m.session, 3, std::nanf(""), "x") == H2O_ERR_INVALID_ARGUMENT);
    CHECK(add_span(m.session, 3, 0.1f, "x", 0x80) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_add_span_text(m.session, 3, 0.1f, nullptr, 4, 0) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_add_span_text(nullptr, 3, 0.1f, "x", 1, 0) == H2O_ERR_INVALID_ARGUMENT);
    h2o_span_info info;
    info.struct_size = 4;
    CHECK(h2o_session_get_span_info(m.session, 1, &info) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_get_span_info(m.session, 1, nullptr) == H2O_ERR_INVALID_ARGUMENT);
    CHECK_FALSE(has_span(m.session, 3));
    // Nothing of the refused calls reached the cache.
    CHECK(greedy(m.session, " Then", 30) == greedy(twin.session, " Then", 30));

    // Lowering a minimum frees its slots for pins; a span may be pinned (and counts as held).
    REQUIRE(add_span(m.session, 1, 0.0f, "") == H2O_OK);
    REQUIRE(add_span(m.session, 2, 0.25f, " Pip sings.", H2O_TEXT_PIN) == H2O_OK);
    const h2o_span_info pinned = span_info(m.session, 2);
    CHECK(pinned.kept_min == pinned.n_tokens);
    for (int i = 0; i < 2; ++i) REQUIRE(h2o_session_add_text(m.session, kStory, std::strlen(kStory), 0) == H2O_OK);
    CHECK(span_info(m.session, 2).kept_min == pinned.n_tokens);

    // At most H2O_MAX_SPANS spans.
    for (uint32_t id = 3; id <= H2O_MAX_SPANS; ++id) REQUIRE(add_span(m.session, id, 0.0f, " a") == H2O_OK);
    CHECK(add_span(m.session, 1000, 0.0f, " a") == H2O_ERR_INVALID_ARGUMENT);
    CHECK(add_span(m.session, 5, 0.0f, " a") == H2O_OK);  // an existing span still takes text

    // A cache that never evicts has no use for minimums; reset forgets the spans.
    h2o_test::ApiSession full;
    REQUIRE(full.open(path, span_session(H2O_KV_FULL, 0)));
    CHECK(add_span(full.session, 1, 0.1f, kInstruction) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(add_span(full.session, 1, 0.0f, kInstruction) == H2O_OK);
    REQUIRE(h2o_session_reset(m.session) == H2O_OK);
    CHECK_FALSE(has_span(m.session, 1));
    CHECK(h2o_session_add_text(m.session, kInstruction, std::strlen(kInstruction), H2O_TEXT_PIN) == H2O_OK);
}

TEST_CASE("retention spans: snapshots and forks carry the spans and continue exactly") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_test::ApiSession m;
    REQUIRE(m.open(path, span_session(H2O_KV_SCISSORHANDS)));
    REQUIRE(add_span(m.session, 11, 0.25f, kInstruction) == H2O_OK);
    REQUIRE(add_span(m.session, 12, 0.125f, " Pip is blue.", H2O_TEXT_PIN) == H2O_OK);
    REQUIRE(h2o_session_add_text(m.session, kStory, std::strlen(kStory), 0) == H2O_OK);

    size_t bound = 0, size = 0;
    REQUIRE(h2o_session_state_size(m.session, &bound) == H2O_OK);
    std::vector<uint8_t> bytes(bound);
    REQUIRE(h2o_session_save_to_buffer(m.session, bytes.data(), bytes.size(), &size) == H2O_OK);
    h2o_session *loaded = nullptr, *forked = nullptr;
    REQUIRE(h2o_session_load_from_buffer(m.model, bytes.data(), size, nullptr, &loaded) == H2O_OK);
    REQUIRE(h2o_session_fork(m.session, &forked) == H2O_OK);
    for (h2o_session *copy : {loaded, forked}) {
        for (uint32_t id : {11u, 12u}) {
            const h2o_span_info a = span_info(m.session, id), b = span_info(copy, id);
            CHECK(b.min_share == a.min_share);
            CHECK(b.min_tokens == a.min_tokens);
            CHECK(b.n_tokens == a.n_tokens);
            CHECK(b.kept_min == a.kept_min);
            CHECK(b.kept_max == a.kept_max);
            CHECK(b.attention_share == a.attention_share);
        }
    }
    // The minimums act after loading: the continuations (which evict) are the same, and so is
    // what each span keeps.
    const std::string expected = greedy(m.session, " Later", 60);
    CHECK(greedy(loaded, " Later", 60) == expected);
    CHECK(greedy(forked, " Later", 60) == expected);
    CHECK(span_info(loaded, 11).kept_min >= 8);
    CHECK(span_info(loaded, 11).kept_mean == span_info(m.session, 11).kept_mean);
    h2o_session_free(loaded);
    h2o_session_free(forked);
}

TEST_CASE("retention spans: a session with a span does not start from the model's prefix cache, which would drop it") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model_params mp;
    h2o_model_params_init(&mp, sizeof mp);
    mp.prefix_cache_bytes = 64u << 20;
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), &mp, &model) == H2O_OK);
    const h2o_session_params sp = span_session(H2O_KV_SCISSORHANDS);
    h2o_session *first = nullptr, *second = nullptr;
    REQUIRE(h2o_session_create(model, &sp, &first) == H2O_OK);
    REQUIRE(h2o_session_add_text(first, kStory, std::strlen(kStory), 0) == H2O_OK);  // cached for the next session
    REQUIRE(h2o_session_create(model, &sp, &second) == H2O_OK);
    REQUIRE(add_span(second, 4, 0.25f, "") == H2O_OK);  // a span defined before any text
    REQUIRE(h2o_session_add_text(second, kStory, std::strlen(kStory), 0) == H2O_OK);
    CHECK(span_info(second, 4).min_tokens == 8);
    h2o_session_free(first);
    h2o_session_free(second);
    h2o_model_free(model);
}

TEST_CASE("retention spans: text refused for a full context defines no span, the pending token counted") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    // A generation leaves its last token pending, fed before the next text. With n_ctx set so
    // that the text alone would fit and not with that token, the call must be refused whole.
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 20;
    gen.temperature = 0.0f;
    gen.stop_at_eos = 0;
    auto run = [&](uint32_t n_ctx, h2o_test::ApiSession &m) {
        h2o_session_params sp = span_session(H2O_KV_SCISSORHANDS, /*rolling=*/0);
        sp.n_ctx = n_ctx;
        REQUIRE(m.open(path, sp));
        std::string text;
        REQUIRE(h2o_generate(m.session, "Once", 4, &gen, h2o_test::append_text, &text) == H2O_OK);
        h2o_generate_stats stats;
        stats.struct_size = sizeof stats;
        REQUIRE(h2o_session_get_stats(m.session, &stats) == H2O_OK);
        return stats.n_past;
    };
    h2o_test::ApiSession probe;
    const uint64_t processed = run(512, probe);
    size_t n_text = 0;
    REQUIRE(h2o_tokenize(probe.model, kInstruction, std::strlen(kInstruction), 0, nullptr, 0, &n_text) == H2O_ERR_BUFFER_TOO_SMALL);
    h2o_test::ApiSession m;
    REQUIRE(run(static_cast<uint32_t>(processed + n_text), m) == processed);
    CHECK(add_span(m.session, 9, 0.25f, kInstruction) == H2O_ERR_CONTEXT_FULL);
    CHECK_FALSE(has_span(m.session, 9));
}
