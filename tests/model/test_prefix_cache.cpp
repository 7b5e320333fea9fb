// The model's prefix cache on a clock of the test's own: what each policy keeps when it is full,
// and what the reuse policy learns, also from prompts it gave up.
#include <cstdint>
#include <vector>

#include "doctest/doctest.h"
#include "prefix_cache.h"

namespace {

using h2o::CachePolicy;
using h2o::PrefixCache;

constexpr size_t kPromptTokens = 32;
constexpr size_t kStateBytes = 1000;
// One entry's bytes: its state and its tokens.
constexpr uint64_t kEntryBytes = kStateBytes + kPromptTokens * sizeof(int32_t);

// A prompt of kPromptTokens tokens that no other prompt number begins like.
std::vector<int32_t> prompt(int32_t number) {
    std::vector<int32_t> tokens(kPromptTokens, 7);
    tokens[0] = number;
    return tokens;
}

struct Cache {
    double now = 0;
    PrefixCache cache;
    Cache(size_t entries, CachePolicy policy) : cache(entries * kEntryBytes, policy, [this] { return now; }) {}
    // A fresh session that begins with the prompt: whether it was held, keeping it if it was not.
    bool use(int32_t number) {
        const std::vector<int32_t> tokens = prompt(number);
        size_t matched = 0;
        if (cache.find(0, true, tokens.data(), tokens.size(), &matched)) {
            CHECK(matched == kPromptTokens);
            return true;
        }
        cache.insert(0, true, tokens.data(), tokens.size(), std::vector<uint8_t>(kStateBytes));
        return false;
    }
};

TEST_CASE("prefix cache: categories count an entry's uses by powers of two") {
    CHECK(PrefixCache::category(0) == 0);
    CHECK(PrefixCache::category(1) == 1);
    CHECK(PrefixCache::category(2) == 2);
    CHECK(PrefixCache::category(3) == 2);
    CHECK(PrefixCache::category(4) == 3);
    CHECK(PrefixCache::category(15) == 4);
    CHECK(PrefixCache::category(16) == PrefixCache::kCategories - 1);
    CHECK(PrefixCache::category(UINT32_MAX) == PrefixCache::kCategories - 1);
}

TEST_CASE("prefix cache: under LRU the least recently used entry goes first") {
    Cache c(2, CachePolicy::kLru);
    CHECK_FALSE(c.use(1));
    c.now = 1;
    CHECK_FALSE(c.use(2));
    c.now = 2;
    CHECK(c.use(1));  // 1 is now the more recent
    c.now = 3;
    CHECK_FALSE(c.use(3));  // gives up 2
    CHECK(c.cache.counters().entries == 2);
    CHECK(c.cache.counters().bytes == 2 * kEntryBytes);
    c.now = 4;
    CHECK(c.use(1));
    CHECK(c.use(3));
    CHECK_FALSE(c.use(2));
}

// A desktop's prefix cache: an assistant's system prompt every two minutes, and between its
// uses a dozen prompts of apps that are never seen again, for ten hours, in a cache of four.
// LRU lets the one-shot prompts push the shared one out every time; the reuse policy learns that
// one-shot prompts do not come back and that the shared one does, and keeps it.
TEST_CASE("prefix cache: the reuse policy keeps a shared prompt that one-shot prompts push out of LRU") {
    for (const CachePolicy policy : {CachePolicy::kLru, CachePolicy::kReuse}) {
        CAPTURE(h2o::cache_policy_name(policy));
        Cache c(4, policy);
        int32_t one_shot = 1000;
        uint64_t late_uses = 0, late_hits = 0;
        for (int round = 0; round < 300; ++round) {
            c.now = 120.0 * round;
            const bool hit = c.use(1);
            if (round >= 150) {
                ++late_uses;
                late_hits += hit ? 1 : 0;
            }
            for (int k = 1; k <= 12; ++k) {
                c.now = 120.0 * round + 9.0 * k;
                CHECK_FALSE(c.use(one_shot++));
            }
        }
        CHECK(c.cache.counters().entries == 4);
        if (policy == CachePolicy::kLru) {
            CHECK(late_hits == 0);
        } else {
            CHECK(late_hits == late_uses);
            // What it learned: one-shot prompts (no use yet) are rarely used again; the shared
            // prompt's category (16 uses or more) is, about every two minutes.
            const h2o::ReuseEstimator e = c.cache.estimates();
            CHECK(e.reuse_share(0) < 0.05);
            CHECK(e.reuse_share(PrefixCache::kCategories - 1) > 0.95);
            CHECK(e.mean_reuse_seconds(PrefixCache::kCategories - 1) == doctest::Approx(120).epsilon(0.1));
        }
    }
}

// The estimate follows every policy: it is what /health shows and what the reuse policy would go by.
TEST_CASE("prefix cache: a prompt given up and kept again counts as reused, with its uses") {
    Cache c(1, CachePolicy::kLru);
    CHECK_FALSE(c.use(1));
    c.now = 10;
    CHECK_FALSE(c.use(2));  // gives up 1, unused
    c.now = 100;
    CHECK_FALSE(c.use(1));  // 1 again after 100 s: a reuse of category 0; gives up 2
    c.now = 130;
    CHECK_FALSE(c.use(2));  // 2 again after 120 s, likewise
    c.now = 140;
    CHECK_FALSE(c.use(1));  // 1, used once now, again after 40 s: a reuse of category 1
    // (Within the fading of earlier observations, 1/1000 each.)
    const h2o::ReuseEstimator e = c.cache.estimates();
    CHECK(e.mean_reuse_seconds(0) == doctest::Approx((100.0 + 120.0 + 600.0) / 3).epsilon(0.001));  // the prior's 600 s
    CHECK(e.reuse_share(0) == doctest::Approx(3.0 / 4).epsilon(0.001));                             // 2 reuses, no end, the prior's 1 of 2
    CHECK(e.mean_reuse_seconds(1) == doctest::Approx((40.0 + 600.0) / 2).epsilon(0.001));
    CHECK(c.cache.counters().hits == 0);
    CHECK(c.cache.counters().entries == 1);
}

TEST_CASE("prefix cache: a state larger than the whole cache is not kept, and nothing else goes for it") {
    for (const CachePolicy policy : {CachePolicy::kLru, CachePolicy::kReuse}) {
        Cache c(2, policy);
        CHECK_FALSE(c.use(1));
        const std::vector<int32_t> tokens = prompt(9);
        c.cache.insert(0, true, tokens.data(), tokens.size(), std::vector<uint8_t>(3 * kEntryBytes));
        CHECK(c.cache.counters().entries == 1);
        CHECK(c.use(1));
    }
}

}  // namespace
