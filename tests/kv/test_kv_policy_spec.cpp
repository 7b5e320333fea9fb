// kv_policy_spec.h: the eviction arithmetic every backend includes. Checks that the CPU cache's
// victims and the CPU backend's statistics are the spec's, and that the spec compiled by nvcc (on
// the host, and on a device when one is present) computes what the C++ compiler's build does.
// The Vulkan shaders include the same header; test_vulkan.cpp checks their decisions against the
// CPU's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cpu/cpu_backend.h"
#include "kv_cache.h"
#include "kv_victim_rules.h"
#include "policy_spec_cases.h"

using namespace h2o;

#ifdef H2O_TEST_CUDA
namespace {

std::vector<SpecCase> spec_cases() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    std::vector<SpecCase> cases;
    for (KV_UINT policy = 0; policy < KV_POLICY_COUNT; ++policy) {
        for (int i = 0; i < 64; ++i) {
            SpecCase c{};
            c.old = SlotStats{4 * unit(rng), 2 * unit(rng), std::floor(8 * unit(rng)), unit(rng), 3 * unit(rng)};
            c.group = 1u + static_cast<KV_UINT>(4 * unit(rng));
            c.visible = 1u + static_cast<KV_UINT>(300 * unit(rng));
            c.w = c.group * unit(rng) * (unit(rng) < 0.5f ? 1.0f : 8.0f / c.visible);
            c.decay = 0.5f + 0.5f * unit(rng);
            c.n = 1u + static_cast<KV_UINT>(40 * unit(rng));
            c.t = static_cast<KV_UINT>((c.n - 1) * unit(rng));
            c.policy = policy;
            c.stale = i % 9 == 0;
            c.proxy = 1u + static_cast<KV_UINT>(48 * unit(rng));
            c.first_part = i % 3 != 0;
            c.index_low = rng();
            c.index_high = i % 4 == 0 ? rng() : 0u;
            c.cell = static_cast<KV_UINT>(rng() % 4096u);
            c.seed = rng();
            c.share = i % 5 == 0 ? 1.0f : unit(rng);
            cases.push_back(c);
        }
    }
    return cases;
}

std::vector<float> floats_of(const std::vector<SpecResult> &results) {
    std::vector<float> out(results.size() * sizeof(SpecResult) / sizeof(float));
    static_assert(sizeof(SpecResult) % sizeof(float) == 0);
    std::memcpy(out.data(), results.data(), results.size() * sizeof(SpecResult));
    return out;
}

}  // namespace
#endif

TEST_CASE("policy spec: the statistics fold and priorities as defined") {
    SlotStats old{1.0f, 0.5f, 2.0f, 0.25f, 2.0f};
    // Query 0 of a batch of 2 finds the slot important (0.9 > 2/4), the last query does not.
    const float threshold = kv_importance_threshold(2, 4);
    SlotStats batch = kv_stats_add_query(kv_stats_zero(), 0.9f, threshold, kv_persistence_weight(0.5f, 2, 0), false);
    batch = kv_stats_add(batch, kv_stats_add_query(kv_stats_zero(), 0.1f, threshold, kv_persistence_weight(0.5f, 2, 1), true));
    const SlotStats after = kv_stats_fold(old, batch, kv_power(0.5f, 2), true);
    CHECK(after.accumulated == doctest::Approx(2.0));
    CHECK(after.squared == doctest::Approx(0.5 + 0.81 + 0.01));
    CHECK(after.steps == 4.0f);
    CHECK(after.last == doctest::Approx(0.1));
    CHECK(after.persistence == doctest::Approx(2.0 * 0.25 + 0.5));  // old·decay² + decay^(2-1-0)
    // A batch that never saw the slot keeps its `last` and only decays its persistence.
    const SlotStats unseen = kv_stats_fold(old, kv_stats_zero(), 0.5f, true);
    CHECK(unseen.last == 0.25f);
    CHECK(unseen.persistence == 1.0f);

    CHECK(kv_victim_priority(KV_POLICY_H2O, after, false) == after.accumulated);
    CHECK(kv_victim_priority(KV_POLICY_SCISSORHANDS, after, false) == after.persistence);
    CHECK(kv_victim_priority(KV_POLICY_TOVA, after, false) == after.last);
    CHECK(kv_victim_priority(KV_POLICY_MEAN_H2O, after, false) == doctest::Approx(0.5));
    CHECK(kv_victim_priority(KV_POLICY_WINDOW, after, false) == 0.0f);
    for (KV_UINT p = 0; p < KV_POLICY_COUNT; ++p) CHECK(kv_victim_priority(p, after, true) < 0.0f);
    CHECK(kv_power(0.9f, 0) == 1.0f);
}

