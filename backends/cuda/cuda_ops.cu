// The CUDA backend's row operations and matmul (cuda_impl.cuh), with their kernels.
#include "cuda/cuda_impl.cuh"

namespace h2o {

namespace {

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

}  // namespace

Status CudaBackend::get_rows(const Tensor &out, const Tensor &table, const Tensor &ids, int n) {
    H2O_TRY(failed_);
    if (n <= 0) return Status::Ok();
    // Rows of table.cols values, one after the other, as the CPU backend writes them.
    get_rows_kernel<<<n, kBlock, 0, stream_>>>(device_ptr<float>(out), table.cols, device_ptr<const uint8_t>(table),
                                               row_bytes(table.type, table.cols), table.type, device_ptr<const int32_t>(ids), table.cols);
    return launched("get_rows");
}

Status CudaBackend::rms_norm(const Tensor &out, const Tensor &in, const Tensor &weight, int n, float eps) {
    H2O_TRY(failed_);
    if (n <= 0) return Status::Ok();
    rms_norm_kernel<<<n, kBlock, 0, stream_>>>(device_ptr<float>(out), out.cols, device_ptr<const float>(in), in.cols,
                                               device_ptr<const float>(weight), eps);
    return launched("rms_norm");
}

Status CudaBackend::matmul(const Tensor &out, const Tensor &weight, const Tensor &in, int n) {
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

Status CudaBackend::rope(const Tensor &q, const Tensor &k, const Tensor &positions, int n, const ModelShape &shape, bool per_kv_head) {
    H2O_TRY(failed_);
    if (n <= 0 || shape.rope.pairs() < 1) return Status::Ok();
    const double *inv_freq = nullptr;
    H2O_TRY(rope_table(shape.rope, &inv_freq));
    rope_kernel<<<n, kBlock, 0, stream_>>>(device_ptr<float>(q), q.cols, device_ptr<float>(k), k.cols, device_ptr<const int32_t>(positions),
                                           per_kv_head ? n : 0, inv_freq, shape.rope.magnitude, shape.rope.pairs(), shape.rope.pairing,
                                           shape.head_dim, shape.n_head, shape.n_head_kv);
    return launched("rope");
}

Status CudaBackend::swiglu(const Tensor &gate, const Tensor &up, int n) {
    H2O_TRY(failed_);
    const int64_t count = gate.cols * n;
    if (count <= 0) return Status::Ok();
    swiglu_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(gate), device_ptr<const float>(up), count);
    return launched("swiglu");
}

Status CudaBackend::geglu(const Tensor &gate, const Tensor &up, int n) {
    H2O_TRY(failed_);
    const int64_t count = gate.cols * n;
    if (count <= 0) return Status::Ok();
    geglu_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(gate), device_ptr<const float>(up), count);
    return launched("geglu");
}

Status CudaBackend::scale_or_cap(const Tensor &x, float value, bool cap, int n, const char *what) {
    H2O_TRY(failed_);
    const int64_t count = x.cols * n;
    if (count <= 0) return Status::Ok();
    scale_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(x), value, cap, count);
    return launched(what);
}

Status CudaBackend::add(const Tensor &acc, const Tensor &x, int n) {
    H2O_TRY(failed_);
    const int64_t count = acc.cols * n;
    if (count <= 0) return Status::Ok();
    add_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(acc), device_ptr<const float>(x), count);
    return launched("add");
}

Status CudaBackend::add_bias(const Tensor &acc, const Tensor &bias, int n) {
    H2O_TRY(failed_);
    const int64_t count = acc.cols * n;
    if (count <= 0) return Status::Ok();
    add_bias_kernel<<<grid_for(count), kBlock, 0, stream_>>>(device_ptr<float>(acc), device_ptr<const float>(bias), acc.cols, count);
    return launched("add_bias");
}

Status CudaBackend::argmax(const Tensor &out, const Tensor &in, int n) {
    H2O_TRY(failed_);
    if (n <= 0) return Status::Ok();
    argmax_kernel<<<n, kBlock, 0, stream_>>>(device_ptr<int32_t>(out), device_ptr<const float>(in), in.cols);
    return launched("argmax");
}

}  // namespace h2o
