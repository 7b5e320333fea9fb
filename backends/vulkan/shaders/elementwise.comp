#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Element-wise operations on count floats, compiled once per operation:
//   OP_ADD       a[i] += b[i]
//   OP_ADD_BIAS  a[i] += b[i % b_cols]: one row of b added to every row of a
//   OP_SWIGLU    a[i] = silu(a[i]) * b[i], silu(g) = g / (1 + exp(-g))

#define WG 128
layout(local_size_x = WG) in;

layout(binding = 0) buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };

layout(push_constant) uniform Params {
    uint a_off;
    uint b_off;
    uint count;
    uint b_cols;
} p;

void main() {
    const uint i = linear_invocation(WG);
    if (i >= p.count) return;
#if defined(OP_ADD)
    a[p.a_off + i] += b[p.b_off + i];
#elif defined(OP_ADD_BIAS)
    a[p.a_off + i] += b[p.b_off + i % p.b_cols];
#else
    const float g = a[p.a_off + i];
    a[p.a_off + i] = g / (1.0 + exp(-g)) * b[p.b_off + i];
#endif
}
