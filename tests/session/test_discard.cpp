// Eviction from outside the policy, for the evaluation's baselines: h2o_experimental_session_discard
// (llama.cpp's context shift): what it evicts and how the kept keys roll (the same as the cache's
// own oldest-first eviction), what the session counts afterwards, and what it refuses; and the
// oracle's h2o_experimental_session_kv_attention and h2o_experimental_session_evict.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "kv_cache.h"
#include "test_util.h"

using namespace h2o;

namespace {

// One (layer, kv head) of 16 slots holding stream indices 0..15 at their positions, with the
// same pseudo-random keys and values in every cache made, rolling, and slot 5 pinned.
struct FilledCell {
    static constexpr int kSlots = 16, kDim = 8;
    KvCache cache;
    explicit FilledCell(const KvPolicyConfig &policy) {
        KvConfig c;
        c.n_layer = 1;
        c.n_head_kv = 1;
        c.head_dim = kDim;
        c.n_slots = kSlots;
        c.policy = policy;
        c.rolling = true;
        c.rope.dims = kDim;
        c.rope.freq_base = 10000.0f;
        REQUIRE(cache.init(c).ok());
        uint32_t seed = 12345;
        for (int i = 0; i < kSlots; ++i) {
            const int s = cache.claim_slot(0, 0, i, i, i == 5 ? KV_TAG_PINNED : 0);
            const KvCache::CellView v = cache.cell(0, 0);
            auto *key = reinterpret_cast<float *>(v.keys + cache.key_row_bytes() * s);
            auto *value = reinterpret_cast<float *>(v.values + cache.value_row_bytes() * s);
            for (int d = 0; d < kDim; ++d) {
                seed = seed * 1664525u + 1013904223u;
                key[d] = static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
                value[d] = -key[d];
            }
        }
    }
};

KvPolicyConfig sink_window(int sinks) {
    KvPolicyConfig p;
    p.policy = KvPolicy::SinkWindow;
    p.sinks = sinks;
    return p;
}

h2o_session_params window_params(uint32_t n_ctx) {
    h2o_session_params p;
    h2o_session_params_init(&p, sizeof p);
    p.backend = H2O_BACKEND_CPU;
    p.n_threads = 1;
    p.n_ctx = n_ctx;
    p.n_batch = n_ctx;
    p.kv_policy = H2O_KV_WINDOW;
    p.kv_budget = n_ctx;
    p.position_rolling = 1;
    return p;
}

h2o_kv_usage usage_of(const h2o_session *session) {
    h2o_kv_usage usage;
    usage.struct_size = sizeof usage;
    REQUIRE(h2o_session_get_kv_usage(session, &usage) == H2O_OK);
    return usage;
}

std::vector<float> logits_after(h2o_session *session, int32_t token, size_t n_vocab) {
    REQUIRE(h2o_session_decode(session, &token, 1) == H2O_OK);
    std::vector<float> logits(n_vocab);
    REQUIRE(h2o_session_get_logits(session, logits.data(), logits.size()) == H2O_OK);
    return logits;
}

}  // namespace

TEST_CASE("discard: the oldest unpinned tokens after the kept ones go at once, and kept keys roll as the cache's own eviction rolls them") {
    // make_room for 6 tokens under sink_window (no recent window) evicts the 6 oldest tokens
    // after the 2 sinks, passing over the pinned one: what discard_oldest(6, keep 2) must do.
    FilledCell evicted(sink_window(2)), discarded(sink_window(2));
    CHECK(discarded.cache.discardable(0, 0, 2) == FilledCell::kSlots - 3);
    REQUIRE(evicted.cache.make_room(0, 0, 6, FilledCell::kSlots) == 6);
    discarded.cache.discard_oldest(0, 0, 6, 2);
    const KvImage &a = evicted.cache.image(), &b = discarded.cache.image();
    CHECK(a.stream_index == b.stream_index);
    CHECK(a.position == b.position);
    CHECK(a.keys == b.keys);
    CHECK(a.values == b.values);
    CHECK(a.free_count == b.free_count);
    CHECK(a.free_list == b.free_list);
    // What went: 2, 3, 4, 6, 7, 8 (5 is pinned); 9 now sits at position 9 - 6.
    const KvCache::CellView v = discarded.cache.cell(0, 0);
    for (int64_t gone : {2, 3, 4, 6, 7, 8}) CHECK(v.stream_index[gone] == -1);
    CHECK(v.position[5] == 2);  // pinned, it rolls back past 2, 3 and 4
    CHECK(v.position[9] == 3);
    CHECK(v.position[15] == 9);
    CHECK(discarded.cache.discardable(0, 0, 2) == FilledCell::kSlots - 3 - 6);
}

