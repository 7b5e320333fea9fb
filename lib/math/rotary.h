// Rotary position embedding as every backend computes it: pair i of a head (RotaryPairing says
// which two elements) is rotated by pos * base^(-2i/d) (divided by the pair's frequency factor
// when the model has them: rotary_spec.h). The inverse frequency and the angle
// are in double precision, because positions reach tens of thousands, where float angles lose the
// low bits that distinguish neighbouring positions; cos and sin are taken in double and rounded
// to float once. Used by the CPU backend's rope, the KV cache's re-rotation of rolled keys and the
// CUDA kernels (which get the inverse frequencies from the host).
#ifndef H2O_ROTARY_H
#define H2O_ROTARY_H

#include <math.h>

#include "device_fn.h"

namespace h2o {

// Which two elements of a head form rotary pair i (of n_pairs = rope dims / 2): the GGUF Llama
// convention pairs neighbours (x[2i], x[2i+1]); the GPT-NeoX convention (Qwen 2 and 3) pairs the
// two halves of the rotated dimensions (x[i], x[i + n_pairs]).
enum class RotaryPairing : int {
    Adjacent = 0,
    Halves = 1
};

H2O_HD int rotary_pair_first(RotaryPairing pairing, int i) { return pairing == RotaryPairing::Halves ? i : 2 * i; }
// The distance from a pair's first element to its second.
H2O_HD int rotary_pair_offset(RotaryPairing pairing, int n_pairs) { return pairing == RotaryPairing::Halves ? n_pairs : 1; }

// base^(-2i/dims), computed on the host.
inline double rotary_inv_freq(float base, int i, int dims) { return pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / dims); }

// cos and sin of the angle of position `pos` (negative: a rotation back) for the pair whose
// inverse frequency is inv_freq.
H2O_HD void rotary_cos_sin(int pos, double inv_freq, float *c, float *s) {
    const double theta = static_cast<double>(pos) * inv_freq;
    *c = static_cast<float>(cos(theta));
    *s = static_cast<float>(sin(theta));
}

// rotary_cos_sin for the forward pass: both times the rotation's magnitude (RotarySpec::magnitude,
// 1 but for LongRoPE), in float as llama.cpp's rope scales them.
H2O_HD void rotary_cos_sin_scaled(int pos, double inv_freq, float magnitude, float *c, float *s) {
    rotary_cos_sin(pos, inv_freq, c, s);
    *c = H2O_FMUL(*c, magnitude);
    *s = H2O_FMUL(*s, magnitude);
}

// Rotates the pair (*a, *b) by the angle with cosine c and sine s.
H2O_HD void rotate_pair(float *a, float *b, float c, float s) {
    const float x = *a, y = *b;
    *a = H2O_FSUB(H2O_FMUL(x, c), H2O_FMUL(y, s));
    *b = H2O_FADD(H2O_FMUL(x, s), H2O_FMUL(y, c));
}

// Rotates pair i of the head starting at `head` (n_pairs pairs, paired as `pairing` says).
H2O_HD void rotate_head_pair(float *head, RotaryPairing pairing, int i, int n_pairs, float c, float s) {
    float *a = head + rotary_pair_first(pairing, i);
    rotate_pair(a, a + rotary_pair_offset(pairing, n_pairs), c, s);
}

}  // namespace h2o

#endif  // H2O_ROTARY_H
