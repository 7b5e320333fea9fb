// Softmax in one pass (the running maximum and the sum of exponentials relative to it), with
// states that merge in any grouping: how a device kernel spreads one softmax over its threads.
// The weights it gives are those of the CPU backend's softmax (max, exp(x - max), 1/sum) up to
// rounding. A score of -infinity is masked out; a softmax of nothing but masked scores gives
// zero weights, as the CPU's does.
#ifndef H2O_ONLINE_SOFTMAX_H
#define H2O_ONLINE_SOFTMAX_H

#include <math.h>

#include "device_fn.h"

namespace h2o {

struct SoftmaxState {
    float max;  // the largest score seen (-infinity: none)
    float sum;  // sum of exp(score - max)
};

H2O_HD SoftmaxState softmax_empty() {
    SoftmaxState s;
    s.max = -INFINITY;
    s.sum = 0.0f;
    return s;
}

H2O_HD SoftmaxState softmax_add(SoftmaxState s, float x) {
    if (x == -INFINITY) return s;
    if (x > s.max) {
        s.sum = (s.max == -INFINITY ? 0.0f : s.sum * expf(s.max - x)) + 1.0f;
        s.max = x;
    } else {
        s.sum += expf(x - s.max);
    }
    return s;
}

H2O_HD SoftmaxState softmax_merge(SoftmaxState a, SoftmaxState b) {
    if (b.max == -INFINITY) return a;
    if (a.max == -INFINITY) return b;
    SoftmaxState s;
    s.max = fmaxf(a.max, b.max);
    s.sum = a.sum * expf(a.max - s.max) + b.sum * expf(b.max - s.max);
    return s;
}

// The weight of score x in the softmax that state s summarises.
H2O_HD float softmax_weight(SoftmaxState s, float x) {
    if (s.max == -INFINITY || x == -INFINITY) return 0.0f;
    return expf(x - s.max) * (1.0f / s.sum);
}

}  // namespace h2o

#endif  // H2O_ONLINE_SOFTMAX_H
