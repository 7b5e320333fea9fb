// The CUDA backend (cuda_backend.h): kernels and the Backend implementation.
#include "cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kv_cache.h"
#include "kv_policy.h"
#include "kv_policy_spec.h"
#include "kv_row_codec.h"
#include "kv_victim_rules.h"
#include "activation.h"
#include "online_softmax.h"
#include "rotary.h"
#include "weight_element.h"

namespace h2o {

namespace {

constexpr TensorType kCudaWeightTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::Q8_0, TensorType::Q4_0,
                                           TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

constexpr int kBlock = 256;       // threads of the reduction and eviction kernels
constexpr int kMatmulTokens = 8;  // matmul: the most tokens the matrix-vector kernel takes
// Attention scores of one chunk of queries: as many tokens as fit in this.
constexpr size_t kAttentionScratchBudget = size_t{64} << 20;
// Split attention: a chunk with fewer (query, head) pairs than this reads each head's slots in
// ranges of at least kBlock slots, one block each, up to about this many blocks in all.
constexpr int kAttentionSplitBlocks = 1024;

// The ranges each (query, head) block of a chunk of `pairs` reads its n_slots slots in.
int attention_splits(int pairs, int n_slots) {
    const int by_length = (n_slots + kBlock - 1) / kBlock, by_device = (kAttentionSplitBlocks + pairs - 1) / pairs;
    return std::max(1, std::min(by_length, by_device));
}

std::string cuda_error_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

// ---- reductions -----------------------------------------------------------------------------------

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    return v;
}

// ---- element-wise and row operations --------------------------------------------------------------

__global__ void get_rows_kernel(float *out, int64_t out_cols, const uint8_t *table, size_t table_row_bytes, TensorType type,
                                const int32_t *ids, int64_t cols) {
    const int t = blockIdx.x;
    const uint8_t *row = table + static_cast<size_t>(ids[t]) * table_row_bytes;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[t * out_cols + c] = weight_element(type, row, c);
}

// The sum of squares in double, as the CPU reference sums it.
__global__ void rms_norm_kernel(float *out, int64_t out_cols, const float *in, int64_t in_cols, const float *weight, float eps) {
    __shared__ double partial[kBlock];
    const int t = blockIdx.x;
    const float *x = in + t * in_cols;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < in_cols; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int half = kBlock / 2; half > 0; half >>= 1) {
        if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    const double mean = partial[0] / static_cast<double>(in_cols);
    const float scale = static_cast<float>(1.0 / sqrt(mean + eps));
    for (int64_t i = threadIdx.x; i < in_cols; i += blockDim.x) out[t * out_cols + i] = H2O_FMUL(H2O_FMUL(x[i], scale), weight[i]);
}

// ---- matmul: out[t][r] = W[r] · in[t] ------------------------------------------------------------
// Two kernels, both dequantizing where they read (weight_element.h): a matrix-vector one for a
// few tokens (decoding), which must stream the weights at the memory's speed, and a tiled one for
// batches (prompts), which must reuse each dequantized weight for many tokens.

// Group g (32 elements) of a row of `cols` values: weight_group32 for a whole group, element by
// element (zeros past the end) for an F32/F16 row's last partial one.
template <TensorType T>
__device__ void load_weight_group(const uint8_t *row, int64_t g, int64_t cols, float *w) {
    if constexpr (T != TensorType::F32 && T != TensorType::F16) {  // quantized rows hold whole blocks
        weight_group32(T, row, g, w);
    } else if (32 * g + 32 <= cols) {
        weight_group32(T, row, g, w);
    } else {
#pragma unroll
        for (int e = 0; e < 32; ++e) w[e] = 32 * g + e < cols ? weight_element(T, row, 32 * g + e) : 0.0f;
    }
}

// Matrix-vector: a block of kMatvecWarps warps, one weight row each, for n <= kMatmulTokens
// tokens. Each lane dequantizes whole groups of its row (a group's scales read once, its bytes
// contiguous), so a warp reads a row's blocks side by side; the tokens' values come from shared
// memory, staged kMatvecChunk columns at a time for the whole block, padded by one float every
// 32 so the lanes' groups lie in different banks.
constexpr int kMatvecWarps = 16;
constexpr int kMatvecChunk = 1024;  // columns: 32 groups, one per lane
constexpr int kMatvecPadded = kMatvecChunk + kMatvecChunk / 32;

template <TensorType T>
__global__ void __launch_bounds__(32 * kMatvecWarps)
    matvec_kernel(float *out, int64_t out_cols, const uint8_t *weight, size_t weight_row_bytes, int64_t rows, int64_t cols, const float *in,
                  int64_t in_cols, int n) {
    __shared__ float staged[kMatmulTokens][kMatvecPadded];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kMatvecWarps + warp;
    const uint8_t *row = weight + static_cast<size_t>(r) * weight_row_bytes;
    float acc[kMatmulTokens];
    for (int j = 0; j < kMatmulTokens; ++j) acc[j] = 0.0f;
    for (int64_t c0 = 0; c0 < cols; c0 += kMatvecChunk) {
        __syncthreads();  // the last chunk's values are read
        for (int j = 0; j < n; ++j) {
            for (int c = threadIdx.x; c < kMatvecChunk; c += blockDim.x) {
                staged[j][c + c / 32] = c0 + c < cols ? in[j * in_cols + c0 + c] : 0.0f;
            }
        }
        __syncthreads();
        const int64_t g = c0 / 32 + lane;
        if (r >= rows || 32 * g >= cols) continue;
        float w[32];
        load_weight_group<T>(row, g, cols, w);
        for (int j = 0; j < kMatmulTokens; ++j) {
            if (j >= n) break;
            const float *x = &staged[j][33 * lane];
            float sum = 0.0f;
#pragma unroll
            for (int e = 0; e < 32; ++e) sum = fmaf(w[e], x[e], sum);
            acc[j] += sum;
        }
    }
    if (r >= rows) return;
    for (int j = 0; j < kMatmulTokens; ++j) {
        const float sum = warp_sum(acc[j]);
        if (lane == 0 && j < n) out[j * out_cols + r] = sum;
    }
}

// Tiled: a block computes kTile weight rows by kTile tokens, 32 columns (a group) at a time: the
// weights of the step dequantized once into shared memory (each thread 8 elements of one row),
// the tokens' values beside them, and each thread 4 rows by 4 tokens of the tile from there.
constexpr int kTile = 64;
constexpr int kTilePadded = kTile + 1;  // rows of the step's arrays: column-indexed writes land in distinct banks

template <TensorType T>
__global__ void __launch_bounds__(256) matmul_tiled_kernel(float *out, int64_t out_cols, const uint8_t *weight, size_t weight_row_bytes,
                                                           int64_t rows, int64_t cols, const float *in, int64_t in_cols, int n) {
    __shared__ float w_step[32][kTilePadded];  // [column in the group][row of the tile]
    __shared__ float x_step[32][kTilePadded];  // [column in the group][token of the tile]
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile;
    const int t0 = blockIdx.y * kTile;
    const int tid = threadIdx.x;
    const int my_row = tid % 16, my_token = tid / 16;   // this thread's rows my_row + 16 i, tokens my_token + 16 j
    const int load_row = tid / 4, load_part = tid % 4;  // the weights this thread dequantizes: 8 of a row's group
    const int64_t r_load = r0 + load_row;
    const uint8_t *row = weight + static_cast<size_t>(r_load < rows ? r_load : 0) * weight_row_bytes;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < cols; k0 += 32) {
        for (int q = 0; q < 8; ++q) {
            const int e = 8 * load_part + q;
            w_step[e][load_row] = (r_load < rows && k0 + e < cols) ? weight_element(T, row, k0 + e) : 0.0f;
        }
        for (int i = tid; i < 32 * kTile; i += 256) {
            const int token = i / 32, e = i % 32;
            x_step[e][token] = (t0 + token < n && k0 + e < cols) ? in[static_cast<int64_t>(t0 + token) * in_cols + k0 + e] : 0.0f;
        }
        __syncthreads();
        for (int e = 0; e < 32; ++e) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = w_step[e][my_row + 16 * i];
            for (int j = 0; j < 4; ++j) b[j] = x_step[e][my_token + 16 * j];
            for (int i = 0; i < 4; ++i) {
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        const int64_t r = r0 + my_row + 16 * i;
        for (int j = 0; j < 4; ++j) {
            const int t = t0 + my_token + 16 * j;
            if (r < rows && t < n) out[static_cast<int64_t>(t) * out_cols + r] = acc[i][j];
        }
    }
}

struct MatmulArgs {
    float *out;
    int64_t out_cols;
    const uint8_t *weight;
    size_t weight_row_bytes;
    int64_t rows, cols;
    const float *in;
    int64_t in_cols;
    int n;
};

// One batch through the kernel for its size: kMatmulTokens tokens or fewer by the matrix-vector
// kernel, more by the tiled one.
template <TensorType T>
void launch_matmul(const MatmulArgs &a, cudaStream_t stream) {
    if (a.n <= kMatmulTokens) {
        const unsigned blocks = static_cast<unsigned>((a.rows + kMatvecWarps - 1) / kMatvecWarps);
        matvec_kernel<T><<<blocks, 32 * kMatvecWarps, 0, stream>>>(a.out, a.out_cols, a.weight, a.weight_row_bytes, a.rows, a.cols, a.in,
                                                                   a.in_cols, a.n);
        return;
    }
    const dim3 grid(static_cast<unsigned>((a.rows + kTile - 1) / kTile), static_cast<unsigned>((a.n + kTile - 1) / kTile));
    matmul_tiled_kernel<T><<<grid, 256, 0, stream>>>(a.out, a.out_cols, a.weight, a.weight_row_bytes, a.rows, a.cols, a.in, a.in_cols, a.n);
}

// The kernels' instance for a weight type (one of kCudaWeightTypes; false for any other).
bool launch_matmul(TensorType type, const MatmulArgs &a, cudaStream_t stream) {
    switch (type) {
        case TensorType::F32:
            launch_matmul<TensorType::F32>(a, stream);
            return true;
        case TensorType::F16:
            launch_matmul<TensorType::F16>(a, stream);
            return true;
        case TensorType::Q8_0:
            launch_matmul<TensorType::Q8_0>(a, stream);
            return true;
        case TensorType::Q4_0:
            launch_matmul<TensorType::Q4_0>(a, stream);
            return true;
        case TensorType::Q4_K:
            launch_matmul<TensorType::Q4_K>(a, stream);
            return true;
        case TensorType::Q5_K:
            launch_matmul<TensorType::Q5_K>(a, stream);
            return true;
        case TensorType::Q6_K:
            launch_matmul<TensorType::Q6_K>(a, stream);
            return true;
        default:
            return false;
    }
}

// pos_head_stride: 0, one position per token; n, n per kv head (a query head takes its kv head's).
__global__ void rope_kernel(float *q, int64_t q_cols, float *k, int64_t k_cols, const int32_t *positions, int pos_head_stride,
                            const double *inv_freq, float magnitude, int pairs, RotaryPairing pairing, int head_dim, int n_head,
                            int n_head_kv) {
    const int t = blockIdx.x;
    const int total = (n_head + n_head_kv) * pairs;
    for (int u = threadIdx.x; u < total; u += blockDim.x) {
        const int head = u / pairs, i = u % pairs;
        float *p = head < n_head ? q + t * q_cols + head * head_dim : k + t * k_cols + (head - n_head) * head_dim;
        const int kv_head = head < n_head ? head / (n_head / n_head_kv) : head - n_head;
        float c, s;
        rotary_cos_sin_scaled(positions[kv_head * pos_head_stride + t], inv_freq[i], magnitude, &c, &s);
        rotate_head_pair(p, pairing, i, pairs, c, s);
    }
}

__global__ void swiglu_kernel(float *gate, const float *up, int64_t count) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void geglu_kernel(float *gate, const float *up, int64_t count) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        gate[i] = gelu_tanh(gate[i]) * up[i];
    }
}

