// A model's rotary position embedding as its file describes it: which dimensions of a head turn,
// how they pair up, and each pair's frequency. The graph's rope and the KV cache's re-rotation
// of rolled keys read it (ModelShape::rope, KvConfig::rope), on every backend; rotary.h holds the
// per-element math they share.
#pragma once

#include <vector>

#include "rotary.h"

namespace h2o {

struct RotarySpec {
    int dims = 0;  // leading dimensions of each head that are rotated (even)
    float freq_base = 10000.0f;
    RotaryPairing pairing = RotaryPairing::Adjacent;
    // Empty, or one per pair: pair i's frequency is divided by freq_factors[i] (the per-dimension
    // factors of Llama 3.1 and later, rope_freqs.weight).
    std::vector<float> freq_factors;
    // Linear position scaling (rope.scaling.type "linear"): every angle times this, 1 / factor.
    float freq_scale = 1.0f;
    // The rotated dimensions of q and k are also multiplied by this (LongRoPE's attention factor,
    // rope.scaling.attn_factor: cosine and sine both scaled, as llama.cpp's rope scales them).
    // Re-rotating rolled keys turns them only (rotary_cos_sin), never scales them again.
    float magnitude = 1.0f;

    int pairs() const { return dims / 2; }
    // Pair i's inverse frequency base^(-2i/dims) * freq_scale / freq_factors[i], in double
    // precision. Without factors and scaling it is rotary_inv_freq's value exactly.
    double inv_freq(int pair) const {
        double f = rotary_inv_freq(freq_base, pair, dims);
        if (freq_scale != 1.0f) f *= static_cast<double>(freq_scale);
        if (!freq_factors.empty()) f /= static_cast<double>(freq_factors[static_cast<size_t>(pair)]);
        return f;
    }
    // inv_freq of every pair.
    std::vector<double> inv_freqs() const {
        std::vector<double> table(static_cast<size_t>(pairs()));
        for (int i = 0; i < pairs(); ++i) table[static_cast<size_t>(i)] = inv_freq(i);
        return table;
    }
    bool operator==(const RotarySpec &o) const {
        return dims == o.dims && freq_base == o.freq_base && pairing == o.pairing && freq_factors == o.freq_factors &&
               freq_scale == o.freq_scale && magnitude == o.magnitude;
    }
};

}  // namespace h2o
