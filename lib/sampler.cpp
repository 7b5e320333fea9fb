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

int32_t Sampler::sample(float *logits, const SamplerSettings &settings, const TokenHistory &history) {
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

    if (settings.temperature <= 0.0f) {
        return greedy_index(logits, n_vocab_);
    }

    size_t n = static_cast<size_t>(n_vocab_);
    for (int i = 0; i < n_vocab_; ++i) candidates_[i] = {logits[i], i};
    auto by_logit = [](const std::pair<float, int32_t> &a, const std::pair<float, int32_t> &b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    if (settings.top_k > 0 && settings.top_k < n) {
        std::partial_sort(candidates_.begin(), candidates_.begin() + settings.top_k, candidates_.end(), by_logit);
        n = settings.top_k;
    } else {
        std::sort(candidates_.begin(), candidates_.end(), by_logit);
    }

    // Softmax at the given temperature over the n best candidates (sorted, best first).
    const float max_logit = candidates_[0].first;
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const float p = std::exp((candidates_[i].first - max_logit) / settings.temperature);
        candidates_[i].first = p;
        sum += p;
    }
    for (size_t i = 0; i < n; ++i) candidates_[i].first = static_cast<float>(candidates_[i].first / sum);

    if (settings.top_p < 1.0f) {
        double cumulative = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            cumulative += candidates_[i].first;
            if (cumulative >= settings.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (settings.min_p > 0.0f) {
        const float threshold = settings.min_p * candidates_[0].first;
        size_t keep = 1;
        while (keep < n && candidates_[keep].first >= threshold) ++keep;
        n = keep;
    }

    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += candidates_[i].first;
    double r = next_uniform() * total;
    for (size_t i = 0; i < n; ++i) {
        r -= candidates_[i].first;
        if (r < 0.0) return candidates_[i].second;
    }
    return candidates_[n - 1].second;
}

}  // namespace h2o