// x[i] *= factor, or with `cap` soft_cap(x[i], value).
__global__ void scale_kernel(float *x, float value, bool cap, int64_t count) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        x[i] = cap ? soft_cap(x[i], value) : x[i] * value;
    }
}

__global__ void add_kernel(float *acc, const float *x, int64_t count) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        acc[i] = acc[i] + x[i];
    }
}

// acc[i] += bias[i % cols]: one row added to every row.
__global__ void add_bias_kernel(float *acc, const float *bias, int64_t cols, int64_t count) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        acc[i] = acc[i] + bias[i % cols];
    }
}

// greedy_index (greedy_index.h): the first of the largest elements, NaNs passed over (a row of NaNs
// gives 0).
__global__ void argmax_kernel(int32_t *out, const float *in, int64_t cols) {
    __shared__ float best_value[kBlock];
    __shared__ int64_t best_index[kBlock];
    const int t = blockIdx.x;
    const float *x = in + t * cols;
    float bv = 0.0f;
    int64_t bi = -1;  // -1: no comparable element yet
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = x[i];
        if (isnan(v)) continue;
        if (bi < 0 || v > bv) {
            bv = v;
            bi = i;
        }
    }
    best_value[threadIdx.x] = bv;
    best_index[threadIdx.x] = bi;
    __syncthreads();
    for (int half = kBlock / 2; half > 0; half >>= 1) {
        if (static_cast<int>(threadIdx.x) < half) {
            const float ov = best_value[threadIdx.x + half];
            const int64_t oi = best_index[threadIdx.x + half];
            const int64_t mi = best_index[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > best_value[threadIdx.x] || (ov == best_value[threadIdx.x] && oi < mi))) {
                best_value[threadIdx.x] = ov;
                best_index[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[t] = best_index[0] < 0 ? 0 : static_cast<int32_t>(best_index[0]);
}

// ---- the KV cache -------------------------------------------------------------------------------

// The device's KV cache. A cell is one (layer, kv head); slot arrays are [cell][slot], cell c
// holding cell_slots[c] slots from cell_first[c]: KvConfig::slots_in(l) from
// KvConfig::uniform_cell_first until the heads' budgets move (kv_head_budgets.h). The per-kv-head
// scratch is laid out by the most slots a cell may hold (KvConfig::max_cell_slots: the stride).
struct KvDevice {
    uint8_t *keys = nullptr, *values = nullptr;  // rows of key_row / value_row bytes
    int64_t *stream = nullptr;                   // stream index, -1: free
    int32_t *position = nullptr;
    uint8_t *tag = nullptr;         // kv_make_tag: pinned, retention span
    SlotStats *stats = nullptr;     // null when the policy reads none
    SlotStats *partial = nullptr;   // [n_kv][stride]: the current batch's statistics
    int32_t *free_list = nullptr;   // per cell, a stack of slots freed by eviction
    int32_t *used = nullptr;        // [cell]: slots [0, used) have held a token
    int32_t *free_count = nullptr;  // [cell]
    int64_t *cell_first = nullptr;  // [cell]: the cell's first slot (KvImage::cell_first_slot)
    int32_t *cell_slots = nullptr;  // [cell]: its slots
    uint64_t *rng = nullptr;        // the random policy's xorshift64* state
    int32_t *batch_slot = nullptr;  // [n_kv][stride]: the slot of each token of the batch
    int64_t *victims = nullptr;     // [n_kv][stride]: stream indices evicted for the batch
    int32_t *candidates = nullptr;  // [stride]: the random policy's shuffle
    float *key_scores = nullptr;    // [n_kv][stride][2]: the key scorers' scores and key norms (or logits)
    float *query_stats = nullptr;   // [cell][kv_query_stats_floats]: Expected Attention's (KvImage::query_stats)
    double *inv_freq = nullptr;     // rotary inverse frequencies (rolling, Expected Attention)
    float *scores = nullptr;        // [chunk][n_head][stride]: a chunk's attention weights
    int32_t *visible = nullptr;     // [chunk][n_kv]: slots each query of the chunk sees
};

// What one layer's eviction and storing needs.
struct ClaimArgs {
    KvDevice kv;
    int layer, n_kv, stride, head_dim, n, pairs;  // stride: of the per-kv-head scratch
    RotaryPairing pairing;
    KvRowFormat key_format, value_format;
    size_t key_row, value_row;
    uint32_t policy;
    int64_t first_index, recent_from, stale_before, sinks;
    uint8_t tag;  // the batch's
    bool rolling, random;
    bool positions_per_kv_head;  // positions holds n per kv head (AttentionBatch)
    bool by_proxy;               // kv_ranks_by_proxy: rank by kv_prompt_priority
    float prompt_share;
    uint32_t prompt_seed;
    int32_t span_min[KV_MAX_SPANS];  // each retention span's minimum per cell
    const float *k, *v;
    int64_t k_cols, v_cols;
    const int32_t *positions;
};

// Outside every protection (kv_victim_rules.h).
__device__ bool eligible(const ClaimArgs &a, size_t at) {
    return kv_slot_evictable(a.kv.stream[at], kv_tag_pinned(a.kv.tag[at]), a.recent_from, static_cast<KV_UINT>(a.sinks));
}

// Retention spans, per cell: each span's tokens (held) and how many of them are eligible; held
// goes down as victims are taken, and a span's tokens stop being taken at its minimum
// (KvCache::make_room).
struct SpanCounts {
    int held[KV_MAX_SPANS];
    int eligible[KV_MAX_SPANS];
};

// Every thread of the block calls it.
__device__ void count_spans(const ClaimArgs &a, size_t base, int used, SpanCounts *c) {
    for (int i = threadIdx.x; i < static_cast<int>(KV_MAX_SPANS); i += blockDim.x) c->held[i] = c->eligible[i] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        const size_t at = base + s;
        const uint32_t span = kv_tag_span(a.kv.tag[at]);
        if (span == 0 || a.kv.stream[at] < 0) continue;
        atomicAdd(&c->held[span - 1], 1);
        if (eligible(a, at)) atomicAdd(&c->eligible[span - 1], 1);
    }
    __syncthreads();
}

__device__ bool span_allows(const ClaimArgs &a, const SpanCounts &c, size_t at) {
    const uint32_t span = kv_tag_span(a.kv.tag[at]);
    return span == 0 || kv_span_allows_eviction(static_cast<uint32_t>(c.held[span - 1]), static_cast<uint32_t>(a.span_min[span - 1]));
}

// One thread, after span_allows: the victim leaves its span's count.
__device__ void leave_span(const ClaimArgs &a, SpanCounts *c, size_t at) {
    const uint32_t span = kv_tag_span(a.kv.tag[at]);
    if (span != 0) --c->held[span - 1];
}

// How many eligible tokens can be taken before every span is down to its minimum.
__device__ int takeable(const ClaimArgs &a, const SpanCounts &c, int plain_candidates) {
    int total = plain_candidates;
    for (uint32_t i = 0; i < KV_MAX_SPANS; ++i) {
        total += static_cast<int>(
            kv_span_takeable(static_cast<KV_UINT>(c.held[i]), static_cast<KV_UINT>(c.eligible[i]), static_cast<KV_UINT>(a.span_min[i])));
    }
    return total;
}

// The query-agnostic scorers' scores of a cell's held slots (KvCache::score_keys), into
// key_scores[h][slot][0], its key norms into [1]; summed in the CPU's order. Every thread of the
// block calls it.
__device__ void score_keys(const ClaimArgs &a, size_t base, int used, int h) {
    __shared__ float anchor[kCudaMaxHeadDim];
    float *scores = a.kv.key_scores + static_cast<size_t>(h) * a.stride * 2;
    float key[kCudaMaxHeadDim];
    auto norm_of = [&](const float *x) {
        float sum = 0.0f;
        for (int j = 0; j < a.head_dim; ++j) sum = __fadd_rn(sum, __fmul_rn(x[j], x[j]));
        return sqrtf(sum);
    };
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        if (a.kv.stream[base + s] < 0) continue;
        kv_decode_row(a.key_format, a.kv.keys + (base + s) * a.key_row, a.head_dim, key);
        const float norm = norm_of(key);
        scores[2 * s] = kv_key_norm_priority(norm);
        scores[2 * s + 1] = norm;
    }
    if (a.policy != KV_POLICY_KEY_DIFF) {
        __syncthreads();
        return;
    }
    __syncthreads();
    // The anchor, the mean of the unit keys (unscaled), a dimension per thread.
    for (int j = threadIdx.x; j < a.head_dim; j += blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < used; ++s) {
            const float norm = scores[2 * s + 1];
            if (a.kv.stream[base + s] >= 0 && norm > 0.0f)
                sum = __fadd_rn(sum, __fdiv_rn(kv_row_element(a.key_format, a.kv.keys + (base + s) * a.key_row, j), norm));
        }
        anchor[j] = sum;
    }
    __syncthreads();
    const float anchor_norm = norm_of(anchor);
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        if (a.kv.stream[base + s] < 0) continue;
        kv_decode_row(a.key_format, a.kv.keys + (base + s) * a.key_row, a.head_dim, key);
        float dot = 0.0f;
        for (int j = 0; j < a.head_dim; ++j) dot = __fadd_rn(dot, __fmul_rn(key[j], anchor[j]));
        const float norms = __fmul_rn(scores[2 * s + 1], anchor_norm);
        scores[2 * s] = kv_key_diff_priority(norms > 0.0f ? __fdiv_rn(dot, norms) : 0.0f);
    }
    __syncthreads();
}

__device__ float victim_priority(const ClaimArgs &a, size_t at, KV_UINT cell, size_t base, int h) {
    const int64_t stream = a.kv.stream[at];
    if (kv_policy_scores_keys(a.policy)) {
        return kv_scored_priority(a.kv.key_scores[(static_cast<size_t>(h) * a.stride + (at - base)) * 2], stream < a.stale_before);
    }
    const SlotStats s = a.kv.stats ? a.kv.stats[at] : kv_stats_zero();
    return kv_batch_priority(a.policy, a.by_proxy, s, stream < a.stale_before, stream, cell, a.prompt_seed, a.prompt_share);
}

