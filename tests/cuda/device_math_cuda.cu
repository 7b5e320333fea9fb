// The device math headers compiled by nvcc (device_math_cuda.h): host entry points running the
// same __host__ __device__ functions the CUDA kernels run.
#include "device_math_cuda.h"

#include <vector>

#include "fp16.h"
#include "kv_row_codec.h"
#include "kv_victim_rules.h"
#include "online_softmax.h"
#include "rotary.h"
#include "weight_element.h"

namespace h2o {

void cuda_host_half_from_float(const float *in, int n, uint16_t *out) {
    for (int i = 0; i < n; ++i) out[i] = half_from_float(in[i]);
}

void cuda_host_half_to_float(const uint16_t *in, int n, float *out) {
    for (int i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
}

void cuda_host_weight_row(TensorType type, const uint8_t *row, int64_t n, float *out) {
    for (int64_t i = 0; i < n; ++i) out[i] = weight_element(type, row, i);
}

void cuda_host_weight_groups(TensorType type, const uint8_t *row, int64_t n, float *out) {
    for (int64_t g = 0; g < n / 32; ++g) weight_group32(type, row, g, out + 32 * g);
}

void cuda_host_kv_encode_row(KvRowFormat type, const float *src, int head_dim, uint8_t *dst) { kv_encode_row(type, src, head_dim, dst); }

void cuda_host_kv_decode_row(KvRowFormat type, const uint8_t *src, int head_dim, float *dst) { kv_decode_row(type, src, head_dim, dst); }

void cuda_host_rope(float *x, int n_heads, int head_dim, const double *inv_freq, int pairs, RotaryPairing pairing, int pos) {
    for (int i = 0; i < pairs; ++i) {
        for (int h = 0; h < n_heads; ++h) {
            float c, s;
            rotary_cos_sin(pos, inv_freq[i], &c, &s);
            rotate_head_pair(x + h * head_dim, pairing, i, pairs, c, s);
        }
    }
}

void cuda_host_softmax(const float *scores, int n, int lanes, float *weights) {
    std::vector<SoftmaxState> states(static_cast<size_t>(lanes), softmax_empty());
    for (int i = 0; i < n; ++i) states[i % lanes] = softmax_add(states[i % lanes], scores[i]);
    for (int half = lanes / 2; half > 0; half /= 2) {
        for (int l = 0; l < half; ++l) states[l] = softmax_merge(states[l], states[l + half]);
    }
    for (int i = 0; i < n; ++i) weights[i] = softmax_weight(states[0], scores[i]);
}

void cuda_host_random_draws(uint64_t state, int n, uint64_t *out) {
    for (int i = 0; i < n; ++i) out[i] = kv_next_random(&state);
}

}  // namespace h2o