TEST_CASE("policy spec: one-shot prompt eviction's proxy attention and random share") {
    // `last` sums the batch's last `proxy` queries: with proxy 1 only the last one, as TOVA reads.
    CHECK(kv_is_proxy_query(5, 4, 1));
    CHECK_FALSE(kv_is_proxy_query(5, 3, 1));
    CHECK(kv_is_proxy_query(5, 2, 3));
    CHECK_FALSE(kv_is_proxy_query(5, 1, 3));
    CHECK(kv_is_proxy_query(5, 0, 9));  // a batch shorter than the proxy: every query
    const float threshold = kv_importance_threshold(1, 8);
    SlotStats batch = kv_stats_zero();
    for (KV_UINT t = 0; t < 4; ++t) batch = kv_stats_add_query(batch, 0.125f * float(t + 1), threshold, 1.0f, kv_is_proxy_query(4, t, 2));
    CHECK(batch.last == 0.375f + 0.5f);
    // Folded in two parts of consecutive queries: the first restarts `last`, a later one adds.
    const SlotStats old{1.0f, 1.0f, 3.0f, 0.75f, 1.0f};
    SlotStats part1 = kv_stats_add_query(kv_stats_zero(), 0.25f, threshold, 1.0f, false);
    SlotStats part2 = kv_stats_add_query(kv_stats_zero(), 0.5f, threshold, 1.0f, true);
    const SlotStats folded = kv_stats_fold(kv_stats_fold(old, part1, 0.5f, true), part2, 1.0f, false);
    CHECK(folded.last == 0.5f);
    CHECK(kv_stats_fold(old, part2, 0.5f, false).last == 0.75f + 0.5f);

    // The random factor: 1 outside the share; inside it, multiples of 2^-23 in [0, 2), spread
    // evenly, and a function of the token, its cell and the seed alone.
    int in_share = 0, below_one = 0;
    double sum = 0;
    for (KV_UINT i = 0; i < 20000; ++i) {
        CHECK(kv_prompt_random_factor(i, 0, 3, 11, 0.0f) == 1.0f);
        const float f = kv_prompt_random_factor(i, 0, 3, 11, 1.0f);
        REQUIRE(f >= 0.0f);
        REQUIRE(f < 2.0f);
        CHECK(f * 8388608.0f == std::floor(f * 8388608.0f));
        sum += f;
        below_one += f < 1.0f;
        in_share += kv_prompt_random_factor(i, 0, 3, 11, 0.25f) != 1.0f;
    }
    CHECK(sum / 20000 == doctest::Approx(1.0).epsilon(0.02));
    CHECK(below_one == doctest::Approx(10000).epsilon(0.03));
    CHECK(in_share == doctest::Approx(5000).epsilon(0.06));
    int differ_cell = 0, differ_seed = 0, differ_high = 0;
    for (KV_UINT i = 0; i < 1000; ++i) {
        const float f = kv_prompt_random_factor(i, 0, 3, 11, 1.0f);
        CHECK(f == kv_prompt_random_factor(i, 0, 3, 11, 1.0f));
        differ_cell += f != kv_prompt_random_factor(i, 0, 4, 11, 1.0f);
        differ_seed += f != kv_prompt_random_factor(i, 0, 3, 12, 1.0f);
        differ_high += f != kv_prompt_random_factor(i, 1, 3, 11, 1.0f);
    }
    CHECK(differ_cell > 990);
    CHECK(differ_seed > 990);
    CHECK(differ_high > 990);

    const SlotStats s{2.0f, 1.0f, 4.0f, 0.5f, 3.0f};
    CHECK(kv_prompt_priority(s, false, 1.0f) == 0.5f);
    CHECK(kv_prompt_priority(s, false, 1.5f) == 0.75f);
    CHECK(kv_prompt_priority(s, true, 1.5f) < 0.0f);  // stale tokens still go first
    CHECK(kv_power(0.9f, 5) == doctest::Approx(std::pow(0.9, 5)));
    CHECK(static_cast<uint32_t>(KvPolicy::MeanH2O) == KV_POLICY_MEAN_H2O);
}

