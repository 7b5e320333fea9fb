#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// out[t] = in[t] / sqrt(mean(in[t]^2) + eps) * weight. One workgroup per row. Every invocation
// writes only the elements it read, so out may alias in.

#define WG 128
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer In { float in_data[]; };
layout(binding = 1) readonly buffer Weight { float weight[]; };
layout(binding = 2) writeonly buffer Out { float out_data[]; };

layout(push_constant) uniform Params {
    uint in_off;
    uint weight_off;
    uint out_off;
    uint cols;
    float eps;
} p;

#include "reduce.glsl"

void main() {
    const uint row_in = p.in_off + gl_WorkGroupID.x * p.cols;
    const uint row_out = p.out_off + gl_WorkGroupID.x * p.cols;
    float sum = 0.0;
    for (uint c = gl_LocalInvocationIndex; c < p.cols; c += WG) sum += in_data[row_in + c] * in_data[row_in + c];
    sum = workgroup_sum(sum);
    const float scale = 1.0 / sqrt(sum / float(p.cols) + p.eps);
    for (uint c = gl_LocalInvocationIndex; c < p.cols; c += WG) {
        out_data[row_out + c] = in_data[row_in + c] * scale * weight[p.weight_off + c];
    }
}
