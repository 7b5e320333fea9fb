// A model's cache of processed prompt prefixes: a session whose first tokens were already
// processed by another session with the same cache-shaping settings starts from that session's
// saved state instead of processing them again (most requests of an assistant begin with one of a
// few system prompts). Bounded in bytes; which entries go first when it is full is a cache policy
// (cache_policy.h): the least recently used, or the lowest expected saving, with entries told
// apart by how often they were used. Thread-safe: every session of the model shares it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "cache_policy.h"

namespace h2o {

class PrefixCache {
public:
    // Entries shorter than this are not worth a snapshot: processing them is cheap.
    static constexpr size_t kMinTokens = 16;
    // The categories of reuse: an entry used 0, 1, 2-3, 4-7, 8-15, or 16 or more times since it
    // was first kept (a popular system prompt has its own category, and so its own reuse times).
    static constexpr size_t kCategories = 6;
    static size_t category(uint32_t uses);
    // Seconds on a clock that only goes forward (the steady clock; tests and the trace replayer
    // give their own).
    using Clock = std::function<double()>;
    static double steady_seconds();

    explicit PrefixCache(uint64_t capacity_bytes, CachePolicy policy = CachePolicy::kReuse, Clock clock = steady_seconds)
        : capacity_(capacity_bytes), policy_(policy), clock_(std::move(clock)) {}
    bool enabled() const { return capacity_ > 0; }
    CachePolicy policy() const { return policy_; }

    // The state saved after the longest cached token sequence that `tokens` begins with, under
    // the same settings key and pin flag; null when none. *matched receives its length.
    std::shared_ptr<const std::vector<uint8_t>> find(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n, size_t *matched);
    // Remembers the state after processing `tokens` from a fresh session, giving up entries by
    // the policy to stay within the capacity (the new one among them; a state larger than the
    // capacity is not kept).
    void insert(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n, std::vector<uint8_t> state);

    struct Counters {
        uint64_t hits = 0, misses = 0, bytes = 0, entries = 0;
    };
    Counters counters() const;
    // What the policy has learned so far (a copy).
    ReuseEstimator estimates() const;

private:
    struct Entry {
        uint64_t settings_key;
        bool pinned;
        std::vector<int32_t> tokens;
        std::shared_ptr<const std::vector<uint8_t>> state;
        uint64_t digest;  // of the three above but the state: how a ghost knows it again
        double last_seconds = 0;
        uint64_t last_use = 0;  // order of uses: LRU's key
        uint32_t uses = 0;
        bool counted_gone = false;  // idle past the horizon, told to the estimator
        uint64_t bytes() const { return state->size() + tokens.size() * sizeof(int32_t); }
    };
    // What an entry given up leaves behind: if the same prefix is kept again, that is a reuse
    // the estimator must hear of (or it would learn only from what the policy chose to keep).
    // A ghost past the horizon, or the oldest when there are kMaxGhosts, counts as gone without
    // reuse.
    struct Ghost {
        uint64_t digest;
        double last_seconds;
        uint32_t uses;
        bool counted_gone;
    };
    static constexpr size_t kMaxGhosts = 4096;  // 32 bytes each

    void note_idle_past_horizon(double now);  // mutex_
    void make_room(double now);               // mutex_

    mutable std::mutex mutex_;
    uint64_t capacity_;
    CachePolicy policy_;
    Clock clock_;
    std::list<Entry> entries_;  // mutex_; most recently used first
    std::deque<Ghost> ghosts_;  // mutex_; oldest first
    ReuseEstimator estimator_{kCategories};
    uint64_t uses_ = 0;  // mutex_
    Counters counters_;  // mutex_
};

}  // namespace h2o