TEST_CASE("policy spec: retention tags") {
    CHECK(kv_make_tag(false, 0) == 0u);
    CHECK(kv_tag_pinned(kv_make_tag(true, 0)));
    CHECK(!kv_tag_pinned(kv_make_tag(false, 5)));
    CHECK(kv_tag_span(kv_make_tag(true, KV_MAX_SPANS)) == KV_MAX_SPANS);
    CHECK(kv_make_tag(true, KV_MAX_SPANS) <= 0xFFu);  // stored in a byte
    CHECK(!kv_span_allows_eviction(3, 3));
    CHECK(kv_span_allows_eviction(4, 3));
}

TEST_CASE("victim rules: eligibility, order, span arithmetic and the generator on word pairs") {
    // Eligibility: free, pinned, recent and sink slots are protected.
    CHECK(kv_slot_evictable(5, false, 10, 4));
    CHECK(!kv_slot_evictable(-1, false, 10, 4));
    CHECK(!kv_slot_evictable(5, true, 10, 4));
    CHECK(!kv_slot_evictable(10, false, 10, 4));
    CHECK(!kv_slot_evictable(3, false, 10, 4));
    CHECK(kv_slot_evictable(int64_t{1} << 40, false, int64_t{1} << 41, 4));
    CHECK(kv_slot_evictable_by_age(12, false));
    CHECK(!kv_slot_evictable_by_age(12, true));
    CHECK(!kv_slot_evictable_by_age(-1, false));
    CHECK(kv_victim_before(0.5f, 9, 1.0f, 2));
    CHECK(kv_victim_before(1.0f, 2, 1.0f, 9));
    CHECK(!kv_victim_before(1.0f, 9, 1.0f, 9));
    CHECK(kv_span_takeable(5, 4, 3) == 2u);
    CHECK(kv_span_takeable(5, 1, 3) == 1u);
    CHECK(kv_span_takeable(3, 4, 3) == 0u);
    // The word-pair arithmetic is the 64-bit arithmetic it stands for: xorshift64*, its draw and
    // the modulo that picks a candidate.
    std::mt19937_64 rng(11);
    for (int i = 0; i < 20000; ++i) {
        const uint64_t a = rng(), state = rng() | 1;
        const auto x = static_cast<uint32_t>(a), y = static_cast<uint32_t>(a >> 32);
        const KvWords product = kv_words_product(x, y);
        CHECK(((static_cast<uint64_t>(product.y) << 32) | product.x) == static_cast<uint64_t>(x) * y);
        uint64_t expected_state = state;
        expected_state ^= expected_state >> 12;
        expected_state ^= expected_state << 25;
        expected_state ^= expected_state >> 27;
        uint64_t s = state;
        const uint64_t draw = kv_next_random(&s);
        CHECK(s == expected_state);
        CHECK(draw == expected_state * 0x2545F4914F6CDD1Dull);
        const auto m = static_cast<uint32_t>(1 + rng() % 0x7FFFFFFFu);
        CHECK(kv_random_index(draw, m) == draw % m);
        CHECK(kv_random_index(draw, 1 + i % 300) == draw % (1 + i % 300));
    }
}

