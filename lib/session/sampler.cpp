#include "sampler.h"

#include <algorithm>
#include <cmath>

namespace h2o {

namespace {

uint64_t splitmix64(uint64_t &x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Sampler::Sampler(int n_vocab, uint64_t seed) : n_vocab_(n_vocab), candidates_(n_vocab) { reseed(seed); }

void Sampler::reseed(uint64_t seed) {
    for (uint64_t &s : state_) s = splitmix64(seed);
}

// xoshiro256**: small, fast and specified bit for bit, unlike the standard distributions.
double Sampler::next_uniform() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return static_cast<double>(result >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(float *logits, const SamplerSettings &settings, const TokenHistory &history, const TokenFilter *filter) {
    for (const auto &[token, bias] : settings.logit_bias) logits[token] += bias;
    if (settings.repeat_penalty != 1.0f && settings.repeat_last_n > 0) {
        // Penalise each distinct recent token once, as is customary: shrink positive logits and
        // grow negative ones, so the penalty always lowers the token's probability.
        const uint32_t window = std::min(settings.repeat_last_n, history.size());
        for (uint32_t i = 0; i < window; ++i) {
            const int32_t token = history.recent(i);
            bool seen_newer = false;
            for (uint32_t j = 0; j < i && !seen_newer; ++j) seen_newer = history.recent(j) == token;
            if (seen_newer) continue;
            float &l = logits[token];
            l = l > 0 ? l / settings.repeat_penalty : l * settings.repeat_penalty;
        }
    }

    if (filter) {
        // Greedy needs the best allowed token, top-k the k best; top-k off, every allowed one.
        const size_t wanted = settings.temperature <= 0.0f ? 1 : settings.top_k > 0 ? settings.top_k : SIZE_MAX;
        if (!apply_filter(logits, *filter, wanted)) return -1;
    }
    if (settings.temperature <= 0.0f) {
        return greedy_index(logits, n_vocab_);
    }
    const size_t n = keep_candidates(logits, settings);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += candidates_[i].probability;
    double r = next_uniform() * total;
    for (size_t i = 0; i < n; ++i) {
        r -= candidates_[i].probability;
        if (r < 0.0) return candidates_[i].token;
    }
    return candidates_[n - 1].token;
}

bool Sampler::apply_filter(float *logits, const TokenFilter &filter, size_t wanted) {
    // The whole mask when it is cheap (few tokens fit: the walk stops at their first bytes) or
    // needed (every allowed token takes part in the draw).
    constexpr size_t kMaskBudget = 1u << 16;
    if (filter.mask(&allowed_, wanted == SIZE_MAX ? 0 : kMaskBudget)) {
        bool any = false;
        for (int32_t t = 0; t < n_vocab_; ++t) {
            if (!allowed_[static_cast<size_t>(t)]) logits[t] = -INFINITY;
            any = any || allowed_[static_cast<size_t>(t)];
        }
        return any;
    }
    // Most tokens fit: the best ones by logit are checked one at a time, in growing steps of a
    // partial sort, until `wanted` are allowed (ties: lower id first, as greedy_index).
    for (int32_t t = 0; t < n_vocab_; ++t)
        candidates_[static_cast<size_t>(t)] = Candidate{logits[t] == logits[t] ? logits[t] : -INFINITY, 0.0f, t};
    auto better = [](const Candidate &a, const Candidate &b) { return a.logit > b.logit || (a.logit == b.logit && a.token < b.token); };
    const auto first = candidates_.begin(), last = first + n_vocab_;
    size_t found = 0, sorted = 0;
    for (size_t step = 64; found < wanted && sorted < static_cast<size_t>(n_vocab_); step *= 8) {
        const size_t end = std::min(static_cast<size_t>(n_vocab_), sorted + step);
        std::partial_sort(first + static_cast<std::ptrdiff_t>(sorted), first + static_cast<std::ptrdiff_t>(end), last, better);
        for (; sorted < end && found < wanted; ++sorted) {
            Candidate &c = candidates_[sorted];
            if (c.logit == -INFINITY || !filter.allows(c.token)) continue;
            candidates_[found++].token = c.token;  // the allowed ones gather at the front
        }
    }
    if (found == 0) return false;
    // Every token but the allowed ones found becomes impossible.
    allowed_.assign(static_cast<size_t>(n_vocab_), 0);
    for (size_t i = 0; i < found; ++i) allowed_[static_cast<size_t>(candidates_[i].token)] = 1;
    for (int32_t t = 0; t < n_vocab_; ++t) {
        if (!allowed_[static_cast<size_t>(t)]) logits[t] = -INFINITY;
    }
    return true;
}

std::vector<std::pair<float, int32_t>> Sampler::kept(const float *logits, const SamplerSettings &settings) {
    const size_t n = keep_candidates(logits, settings);
    std::vector<std::pair<float, int32_t>> out;
    for (size_t i = 0; i < n; ++i) out.emplace_back(candidates_[i].probability, candidates_[i].token);
    return out;
}

size_t Sampler::keep_candidates(const float *logits, const SamplerSettings &settings) {
    // The candidates in order are the tokens by logit, highest first (ties: lower id first). Only
    // the part that top-k, min-p and top-p keep is ever sorted: with a vocabulary of 128k-152k
    // tokens, sorting them all would cost about a tenth of a decoded token.
    size_t n = static_cast<size_t>(n_vocab_);
    // A NaN logit (a broken model) counts as impossible, as the greedy rule passes NaNs over.
    auto candidate = [&](int32_t i) { return Candidate{logits[i] == logits[i] ? logits[i] : -INFINITY, 0.0f, i}; };
    const auto first = candidates_.begin();
    auto better = [](const Candidate &a, const Candidate &b) { return a.logit > b.logit || (a.logit == b.logit && a.token < b.token); };
    if (settings.top_k > 0 && settings.top_k < n) {
        // The k best, unordered, in one pass over the logits: a heap of the best so far whose top
        // is the worst of them, which most logits fail to beat at one comparison.
        n = settings.top_k;
        for (size_t i = 0; i < n; ++i) candidates_[i] = candidate(static_cast<int32_t>(i));
        std::make_heap(first, first + n, better);
        for (int32_t i = static_cast<int32_t>(n); i < n_vocab_; ++i) {
            const Candidate c = candidate(i);
            if (!better(c, *first)) continue;
            std::pop_heap(first, first + n, better);
            candidates_[n - 1] = c;
            std::push_heap(first, first + n, better);
        }
    } else {
        for (int32_t i = 0; i < n_vocab_; ++i) candidates_[i] = candidate(i);
    }

    // Softmax at the given temperature over the n candidates.
    float max_logit = first->logit;
    for (size_t i = 1; i < n; ++i) max_logit = std::max(max_logit, candidates_[i].logit);
    if (!std::isfinite(max_logit)) {
        // No finite logit leads (all impossible, or one infinitely likely): no softmax exists, and
        // the token is the greedy rule's.
        candidates_[0] = {max_logit, 1.0f, greedy_index(logits, n_vocab_)};
        return 1;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const float p = std::exp((candidates_[i].logit - max_logit) / settings.temperature);
        candidates_[i].probability = p;
        sum += p;
    }
    for (size_t i = 0; i < n; ++i) candidates_[i].probability = static_cast<float>(candidates_[i].probability / sum);

    // min-p keeps the probabilities of at least min_p times the largest (1 / sum), top-p the
    // shortest run from the best whose probabilities add up to top_p: both keep a prefix of the
    // order. The min-p survivors are moved to the front, then sorted in growing steps only until
    // the top-p sum is reached.
    if (settings.min_p > 0.0f) {
        // The most probable token always passes (min_p <= 1, which the API checks).
        const float threshold = settings.min_p * static_cast<float>(1.0 / sum);
        n = static_cast<size_t>(std::partition(first, first + n, [&](const Candidate &c) { return c.probability >= threshold; }) - first);
    }
    if (settings.top_p < 1.0f) {
        double cumulative = 0.0;
        size_t sorted = 0;  // candidates_[0, sorted) are in order and summed in cumulative
        for (size_t step = 64; sorted < n && cumulative < settings.top_p; step *= 8) {
            const size_t end = std::min(n, sorted + step);
            std::partial_sort(first + sorted, first + end, first + n, better);
            while (sorted < end && cumulative < settings.top_p) cumulative += candidates_[sorted++].probability;
        }
        n = sorted;
    } else {
        std::sort(first, first + n, better);
    }
    return n;
}

}  // namespace h2o
