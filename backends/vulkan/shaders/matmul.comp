#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// y[t][row] = W[row] . x[t] for a batch of tokens, tiled: each workgroup computes a TM x TN tile
// of (rows x tokens). The K dimension is walked in steps of TK = 32 columns (a quant block, a
// K-quant run): the weight tile is dequantized into shared memory once and reused by all TN
// tokens, the token tile once and reused by all TM rows. Each invocation accumulates a 4 x 4
// block of the tile, with rows and tokens interleaved across invocations so neighbours read
// neighbouring shared words.
// Rows are those of a window [row_first, row_first + rows) of W, as in matvec.comp.

#define WG 128
#define TM 64
#define TN 32
#define TK 32
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Weights { uint weights[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Params {
    uint w_off;
    uint x_off;
    uint y_off;
    uint cols;
    uint rows;
    uint y_stride;
    uint row_first;
    uint n;  // tokens
} p;

#include "weights.glsl"

shared float w_tile[TK][TM];
shared float x_tile[TK][TN];

void main() {
    const uint tid = gl_LocalInvocationIndex;
    const uint row0 = gl_WorkGroupID.x * TM, tok0 = gl_WorkGroupID.y * TN;
    const uint tr = tid % 16u, tc = tid / 16u;  // this invocation: rows tr + 16i, tokens tc + 8j
    const uint row_words = weight_row_words(p.cols);

    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;

    for (uint k0 = 0u; k0 < p.cols; k0 += TK) {
#if defined(K_QUANT)
        // One run of 32 elements (a whole sub-block, its scales read once) per invocation; rows
        // are multiples of 256 long, so every run lies inside the row.
        for (uint r = tid; r < TM; r += WG) {
            const uint row = row0 + r;
            if (row < p.rows) {
                const KRun run = k_run(p.w_off + row * row_words, k0 / TK);
                for (uint i = 0u; i < 8u; ++i) {
                    const vec4 v = k_run_values(run, i);
                    for (uint k = 0u; k < 4u; ++k) w_tile[4u * i + k][r] = v[k];
                }
            } else {
                for (uint kk = 0u; kk < TK; ++kk) w_tile[kk][r] = 0.0;
            }
        }
#else
        for (uint e = tid; e < TM * TK; e += WG) {
            const uint r = e / TK, kk = e % TK, row = row0 + r, c = k0 + kk;
            w_tile[kk][r] = (row < p.rows && c < p.cols) ? weight_at(p.w_off + row * row_words, p.cols, c) : 0.0;
        }
#endif
        for (uint e = tid; e < TN * TK; e += WG) {
            const uint tk = e / TK, kk = e % TK, t = tok0 + tk, c = k0 + kk;
            x_tile[kk][tk] = (t < p.n && c < p.cols) ? x[p.x_off + t * p.cols + c] : 0.0;
        }
        barrier();
        for (uint kk = 0u; kk < TK; ++kk) {
            float a[4], b[4];
            for (uint i = 0u; i < 4u; ++i) a[i] = w_tile[kk][tr + 16u * i];
            for (uint j = 0u; j < 4u; ++j) b[j] = x_tile[kk][tc + 8u * j];
            for (uint i = 0u; i < 4u; ++i)
                for (uint j = 0u; j < 4u; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }

    for (uint i = 0u; i < 4u; ++i) {
        const uint row = row0 + tr + 16u * i;
        if (row >= p.rows) continue;
        for (uint j = 0u; j < 4u; ++j) {
            const uint t = tok0 + tc + 8u * j;
            if (t < p.n) y[p.y_off + t * p.y_stride + p.row_first + row] = acc[i][j];
        }
    }
}
