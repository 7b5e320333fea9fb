// The query-agnostic scorers (key_norm, key_diff, expected_attention) on the host cache: the
// victims their definitions name on hand-made keys, Expected Attention's running query statistics
// (queries taken back to position 0, averaged), and its statistics in snapshots. The priorities on
// random caches are checked against an independent computation in test_kv_policy_spec.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "kv_image.h"

using namespace h2o;

namespace {

constexpr int kDim = 8;

KvConfig scorer_config(KvPolicy policy, int slots) {
    KvConfig c;
    c.n_layer = 1;
    c.n_head_kv = 1;
    c.head_dim = kDim;
    c.n_slots = slots;
    c.policy.policy = policy;
    c.rope.dims = kDim;
    c.rope.freq_base = 10000.0f;
    c.query_group = 2;
    c.attention_scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    return c;
}

// Fills the cache with one token per key (stream indices 0, 1, ...), values all ones.
void fill(KvCache &cache, const std::vector<std::vector<float>> &keys) {
    const std::vector<float> ones(kDim, 1.0f);
    for (size_t i = 0; i < keys.size(); ++i) {
        const int slot = cache.claim_slot(0, 0, static_cast<int64_t>(i), static_cast<int32_t>(i), 0);
        std::memcpy(cache.cell(0, 0).keys + slot * cache.key_row_bytes(), keys[i].data(), kDim * sizeof(float));
        std::memcpy(cache.cell(0, 0).values + slot * cache.value_row_bytes(), ones.data(), kDim * sizeof(float));
    }
}

std::set<int64_t> evict(KvCache &cache, int n_new) {
    const int slots = cache.config().n_slots;
    const std::vector<int64_t> before(cache.cell(0, 0).stream_index, cache.cell(0, 0).stream_index + slots);
    cache.make_room(0, 0, n_new, slots);
    std::set<int64_t> gone;
    for (int s = 0; s < slots; ++s) {
        if (before[s] >= 0 && cache.cell(0, 0).stream_index[s] < 0) gone.insert(before[s]);
    }
    return gone;
}

// x rotated by `position` as attention rotates queries: adjacent pairs, pair i by position *
// 10000^(-2i/d).
std::vector<float> rotated(const std::vector<float> &x, int position) {
    std::vector<float> out(x);
    for (int i = 0; i < kDim / 2; ++i) {
        const double theta = position * std::pow(10000.0, -2.0 * i / kDim);
        out[2 * i] = static_cast<float>(x[2 * i] * std::cos(theta) - x[2 * i + 1] * std::sin(theta));
        out[2 * i + 1] = static_cast<float>(x[2 * i] * std::sin(theta) + x[2 * i + 1] * std::cos(theta));
    }
    return out;
}

}  // namespace

TEST_CASE("key scorers: the victims their definitions name") {
    SUBCASE("key_norm: the largest key goes, protected tokens stay") {
        KvConfig c = scorer_config(KvPolicy::KeyNorm, 6);
        c.policy.recent = 2;
        const std::vector<std::vector<float>> keys = {{1, 0, 0, 0, 0, 0, 0, 0}, {0, 3, 0, 0, 0, 0, 0, 0}, {0, 0, 0.5f, 0, 0, 0, 0, 0},
                                                      {2, 2, 0, 0, 0, 0, 0, 0}, {9, 9, 9, 0, 0, 0, 0, 0}, {9, 0, 0, 0, 0, 0, 0, 0}};
        // One incoming token: the recent window (2, counting it) protects stream index 5 (norm 9);
        // two incoming: none of the cached ones.
        for (int incoming : {1, 2}) {
            KvCache cache;
            REQUIRE(cache.init(c).ok());
            fill(cache, keys);
            CHECK(evict(cache, incoming) == (incoming == 1 ? std::set<int64_t>{4} : std::set<int64_t>{4, 5}));
        }
    }
    SUBCASE("key_diff: of keys pointing one way, one goes; the keys that differ stay") {
        KvCache cache;
        REQUIRE(cache.init(scorer_config(KvPolicy::KeyDiff, 6)).ok());
        // Four keys near the x direction (of different lengths: the cosine ignores them), two that differ.
        fill(cache, {{1, 0.1f, 0, 0, 0, 0, 0, 0},
                     {0, 0, 0, 0, 0, 0, 0, 1},
                     {5, 0, 0, 0, 0, 0, 0, 0},
                     {2, -0.1f, 0, 0, 0, 0, 0, 0},
                     {0, 0, 0, 0, 0, -1, 1, 0},
                     {3, 0.05f, 0, 0, 0, 0, 0, 0}});
        const std::set<int64_t> gone = evict(cache, 2);
        CHECK(gone.size() == 2);
        CHECK(gone.count(1) == 0);
        CHECK(gone.count(4) == 0);
    }
    SUBCASE("expected_attention: the keys the queries point to stay") {
        KvCache cache;
        REQUIRE(cache.init(scorer_config(KvPolicy::ExpectedAttention, 6)).ok());
        // Queries along the last pair, whose rotation is slowest: at positions 0..7 they barely turn.
        std::vector<float> queries;
        const int32_t positions[4] = {0, 1, 2, 3};
        for (int t = 0; t < 4; ++t) {
            for (int g = 0; g < 2; ++g) {
                const std::vector<float> q = rotated({0, 0, 0, 0, 0, 0, 4, 0}, positions[t]);
                queries.insert(queries.end(), q.begin(), q.end());
            }
        }
        cache.observe_queries(0, 0, queries.data(), 2 * kDim, positions, 4);
        fill(cache, {{0, 0, 0, 0, 0, 0, 1, 0},
                     {0, 0, 0, 0, 0, 0, -1, 0},
                     {1, 0, 0, 0, 0, 0, 0, 0},
                     {0, 0, 0, 0, 0, 0, 0.9f, 0.1f},
                     {0, 0, 0, 0, 0, 0, -0.5f, 0},
                     {0, 1, 0, 0, 0, 0, 0, 0}});
        CHECK(evict(cache, 3) == std::set<int64_t>{1, 4, 2});
    }
}