namespace {

// The query-agnostic scorers' priorities of a cell's slots as their papers define them, computed
// here in double precision and without the cache's code: a key's norm (to 11 bits); one minus its cosine with
// the mean of the cell's unit keys; Expected Attention's softmax of the closed-form logit, averaged
// over the group and times the value's norm, with the average rotation summed term by term.
// Keys and values are F32 rows; the rotary pairs are adjacent.
std::map<int64_t, double> paper_key_priorities(const KvConfig &config, KvCache &cache) {
    const KvCache::CellView view = cache.cell(0, 0);
    const int hd = config.head_dim, group = config.query_group;
    std::vector<int> held;
    for (int s = 0; s < config.n_slots; ++s) {
        if (view.stream_index[s] >= 0) held.push_back(s);
    }
    auto row = [&](const uint8_t *rows, int s) {
        const float *r = reinterpret_cast<const float *>(rows) + static_cast<size_t>(s) * hd;
        return std::vector<double>(r, r + hd);
    };
    auto norm = [](const std::vector<double> &x) {
        double sum = 0;
        for (double e : x) sum += e * e;
        return std::sqrt(sum);
    };
    std::map<int64_t, double> out;
    if (config.policy.policy == KvPolicy::KeyNorm) {
        // Norms that agree to 11 bits tie (the low 12 bits of the float cleared).
        for (int s : held) {
            uint32_t bits = 0;
            const float n = static_cast<float>(norm(row(view.keys, s)));
            std::memcpy(&bits, &n, sizeof bits);
            bits &= 0xFFFFF000u;
            float coarse = 0;
            std::memcpy(&coarse, &bits, sizeof coarse);
            out[view.stream_index[s]] = 1.0 / (1.0 + coarse);
        }
        return out;
    }
    if (config.policy.policy == KvPolicy::KeyDiff) {
        std::vector<double> anchor(hd, 0.0);
        for (int s : held) {
            const std::vector<double> k = row(view.keys, s);
            for (int j = 0; j < hd; ++j) anchor[j] += k[j] / norm(k);
        }
        for (int s : held) {
            const std::vector<double> k = row(view.keys, s);
            double dot = 0;
            for (int j = 0; j < hd; ++j) dot += k[j] * anchor[j];
            out[view.stream_index[s]] = 1.0 - dot / (norm(k) * norm(anchor));
        }
        return out;
    }
    const float *stats = cache.image().query_stats.data();
    const double first = stats[1];
    const int T = config.n_slots, pairs = config.rope.pairs();
    std::vector<double> c(pairs, 0.0), sn(pairs, 0.0);
    for (int i = 0; i < pairs; ++i) {
        const double theta = std::pow(static_cast<double>(config.rope.freq_base), -2.0 * i / config.rope.dims);
        for (int t = 0; t < T; ++t) {
            c[i] += std::cos(theta * (first + t)) / T;
            sn[i] += std::sin(theta * (first + t)) / T;
        }
    }
    std::map<int, double> weight;
    for (int g = 0; g < group; ++g) {
        const float *mean = stats + 2 + g * hd, *variance = stats + 2 + (group + g) * hd;
        std::map<int, double> z;
        double top = -1e300;
        for (int s : held) {
            const std::vector<double> k = row(view.keys, s);
            std::vector<double> u(k);
            for (int i = 0; i < pairs; ++i) {
                u[2 * i] = c[i] * k[2 * i] + sn[i] * k[2 * i + 1];
                u[2 * i + 1] = c[i] * k[2 * i + 1] - sn[i] * k[2 * i];
            }
            double logit = 0;
            for (int j = 0; j < hd; ++j) {
                logit += config.attention_scale * mean[j] * u[j] +
                         0.5 * config.attention_scale * config.attention_scale * variance[j] * u[j] * u[j];
            }
            z[s] = logit;
            top = std::max(top, logit);
        }
        double sum = 0;
        for (int s : held) sum += std::exp(z[s] - top);
        for (int s : held) weight[s] += std::exp(z[s] - top) / sum / group;
    }
    for (int s : held) out[view.stream_index[s]] = weight[s] * norm(row(view.values, s));
    return out;
}

}  // namespace

