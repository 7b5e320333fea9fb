#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// y[t][row] = W[row] . x[t] for a few tokens. The invocations that share a row walk its words in
// order (adjacent invocations read adjacent words), unpack the 1, 2, 4 or 8 elements of each
// word, and their partial dot products are summed. K-quant rows are walked in runs of 32
// elements instead (weights.glsl), one run per invocation. Rows are those of a window
// [row_first, row_first + rows) of W; output column row_first + row.
//
// With SUBGROUP_ROWS (subgroup arithmetic), a workgroup takes ROWS rows of a token and each
// subgroup whole rows (the subgroups' count and size are the device's), summed by subgroupAdd:
// no barrier, and no workgroup for a row too short to repay one (a CPU device's workgroups are
// costly, and so are its barriers). Otherwise one workgroup per (row, token), summed over the
// workgroup (reduce.glsl, with or without subgroups).

#define WG 64
#ifdef SUBGROUP_ROWS
#define ROWS 8  // kMatvecRowsPerGroup in vk_weights.cpp
#endif
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

// The partial dot product of `lane` of `lanes` invocations with row `row_index` of the window.
float row_partial(uint row_index, uint xb, uint lane, uint lanes) {
    const uint row = p.w_off + row_index * weight_row_words(p.cols);
    float sum = 0.0;
#if defined(K_QUANT)
    for (uint r = lane; r < p.cols / 32u; r += lanes) sum += dot_run(row, r, xb);
#else
#if defined(TYPE_F32) || defined(TYPE_F16)
    const uint data_words = weight_row_words(p.cols);
#else
    const uint data_words = (p.cols / 32u) * QUANT_WORDS_PER_BLOCK;
#endif
    for (uint w = lane; w < data_words; w += lanes) sum += dot_word(row, w, xb);
#endif
    return sum;
}

void main() {
    const uint t = gl_WorkGroupID.y;
    const uint xb = p.x_off + t * p.cols;
#ifdef SUBGROUP_ROWS
    // A row's index is the same across its subgroup: each subgroup adds in uniform control flow.
    for (uint r = gl_SubgroupID; r < ROWS; r += gl_NumSubgroups) {
        const uint row_index = gl_WorkGroupID.x * ROWS + r;
        if (row_index >= p.rows) break;
        const float sum = subgroupAdd(row_partial(row_index, xb, gl_SubgroupInvocationID, gl_SubgroupSize));
        if (subgroupElect()) y[p.y_off + t * p.y_stride + p.row_first + row_index] = sum;
    }
#else
    const uint row_index = gl_WorkGroupID.x;
    const float sum = workgroup_sum(row_partial(row_index, xb, gl_LocalInvocationIndex, WG));
    if (gl_LocalInvocationIndex == 0u) y[p.y_off + t * p.y_stride + p.row_first + row_index] = sum;
#endif
}
