#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// out[t] = the index of the largest element of in[t] (ties: the smallest index), as the CPU
// backend's argmax: greedy sampling on the device, so a decoded token costs 4 bytes to read back
// instead of the whole vocabulary's logits. One workgroup per row.

#define WG 256
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer In { float in_data[]; };
layout(binding = 1) writeonly buffer Out { int out_data[]; };

layout(push_constant) uniform Params {
    uint in_off;
    uint out_off;
    uint cols;
} p;

#include "reduce.glsl"

void main() {
    const uint row = p.in_off + gl_WorkGroupID.x * p.cols;
    float best = uintBitsToFloat(0xFF800000u);  // -infinity
    for (uint c = gl_LocalInvocationIndex; c < p.cols; c += WG) best = max(best, in_data[row + c]);
    best = workgroup_max(best);
    // The smallest index holding the maximum, as the largest negated index (exact in a float for
    // rows shorter than 2^24).
    float first = -float(p.cols);
    for (uint c = gl_LocalInvocationIndex; c < p.cols; c += WG) {
        if (in_data[row + c] == best) first = max(first, -float(c));
    }
    first = workgroup_max(first);
    if (gl_LocalInvocationIndex == 0u) {
        const uint index = uint(-first);
        out_data[p.out_off + gl_WorkGroupID.x] = int(index < p.cols ? index : 0u);  // a row of NaNs: 0, as on the CPU
    }
}
