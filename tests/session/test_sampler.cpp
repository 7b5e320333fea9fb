// The sampler keeps exactly the tokens that sorting the whole vocabulary would keep (it sorts only
// what top-k, min-p and top-p leave), and draws reproducibly from them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "sampler.h"

namespace {

using Candidates = std::vector<std::pair<float, int32_t>>;

// The rule written the plain way: every token sorted best first (ties: lower id first), top-k,
// softmax at the temperature over those, then top-p's shortest prefix and min-p's prefix.
Candidates reference_kept(const std::vector<float> &logits, const h2o::SamplerSettings &s) {
    Candidates c;
    for (size_t i = 0; i < logits.size(); ++i) c.emplace_back(logits[i], static_cast<int32_t>(i));
    std::sort(c.begin(), c.end(),
              [](const auto &a, const auto &b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    if (s.top_k > 0 && s.top_k < c.size()) c.resize(s.top_k);
    const float max_logit = c[0].first;
    double sum = 0.0;
    for (auto &x : c) sum += x.first = std::exp((x.first - max_logit) / s.temperature);
    for (auto &x : c) x.first = static_cast<float>(x.first / sum);
    if (s.top_p < 1.0f) {
        double cumulative = 0.0;
        for (size_t i = 0; i < c.size(); ++i) {
            cumulative += c[i].first;
            if (cumulative >= s.top_p) {
                c.resize(i + 1);
                break;
            }
        }
    }
    if (s.min_p > 0.0f) {
        size_t keep = 1;
        while (keep < c.size() && c[keep].first >= s.min_p * c[0].first) ++keep;
        c.resize(keep);
    }
    return c;
}

}  // namespace

TEST_CASE("sampler: keeps what a sort of the whole vocabulary keeps, in its order") {
    std::mt19937 random(11);
    for (int n_vocab : {1, 7, 300, 20000}) {
        for (float spread : {0.5f, 3.0f, 12.0f}) {
            std::normal_distribution<float> normal(0.0f, spread);
            std::vector<float> logits(static_cast<size_t>(n_vocab));
            for (float &x : logits) x = normal(random);
            // Ties: equal logits are ordered by token id.
            for (size_t i = 0; i + 3 < logits.size(); i += 5) logits[i + 3] = logits[i];
            for (uint32_t top_k : {0u, 1u, 40u, 1000u}) {
                for (float top_p : {0.5f, 0.95f, 1.0f}) {
                    for (float min_p : {0.0f, 0.05f, 1.0f}) {
                        h2o::SamplerSettings s;
                        s.temperature = 0.8f;
                        s.top_k = top_k;
                        s.top_p = top_p;
                        s.min_p = min_p;
                        CAPTURE(n_vocab);
                        CAPTURE(spread);
                        CAPTURE(top_k);
                        CAPTURE(top_p);
                        CAPTURE(min_p);
                        h2o::Sampler sampler(n_vocab, 1);
                        const Candidates got = sampler.kept(logits.data(), s);
                        const Candidates want = reference_kept(logits, s);
                        REQUIRE(got.size() == want.size());
                        for (size_t i = 0; i < got.size(); ++i) {
                            CHECK(got[i].second == want[i].second);
                            CHECK(got[i].first == doctest::Approx(want[i].first).epsilon(1e-5));
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("sampler: the same seed draws the same tokens, and every draw is a kept token") {
    std::mt19937 random(5);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(128256);
    for (float &x : logits) x = normal(random);
    h2o::SamplerSettings s;  // the defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
    h2o::Sampler a(static_cast<int>(logits.size()), 42), b(static_cast<int>(logits.size()), 42);
    const Candidates kept = a.kept(logits.data(), s);
    h2o::TokenHistory history;
    std::vector<int32_t> drawn_a, drawn_b;
    for (int i = 0; i < 200; ++i) {
        std::vector<float> copy = logits;
        drawn_a.push_back(a.sample(copy.data(), s, history));
        copy = logits;
        drawn_b.push_back(b.sample(copy.data(), s, history));
    }
    CHECK(drawn_a == drawn_b);
    for (int32_t t : drawn_a) {
        CHECK(std::any_of(kept.begin(), kept.end(), [&](const auto &c) { return c.second == t; }));
    }
    // More than one token is drawn: the draw is not stuck on the best.
    std::sort(drawn_a.begin(), drawn_a.end());
    CHECK(std::unique(drawn_a.begin(), drawn_a.end()) - drawn_a.begin() > 1);
}

TEST_CASE("sampler: NaN and infinite logits give a valid token, never a read outside the vocabulary") {
    h2o::SamplerSettings s;  // defaults: top-k 40, top-p 0.95, min-p 0.05
    h2o::TokenHistory history;
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (uint32_t top_k : {0u, 40u}) {
        s.top_k = top_k;
        h2o::Sampler sampler(5, 3);
        std::vector<float> all_nan(5, nan);
        CHECK(sampler.sample(all_nan.data(), s, history) == 0);  // the greedy rule's choice
        std::vector<float> all_minus_inf(5, -inf);
        CHECK(sampler.sample(all_minus_inf.data(), s, history) == 0);
        std::vector<float> one_inf = {0.0f, nan, inf, 1.0f, inf};
        CHECK(sampler.sample(one_inf.data(), s, history) == 2);  // the first of the largest
        // NaNs among finite logits are never drawn.
        std::vector<float> some_nan = {nan, 0.5f, nan, 0.4f, nan};
        for (int i = 0; i < 50; ++i) {
            std::vector<float> copy = some_nan;
            const int32_t t = sampler.sample(copy.data(), s, history);
            CHECK((t == 1 || t == 3));
        }
    }
}