TEST_CASE("discard: through the C API a session frees what it discarded, counts it, and continues (snapshots too)") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_test::ApiSession m;
    REQUIRE_MESSAGE(m.open(path, window_params(64)), h2o_last_error());
    h2o_model_info info;
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(m.model, &info) == H2O_OK);
    std::vector<int32_t> tokens(64);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i == 0 ? 1 : static_cast<int32_t>(5 + (i * 37) % 400);
    REQUIRE(h2o_session_decode(m.session, tokens.data(), tokens.size()) == H2O_OK);
    CHECK(usage_of(m.session).n_held == 64);

    // More than a cell holds after BOS: refused, naming the cell, and nothing changes.
    CHECK(h2o_experimental_session_discard(m.session, 1, 64) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_session_last_error(m.session)).find("(layer 0, kv head 0) holds 63") != std::string::npos);
    CHECK(usage_of(m.session).n_held == 64);
    CHECK(h2o_experimental_session_discard(nullptr, 1, 1) == H2O_ERR_INVALID_ARGUMENT);

    // llama.cpp's shift: keep BOS, discard half of the rest.
    REQUIRE(h2o_experimental_session_discard(m.session, 1, 31) == H2O_OK);
    h2o_kv_usage usage = usage_of(m.session);
    CHECK(usage.n_past == 64);
    CHECK(usage.n_held == 33);
    CHECK(usage.n_evicted == 31);
    CHECK(usage.evicting_since == 0);  // the cache itself never evicted
    CHECK(h2o_experimental_session_discard(m.session, 1, 0) == H2O_OK);

    // A snapshot of the shifted cache continues as the session does, bit for bit.
    size_t size = 0;
    REQUIRE(h2o_session_state_size(m.session, &size) == H2O_OK);
    std::vector<uint8_t> state(size);
    size_t written = 0;
    REQUIRE(h2o_session_save_to_buffer(m.session, state.data(), state.size(), &written) == H2O_OK);
    h2o_session *loaded = nullptr;
    REQUIRE_MESSAGE(h2o_session_load_from_buffer(m.model, state.data(), written, nullptr, &loaded) == H2O_OK, h2o_last_error());
    CHECK(usage_of(loaded).n_held == 33);
    const std::vector<float> here = logits_after(m.session, 42, info.n_vocab), there = logits_after(loaded, 42, info.n_vocab);
    CHECK(std::memcmp(here.data(), there.data(), here.size() * sizeof(float)) == 0);
    h2o_session_free(loaded);

    // The freed slots take the next 30 tokens without evicting; the 31st evicts by the policy.
    for (int i = 0; i < 30; ++i) logits_after(m.session, 7 + i, info.n_vocab);
    usage = usage_of(m.session);
    CHECK(usage.n_held == 64);
    CHECK(usage.n_evicted == 31);
    logits_after(m.session, 99, info.n_vocab);
    CHECK(usage_of(m.session).n_evicted == 32);
    CHECK(usage_of(m.session).n_held == 64);
}