// The slot with the smallest (priority, stream index) among eligible slots, or by_age: the oldest
// occupied unpinned slot, that their spans allow to go; -1 when there is none. Every thread of
// the block calls it.
__device__ int argmin_slot(const ClaimArgs &a, const SpanCounts &spans, size_t cell, size_t base, int used, bool by_age, int h) {
    __shared__ float best_priority[kBlock];
    __shared__ int64_t best_stream[kBlock];
    __shared__ int best_slot[kBlock];
    float bp = 0.0f;
    int64_t bs = 0;
    int bslot = -1;
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        const size_t at = base + s;
        const bool candidate = by_age ? kv_slot_evictable_by_age(a.kv.stream[at], kv_tag_pinned(a.kv.tag[at])) : eligible(a, at);
        if (!candidate || !span_allows(a, spans, at)) continue;
        const float p = by_age ? 0.0f : victim_priority(a, at, static_cast<KV_UINT>(cell), base, h);
        const int64_t st = a.kv.stream[at];
        if (bslot < 0 || kv_victim_before(p, st, bp, bs)) {
            bp = p;
            bs = st;
            bslot = s;
        }
    }
    best_priority[threadIdx.x] = bp;
    best_stream[threadIdx.x] = bs;
    best_slot[threadIdx.x] = bslot;
    __syncthreads();
    for (int half = kBlock / 2; half > 0; half >>= 1) {
        const int me = threadIdx.x, o = me + half;
        if (me < half && best_slot[o] >= 0 &&
            (best_slot[me] < 0 || kv_victim_before(best_priority[o], best_stream[o], best_priority[me], best_stream[me]))) {
            best_priority[me] = best_priority[o];
            best_stream[me] = best_stream[o];
            best_slot[me] = best_slot[o];
        }
        __syncthreads();
    }
    const int result = best_slot[0];
    __syncthreads();
    return result;
}

// Expected Attention for one global layer, before kv_claim_kernel ranks by it: per kv head, the
// batch's queries into the cell's running statistics (KvCache::observe_queries), then each held
// slot's score into key_scores (KvCache::score_keys), sums in the CPU's order. One block per kv
// head.
struct ExpectArgs {
    KvDevice kv;
    int layer, n_kv, group, head_dim, n, pairs, stride;
    RotaryPairing pairing;
    KvRowFormat key_format, value_format;
    size_t key_row, value_row;
    float scale;
    const float *q;
    int64_t q_cols;
    const int32_t *positions;
    bool positions_per_kv_head;
};

__global__ void __launch_bounds__(kBlock) kv_expect_kernel(ExpectArgs a) {
    __shared__ float rotation[kCudaMaxHeadDim];  // (c, s) per rotary pair
    __shared__ float top, total;
    const int hd = a.head_dim, dims = 2 * a.pairs, units = a.pairs + (hd - dims);
    const size_t words = 2 + 2 * static_cast<size_t>(a.group) * hd;
    for (int h = blockIdx.x; h < a.n_kv; h += gridDim.x) {
        const size_t cell = static_cast<size_t>(a.layer) * a.n_kv + h;
        float *stats = a.kv.query_stats + cell * words;
        float *mean = stats + 2, *variance = mean + static_cast<size_t>(a.group) * hd;
        const int32_t *positions = a.positions + (a.positions_per_kv_head ? static_cast<size_t>(h) * a.n : 0);
        const float count = stats[0], window = kv_expected_attention_queries();
        // One thread per (query head, rotary pair or unrotated dimension), the tokens in order.
        for (int u = threadIdx.x; u < a.group * units; u += blockDim.x) {
            const int g = u / units, i = u % units;
            const bool rotated = i < a.pairs;
            const int e0 = rotated ? rotary_pair_first(a.pairing, i) : dims + (i - a.pairs);
            const int e1 = rotated ? e0 + rotary_pair_offset(a.pairing, a.pairs) : e0;
            float *m = mean + static_cast<size_t>(g) * hd, *v = variance + static_cast<size_t>(g) * hd;
            auto fold = [&](int j, float x, float rate) {
                const float d = x - m[j];
                v[j] = kv_query_variance(v[j], d, rate);
                m[j] = kv_query_mean(m[j], d, rate);
            };
            for (int t = 0; t < a.n; ++t) {
                const float rate = kv_query_rate(fminf(count + static_cast<float>(t), window), window);
                const float *q = a.q + t * a.q_cols + static_cast<size_t>(h * a.group + g) * hd;
                float x = q[e0], y = q[e1];
                if (rotated) {
                    float c, sn;
                    rotary_cos_sin(-positions[t], a.kv.inv_freq[i], &c, &sn);
                    rotate_pair(&x, &y, c, sn);
                }
                fold(e0, x, rate);
                if (rotated) fold(e1, y, rate);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            stats[0] = fminf(count + static_cast<float>(a.n), window);
            stats[1] = static_cast<float>(positions[0]);
        }
        __syncthreads();

        const size_t base = static_cast<size_t>(a.kv.cell_first[cell]);
        const int used = a.kv.used[cell], cell_slots = a.kv.cell_slots[cell];
        // Scores are read only when the batch must evict (kv_claim_kernel).
        if (a.n <= cell_slots - used + a.kv.free_count[cell]) continue;
        for (int i = threadIdx.x; i < a.pairs; i += blockDim.x) {
            kv_expected_rotation(a.kv.inv_freq[i], stats[1], cell_slots, &rotation[2 * i], &rotation[2 * i + 1]);
        }
        float *scores = a.kv.key_scores + static_cast<size_t>(h) * a.stride * 2;  // [slot]: score, logit
        for (int s = threadIdx.x; s < used; s += blockDim.x) scores[2 * s] = 0.0f;
        __syncthreads();
        float row[kCudaMaxHeadDim];
        for (int g = 0; g < a.group; ++g) {
            const float *m = mean + static_cast<size_t>(g) * hd, *v = variance + static_cast<size_t>(g) * hd;
            auto term = [&](int j, float u) { return kv_expected_logit_term(u, m[j], v[j], a.scale); };
            for (int s = threadIdx.x; s < used; s += blockDim.x) {
                if (a.kv.stream[base + s] < 0) continue;
                kv_decode_row(a.key_format, a.kv.keys + (base + s) * a.key_row, hd, row);
                float z = 0.0f;
                for (int i = 0; i < a.pairs; ++i) {
                    const int e0 = rotary_pair_first(a.pairing, i), e1 = e0 + rotary_pair_offset(a.pairing, a.pairs);
                    const float c = rotation[2 * i], sn = rotation[2 * i + 1];
                    z += term(e0, kv_expected_pair_u_first(row[e0], row[e1], c, sn)) +
                         term(e1, kv_expected_pair_u_second(row[e0], row[e1], c, sn));
                }
                for (int j = dims; j < hd; ++j) z += term(j, row[j]);
                scores[2 * s + 1] = z;
            }
            __syncthreads();
            if (threadIdx.x == 0) {  // the softmax's maximum and sum in slot order
                float best = -INFINITY, sum = 0.0f;
                for (int s = 0; s < used; ++s) {
                    if (a.kv.stream[base + s] >= 0) best = fmaxf(best, scores[2 * s + 1]);
                }
                for (int s = 0; s < used; ++s) {
                    if (a.kv.stream[base + s] >= 0) sum += expf(scores[2 * s + 1] - best);
                }
                top = best;
                total = sum;
            }
            __syncthreads();
            for (int s = threadIdx.x; s < used; s += blockDim.x) {
                if (a.kv.stream[base + s] >= 0) scores[2 * s] += expf(scores[2 * s + 1] - top) / (total * static_cast<float>(a.group));
            }
            __syncthreads();
        }
        for (int s = threadIdx.x; s < used; s += blockDim.x) {
            if (a.kv.stream[base + s] < 0) continue;
            kv_decode_row(a.value_format, a.kv.values + (base + s) * a.value_row, hd, row);
            float sum = 0.0f;
            for (int j = 0; j < hd; ++j) sum += row[j] * row[j];
            scores[2 * s] = kv_expected_attention_priority(scores[2 * s], sqrtf(sum));
        }
        __syncthreads();
    }
}

// Rolls the key row back by `shift` positions: decoded, its rotary pairs turned by -shift times
// each pair's frequency, encoded again (KvCache::rotate_back's arithmetic).
__device__ void roll_key_back(uint8_t *row, int shift, KvRowFormat format, int head_dim, const double *inv_freq, RotaryPairing pairing,
                              int pairs) {
    float key[kCudaMaxHeadDim];
    kv_decode_row(format, row, head_dim, key);
    for (int i = 0; i < pairs; ++i) {
        float c, sn;
        rotary_cos_sin(-shift, inv_freq[i], &c, &sn);
        rotate_head_pair(key, pairing, i, pairs, c, sn);
    }
    kv_encode_row(format, key, head_dim, row);
}

// Budgets that move (kv_head_budgets.h) done on the device: what the host's rule did to the rows
// (KvRowEdits), a chunk of `n` entries of two int64 at a time. (slot, shift): the slot's key rolls
// back; only global layers rebalance, so by the global rotation.
__global__ void kv_rebalance_roll_kernel(KvDevice kv, const int64_t *entries, int n, KvRowFormat format, size_t key_row, int head_dim,
                                         RotaryPairing pairing, int pairs) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        roll_key_back(kv.keys + entries[2 * i] * key_row, static_cast<int>(entries[2 * i + 1]), format, head_dim, kv.inv_freq, pairing,
                      pairs);
    }
}

// (from, to): gathering copies the key and value rows of slot `from` to `area` (entry after
// entry), scattering copies them from there to slot `to`. A chunk's gather before its scatter
// moves its rows as one move after another in the rule's order would (KvRowEdits).
__global__ void kv_rebalance_move_kernel(KvDevice kv, const int64_t *entries, int n, uint8_t *area, size_t key_row, size_t value_row,
                                         bool gather) {
    const size_t slot_bytes = key_row + value_row, total = static_cast<size_t>(n) * slot_bytes;
    for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < total;
         k += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const size_t i = k / slot_bytes, b = k % slot_bytes;
        const auto slot = static_cast<size_t>(entries[2 * i + (gather ? 0 : 1)]);
        uint8_t *row = b < key_row ? kv.keys + slot * key_row + b : kv.values + slot * value_row + (b - key_row);
        if (gather) {
            area[k] = *row;
        } else {
            *row = area[k];
        }
    }
}

