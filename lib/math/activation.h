// Gemma's per-element functions (ModelShape::gelu, attention_softcap, output_softcap), written
// once for every backend that runs them.
#ifndef H2O_ACTIVATION_H
#define H2O_ACTIVATION_H

#include <math.h>

#include "device_fn.h"

namespace h2o {

// GELU, tanh approximation: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), as Gemma is trained
// with. Computed in float, not from a table of half-precision inputs.
H2O_HD float gelu_tanh(float x) {
    const float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}

// Soft-capping: x squashed smoothly into (-cap, cap), cap > 0.
H2O_HD float soft_cap(float x, float cap) { return cap * tanhf(x / cap); }

}  // namespace h2o

#endif  // H2O_ACTIVATION_H