TEST_CASE("discard: refused for a full cache, cells of different sizes and spans") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const int32_t bos = 1, tokens[4] = {1, 50, 60, 70};
    {
        h2o_session_params p = window_params(64);
        p.kv_policy = H2O_KV_FULL;
        p.kv_budget = 0;
        p.kv_overflow = H2O_KV_OVERFLOW_ERROR;
        p.position_rolling = 0;
        h2o_test::ApiSession m;
        REQUIRE_MESSAGE(m.open(path, p), h2o_last_error());
        REQUIRE(h2o_session_decode(m.session, tokens, 4) == H2O_OK);
        CHECK(h2o_experimental_session_discard(m.session, 1, 1) == H2O_ERR_INVALID_ARGUMENT);
    }
    {
        h2o_session_params p = window_params(64);
        p.kv_policy = H2O_KV_SCISSORHANDS;
        REQUIRE(h2o_session_params_set_experimental(&p, H2O_EXP_KV_HEAD_SHARE, 0.5) == H2O_OK);
        h2o_test::ApiSession m;
        REQUIRE_MESSAGE(m.open(path, p), h2o_last_error());
        REQUIRE(h2o_session_decode(m.session, tokens, 4) == H2O_OK);
        CHECK(h2o_experimental_session_discard(m.session, 1, 1) == H2O_ERR_UNSUPPORTED);
    }
    {
        h2o_test::ApiSession m;
        REQUIRE_MESSAGE(m.open(path, window_params(64)), h2o_last_error());
        REQUIRE(h2o_session_decode(m.session, &bos, 1) == H2O_OK);
        REQUIRE(h2o_session_add_span_text(m.session, 7, 0.25f, "Once upon a time", 16, 0) == H2O_OK);
        CHECK(h2o_experimental_session_discard(m.session, 1, 1) == H2O_ERR_UNSUPPORTED);
    }
}

// (Its own case, named for Vulkan: builds without the Vulkan backend leave such cases out.)
TEST_CASE("discard: a Vulkan session, whose backend cannot, refuses it and keeps its cache") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const int32_t tokens[4] = {1, 50, 60, 70};
    h2o_session_params p = window_params(64);
    p.backend = H2O_BACKEND_VULKAN;
    h2o_test::ApiSession m;
    if (!m.open(path, p)) {
        if (!std::getenv("H2O_REQUIRE_VULKAN")) return;  // no Vulkan device here
        FAIL(std::string(h2o_last_error()));
    }
    REQUIRE(h2o_session_decode(m.session, tokens, 4) == H2O_OK);
    CHECK(h2o_experimental_session_discard(m.session, 1, 1) == H2O_ERR_UNSUPPORTED);
    CHECK(usage_of(m.session).n_held == 4);
}