// One layer: for each kv head, make room for the batch (KvCache::make_room), take its slots
// (KvCache::claim_slot) and store its keys and values. One block per kv head, or for the random
// policy one block walking the kv heads in order, its generator being one sequence.
__global__ void __launch_bounds__(kBlock) kv_claim_kernel(ClaimArgs a) {
    __shared__ int sh_used, sh_free, sh_count, sh_victims;
    __shared__ SpanCounts spans;
    for (int h = blockIdx.x; h < a.n_kv; h += gridDim.x) {
        const size_t cell = static_cast<size_t>(a.layer) * a.n_kv + h, base = static_cast<size_t>(a.kv.cell_first[cell]);
        const int cell_slots = a.kv.cell_slots[cell];
        if (threadIdx.x == 0) {
            sh_used = a.kv.used[cell];
            sh_free = a.kv.free_count[cell];
            sh_count = 0;
            sh_victims = 0;
        }
        __syncthreads();
        const int used = sh_used;
        const int needed = a.n - (cell_slots - used + sh_free);
        __syncthreads();  // every thread has read the counts before thread 0 changes them
        int64_t *victims = a.kv.victims + static_cast<size_t>(h) * a.stride;
        auto evict = [&](int slot) {  // thread 0 only
            const size_t at = base + slot;
            victims[sh_victims++] = a.kv.stream[at];
            a.kv.stream[at] = -1;
            a.kv.free_list[base + sh_free++] = slot;
        };
        if (needed > 0) {
            count_spans(a, base, used, &spans);
            int mine = 0;
            for (int s = threadIdx.x; s < used; s += blockDim.x) {
                mine += eligible(a, base + s) && kv_tag_span(a.kv.tag[base + s]) == 0 ? 1 : 0;
            }
            atomicAdd(&sh_count, mine);
            __syncthreads();
            // The policy's choice stands only when enough candidates can be taken.
            const bool enough = takeable(a, spans, sh_count) >= needed;
            if (a.random) {
                // A partial Fisher-Yates shuffle of the candidates in slot order, one draw each
                // until enough are taken or none is left; the draws are made (the generator
                // advances) even when the fallback below replaces the choice.
                if (threadIdx.x == 0) {
                    int count = 0;
                    for (int s = 0; s < used; ++s) {
                        if (eligible(a, base + s)) a.kv.candidates[count++] = s;
                    }
                    int taken = 0;
                    for (int i = 0; i < count && taken < needed; ++i) {
                        const int j = i + static_cast<int>(kv_random_index(kv_next_random(a.kv.rng), static_cast<KV_UINT>(count - i)));
                        const int32_t swap = a.kv.candidates[i];
                        a.kv.candidates[i] = a.kv.candidates[j];
                        a.kv.candidates[j] = swap;
                        const int slot = a.kv.candidates[i];
                        if (!span_allows(a, spans, base + slot)) continue;
                        leave_span(a, &spans, base + slot);
                        a.kv.candidates[taken++] = slot;
                    }
                    if (taken == needed) {
                        for (int i = 0; i < taken; ++i) evict(a.kv.candidates[i]);
                    }
                }
                __syncthreads();
            } else if (enough) {
                // (Expected Attention's scores come from kv_expect_kernel.)
                if (a.policy == KV_POLICY_KEY_NORM || a.policy == KV_POLICY_KEY_DIFF) score_keys(a, base, used, h);
                for (int i = 0; i < needed; ++i) {
                    const int slot = argmin_slot(a, spans, cell, base, used, false, h);
                    if (threadIdx.x == 0) {
                        leave_span(a, &spans, base + slot);
                        evict(slot);
                    }
                    __syncthreads();
                }
            }
            if (!enough) {
                // Everything evictable is protected by the windows: the oldest unpinned tokens
                // go, span minimums still kept.
                count_spans(a, base, used, &spans);
                for (int i = 0; i < needed; ++i) {
                    const int slot = argmin_slot(a, spans, cell, base, used, true, h);
                    if (slot < 0) break;
                    if (threadIdx.x == 0) {
                        leave_span(a, &spans, base + slot);
                        evict(slot);
                    }
                    __syncthreads();
                }
            }
            __syncthreads();
            const int evicted = sh_victims;
            if (a.rolling && evicted > 0) {
                // Each kept token moves back one rank per evicted token that preceded it.
                for (int s = threadIdx.x; s < used; s += blockDim.x) {
                    const size_t at = base + s;
                    const int64_t index = a.kv.stream[at];
                    if (index < 0) continue;
                    int shift = 0;
                    for (int i = 0; i < evicted; ++i) shift += victims[i] < index ? 1 : 0;
                    if (shift == 0) continue;
                    a.kv.position[at] -= shift;
                    roll_key_back(a.kv.keys + at * a.key_row, shift, a.key_format, a.head_dim, a.kv.inv_freq, a.pairing, a.pairs);
                }
            }
            __syncthreads();
        }
        int32_t *batch_slot = a.kv.batch_slot + static_cast<size_t>(h) * a.stride;
        const int32_t *positions = a.positions + (a.positions_per_kv_head ? static_cast<size_t>(h) * a.n : 0);
        if (threadIdx.x == 0) {
            for (int t = 0; t < a.n; ++t) {
                const int slot = sh_free > 0 ? a.kv.free_list[base + --sh_free] : sh_used++;
                batch_slot[t] = slot;
                const size_t at = base + slot;
                a.kv.stream[at] = a.first_index + t;
                a.kv.position[at] = positions[t];
                a.kv.tag[at] = a.tag;
                if (a.kv.stats) a.kv.stats[at] = kv_stats_zero();
            }
            a.kv.used[cell] = sh_used;
            a.kv.free_count[cell] = sh_free;
        }
        __syncthreads();
        // One thread per row: a quantized row's scale depends on all of its elements.
        for (int u = threadIdx.x; u < 2 * a.n; u += blockDim.x) {
            const int t = u / 2;
            const size_t at = base + batch_slot[t];
            if (u % 2 == 0) {
                kv_encode_row(a.key_format, a.k + t * a.k_cols + h * a.head_dim, a.head_dim, a.kv.keys + at * a.key_row);
            } else {
                kv_encode_row(a.value_format, a.v + t * a.v_cols + h * a.head_dim, a.head_dim, a.kv.values + at * a.value_row);
            }
        }
        __syncthreads();
    }
}

struct AttentionArgs {
    KvDevice kv;
    int layer, n_kv, n_head, stride, head_dim, n, t0;  // stride: of the scores' rows
    KvRowFormat key_format, value_format;
    size_t key_row, value_row;
    int64_t first_index;
    float scale;
    float softcap;   // scores become soft_cap(score, softcap); 0: as they are
    int64_t window;  // a local layer's sliding window (0: a global layer)
    const float *q;
    int64_t q_cols;
    float *out;
    int64_t out_cols;
    // A query head's slots are read in n_split ranges of split_len slots, one block each, so that
    // a long cache read by one token still spreads over the device (split attention).
    int n_split, split_len;
    SoftmaxState *split_state;  // [chunk][n_head][n_split]: each range's softmax
    int32_t *split_visible;     // [chunk][n_kv][n_split]: each range's visible slots
    float *partial_out;         // [chunk][n_head][n_split][head_dim]: each range's weighted values (n_split > 1)
};

constexpr int kAttentionWarps = kBlock / 32;

// Whether the query at stream index `query` sees the token at `index` (-1: a free slot): stored,
// not after it and, in a local layer (window > 0), less than `window` tokens before it.
__device__ bool attention_visible(int64_t index, int64_t query, int64_t window) {
    return index >= 0 && index <= query && (window == 0 || index > query - window);
}

struct AttentionBlock {
    int c, t, head, h, group, split, begin, end;
    size_t cell, base;
};

__device__ AttentionBlock attention_block(const AttentionArgs &a) {
    AttentionBlock b;
    b.c = blockIdx.x;
    b.t = a.t0 + b.c;
    b.head = blockIdx.y;
    b.split = blockIdx.z;
    b.group = a.n_head / a.n_kv;
    b.h = b.head / b.group;
    b.cell = static_cast<size_t>(a.layer) * a.n_kv + b.h;
    b.base = static_cast<size_t>(a.kv.cell_first[b.cell]);
    const int used = a.kv.used[b.cell];
    b.begin = min(used, b.split * a.split_len);
    b.end = min(used, b.begin + a.split_len);
    return b;
}

// Pass 1, one block per (query token of the chunk, query head, range of slots): the range's
// scores, kept in the chunk's scratch, and their online softmax.
__global__ void __launch_bounds__(kBlock) attention_scores_kernel(AttentionArgs a) {
    __shared__ float q[kCudaMaxHeadDim];
    __shared__ SoftmaxState states[kBlock];
    __shared__ int counts[kBlock];
    const AttentionBlock b = attention_block(a);
    const int64_t query_index = a.first_index + b.t;
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) q[d] = a.q[b.t * a.q_cols + b.head * a.head_dim + d];
    __syncthreads();
    float *weights = a.kv.scores + (static_cast<size_t>(b.c) * a.n_head + b.head) * a.stride;
    SoftmaxState state = softmax_empty();
    int visible = 0;
    for (int s = b.begin + threadIdx.x; s < b.end; s += blockDim.x) {
        const int64_t index = a.kv.stream[b.base + s];
        float score = -INFINITY;
        if (attention_visible(index, query_index, a.window)) {
            const uint8_t *row = a.kv.keys + (b.base + s) * a.key_row;
            float dot = 0.0f;
            for (int d = 0; d < a.head_dim; ++d) dot += q[d] * kv_row_element(a.key_format, row, d);
            score = dot * a.scale;
            if (a.softcap != 0.0f) score = soft_cap(score, a.softcap);
            ++visible;
        }
        weights[s] = score;
        state = softmax_add(state, score);
    }
    states[threadIdx.x] = state;
    counts[threadIdx.x] = visible;
    __syncthreads();
    for (int half = kBlock / 2; half > 0; half >>= 1) {
        if (static_cast<int>(threadIdx.x) < half) {
            states[threadIdx.x] = softmax_merge(states[threadIdx.x], states[threadIdx.x + half]);
            counts[threadIdx.x] += counts[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        a.split_state[(static_cast<size_t>(b.c) * a.n_head + b.head) * a.n_split + b.split] = states[0];
        if (b.head % b.group == 0) a.split_visible[(static_cast<size_t>(b.c) * a.n_kv + b.h) * a.n_split + b.split] = counts[0];
    }
}

// Pass 2, the same blocks: the ranges' softmaxes merged in range order, the range's weights
// normalised in the scratch (for the statistics), and its weighted sum of the value rows, written
// as the output when there is one range and as the range's part otherwise.
__global__ void __launch_bounds__(kBlock) attention_values_kernel(AttentionArgs a) {
    __shared__ SoftmaxState total;
    const AttentionBlock b = attention_block(a);
    if (threadIdx.x == 0) {
        const SoftmaxState *states = a.split_state + (static_cast<size_t>(b.c) * a.n_head + b.head) * a.n_split;
        SoftmaxState merged = states[0];
        for (int i = 1; i < a.n_split; ++i) merged = softmax_merge(merged, states[i]);
        total = merged;
        if (b.split == 0 && b.head % b.group == 0) {
            const int32_t *counts = a.split_visible + (static_cast<size_t>(b.c) * a.n_kv + b.h) * a.n_split;
            int visible = 0;
            for (int i = 0; i < a.n_split; ++i) visible += counts[i];
            a.kv.visible[static_cast<size_t>(b.c) * a.n_kv + b.h] = visible;
        }
    }
    __syncthreads();
    float *weights = a.kv.scores + (static_cast<size_t>(b.c) * a.n_head + b.head) * a.stride;
    for (int s = b.begin + threadIdx.x; s < b.end; s += blockDim.x) weights[s] = softmax_weight(total, weights[s]);
    __syncthreads();
    // Warp w takes the range's slots w, w + kAttentionWarps, ..., its lanes a row's dimensions side
    // by side; the warps' sums are then added in warp order.
    __shared__ float warp_out[kAttentionWarps][kCudaMaxHeadDim];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int d0 = 0; d0 < a.head_dim; d0 += 32) {
        const int d = d0 + lane;
        float acc = 0.0f;
        if (d < a.head_dim) {
            for (int s = b.begin + warp; s < b.end; s += kAttentionWarps) {
                const float w = weights[s];
                if (w != 0.0f) acc += w * kv_row_element(a.value_format, a.kv.values + (b.base + s) * a.value_row, d);
            }
            warp_out[warp][d] = acc;
        }
    }
    __syncthreads();
    float *dest = a.n_split == 1 ? a.out + b.t * a.out_cols + b.head * a.head_dim
                                 : a.partial_out + ((static_cast<size_t>(b.c) * a.n_head + b.head) * a.n_split + b.split) * a.head_dim;
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < kAttentionWarps; ++w) acc += warp_out[w][d];
        dest[d] = acc;
    }
}

