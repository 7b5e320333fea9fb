// The device math headers (fp16.h, weight_element.h, kv_row_codec.h, rotary.h, online_softmax.h)
// compiled by nvcc, run on the host: tests/backends/test_cuda.cpp compares them with the CPU reference.
#pragma once

#include <cstdint>

#include "kv_format.h"
#include "rotary.h"
#include "tensor_types.h"

namespace h2o {

void cuda_host_half_from_float(const float *in, int n, uint16_t *out);
void cuda_host_half_to_float(const uint16_t *in, int n, float *out);
// Elements [0, n) of a weight row, one weight_element() call each, as the kernels read them.
void cuda_host_weight_row(TensorType type, const uint8_t *row, int64_t n, float *out);
// The same elements (n a multiple of 32) read 32 at a time by weight_group32(), as the matmul
// kernel reads them.
void cuda_host_weight_groups(TensorType type, const uint8_t *row, int64_t n, float *out);
void cuda_host_kv_encode_row(KvRowFormat type, const float *src, int head_dim, uint8_t *dst);
void cuda_host_kv_decode_row(KvRowFormat type, const uint8_t *src, int head_dim, float *dst);
// Rotates the first 2 * pairs dimensions of each of n_heads heads of x in place, paired as
// `pairing` says, by position pos, as the rope kernel does (inverse frequencies from the host, as
// the backend uploads them: RotarySpec::inv_freqs).
void cuda_host_rope(float *x, int n_heads, int head_dim, const double *inv_freq, int pairs, RotaryPairing pairing, int pos);
// Softmax of n scores (-infinity: masked) as the attention kernel computes it: the scores dealt
// out to `lanes` online states in turn, merged pairwise as a tree (lanes: a power of two).
void cuda_host_softmax(const float *scores, int n, int lanes, float *weights);
// n draws of the random policy's generator (kv_victim_rules.h) from `state`.
void cuda_host_random_draws(uint64_t state, int n, uint64_t *out);

}  // namespace h2o