TEST_CASE("expected_attention: queries are averaged as they were before rotation") {
    KvCache cache;
    REQUIRE(cache.init(scorer_config(KvPolicy::ExpectedAttention, 8)).ok());
    const std::vector<float> a = {1, -2, 0.5f, 3, -1, 0.25f, 2, -0.5f}, b = {-1, 0, 1.5f, 1, 1, 0.75f, 0, 0.5f};
    // One batch of three tokens at positions 5, 17 and 300: query head 0 asks a, head 1 asks b.
    const int32_t positions[3] = {5, 17, 300};
    std::vector<float> queries;
    for (int32_t p : positions) {
        for (const std::vector<float> *x : {&a, &b}) {
            const std::vector<float> q = rotated(*x, p);
            queries.insert(queries.end(), q.begin(), q.end());
        }
    }
    cache.observe_queries(0, 0, queries.data(), 2 * kDim, positions, 3);
    const std::vector<float> &stats = cache.image().query_stats;
    REQUIRE(stats.size() == 2 + 2 * 2 * kDim);
    CHECK(stats[0] == 3.0f);
    CHECK(stats[1] == 5.0f);
    for (int j = 0; j < kDim; ++j) {
        CHECK(stats[2 + j] == doctest::Approx(a[j]).epsilon(1e-5));
        CHECK(stats[2 + kDim + j] == doctest::Approx(b[j]).epsilon(1e-5));
        // One value asked three times: no spread (to the rounding of turning it back).
        CHECK(std::fabs(stats[2 + 2 * kDim + j]) <= 1e-9f);
    }
    // A fourth query of a different value: the mean of four, equally weighted.
    const int32_t later[1] = {40};
    std::vector<float> fourth = rotated(b, 40), second = rotated(b, 40);
    fourth.insert(fourth.end(), second.begin(), second.end());
    cache.observe_queries(0, 0, fourth.data(), 2 * kDim, later, 1);
    CHECK(stats[0] == 4.0f);
    CHECK(stats[1] == 40.0f);
    for (int j = 0; j < kDim; ++j) {
        // Of the four values a, a, a, b: mean (3a + b) / 4, variance 3 (b - a)^2 / 16.
        CHECK(stats[2 + j] == doctest::Approx((3 * a[j] + b[j]) / 4).epsilon(1e-4));
        CHECK(stats[2 + 2 * kDim + j] == doctest::Approx(3 * (b[j] - a[j]) * (b[j] - a[j]) / 16).epsilon(1e-4).scale(1e-5));
    }
    // The count stops at the window (512): later queries weigh 1/512 each.
    std::vector<float> many;
    std::vector<int32_t> many_positions(600);
    for (int t = 0; t < 600; ++t) {
        many_positions[t] = t;
        for (int g = 0; g < 2; ++g) {
            const std::vector<float> q = rotated(b, t);
            many.insert(many.end(), q.begin(), q.end());
        }
    }
    cache.observe_queries(0, 0, many.data(), 2 * kDim, many_positions.data(), 600);
    CHECK(stats[0] == 512.0f);
    // Other policies keep no query statistics.
    KvCache other;
    REQUIRE(other.init(scorer_config(KvPolicy::KeyNorm, 8)).ok());
    other.observe_queries(0, 0, queries.data(), 2 * kDim, positions, 3);
    CHECK(other.image().query_stats.empty());
}

TEST_CASE("expected_attention: query statistics travel with the cache's snapshot, and damaged ones are refused") {
    const KvConfig c = scorer_config(KvPolicy::ExpectedAttention, 4);
    KvCache cache;
    REQUIRE(cache.init(c).ok());
    const int32_t positions[2] = {0, 1};
    std::vector<float> queries(2 * 2 * kDim);
    for (size_t i = 0; i < queries.size(); ++i) queries[i] = 0.25f * static_cast<float>(i) - 3.0f;
    cache.observe_queries(0, 0, queries.data(), 2 * kDim, positions, 2);
    fill(cache, {{1, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 0, 0, 0, 0, 0, 0}});
    std::vector<uint8_t> bytes;
    ByteWriter out(&bytes);
    cache.save(out);

    KvCache loaded;
    REQUIRE(loaded.init(c).ok());
    ByteReader in(bytes.data(), bytes.size());
    REQUIRE(loaded.load(in, 2, 2, 0, 0).ok());
    CHECK(loaded.image().query_stats == cache.image().query_stats);

    // The cell's statistics end the section: a NaN mean, a negative variance and a fractional
    // count are each refused by name.
    const size_t stats_at = bytes.size() - cache.image().query_stats.size() * sizeof(float);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const std::pair<size_t, float> &damage :
         {std::make_pair<size_t, float>(2, float(nan)), std::make_pair<size_t, float>(2 + 2 * kDim, -1.0f),
          std::make_pair<size_t, float>(0, 1.5f)}) {
        std::vector<uint8_t> bad = bytes;
        std::memcpy(bad.data() + stats_at + damage.first * sizeof(float), &damage.second, sizeof(float));
        ByteReader reader(bad.data(), bad.size());
        const Status st = loaded.load(reader, 2, 2, 0, 0);
        CHECK(st.code == H2O_ERR_STATE_FORMAT);
        CHECK(st.message.find("query statistics") != std::string::npos);
    }
}
