#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// out[t] = row ids[t] of the table, dequantized. One invocation per output element, or for the
// K-quants per run of 32 elements (weights.glsl).
// The table may be bound as a window of rows [row_first, row_first + row_count) (tables larger
// than the device's storage buffer range are processed window by window); ids outside the
// window are left for another dispatch.

#define WG 128
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Weights { uint weights[]; };
layout(binding = 1) readonly buffer Ids { int ids[]; };
layout(binding = 2) writeonly buffer Out { float out_data[]; };

layout(push_constant) uniform Params {
    uint table_off;   // word offset of row row_first
    uint ids_off;
    uint out_off;
    uint cols;
    uint n;
    uint row_first;
    uint row_count;
} p;

#include "weights.glsl"

void main() {
#if defined(K_QUANT)
    const uint runs = p.cols / 32u, i = linear_invocation(WG);
    if (i >= runs * p.n) return;
    const uint t = i / runs, r = i % runs;
#else
    const uint i = linear_invocation(WG);
    if (i >= p.cols * p.n) return;
    const uint t = i / p.cols, c = i % p.cols;
#endif
    const uint row = uint(ids[p.ids_off + t]) - p.row_first;  // wraps to large for rows before the window
    if (row >= p.row_count) return;
#if defined(K_QUANT)
    const KRun run = k_run(p.table_off + row * weight_row_words(p.cols), r);
    const uint at = p.out_off + t * p.cols + 32u * r;
    for (uint j = 0u; j < 8u; ++j) {
        const vec4 v = k_run_values(run, j);
        for (uint k = 0u; k < 4u; ++k) out_data[at + 4u * j + k] = v[k];
    }
#else
    out_data[p.out_off + i] = weight_at(p.table_off + row * weight_row_words(p.cols), p.cols, c);
#endif
}