TEST_CASE("oracle hooks: the last query's attention per slot, and victims chosen per (layer, kv head)") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_session_params p = window_params(32);
    p.kv_policy = H2O_KV_TOVA;
    h2o_test::ApiSession m, shifted;
    REQUIRE_MESSAGE(m.open(path, p), h2o_last_error());
    REQUIRE_MESSAGE(shifted.open(path, p), h2o_last_error());
    h2o_model_info info;
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(m.model, &info) == H2O_OK);
    const size_t cells = size_t{info.n_layer} * info.n_head_kv, slots = cells * 32;
    const float group = static_cast<float>(info.n_head) / static_cast<float>(info.n_head_kv);
    std::vector<int64_t> index(slots);
    std::vector<float> attention(slots);
    for (int32_t t = 0; t < 20; ++t) {
        const int32_t token = t == 0 ? 1 : 5 + (t * 37) % 400;
        REQUIRE(h2o_session_decode(m.session, &token, 1) == H2O_OK);
        REQUIRE(h2o_session_decode(shifted.session, &token, 1) == H2O_OK);
        REQUIRE(h2o_experimental_session_kv_attention(m.session, index.data(), attention.data(), slots) == H2O_OK);
        // Every cell holds tokens 0..t, and each of its query heads gives them a softmax's 1.
        for (size_t c = 0; c < cells; ++c) {
            float total = 0.0f;
            int held = 0;
            for (size_t s = c * 32; s < (c + 1) * 32; ++s) {
                CHECK(attention[s] >= 0.0f);
                if (index[s] < 0) CHECK(attention[s] == 0.0f);
                held += index[s] >= 0 && index[s] <= t;
                total += attention[s];
            }
            CHECK(held == t + 1);
            CHECK(total == doctest::Approx(group).epsilon(1e-4));
        }
    }

    // Evicting stream index 1 from every cell is the shift that discards one token after BOS.
    std::vector<int64_t> victims(cells, 1);
    REQUIRE(h2o_experimental_session_evict(m.session, victims.data(), cells) == H2O_OK);
    REQUIRE(h2o_experimental_session_discard(shifted.session, 1, 1) == H2O_OK);
    const std::vector<float> evicted = logits_after(m.session, 77, info.n_vocab),
                             discarded = logits_after(shifted.session, 77, info.n_vocab);
    CHECK(std::memcmp(evicted.data(), discarded.data(), evicted.size() * sizeof(float)) == 0);
    CHECK(usage_of(m.session).n_evicted == 1);

    // Each cell its own victim; the others keep theirs.
    for (size_t c = 0; c < cells; ++c) victims[c] = 2 + static_cast<int64_t>(c % 5);
    REQUIRE(h2o_experimental_session_evict(m.session, victims.data(), cells) == H2O_OK);
    REQUIRE(h2o_experimental_session_kv_attention(m.session, index.data(), nullptr, slots) == H2O_OK);
    for (size_t c = 0; c < cells; ++c) {
        int held = 0;
        for (size_t s = c * 32; s < (c + 1) * 32; ++s) {
            CHECK(index[s] != victims[c]);
            held += index[s] >= 0;
        }
        CHECK(held == 21 - 2);
    }
    h2o_kv_usage usage = usage_of(m.session);
    CHECK(usage.n_held == 19);
    CHECK(usage.n_evicted == 2);

    // A token a cell no longer holds: refused, naming the cell, nothing changed.
    for (size_t c = 0; c < cells; ++c) victims[c] = 10;
    victims[cells - 1] = 1;
    CHECK(h2o_experimental_session_evict(m.session, victims.data(), cells) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_session_last_error(m.session)).find("holds no unpinned token of stream index 1") != std::string::npos);
    CHECK(usage_of(m.session).n_held == 19);
    CHECK(h2o_experimental_session_evict(m.session, victims.data(), cells - 1) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_experimental_session_kv_attention(m.session, index.data(), attention.data(), slots + 1) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_experimental_session_kv_attention(nullptr, index.data(), nullptr, slots) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_experimental_session_evict(m.session, nullptr, cells) == H2O_ERR_INVALID_ARGUMENT);

    // A window gathers no attention (its stream indices it has), and a full cache keeps every token.
    h2o_test::ApiSession window, full;
    REQUIRE_MESSAGE(window.open(path, window_params(32)), h2o_last_error());
    const int32_t bos = 1;
    REQUIRE(h2o_session_decode(window.session, &bos, 1) == H2O_OK);
    CHECK(h2o_experimental_session_kv_attention(window.session, index.data(), attention.data(), slots) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_experimental_session_kv_attention(window.session, index.data(), nullptr, slots) == H2O_OK);
    h2o_session_params f = window_params(32);
    f.kv_policy = H2O_KV_FULL;
    f.kv_budget = 0;
    REQUIRE_MESSAGE(full.open(path, f), h2o_last_error());
    REQUIRE(h2o_session_decode(full.session, &bos, 1) == H2O_OK);
    for (size_t c = 0; c < cells; ++c) victims[c] = 0;
    CHECK(h2o_experimental_session_evict(full.session, victims.data(), cells) == H2O_ERR_INVALID_ARGUMENT);
}
