#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// y[t][row] = W[row] . x[t] for a few tokens: one workgroup per (row, token). The invocations
// walk the row's words in order (adjacent invocations read adjacent words), unpack the 1, 2, 4
// or 8 elements of each word, and the partial dot products are summed over the workgroup.
// K-quant rows are walked in runs of 32 elements instead (weights.glsl), one run per invocation.
// Rows are those of a window [row_first, row_first + rows) of W; output column row_first + row.

#define WG 64
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Weights { uint weights[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Params {
    uint w_off;       // word offset of the window's first row
    uint x_off;
    uint y_off;
    uint cols;
    uint rows;        // rows in the window
    uint y_stride;    // floats per output token (all rows of W)
    uint row_first;   // the window's first row
} p;

#include "weights.glsl"
#include "reduce.glsl"

#if !defined(K_QUANT)
// Partial dot product of data word w of the row starting at `row` with x[xb ...].
float dot_word(uint row, uint w, uint xb) {
#if defined(TYPE_F32)
    return uintBitsToFloat(weights[row + w]) * x[xb + w];
#elif defined(TYPE_F16)
    const vec2 h = unpackHalf2x16(weights[row + w]);
    const uint c = 2u * w;
    return h.x * x[xb + c] + (c + 1u < p.cols ? h.y * x[xb + c + 1u] : 0.0);
#elif defined(TYPE_Q8_0)
    const uint b = w / 8u, j = 4u * (w % 8u);  // block, first element
    const int word = int(weights[row + w]);
    const uint e = xb + 32u * b + j;
    const float s = float(bitfieldExtract(word, 0, 8)) * x[e] + float(bitfieldExtract(word, 8, 8)) * x[e + 1u] +
                    float(bitfieldExtract(word, 16, 8)) * x[e + 2u] + float(bitfieldExtract(word, 24, 8)) * x[e + 3u];
    return s * block_scale(row, p.cols, b);
#else
    const uint b = w / 4u, j = 4u * (w % 4u);  // block, first byte: elements j..j+3 and 16+j..16+j+3
    const uint word = weights[row + w];
    const uint e = xb + 32u * b + j;
    float s = 0.0;
    for (uint k = 0u; k < 4u; ++k) {
        const uint byte_value = (word >> (8u * k)) & 0xFFu;
        s += (float(byte_value & 0xFu) - 8.0) * x[e + k] + (float(byte_value >> 4u) - 8.0) * x[e + 16u + k];
    }
    return s * block_scale(row, p.cols, b);
#endif
}
#else
// Partial dot product of run r of the row starting at `row` with x[xb ...]: the integer quants
// times x summed per half, then scaled once: step.x * sum_lo + step.y * sum_hi - off * sum(x).
float dot_run(uint row, uint r, uint xb) {
    const KRun run = k_run(row, r);
    const uint e = xb + 32u * r;
    vec2 qx = vec2(0.0);
    vec4 xs = vec4(0.0);  // Q4_K, Q5_K: x summed, for the min
    for (uint i = 0u; i < 8u; ++i) {
        const uint at = e + 4u * i;
        const vec4 xv = vec4(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
        qx[i / 4u] += dot(k_run_quants(run, i), xv);
#if !defined(TYPE_Q6_K)
        xs += xv;
#endif
    }
#if defined(TYPE_Q6_K)
    return run.step.x * qx.x + run.step.y * qx.y;
#else
    return run.step.x * (qx.x + qx.y) - run.off * (xs.x + xs.y + xs.z + xs.w);
#endif
}
#endif

void main() {
    const uint row_index = gl_WorkGroupID.x;
    const uint t = gl_WorkGroupID.y;
    const uint row = p.w_off + row_index * weight_row_words(p.cols);
    const uint xb = p.x_off + t * p.cols;
#if defined(TYPE_F32) || defined(TYPE_F16)
    const uint data_words = weight_row_words(p.cols);
#elif !defined(K_QUANT)
    const uint data_words = (p.cols / 32u) * QUANT_WORDS_PER_BLOCK;
#endif
    float sum = 0.0;
#if defined(K_QUANT)
    for (uint r = gl_LocalInvocationIndex; r < p.cols / 32u; r += WG) sum += dot_run(row, r, xb);
#else
    for (uint w = gl_LocalInvocationIndex; w < data_words; w += WG) sum += dot_word(row, w, xb);
#endif
    sum = workgroup_sum(sum);
    if (gl_LocalInvocationIndex == 0u) y[p.y_off + t * p.y_stride + p.row_first + row_index] = sum;
}
