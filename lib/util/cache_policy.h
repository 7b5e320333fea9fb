// Which entry of a bounded cache gives up its place when room is needed: the least recently used
// (LRU), or, after "KVCache Cache in the Wild" (Wang et al., USENIX ATC '25), the one whose
// expected saving is lowest: the probability that it is used again, estimated per category of
// entry from the cache's own history, times the work its reuse saves, per byte it holds. The
// server's conversations and the model's prefix cache each choose their categories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace h2o {

enum class CachePolicy {
    kLru,
    kReuse
};
// "lru" or "reuse"; false for another name.
bool parse_cache_policy(const std::string &name, CachePolicy *out);
const char *cache_policy_name(CachePolicy policy);

// Learns online, per category, how often an idle entry is used again and after how long. The
// paper finds reuse times exponential within a category, so an entry idle for t seconds is used
// again with probability
//   p(t) = q e^(-t/m) / (q e^(-t/m) + 1 - q),
// q the share of idle periods that ended in a reuse and m their mean length. Counts fade (each
// observation weighs 1/1000 less than the one after it), so the estimate follows a changing
// workload; before any observation q = 1/2 and m = 10 minutes.
class ReuseEstimator {
public:
    explicit ReuseEstimator(size_t categories) : counts_(categories) {}
    // An entry of this category was used again after idle_seconds.
    void reused(size_t category, double idle_seconds);
    // One went without reuse: deleted, or idle past horizon_seconds.
    void ended(size_t category);
    double probability(size_t category, double idle_seconds) const;
    // How long an idle entry waits before it counts as gone without reuse: ten mean reuse times,
    // and at least an hour.
    double horizon_seconds(size_t category) const;
    double mean_reuse_seconds(size_t category) const;
    double reuse_share(size_t category) const;

private:
    struct Counts {
        double reuses = 0, ended = 0, reuse_seconds = 0;
    };
    static void fade(Counts &counts);
    std::vector<Counts> counts_;
};

// An idle entry that may give up its place.
struct CacheCandidate {
    uint64_t last_used = 0;   // a clock that orders uses (LRU's key)
    double idle_seconds = 0;  // since its last use
    size_t category = 0;
    uint64_t tokens = 0;  // the prefill its reuse saves
    uint64_t bytes = 1;   // what giving it up frees
};

// Orders candidates from the first to give up to the last: by last_used (LRU), or by expected
// saving per byte freed (reuse), ties by last_used.
std::vector<size_t> give_up_order(CachePolicy policy, const ReuseEstimator &estimator, const std::vector<CacheCandidate> &candidates);

}  // namespace h2o