// Pass 3 when there are several ranges, one block per (query token, query head): the ranges'
// parts added in range order.
__global__ void attention_reduce_kernel(AttentionArgs a) {
    const int c = blockIdx.x, head = blockIdx.y;
    const float *parts = a.partial_out + (static_cast<size_t>(c) * a.n_head + head) * a.n_split * a.head_dim;
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < a.n_split; ++i) acc += parts[static_cast<size_t>(i) * a.head_dim + d];
        a.out[(a.t0 + c) * a.out_cols + head * a.head_dim + d] = acc;
    }
}

struct StatsArgs {
    KvDevice kv;
    int layer, n_kv, n_head, stride, n, t0, count;  // stride: of the per-kv-head scratch
    int64_t first_index;
    float decay;
    int proxy;       // kv_proxy_queries
    int64_t window;  // a local layer's sliding window (0: a global layer)
};

// The chunk's queries' contributions to each slot's statistics of the batch (kv_policy_spec.h):
// blocks (kv head, range of kBlock slots), one thread per slot.
__global__ void attention_stats_kernel(StatsArgs a) {
    const int h = blockIdx.x, group = a.n_head / a.n_kv;
    const size_t cell = static_cast<size_t>(a.layer) * a.n_kv + h, base = static_cast<size_t>(a.kv.cell_first[cell]);
    const int used = a.kv.used[cell];
    for (int s = blockIdx.y * blockDim.x + threadIdx.x; s < used; s += gridDim.y * blockDim.x) {
        const int64_t index = a.kv.stream[base + s];
        if (index < 0) continue;
        SlotStats partial = a.kv.partial[static_cast<size_t>(h) * a.stride + s];
        for (int c = 0; c < a.count; ++c) {
            const int t = a.t0 + c;
            if (!attention_visible(index, a.first_index + t, a.window)) continue;
            float w = 0.0f;
            for (int g = 0; g < group; ++g) w += a.kv.scores[(static_cast<size_t>(c) * a.n_head + h * group + g) * a.stride + s];
            const float threshold = kv_importance_threshold(static_cast<KV_UINT>(group),
                                                            static_cast<KV_UINT>(a.kv.visible[static_cast<size_t>(c) * a.n_kv + h]));
            partial = kv_stats_add_query(
                partial, w, threshold, kv_persistence_weight(a.decay, static_cast<KV_UINT>(a.n), static_cast<KV_UINT>(t)),
                kv_is_proxy_query(static_cast<KV_UINT>(a.n), static_cast<KV_UINT>(t), static_cast<KV_UINT>(a.proxy)));
        }
        a.kv.partial[static_cast<size_t>(h) * a.stride + s] = partial;
    }
}

__global__ void attention_fold_kernel(KvDevice kv, int layer, int n_kv, int stride, float old_persistence_weight) {
    const int h = blockIdx.x;
    const size_t cell = static_cast<size_t>(layer) * n_kv + h, base = static_cast<size_t>(kv.cell_first[cell]);
    const int used = kv.used[cell];
    for (int s = blockIdx.y * blockDim.x + threadIdx.x; s < used; s += gridDim.y * blockDim.x) {
        kv.stats[base + s] =
            kv_stats_fold(kv.stats[base + s], kv.partial[static_cast<size_t>(h) * stride + s], old_persistence_weight, true);
    }
}

// ---- the backend --------------------------------------------------------------------------------

class CudaBackend final : public Backend, public KvStore {
public:
    KvStore &kv_store() override { return *this; }
    CudaBackend(int device, int max_batch) : device_(device), max_batch_(std::max(1, max_batch)) {}

    ~CudaBackend() override {
        if (cudaSetDevice(device_) != cudaSuccess) return;
        for (void *p : allocations_) (void)cudaFree(p);
        if (stream_) (void)cudaStreamDestroy(stream_);
    }

