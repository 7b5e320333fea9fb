// A model's cache of processed prompt prefixes: a session whose first tokens were already
// processed by another session with the same cache-shaping settings starts from that session's
// saved state instead of processing them again (most requests of an assistant begin with one of a
// few system prompts). Bounded in bytes; the least recently used entries go first. Thread-safe:
// every session of the model shares it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

namespace h2o {

class PrefixCache {
public:
    // Entries shorter than this are not worth a snapshot: processing them is cheap.
    static constexpr size_t kMinTokens = 16;

    explicit PrefixCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}
    bool enabled() const { return capacity_ > 0; }

    // The state saved after the longest cached token sequence that `tokens` begins with, under
    // the same settings key and pin flag; null when none. *matched receives its length.
    std::shared_ptr<const std::vector<uint8_t>> find(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n, size_t *matched);
    // Remembers the state after processing `tokens` from a fresh session (evicting old entries to
    // stay within the capacity; a state larger than the capacity is not kept).
    void insert(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n, std::vector<uint8_t> state);

    struct Counters {
        uint64_t hits = 0, misses = 0, bytes = 0, entries = 0;
    };
    Counters counters() const;

private:
    struct Entry {
        uint64_t settings_key;
        bool pinned;
        std::vector<int32_t> tokens;
        std::shared_ptr<const std::vector<uint8_t>> state;
        uint64_t bytes() const { return state->size() + tokens.size() * sizeof(int32_t); }
    };
    mutable std::mutex mutex_;
    uint64_t capacity_;
    std::list<Entry> entries_;  // most recently used first
    Counters counters_;
};

}  // namespace h2o
