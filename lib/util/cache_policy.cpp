#include "cache_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace h2o {

namespace {

constexpr double kFade = 1.0 - 1.0 / 1000;
constexpr double kPriorMeanSeconds = 600;

}  // namespace

bool parse_cache_policy(const std::string &name, CachePolicy *out) {
    if (name == "lru") {
        *out = CachePolicy::kLru;
    } else if (name == "reuse") {
        *out = CachePolicy::kReuse;
    } else {
        return false;
    }
    return true;
}

const char *cache_policy_name(CachePolicy policy) { return policy == CachePolicy::kLru ? "lru" : "reuse"; }

void ReuseEstimator::fade(Counts &counts) {
    counts.reuses *= kFade;
    counts.ended *= kFade;
    counts.reuse_seconds *= kFade;
}

void ReuseEstimator::reused(size_t category, double idle_seconds) {
    Counts &c = counts_.at(category);
    fade(c);
    c.reuses += 1;
    c.reuse_seconds += std::max(0.0, idle_seconds);
}

void ReuseEstimator::ended(size_t category) {
    Counts &c = counts_.at(category);
    fade(c);
    c.ended += 1;
}

double ReuseEstimator::reuse_share(size_t category) const {
    const Counts &c = counts_.at(category);
    return (c.reuses + 1) / (c.reuses + c.ended + 2);
}

double ReuseEstimator::mean_reuse_seconds(size_t category) const {
    const Counts &c = counts_.at(category);
    return (c.reuse_seconds + kPriorMeanSeconds) / (c.reuses + 1);
}

double ReuseEstimator::probability(size_t category, double idle_seconds) const {
    const double q = reuse_share(category);
    const double still = q * std::exp(-std::max(0.0, idle_seconds) / mean_reuse_seconds(category));
    return still / (still + 1 - q);
}

double ReuseEstimator::horizon_seconds(size_t category) const { return std::max(3600.0, 10 * mean_reuse_seconds(category)); }

std::vector<size_t> give_up_order(CachePolicy policy, const ReuseEstimator &estimator, const std::vector<CacheCandidate> &candidates) {
    std::vector<double> saving(candidates.size(), 0);
    if (policy == CachePolicy::kReuse) {
        for (size_t i = 0; i < candidates.size(); ++i) {
            const CacheCandidate &c = candidates[i];
            saving[i] = estimator.probability(c.category, c.idle_seconds) * static_cast<double>(c.tokens + 1) /
                        static_cast<double>(std::max<uint64_t>(c.bytes, 1));
        }
    }
    std::vector<size_t> order(candidates.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (saving[a] != saving[b]) return saving[a] < saving[b];
        return candidates[a].last_used < candidates[b].last_used;
    });
    return order;
}

}  // namespace h2o