    Status init() {
        H2O_TRY(check(cudaSetDevice(device_), "cudaSetDevice"));
        H2O_TRY(check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
        return Status::Ok();
    }

    const char *name() const override { return "cuda"; }

    Status alloc(TensorType type, int64_t cols, int64_t rows, Tensor *out) override {
        H2O_TRY(failed_);
        void *p = nullptr;
        H2O_TRY(device_alloc(row_bytes(type, cols) * static_cast<size_t>(rows), &p));
        H2O_TRY(check(cudaMemsetAsync(p, 0, row_bytes(type, cols) * static_cast<size_t>(rows), stream_), "cudaMemsetAsync"));
        *out = Tensor{reinterpret_cast<uintptr_t>(p), 0, type, cols, rows};
        return Status::Ok();
    }

    Status adopt_weight(TensorType type, int64_t cols, int64_t rows, const void *host_data, Tensor *out) override {
        H2O_TRY(failed_);
        H2O_TRY(cuda_runs_weight_type(type));
        const size_t bytes = row_bytes(type, cols) * static_cast<size_t>(rows);
        void *p = nullptr;
        H2O_TRY(device_alloc(bytes, &p));
        H2O_TRY(check(cudaMemcpyAsync(p, host_data, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (weights)"));
        traffic_.bytes_to_device += bytes;
        *out = Tensor{reinterpret_cast<uintptr_t>(p), 0, type, cols, rows};
        return Status::Ok();
    }

    bool weight_is_copy(const Tensor &) const override { return true; }

    Status upload(const Tensor &dst, const void *src, size_t bytes) override {
        H2O_TRY(failed_);
        H2O_TRY(check(cudaMemcpyAsync(device_ptr<uint8_t>(dst), src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)"));
        traffic_.bytes_to_device += bytes;
        return Status::Ok();
    }

    Status download(const Tensor &src, void *dst, size_t bytes) override {
        H2O_TRY(failed_);
        H2O_TRY(
            check(cudaMemcpyAsync(dst, device_ptr<uint8_t>(src), bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)"));
        traffic_.bytes_to_host += bytes;
        return synchronize();
    }

    Status synchronize() override {
        H2O_TRY(failed_);
        ++traffic_.submissions;
        return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }

    size_t allocated_bytes() const override {
        return allocated_ + rebalance_books_.bytes() + rebalance_entries_.capacity() * sizeof(int64_t);
    }

    Traffic traffic() const override {
        Traffic t = traffic_;
        t.device_memory_bytes = allocated_;
        return t;
    }

    Status get_rows(const Tensor &out, const Tensor &table, const Tensor &ids, int n) override {
        H2O_TRY(failed_);
        if (n <= 0) return Status::Ok();
        // Rows of table.cols values, one after the other, as the CPU backend writes them.
        get_rows_kernel<<<n, kBlock, 0, stream_>>>(device_ptr<float>(out), table.cols, device_ptr<const uint8_t>(table),
                                                   row_bytes(table.type, table.cols), table.type, device_ptr<const int32_t>(ids),
                                                   table.cols);
        return launched("get_rows");
    }

    Status rms_norm(const Tensor &out, const Tensor &in, const Tensor &weight, int n, float eps) override {
        H2O_TRY(failed_);
        if (n <= 0) return Status::Ok();
        rms_norm_kernel<<<n, kBlock, 0, stream_>>>(device_ptr<float>(out), out.cols, device_ptr<const float>(in), in.cols,
                                                   device_ptr<const float>(weight), eps);
        return launched("rms_norm");
    }

    Status matmul(const Tensor &out, const Tensor &weight, const Tensor &in, int n) override {
        H2O_TRY(failed_);
        if (n <= 0) return Status::Ok();
        // Input rows of weight.cols values, as the CPU backend reads them; output rows of out.cols.
        const MatmulArgs a{device_ptr<float>(out),
                           out.cols,
                           device_ptr<const uint8_t>(weight),
                           row_bytes(weight.type, weight.cols),
                           weight.rows,
                           weight.cols,
                           device_ptr<const float>(in),
                           weight.cols,
                           n};
        if (!launch_matmul(weight.type, a, stream_))
            return make_error(H2O_ERR_UNSUPPORTED, std::string("CUDA matmul: weight type ") + type_name(weight.type));
        return launched("matmul");
    }

    Status rope(const Tensor &q, const Tensor &k, const Tensor &positions, int n, const ModelShape &shape, bool per_kv_head) override {
        H2O_TRY(failed_);
        if (n <= 0 || shape.rope.pairs() < 1) return Status::Ok();
        const double *inv_freq = nullptr;
        H2O_TRY(rope_table(shape.rope, &inv_freq));
        rope_kernel<<<n, kBlock, 0, stream_>>>(device_ptr<float>(q), q.cols, device_ptr<float>(k), k.cols,
                                               device_ptr<const int32_t>(positions), per_kv_head ? n : 0, inv_freq, shape.rope.magnitude,
                                               shape.rope.pairs(), shape.rope.pairing, shape.head_dim, shape.n_head, shape.n_head_kv);
        return launched("rope");
    }

    Status swiglu(const Tensor &gate, const Tensor &up, int n) override {
        H2O_TRY(failed_);
        const int64_t count = gate.cols * n;
        if (count <= 0) return Status::Ok();
        swiglu_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(gate), device_ptr<const float>(up), count);
        return launched("swiglu");
    }

    Status geglu(const Tensor &gate, const Tensor &up, int n) override {
        H2O_TRY(failed_);
        const int64_t count = gate.cols * n;
        if (count <= 0) return Status::Ok();
        geglu_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(gate), device_ptr<const float>(up), count);
        return launched("geglu");
    }

    Status scale(const Tensor &x, float factor, int n) override { return scale_or_cap(x, factor, false, n, "scale"); }
    Status softcap(const Tensor &x, float cap, int n) override { return scale_or_cap(x, cap, true, n, "softcap"); }
    Status scale_or_cap(const Tensor &x, float value, bool cap, int n, const char *what) {
        H2O_TRY(failed_);
        const int64_t count = x.cols * n;
        if (count <= 0) return Status::Ok();
        scale_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(x), value, cap, count);
        return launched(what);
    }

    Status add(const Tensor &acc, const Tensor &x, int n) override {
        H2O_TRY(failed_);
        const int64_t count = acc.cols * n;
        if (count <= 0) return Status::Ok();
        add_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(acc), device_ptr<const float>(x), count);
        return launched("add");
    }

    Status add_bias(const Tensor &acc, const Tensor &bias, int n) override {
        H2O_TRY(failed_);
        const int64_t count = acc.cols * n;
        if (count <= 0) return Status::Ok();
        add_bias_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(acc), device_ptr<const float>(bias), acc.cols, count);
        return launched("add_bias");
    }

    Status argmax(const Tensor &out, const Tensor &in, int n) override {
        H2O_TRY(failed_);
        if (n <= 0) return Status::Ok();
        argmax_kernel<<<n, kBlock, 0, stream_>>>(device_ptr<int32_t>(out), device_ptr<const float>(in), in.cols);
        return launched("argmax");
    }

    Status create_kv(const KvConfig &config) override;
    Status clear_kv() override;
    size_t kv_bytes() const override { return has_kv_ ? KvCache::planned_bytes(kv_config_) : 0; }
    Status download_kv_stream_indices(int64_t *out) override {
        H2O_TRY(failed_);
        if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
        return download_raw(kv_.stream, out, slot_count() * sizeof(int64_t));
    }
    Status download_kv_statistics(SlotStats *out) override {
        H2O_TRY(failed_);
        if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
        if (!kv_.stats) {
            std::fill(out, out + slot_count(), kv_stats_zero());
            return Status::Ok();
        }
        return download_raw(kv_.stats, out, slot_count() * sizeof(SlotStats));
    }
    Status download_kv_cell_slots(int32_t *out) override {
        H2O_TRY(failed_);
        if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
        return download_raw(kv_.cell_slots, out, static_cast<size_t>(kv_config_.n_layer) * kv_config_.n_head_kv * sizeof(int32_t));
    }
    // The rule of kv_head_budgets.h on a host copy of the bookkeeping (no rows): it comes down,
    // the rule records what it does to the rows, the device does the same to its rows
    // (kv_rebalance_*_kernel) and the bookkeeping goes back up. The rows never cross.
    Status rebalance_kv(int64_t next_index, int incoming, int floor, int32_t *held, int32_t *slots) override {
        H2O_TRY(failed_);
        if (!has_kv_ || kv_config_.head_share <= 0.0f) return Status::Ok();
        KvImage &image = rebalance_books_.image();
        const std::vector<ImageArray> books = image_arrays(image, ImagePart::Bookkeeping);
        for (const ImageArray &a : books) H2O_TRY(download_raw(a.device, a.host, a.bytes));
        std::copy(span_min_, span_min_ + KV_MAX_SPANS, image.span_minimum);
        rebalance_books_.rebalance_heads(next_index, incoming, floor);
        rebalance_books_.cell_fill(held, slots);
        const KvRowEdits &edits = rebalance_books_.row_edits();
        std::vector<int64_t> &entries = rebalance_entries_;
        for (size_t done = 0; done < edits.rotations.size();) {
            const size_t n = std::min(edits.rotations.size() - done, kRebalanceChunk);
            for (size_t i = 0; i < n; ++i) {
                entries[2 * i] = edits.rotations[done + i].slot;
                entries[2 * i + 1] = edits.rotations[done + i].shift;
            }
            H2O_TRY(copy_to_device_now(rebalance_edits_, entries.data(), 2 * n * sizeof(int64_t)));  // (also waits for the last chunk)
            kv_rebalance_roll_kernel<<<grid_for(static_cast<int64_t>(n)), kBlock, 0, stream_>>>(
                kv_, rebalance_edits_, static_cast<int>(n), kv_key_format(kv_config_.type), key_row_, kv_config_.head_dim,
                kv_config_.rope.pairing, kv_config_.rope.pairs());
            H2O_TRY(launched("kv_rebalance_roll"));
            done += n;
        }
        for (size_t done = 0; done < edits.moves.size();) {
            const size_t n = std::min(edits.moves.size() - done, kRebalanceChunk);
            for (size_t i = 0; i < n; ++i) {
                entries[2 * i] = edits.moves[done + i].from;
                entries[2 * i + 1] = edits.moves[done + i].to;
            }
            H2O_TRY(copy_to_device_now(rebalance_edits_, entries.data(), 2 * n * sizeof(int64_t)));
            const unsigned grid = grid_for(static_cast<int64_t>(n * (key_row_ + value_row_)));
            for (const bool gather : {true, false}) {
                kv_rebalance_move_kernel<<<grid, kBlock, 0, stream_>>>(kv_, rebalance_edits_, static_cast<int>(n), rebalance_rows_,
                                                                       key_row_, value_row_, gather);
                H2O_TRY(launched("kv_rebalance_move"));
            }
            done += n;
        }
        for (const ImageArray &a : books) H2O_TRY(copy_to_device_now(a.device, a.host, a.bytes));
        return Status::Ok();
    }
    Status download_kv_tags(uint8_t *out) override {
        H2O_TRY(failed_);
        if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
        std::vector<int64_t> stream(slot_count());
        H2O_TRY(download_raw(kv_.tag, out, slot_count()));
        H2O_TRY(download_raw(kv_.stream, stream.data(), slot_count() * sizeof(int64_t)));
        // A freed slot keeps its last token's tag on the device.
        for (size_t i = 0; i < stream.size(); ++i) out[i] = stream[i] >= 0 ? out[i] : 0;
        return Status::Ok();
    }
    // Passed to every eviction by value (ClaimArgs), so they take effect with the next batch.
    Status set_kv_span_minimums(const int32_t *minimums) override {
        H2O_TRY(failed_);
        std::copy(minimums, minimums + KV_MAX_SPANS, span_min_);
        return Status::Ok();
    }
    // Snapshots (and forks) through a host image of the cache (kv_image.h): the device keeps the
    // image's arrays, array for array, so each is one copy.
    Status save_kv(ByteWriter &out) override;
    Status load_kv(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) override;
    Status attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                     const ModelShape &shape) override;

private:
    // ---- attention's steps (attention())
    Status ensure_attention_scratch(const ModelShape &shape);
    ClaimArgs claim_args(const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch, const ModelShape &shape,
                         const KvPolicyConfig &policy, int stride) const;
    Status expect_queries(const ClaimArgs &c, const Tensor &q, const ModelShape &shape);
    Status attend_chunk(const Tensor &out, const Tensor &q, int layer, const AttentionBatch &batch, const ModelShape &shape,
                        const ClaimArgs &c, int t0, int count);

    // One array of the cache on the device and in a host image (save_kv, load_kv).
    struct ImageArray {
        void *device;
        void *host;
        size_t bytes;
    };
    // The whole image, or its bookkeeping only (no rows, no Expected Attention statistics: what
    // the rule of kv_head_budgets.h reads and writes).
    enum class ImagePart {
        Whole,
        Bookkeeping
    };
    std::vector<ImageArray> image_arrays(KvImage &image, ImagePart part = ImagePart::Whole);

    template <typename T>
    static T *device_ptr(const Tensor &t) {
        return reinterpret_cast<T *>(t.buffer + t.offset);
    }

    static unsigned grid_for(int64_t count) { return static_cast<unsigned>(std::min<int64_t>((count + kBlock - 1) / kBlock, 65535)); }

    size_t slot_count() const { return static_cast<size_t>(kv_config_.total_slots()); }

    // A device error: the backend stays failed, and says which call failed and how.
    Status check(cudaError_t e, const char *what) {
        if (e == cudaSuccess) return Status::Ok();
        if (failed_.ok()) {
            // (member-wise: nvcc reports the assignment operator's [[nodiscard]] Status& result)
            failed_.code = H2O_ERR_BACKEND_FAILED;
            failed_.message = std::string("CUDA device error in ") + what + ": " + cuda_error_text(e);
        }
        return failed_;
    }

    Status launched(const char *kernel) { return check(cudaGetLastError(), (std::string(kernel) + " kernel launch").c_str()); }

    // Device memory. Running out is H2O_ERR_OUT_OF_MEMORY and leaves the backend usable.
    Status device_alloc(size_t bytes, void **out) {
        const cudaError_t e = cudaMalloc(out, std::max<size_t>(bytes, 1));
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();  // not sticky: clear it
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes >> 20) + " MiB of CUDA device memory");
        }
        H2O_TRY(check(e, "cudaMalloc"));
        allocations_.push_back(*out);
        allocated_ += bytes;
        return Status::Ok();
    }

    template <typename T>
    Status device_array(size_t count, T **out) {
        void *p = nullptr;
        H2O_TRY(device_alloc(count * sizeof(T), &p));
        *out = static_cast<T *>(p);
        return Status::Ok();
    }

    // A copy in stream order that has finished when this returns.
    Status copy_to_device_now(void *dst, const void *src, size_t bytes) {
        if (bytes == 0) return Status::Ok();
        H2O_TRY(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync"));
        traffic_.bytes_to_device += bytes;
        return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }

    Status download_raw(const void *src, void *dst, size_t bytes) {
        H2O_TRY(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)"));
        traffic_.bytes_to_host += bytes;
        return synchronize();
    }

    // The rotary inverse frequencies of `rope` on the device (RotarySpec computes them on the host).
    // Two tables, for a model's global and local layers (which rotate differently): the one that
    // holds `rope`, else the one used less recently, filled now.
    Status rope_table(const RotarySpec &rope, const double **out) {
        const int slot = rope_inv_freq_[last_rope_slot_] && rope_spec_[last_rope_slot_] == rope ? last_rope_slot_ : 1 - last_rope_slot_;
        double *&table_on_device = rope_inv_freq_[slot];
        if (!table_on_device || !(rope_spec_[slot] == rope)) {
            const std::vector<double> table = rope.inv_freqs();
            if (!table_on_device || rope_spec_[slot].pairs() < rope.pairs()) H2O_TRY(device_array(table.size(), &table_on_device));
            // In stream order (earlier kernels read the old table), waited for: the host table goes
            // out of scope.
            H2O_TRY(copy_to_device_now(table_on_device, table.data(), table.size() * sizeof(double)));
            rope_spec_[slot] = rope;
        }
        last_rope_slot_ = slot;
        *out = table_on_device;
        return Status::Ok();
    }

    int device_;
    int max_batch_;
    cudaStream_t stream_ = nullptr;
    Status failed_;  // the first device error; every later operation returns it
    std::vector<void *> allocations_;
    size_t allocated_ = 0;
    Traffic traffic_;
    double *rope_inv_freq_[2] = {nullptr, nullptr};
    RotarySpec rope_spec_[2];  // what each of rope_inv_freq_ holds
    int last_rope_slot_ = 0;
    double *local_inv_freq_ = nullptr;  // rolling: the local layers' (KvConfig::local_rope), or null
    // When the heads' budgets move (rebalance_kv): the bookkeeping the rule runs on, and a chunk of
    // its edits of the rows on the host and the device, with the rows a chunk of moves carries.
    static constexpr size_t kRebalanceChunk = 4096;
    KvCache rebalance_books_;
    std::vector<int64_t> rebalance_entries_;
    int64_t *rebalance_edits_ = nullptr;
    uint8_t *rebalance_rows_ = nullptr;

    bool has_kv_ = false;
    int32_t span_min_[KV_MAX_SPANS] = {};  // set_kv_span_minimums
    KvConfig kv_config_;
    KvDevice kv_;
    size_t key_row_ = 0, value_row_ = 0;
    int chunk_ = 1;  // query tokens whose attention weights the scratch holds
    int scratch_heads_ = 0;
    SoftmaxState *split_state_ = nullptr;  // split attention's scratch (AttentionArgs)
    int32_t *split_visible_ = nullptr;
    float *partial_out_ = nullptr;
};

