#include "prefix_cache.h"

#include <algorithm>

namespace h2o {

std::shared_ptr<const std::vector<uint8_t>> PrefixCache::find(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n,
                                                              size_t *matched) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        const size_t len = it->tokens.size();
        if (it->settings_key != settings_key || it->pinned != pinned || len > n) continue;
        if (best != entries_.end() && len <= best->tokens.size()) continue;
        if (std::equal(it->tokens.begin(), it->tokens.end(), tokens)) best = it;
    }
    if (best == entries_.end()) {
        ++counters_.misses;
        return nullptr;
    }
    ++counters_.hits;
    entries_.splice(entries_.begin(), entries_, best);  // now the most recently used
    *matched = entries_.front().tokens.size();
    return entries_.front().state;
}

void PrefixCache::insert(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n, std::vector<uint8_t> state) {
    Entry entry{settings_key, pinned, std::vector<int32_t>(tokens, tokens + n),
                std::make_shared<const std::vector<uint8_t>>(std::move(state))};
    if (n < kMinTokens || entry.bytes() > capacity_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry &e : entries_) {
        if (e.settings_key == settings_key && e.pinned == pinned && e.tokens == entry.tokens) return;  // already there
    }
    counters_.bytes += entry.bytes();
    entries_.push_front(std::move(entry));
    while (counters_.bytes > capacity_) {
        counters_.bytes -= entries_.back().bytes();
        entries_.pop_back();
    }
    counters_.entries = entries_.size();
}

PrefixCache::Counters PrefixCache::counters() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_;
}

}  // namespace h2o
