// The greedy choice over a row of logits, which the sampler and every backend's argmax follow.
#pragma once

#include <cstdint>

namespace h2o {

// Greedy choice over n logits, the rule every backend's argmax follows: the first of the largest
// values, NaNs passed over (a row of NaNs gives 0).
inline int32_t greedy_index(const float *logits, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i) {
        if (logits[i] == logits[i] && (best < 0 || logits[i] > logits[best])) best = i;  // x == x: not NaN
    }
    return static_cast<int32_t>(best < 0 ? 0 : best);
}

}  // namespace h2o