Status CudaBackend::create_kv(const KvConfig &config) {
    H2O_TRY(failed_);
    H2O_TRY(cuda_runs_kv(config));
    if (has_kv_) return make_error(H2O_ERR_INVALID_ARGUMENT, "the KV cache was already created");
    const KvRowFormat key_format = kv_key_format(config.type), value_format = kv_value_format(config.type);
    key_row_ = kv_row_bytes(key_format, config.head_dim);
    value_row_ = kv_row_bytes(value_format, config.head_dim);
    kv_config_ = config;
    const size_t cells = static_cast<size_t>(config.n_layer) * config.n_head_kv;
    const size_t slots = static_cast<size_t>(config.total_slots()),
                 per_head = static_cast<size_t>(config.n_head_kv) * config.max_cell_slots();
    H2O_TRY(device_array(slots * key_row_, &kv_.keys));
    H2O_TRY(device_array(slots * value_row_, &kv_.values));
    H2O_TRY(device_array(slots, &kv_.stream));
    H2O_TRY(device_array(slots, &kv_.position));
    H2O_TRY(device_array(slots, &kv_.tag));
    if (kv_policy_uses_statistics(config.policy.policy)) {
        H2O_TRY(device_array(slots, &kv_.stats));
        H2O_TRY(device_array(per_head, &kv_.partial));
    }
    H2O_TRY(device_array(slots, &kv_.free_list));
    H2O_TRY(device_array(cells, &kv_.used));
    H2O_TRY(device_array(cells, &kv_.free_count));
    H2O_TRY(device_array(cells, &kv_.cell_first));
    H2O_TRY(device_array(cells, &kv_.cell_slots));
    H2O_TRY(device_array(1, &kv_.rng));
    H2O_TRY(device_array(per_head, &kv_.batch_slot));
    H2O_TRY(device_array(per_head, &kv_.victims));
    H2O_TRY(device_array(static_cast<size_t>(config.max_cell_slots()), &kv_.candidates));
    if (kv_policy_scores_keys(static_cast<uint32_t>(config.policy.policy))) {
        H2O_TRY(device_array(per_head * 2, &kv_.key_scores));
    }
    if (kv_query_stats_floats(config) != 0) H2O_TRY(device_array(cells * kv_query_stats_floats(config), &kv_.query_stats));
    // Budgets per kv head move by the rule of kv_head_budgets.h, run on a host copy of the
    // bookkeeping, its edits of the rows done here a chunk at a time (rebalance_kv).
    if (config.head_share > 0.0f) {
        H2O_TRY(rebalance_books_.init_bookkeeping(config));
        const size_t chunk = std::min(kRebalanceChunk, slots);
        H2O_TRY(device_array(2 * chunk, &rebalance_edits_));
        H2O_TRY(device_array(chunk * (key_row_ + value_row_), &rebalance_rows_));
        try {
            rebalance_entries_.assign(2 * chunk, 0);
        } catch (const std::bad_alloc &) {
            return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the KV cache's rebalancing entries");
        }
    }
    const int pairs = config.rope.pairs();
    H2O_TRY(device_array(static_cast<size_t>(std::max(pairs, 1)), &kv_.inv_freq));
    const std::vector<double> inv_freq = config.rope.inv_freqs();
    H2O_TRY(copy_to_device_now(kv_.inv_freq, inv_freq.data(), inv_freq.size() * sizeof(double)));
    if (!config.layer_window.empty()) {
        H2O_TRY(device_array(static_cast<size_t>(std::max(pairs, 1)), &local_inv_freq_));
        const std::vector<double> local = config.local_rope.inv_freqs();
        H2O_TRY(copy_to_device_now(local_inv_freq_, local.data(), local.size() * sizeof(double)));
    }
    // The attention scratch is sized at the first attention call, when the number of query heads
    // is known.
    has_kv_ = true;
    return clear_kv();
}

Status CudaBackend::clear_kv() {
    H2O_TRY(failed_);
    if (!has_kv_) return Status::Ok();
    const size_t cells = static_cast<size_t>(kv_config_.n_layer) * kv_config_.n_head_kv;
    H2O_TRY(check(cudaMemsetAsync(kv_.stream, 0xFF, slot_count() * sizeof(int64_t), stream_), "cudaMemsetAsync"));  // -1: free
    H2O_TRY(check(cudaMemsetAsync(kv_.tag, 0, slot_count(), stream_), "cudaMemsetAsync"));
    std::fill(span_min_, span_min_ + KV_MAX_SPANS, 0);
    H2O_TRY(check(cudaMemsetAsync(kv_.used, 0, cells * sizeof(int32_t), stream_), "cudaMemsetAsync"));
    H2O_TRY(check(cudaMemsetAsync(kv_.free_count, 0, cells * sizeof(int32_t), stream_), "cudaMemsetAsync"));
    // Every cell its layer's budget (KvImage::clear).
    std::vector<int64_t> first(cells);
    std::vector<int32_t> sizes(cells);
    for (size_t c = 0; c < cells; ++c) {
        const int layer = static_cast<int>(c / static_cast<size_t>(kv_config_.n_head_kv)),
                  head = static_cast<int>(c % static_cast<size_t>(kv_config_.n_head_kv));
        first[c] = kv_config_.uniform_cell_first(layer, head);
        sizes[c] = kv_config_.slots_in(layer);
    }
    H2O_TRY(copy_to_device_now(kv_.cell_first, first.data(), cells * sizeof(int64_t)));
    H2O_TRY(copy_to_device_now(kv_.cell_slots, sizes.data(), cells * sizeof(int32_t)));
    if (kv_.stats) H2O_TRY(check(cudaMemsetAsync(kv_.stats, 0, slot_count() * sizeof(SlotStats), stream_), "cudaMemsetAsync"));
    if (kv_.query_stats) {
        H2O_TRY(check(cudaMemsetAsync(kv_.query_stats, 0, cells * kv_query_stats_floats(kv_config_) * sizeof(float), stream_),
                      "cudaMemsetAsync"));
    }
    // KvImage::clear's generator state (the value is on this stack: the copy is waited for).
    const uint64_t rng = kv_initial_random_state(kv_config_.policy.seed);
    return copy_to_device_now(kv_.rng, &rng, sizeof rng);
}

// The device arrays of the cache and their host image's, with their sizes in bytes: the device
// keeps the image's arrays, array for array (statistics only for the policies that read them).
std::vector<CudaBackend::ImageArray> CudaBackend::image_arrays(KvImage &image, ImagePart part) {
    std::vector<ImageArray> arrays = {
        {kv_.stream, image.stream_index.data(), image.stream_index.size() * sizeof(int64_t)},
        {kv_.position, image.position.data(), image.position.size() * sizeof(int32_t)},
        {kv_.tag, image.tags.data(), image.tags.size()},
        {kv_.free_list, image.free_list.data(), image.free_list.size() * sizeof(int32_t)},
        {kv_.used, image.used.data(), image.used.size() * sizeof(int32_t)},
        {kv_.free_count, image.free_count.data(), image.free_count.size() * sizeof(int32_t)},
        {kv_.cell_first, image.cell_first_slot.data(), image.cell_first_slot.size() * sizeof(int64_t)},
        {kv_.cell_slots, image.cell_slots.data(), image.cell_slots.size() * sizeof(int32_t)},
        {kv_.rng, &image.random_state, sizeof image.random_state},
    };
    if (kv_.stats) arrays.push_back({kv_.stats, image.stats.data(), image.stats.size() * sizeof(SlotStats)});
    if (part == ImagePart::Bookkeeping) return arrays;
    arrays.push_back({kv_.keys, image.keys.data(), image.keys.size()});
    arrays.push_back({kv_.values, image.values.data(), image.values.size()});
    if (kv_.query_stats) arrays.push_back({kv_.query_stats, image.query_stats.data(), image.query_stats.size() * sizeof(float)});
    return arrays;
}

Status CudaBackend::save_kv(ByteWriter &out) {
    H2O_TRY(failed_);
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
    KvImage image;
    H2O_TRY(image.allocate(kv_config_));
    for (const ImageArray &a : image_arrays(image)) H2O_TRY(download_raw(a.device, a.host, a.bytes));
    save_kv_image(kv_config_, image, out);
    return Status::Ok();
}

Status CudaBackend::load_kv(ByteReader &in, int64_t n_past, int64_t n_cached, int64_t n_pinned, int n_spans) {
    H2O_TRY(failed_);
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: no KV cache");
    KvImage image;
    H2O_TRY(image.allocate(kv_config_));
    H2O_TRY(load_kv_image(kv_config_, image, in, n_past, n_cached, n_pinned, n_spans));  // checked before the device changes
    for (const ImageArray &a : image_arrays(image)) H2O_TRY(copy_to_device_now(a.device, a.host, a.bytes));
    std::copy(image.span_minimum, image.span_minimum + KV_MAX_SPANS, span_min_);  // none: the session sets them again
    return Status::Ok();
}

Status CudaBackend::attention(const Tensor &out, const Tensor &q, const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch,
                              const ModelShape &shape) {
    H2O_TRY(failed_);
    if (!has_kv_) return make_error(H2O_ERR_INTERNAL, "cuda backend: attention without a KV cache");
    const int n = batch.n_tokens;
    if (n <= 0) return Status::Ok();
    // Each cell's region is on the device (cell_first, cell_slots); the scratch rows are as long
    // as the most slots a cell of the layer may hold.
    const int stride = kv_config_.max_cell_slots(layer);
    if (n > kv_config_.min_cell_slots(layer)) return make_error(H2O_ERR_INTERNAL, "cuda backend: a batch larger than the KV cache");
    if (shape.n_head_kv != kv_config_.n_head_kv || shape.head_dim != kv_config_.head_dim || shape.n_head % shape.n_head_kv != 0) {
        return make_error(H2O_ERR_INTERNAL, "cuda backend: the model's heads do not match the KV cache");
    }
    H2O_TRY(ensure_attention_scratch(shape));
    const KvPolicyConfig policy = kv_config_.policy_in(layer);
    const ClaimArgs c = claim_args(k, v, layer, batch, shape, policy, stride);
    if (policy.policy == KvPolicy::ExpectedAttention) H2O_TRY(expect_queries(c, q, shape));
    kv_claim_kernel<<<c.random ? 1 : shape.n_head_kv, kBlock, 0, stream_>>>(c);
    H2O_TRY(launched("kv_claim"));

    const bool statistics = kv_.stats != nullptr;
    if (statistics) {
        H2O_TRY(check(cudaMemsetAsync(kv_.partial, 0, sizeof(SlotStats) * static_cast<size_t>(shape.n_head_kv) * stride, stream_),
                      "cudaMemsetAsync"));
    }
    const dim3 slot_blocks(static_cast<unsigned>(shape.n_head_kv), static_cast<unsigned>((stride + kBlock - 1) / kBlock));
    for (int t0 = 0; t0 < n; t0 += chunk_) {
        const int count = std::min(chunk_, n - t0);
        H2O_TRY(attend_chunk(out, q, layer, batch, shape, c, t0, count));
        if (!statistics) continue;
        StatsArgs s;
        s.kv = kv_;
        s.layer = layer;
        s.n_kv = shape.n_head_kv;
        s.n_head = shape.n_head;
        s.stride = stride;
        s.n = n;
        s.t0 = t0;
        s.count = count;
        s.first_index = batch.first_index;
        s.decay = policy.persistence_decay;
        s.proxy = kv_proxy_queries(policy);
        s.window = shape.is_local(layer) ? shape.sliding_window : 0;
        attention_stats_kernel<<<slot_blocks, kBlock, 0, stream_>>>(s);
        H2O_TRY(launched("attention_stats"));
    }
    if (statistics) {
        attention_fold_kernel<<<slot_blocks, kBlock, 0, stream_>>>(kv_, layer, shape.n_head_kv, stride,
                                                                   kv_power(policy.persistence_decay, static_cast<KV_UINT>(n)));
        H2O_TRY(launched("attention_fold"));
    }
    return Status::Ok();
}