TEST_CASE("policy spec: the CPU cache evicts the unprotected slots the spec ranks lowest") {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    const int n_slots = 24;
    for (KV_UINT id = 1; id < KV_POLICY_COUNT; ++id) {
        if (id == KV_POLICY_RANDOM) continue;  // its victims are drawn, not ranked
        for (int trial = 0; trial < 40; ++trial) {
            KvConfig config;
            config.n_layer = 1;
            config.n_head_kv = 1;
            config.head_dim = 4;
            config.n_slots = n_slots;
            config.policy.policy = static_cast<KvPolicy>(id);
            config.policy.recent = static_cast<int>(8 * unit(rng));
            config.policy.sinks = trial % 3 == 0 ? 2 : 0;
            const bool scores_keys = kv_policy_scores_keys(id);
            config.policy.horizon = trial % 4 == 0 ? 12 + static_cast<int>(8 * unit(rng)) : 0;
            config.query_group = 2;
            config.attention_scale = 0.5f;
            config.rope.dims = 4;
            KvCache cache;
            REQUIRE(cache.init(config).ok());
            // Slots hold stream indices 0..n_slots-1 in a shuffled order, a few of them pinned; in
            // odd trials, many belong to one of three retention spans with small minimums.
            std::vector<int64_t> order(n_slots);
            for (int i = 0; i < n_slots; ++i) order[i] = i;
            std::shuffle(order.begin(), order.end(), rng);
            const bool spans = trial % 2 == 1;
            int32_t minimums[KV_MAX_SPANS] = {};
            for (int i = 0; spans && i < 3; ++i) minimums[i] = static_cast<int32_t>(5 * unit(rng));
            for (int s = 0; s < n_slots; ++s) {
                const uint32_t span = spans && unit(rng) < 0.6f ? 1 + static_cast<uint32_t>(3 * unit(rng)) % 3 : 0;
                cache.claim_slot(0, 0, order[s], static_cast<int32_t>(order[s]), static_cast<uint8_t>(kv_make_tag(unit(rng) < 0.1f, span)));
            }
            cache.set_span_minimums(minimums);
            KvCache::CellView view = cache.cell(0, 0);
            for (int s = 0; view.stats && s < n_slots; ++s) {
                // Coarse values, so that ties (broken by age) occur.
                view.stats[s] = SlotStats{std::round(4 * unit(rng)), std::round(4 * unit(rng)), 1 + std::round(3 * unit(rng)),
                                          std::round(4 * unit(rng)) / 4, std::round(4 * unit(rng))};
            }
            // The key scorers' inputs: random keys and values, and query statistics (a mean and
            // a variance) from a batch at position `next`.
            for (size_t i = 0; scores_keys && i < cache.image().keys.size() / sizeof(float); ++i) {
                const float key = 4 * unit(rng) - 2, value = 4 * unit(rng) - 2;
                std::memcpy(cache.image().keys.data() + i * sizeof(float), &key, sizeof key);
                std::memcpy(cache.image().values.data() + i * sizeof(float), &value, sizeof value);
            }
            std::vector<float> &query_stats = cache.image().query_stats;
            const size_t n_means = query_stats.empty() ? 0 : (query_stats.size() - 2) / 2;
            for (size_t i = 2; i < 2 + n_means; ++i) {
                query_stats[i] = 3 * unit(rng) - 1.5f;
                query_stats[i + n_means] = 2 * unit(rng);
            }
            if (!query_stats.empty()) query_stats[1] = static_cast<float>(n_slots + trial);
            const std::map<int64_t, double> key_priority = scores_keys ? paper_key_priorities(config, cache) : std::map<int64_t, double>{};
            const int n_new = 1 + static_cast<int>(3 * unit(rng));
            const int64_t next = n_slots;

            // The spec's choice: unprotected slots by (priority, stream index), passing over a
            // span's tokens once it is down to its minimum; the oldest unpinned tokens (minimums
            // still kept) when the protections leave too few.
            const int64_t recent_from = kv_recent_from(config.policy, next, n_new);
            const int64_t stale_before = kv_stale_before(config.policy, next, n_new);
            std::vector<std::pair<float, int64_t>> ranked, unpinned;
            std::map<int64_t, uint32_t> span_of;
            int held[4] = {};
            for (int s = 0; s < n_slots; ++s) {
                const int64_t index = view.stream_index[s];
                span_of[index] = kv_tag_span(view.tag[s]);
                ++held[span_of[index]];
                if (kv_tag_pinned(view.tag[s])) continue;
                unpinned.push_back({0.0f, index});
                if (index >= recent_from || index < config.policy.sinks) continue;
                const SlotStats stats = view.stats ? view.stats[s] : kv_stats_zero();
                const bool stale = index < stale_before;
                ranked.push_back(
                    {scores_keys ? (stale ? -1.0f : static_cast<float>(key_priority.at(index))) : kv_victim_priority(id, stats, stale),
                     index});
            }
            auto take = [&](std::vector<std::pair<float, int64_t>> pool) {
                std::sort(pool.begin(), pool.end());
                int left[4] = {held[0], held[1], held[2], held[3]};
                std::set<int64_t> chosen;
                for (const auto &candidate : pool) {
                    if (static_cast<int>(chosen.size()) == n_new) break;
                    const uint32_t span = span_of[candidate.second];
                    if (span != 0 && left[span] <= minimums[span - 1]) continue;
                    if (span != 0) --left[span];
                    chosen.insert(candidate.second);
                }
                return chosen;
            };
            std::set<int64_t> expected = take(ranked);
            if (static_cast<int>(expected.size()) < n_new) expected = take(unpinned);

            const std::vector<int64_t> before(view.stream_index, view.stream_index + n_slots);
            cache.make_room(0, 0, n_new, next);
            std::set<int64_t> evicted;
            for (int s = 0; s < n_slots; ++s) {
                if (before[s] >= 0 && view.stream_index[s] < 0) evicted.insert(before[s]);
            }
            INFO("policy " << kv_policy_name(static_cast<KvPolicy>(id)) << ", trial " << trial);
            CHECK(evicted == expected);
        }
    }
}

