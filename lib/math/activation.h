// Gemma's per-element functions (ModelShape::gelu, attention_softcap, output_softcap), written
// once for every backend that runs them.
#ifndef H2O_ACTIVATION_H
#define H2O_ACTIVATION_H

#include <math.h>

#include "device_fn.h"

namespace h2o {

// GELU, tanh approximation: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), as Gemma is trained
// with. Since (1 + tanh(z)) / 2 = 1 / (1 + exp(-2z)), it is x / (1 + exp(-gelu_sigmoid_arg(x))),
// the form every backend computes (the CPU's vector kernels with their exp, as SiLU's). In float,
// not from a table of half-precision inputs. Beyond |x| ~ 10 the exponential over- or
// underflows to x or -0, the function's limits.
H2O_HD float gelu_sigmoid_arg(float x) {
    const float kTwoSqrt2OverPi = 1.5957691216057308f;
    return kTwoSqrt2OverPi * x * (1.0f + 0.044715f * x * x);
}
H2O_HD float gelu_tanh(float x) { return x / (1.0f + expf(-gelu_sigmoid_arg(x))); }

// Soft-capping: x squashed smoothly into (-cap, cap), cap > 0.
H2O_HD float soft_cap(float x, float cap) { return cap * tanhf(x / cap); }

}  // namespace h2o

#endif  // H2O_ACTIVATION_H