// The attention scratch, sized at the first attention call (when the number of query heads is
// known): the weights of a chunk of queries and their visible-slot counts, as many tokens as the
// budget allows, and split attention's parts.
Status CudaBackend::ensure_attention_scratch(const ModelShape &shape) {
    if (scratch_heads_ >= shape.n_head) return Status::Ok();
    const size_t per_token = sizeof(float) * static_cast<size_t>(shape.n_head) * kv_config_.max_cell_slots() +
                             sizeof(int32_t) * static_cast<size_t>(shape.n_head_kv);
    chunk_ = static_cast<int>(std::clamp<size_t>(kAttentionScratchBudget / per_token, 1, static_cast<size_t>(max_batch_)));
    H2O_TRY(device_array(per_token / sizeof(float) * chunk_, &kv_.scores));
    H2O_TRY(device_array(static_cast<size_t>(shape.n_head_kv) * chunk_, &kv_.visible));
    // Split attention's parts: at most about kAttentionSplitBlocks ranges beyond one per
    // (query, head) (attention_splits).
    const size_t parts = static_cast<size_t>(chunk_) * shape.n_head + 2 * kAttentionSplitBlocks;
    H2O_TRY(device_array(parts, &split_state_));
    H2O_TRY(device_array(parts, &split_visible_));
    H2O_TRY(device_array(parts * static_cast<size_t>(shape.head_dim), &partial_out_));
    scratch_heads_ = shape.n_head;
    return Status::Ok();
}

// What kv_claim_kernel needs to make room in a layer's cells and store the batch's keys and values.
ClaimArgs CudaBackend::claim_args(const Tensor &k, const Tensor &v, int layer, const AttentionBatch &batch, const ModelShape &shape,
                                  const KvPolicyConfig &policy, int stride) const {
    const int n = batch.n_tokens;
    ClaimArgs c;
    c.kv = kv_;
    if (kv_config_.is_window_layer(layer)) c.kv.inv_freq = local_inv_freq_;  // rolled keys turn back by the local rotation
    c.layer = layer;
    c.n_kv = shape.n_head_kv;
    c.stride = stride;
    c.head_dim = shape.head_dim;
    c.n = n;
    c.pairs = kv_config_.rope.pairs();
    c.pairing = kv_config_.rope.pairing;
    c.key_format = kv_key_format(kv_config_.type);
    c.value_format = kv_value_format(kv_config_.type);
    c.key_row = key_row_;
    c.value_row = value_row_;
    c.policy = static_cast<uint32_t>(policy.policy);
    c.first_index = batch.first_index;
    c.recent_from = kv_recent_from(policy, batch.first_index, n);
    c.stale_before = kv_stale_before(policy, batch.first_index, n);
    c.sinks = policy.sinks;
    c.tag = batch.tag;
    std::copy(span_min_, span_min_ + KV_MAX_SPANS, c.span_min);
    c.rolling = kv_config_.rolling;
    c.random = policy.policy == KvPolicy::Random;
    c.by_proxy = kv_ranks_by_proxy(policy, n);
    c.prompt_share = policy.prompt_random_share;
    c.prompt_seed = kv_prompt_seed(policy);
    c.k = device_ptr<const float>(k);
    c.v = device_ptr<const float>(v);
    c.k_cols = k.cols;
    c.v_cols = v.cols;
    c.positions = device_ptr<const int32_t>(batch.positions);
    c.positions_per_kv_head = batch.positions_per_kv_head;
    return c;
}

// Expected Attention: the batch's queries into the cells' statistics, then every held slot's
// score (kv_expect_kernel), which the claim ranks by.
Status CudaBackend::expect_queries(const ClaimArgs &c, const Tensor &q, const ModelShape &shape) {
    ExpectArgs e;
    e.kv = kv_;
    e.layer = c.layer;
    e.n_kv = shape.n_head_kv;
    e.group = kv_config_.query_group;
    e.head_dim = shape.head_dim;
    e.n = c.n;
    e.pairs = kv_config_.rope.pairs();
    e.stride = c.stride;
    e.pairing = kv_config_.rope.pairing;
    e.key_format = c.key_format;
    e.value_format = c.value_format;
    e.key_row = key_row_;
    e.value_row = value_row_;
    e.scale = kv_config_.attention_scale;
    e.q = device_ptr<const float>(q);
    e.q_cols = q.cols;
    e.positions = c.positions;
    e.positions_per_kv_head = c.positions_per_kv_head;
    kv_expect_kernel<<<shape.n_head_kv, kBlock, 0, stream_>>>(e);
    return launched("kv_expect");
}

// Attention of the batch's queries [t0, t0 + count) over the layer's cells, each (query, head)
// reading its slots in one range or, when few, in several that attention_reduce_kernel joins.
Status CudaBackend::attend_chunk(const Tensor &out, const Tensor &q, int layer, const AttentionBatch &batch, const ModelShape &shape,
                                 const ClaimArgs &c, int t0, int count) {
    AttentionArgs a;
    a.kv = kv_;
    a.layer = layer;
    a.n_kv = shape.n_head_kv;
    a.n_head = shape.n_head;
    a.stride = c.stride;
    a.head_dim = shape.head_dim;
    a.n = c.n;
    a.t0 = t0;
    a.key_format = c.key_format;
    a.value_format = c.value_format;
    a.key_row = key_row_;
    a.value_row = value_row_;
    a.first_index = batch.first_index;
    a.scale = shape.attention_scale != 0.0f ? shape.attention_scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    a.softcap = shape.attention_softcap;
    a.window = shape.is_local(layer) ? shape.sliding_window : 0;
    a.q = device_ptr<const float>(q);
    a.q_cols = q.cols;
    a.out = device_ptr<float>(out);
    a.out_cols = out.cols;
    a.n_split = attention_splits(count * shape.n_head, c.stride);
    a.split_len = (c.stride + a.n_split - 1) / a.n_split;
    a.split_state = split_state_;
    a.split_visible = split_visible_;
    a.partial_out = partial_out_;
    const dim3 blocks(static_cast<unsigned>(count), static_cast<unsigned>(shape.n_head), static_cast<unsigned>(a.n_split));
    attention_scores_kernel<<<blocks, kBlock, 0, stream_>>>(a);
    H2O_TRY(launched("attention_scores"));
    attention_values_kernel<<<blocks, kBlock, 0, stream_>>>(a);
    H2O_TRY(launched("attention_values"));
    if (a.n_split > 1) {
        attention_reduce_kernel<<<dim3(static_cast<unsigned>(count), static_cast<unsigned>(shape.n_head)), 128, 0, stream_>>>(a);
        H2O_TRY(launched("attention_reduce"));
    }
    return Status::Ok();
}

}  // namespace

std::vector<TensorType> cuda_weight_types() { return {std::begin(kCudaWeightTypes), std::end(kCudaWeightTypes)}; }

Status cuda_runs_weight_type(TensorType type) {
    if (std::find(std::begin(kCudaWeightTypes), std::end(kCudaWeightTypes), type) == std::end(kCudaWeightTypes)) {
        return make_error(H2O_ERR_UNSUPPORTED, std::string("the CUDA backend does not support ") + type_name(type) + " weights");
    }
    return Status::Ok();
}

Status cuda_runs_kv(const KvConfig &config) {
    H2O_TRY(kv_type_fits_head_dim(config.type, config.head_dim));
    if (config.head_dim > kCudaMaxHeadDim) {
        return make_error(H2O_ERR_UNSUPPORTED, "the CUDA attention kernels run heads of up to " + std::to_string(kCudaMaxHeadDim) +
                                                   " dimensions, not " + std::to_string(config.head_dim));
    }
    if (config.rope.dims < 0 || config.rope.dims > config.head_dim) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "rotary dimensions " + std::to_string(config.rope.dims) + " do not fit heads of " +
                                                        std::to_string(config.head_dim));
    }
    return Status::Ok();
}

Status list_cuda_devices(std::vector<CudaDeviceInfo> *out) {
    // Counting devices loads the driver; the devices of a machine do not change while a process
    // runs, so they are listed once.
    static const std::pair<Status, std::vector<CudaDeviceInfo>> listed = [] {
        std::vector<CudaDeviceInfo> devices;
        int count = 0;
        const cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess) {
            // No driver (cudaErrorInsufficientDriver), or a driver without devices (cudaErrorNoDevice).
            (void)cudaGetLastError();
            return std::make_pair(
                make_error(H2O_ERR_BACKEND_UNAVAILABLE, "no usable CUDA device: cudaGetDeviceCount: " + cuda_error_text(e)), devices);
        }
        for (int i = 0; i < count; ++i) {
            cudaDeviceProp props;
            const cudaError_t pe = cudaGetDeviceProperties(&props, i);
            if (pe != cudaSuccess) {
                (void)cudaGetLastError();
                return std::make_pair(
                    make_error(H2O_ERR_BACKEND_UNAVAILABLE, "cudaGetDeviceProperties(" + std::to_string(i) + "): " + cuda_error_text(pe)),
                    std::vector<CudaDeviceInfo>());
            }
            CudaDeviceInfo d;
            d.index = i;
            d.name = props.name;
            d.integrated = props.integrated != 0;
            d.memory_bytes = props.totalGlobalMem;
            d.compute_major = props.major;
            d.compute_minor = props.minor;
            devices.push_back(std::move(d));
        }
        return std::make_pair(Status::Ok(), devices);
    }();
    *out = listed.second;
    return listed.first;
}

Status make_cuda_backend(int device_index, int max_batch, std::unique_ptr<Backend> *out) {
    out->reset();
    std::vector<CudaDeviceInfo> devices;
    H2O_TRY(list_cuda_devices(&devices));
    if (devices.empty()) return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "no CUDA device is present");
    if (device_index < -1 || device_index >= static_cast<int>(devices.size())) {
        return make_error(H2O_ERR_BACKEND_UNAVAILABLE, "CUDA device index " + std::to_string(device_index) + " is out of range (" +
                                                           std::to_string(devices.size()) + " devices)");
    }
    auto backend = std::make_unique<CudaBackend>(device_index < 0 ? 0 : device_index, max_batch);
    H2O_TRY(backend->init());
    *out = std::move(backend);
    return Status::Ok();
}

}  // namespace h2o