namespace {

// 2 kv heads, 6 query heads (groups of 3), head_dim 8, random queries and keys; a prompt of 5
// then 2 single tokens. The expected statistics are computed here from the attention weights.
void check_cpu_statistics(int prompt_proxy) {
    const auto proxy = static_cast<KV_UINT>(prompt_proxy > 0 ? prompt_proxy : 1);
    ModelShape shape;
    shape.n_head = 6;
    shape.n_head_kv = 2;
    shape.head_dim = 8;
    shape.n_embd = 48;
    const int n_kv = 2, group = 3, hd = 8, n_slots = 16;
    const float decay = 0.8f;
    auto backend = make_cpu_backend(2, 8);
    KvConfig kv;
    kv.n_layer = 1;
    kv.n_head_kv = n_kv;
    kv.head_dim = hd;
    kv.n_slots = n_slots;
    kv.policy.policy = KvPolicy::Scissorhands;
    kv.policy.persistence_decay = decay;
    kv.policy.prompt_proxy = prompt_proxy;
    REQUIRE(backend->kv_store().create_kv(kv).ok());
    Tensor q, k, v, out, positions;
    REQUIRE(backend->alloc(TensorType::F32, 48, 5, &q).ok());
    REQUIRE(backend->alloc(TensorType::F32, 16, 5, &k).ok());
    REQUIRE(backend->alloc(TensorType::F32, 16, 5, &v).ok());
    REQUIRE(backend->alloc(TensorType::F32, 48, 5, &out).ok());
    REQUIRE(backend->alloc(TensorType::I32, 1, 5, &positions).ok());

    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.5f);
    std::vector<float> keys;  // every token's keys so far, [token][kv head][hd]
    std::vector<SlotStats> expected(static_cast<size_t>(n_kv) * n_slots, kv_stats_zero());
    int64_t next = 0;
    for (int n : {5, 1, 1}) {
        std::vector<float> qs(48 * n), ks(16 * n), vs(16 * n);
        for (float &x : qs) x = normal(rng);
        for (float &x : ks) x = normal(rng);
        for (float &x : vs) x = normal(rng);
        keys.insert(keys.end(), ks.begin(), ks.end());
        std::vector<int32_t> pos(n);
        for (int t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(next + t);
        REQUIRE(backend->upload(q, qs.data(), qs.size() * sizeof(float)).ok());
        REQUIRE(backend->upload(k, ks.data(), ks.size() * sizeof(float)).ok());
        REQUIRE(backend->upload(v, vs.data(), vs.size() * sizeof(float)).ok());
        REQUIRE(backend->upload(positions, pos.data(), pos.size() * sizeof(int32_t)).ok());
        REQUIRE(backend->attention(out, q, k, v, 0, AttentionBatch{n, next, positions, 0}, shape).ok());

        // Tokens take slots in stream order (no eviction here): slot j holds token j.
        for (int h = 0; h < n_kv; ++h) {
            SlotStats *slots = expected.data() + static_cast<size_t>(h) * n_slots;
            std::vector<SlotStats> batch(static_cast<size_t>(next + n), kv_stats_zero());
            for (int t = 0; t < n; ++t) {
                const int visible = static_cast<int>(next) + t + 1;
                std::vector<double> w(visible, 0.0);
                for (int g = 0; g < group; ++g) {
                    const float *qh = qs.data() + t * 48 + (h * group + g) * hd;
                    std::vector<double> logits(visible);
                    double top = -INFINITY, sum = 0;
                    for (int j = 0; j < visible; ++j) {
                        double dot = 0;
                        for (int d = 0; d < hd; ++d) dot += double(qh[d]) * keys[(j * n_kv + h) * hd + d];
                        logits[j] = dot / std::sqrt(double(hd));
                        top = std::max(top, logits[j]);
                    }
                    for (int j = 0; j < visible; ++j) sum += std::exp(logits[j] - top);
                    for (int j = 0; j < visible; ++j) w[j] += std::exp(logits[j] - top) / sum;
                }
                for (int j = 0; j < visible; ++j) {
                    batch[j] = kv_stats_add_query(batch[j], static_cast<float>(w[j]), kv_importance_threshold(group, visible),
                                                  kv_persistence_weight(decay, n, t), kv_is_proxy_query(n, t, proxy));
                }
            }
            for (int j = 0; j < n_slots; ++j) {
                slots[j] = kv_stats_fold(slots[j], j < next + n ? batch[j] : kv_stats_zero(), kv_power(decay, n), true);
            }
        }
        next += n;
    }
    std::vector<SlotStats> got(expected.size());
    REQUIRE(backend->kv_store().download_kv_statistics(got.data()).ok());
    for (size_t i = 0; i < got.size(); ++i) {
        INFO("kv head " << i / n_slots << ", slot " << i % n_slots);
        CHECK(got[i].accumulated == doctest::Approx(expected[i].accumulated).epsilon(1e-5));
        CHECK(got[i].squared == doctest::Approx(expected[i].squared).epsilon(1e-5));
        CHECK(got[i].steps == expected[i].steps);
        CHECK(got[i].last == doctest::Approx(expected[i].last).epsilon(1e-5));
        CHECK(got[i].persistence == doctest::Approx(expected[i].persistence).epsilon(1e-6));
    }
}

}  // namespace

