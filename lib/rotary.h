// Rotary position embedding as every backend computes it (the GGUF Llama convention): the pair
// (x[2i], x[2i+1]) of a head is rotated by pos * base^(-2i/d). The inverse frequency and the angle
// are in double precision, because positions reach tens of thousands, where float angles lose the
// low bits that distinguish neighbouring positions; cos and sin are taken in double and rounded
// to float once. Used by the CPU backend's rope, the KV cache's re-rotation of rolled keys and the
// CUDA kernels (which get the inverse frequencies from the host).
#ifndef H2O_ROTARY_H
#define H2O_ROTARY_H

#include <math.h>

#include "device_fn.h"

namespace h2o {

// base^(-2i/dims), computed on the host.
inline double rotary_inv_freq(float base, int i, int dims) {
    return pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / dims);
}

// cos and sin of the angle of position `pos` (negative: a rotation back) for the pair whose
// inverse frequency is inv_freq.
H2O_HD void rotary_cos_sin(int pos, double inv_freq, float *c, float *s) {
    const double theta = static_cast<double>(pos) * inv_freq;
    *c = static_cast<float>(cos(theta));
    *s = static_cast<float>(sin(theta));
}

// Rotates the pair (*a, *b) by the angle with cosine c and sine s.
H2O_HD void rotate_pair(float *a, float *b, float c, float s) {
    const float x = *a, y = *b;
    *a = H2O_FSUB(H2O_FMUL(x, c), H2O_FMUL(y, s));
    *b = H2O_FADD(H2O_FMUL(x, s), H2O_FMUL(y, c));
}

}  // namespace h2o

#endif  // H2O_ROTARY_H
