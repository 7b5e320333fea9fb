#include "prefix_cache.h"

#include <algorithm>
#include <chrono>

namespace h2o {

namespace {

uint64_t digest_of(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the settings, the pin flag and the tokens
    auto mix = [&h](uint64_t v) {
        for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
    };
    mix(settings_key);
    mix(pinned ? 1 : 0);
    for (size_t i = 0; i < n; ++i) mix(static_cast<uint32_t>(tokens[i]));
    return h;
}

}  // namespace

size_t PrefixCache::category(uint32_t uses) {
    size_t c = 0;  // 1 + floor(log2(uses)), at most the last category
    for (; uses > 0 && c + 1 < kCategories; uses >>= 1) ++c;
    return c;
}

double PrefixCache::steady_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::shared_ptr<const std::vector<uint8_t>> PrefixCache::find(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n,
                                                              size_t *matched) {
    const double now = clock_();
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
    estimator_.reused(category(best->uses), now - best->last_seconds);
    ++best->uses;
    best->last_seconds = now;
    best->last_use = ++uses_;
    best->counted_gone = false;
    entries_.splice(entries_.begin(), entries_, best);  // now the most recently used
    *matched = entries_.front().tokens.size();
    return entries_.front().state;
}

void PrefixCache::insert(uint64_t settings_key, bool pinned, const int32_t *tokens, size_t n, std::vector<uint8_t> state) {
    const double now = clock_();
    Entry entry{settings_key, pinned, std::vector<int32_t>(tokens, tokens + n),
                std::make_shared<const std::vector<uint8_t>>(std::move(state)), digest_of(settings_key, pinned, tokens, n)};
    if (n < kMinTokens || entry.bytes() > capacity_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    note_idle_past_horizon(now);
    for (const Entry &e : entries_) {
        if (e.settings_key == settings_key && e.pinned == pinned && e.tokens == entry.tokens) return;  // already there
    }
    auto ghost = std::find_if(ghosts_.begin(), ghosts_.end(), [&](const Ghost &g) { return g.digest == entry.digest; });
    if (ghost != ghosts_.end()) {  // given up earlier and needed again
        estimator_.reused(category(ghost->uses), now - ghost->last_seconds);
        entry.uses = ghost->uses + 1;
        ghosts_.erase(ghost);
    }
    entry.last_seconds = now;
    entry.last_use = ++uses_;
    counters_.bytes += entry.bytes();
    entries_.push_front(std::move(entry));
    make_room(now);
    counters_.entries = entries_.size();
}

void PrefixCache::note_idle_past_horizon(double now) {
    for (Entry &e : entries_) {
        const size_t c = category(e.uses);
        if (!e.counted_gone && now - e.last_seconds > estimator_.horizon_seconds(c)) {
            estimator_.ended(c);
            e.counted_gone = true;
        }
    }
    for (auto it = ghosts_.begin(); it != ghosts_.end();) {
        const size_t c = category(it->uses);
        if (now - it->last_seconds <= estimator_.horizon_seconds(c)) {
            ++it;
            continue;
        }
        if (!it->counted_gone) estimator_.ended(c);
        it = ghosts_.erase(it);
    }
}

void PrefixCache::make_room(double now) {
    while (counters_.bytes > capacity_) {
        std::vector<std::list<Entry>::iterator> where;
        std::vector<CacheCandidate> candidates;
        for (auto it = entries_.begin(); it != entries_.end(); ++it) {
            where.push_back(it);
            candidates.push_back({it->last_use, now - it->last_seconds, category(it->uses), it->tokens.size(), it->bytes()});
        }
        const auto victim = where[give_up_order(policy_, estimator_, candidates).front()];
        if (ghosts_.size() == kMaxGhosts) {
            if (!ghosts_.front().counted_gone) estimator_.ended(category(ghosts_.front().uses));
            ghosts_.pop_front();
        }
        ghosts_.push_back({victim->digest, victim->last_seconds, victim->uses, victim->counted_gone});
        counters_.bytes -= victim->bytes();
        entries_.erase(victim);
    }
}

PrefixCache::Counters PrefixCache::counters() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_;
}

ReuseEstimator PrefixCache::estimates() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return estimator_;
}

}  // namespace h2o