TEST_CASE("policy spec: the CPU backend's statistics are the spec's fold of the attention weights") {
    // Without one-shot prompt eviction `last` is the last query's weight; with a proxy of 3 it
    // sums the prompt's last three queries.
    for (int prompt_proxy : {0, 3}) {
        INFO("prompt_proxy " << prompt_proxy);
        check_cpu_statistics(prompt_proxy);
    }
}

TEST_CASE("policy spec: compiled by nvcc for the host, it computes what the C++ build computes") {
#ifdef H2O_TEST_CUDA
    const std::vector<SpecCase> cases = spec_cases();
    std::vector<SpecResult> cpp(cases.size()), nvcc(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) cpp[i] = evaluate_spec_case(cases[i]);
    evaluate_spec_cases_cuda_host(cases.data(), static_cast<int>(cases.size()), nvcc.data());
    CHECK(floats_of(cpp) == floats_of(nvcc));
#else
    MESSAGE("H2O-SKIP: this build found no CUDA compiler");
#endif
}

TEST_CASE("policy spec: compiled by nvcc for a device, it computes what the C++ build computes") {
#ifdef H2O_TEST_CUDA
    const std::vector<SpecCase> cases = spec_cases();
    std::vector<SpecResult> cpp(cases.size()), device(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) cpp[i] = evaluate_spec_case(cases[i]);
    char why[256];
    if (!evaluate_spec_cases_cuda_device(cases.data(), static_cast<int>(cases.size()), device.data(), why, sizeof why)) {
        MESSAGE("H2O-SKIP: the device run did not happen: " << why);
        return;
    }
    // The device may fuse multiplies and adds: equal to rounding.
    const std::vector<float> a = floats_of(cpp), b = floats_of(device);
    for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-6));
#else
    MESSAGE("H2O-SKIP: this build found no CUDA compiler");
#endif
}
