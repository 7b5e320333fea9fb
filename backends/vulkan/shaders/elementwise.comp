#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Element-wise operations on count floats, compiled once per operation:
//   OP_ADD       a[i] += b[i]
//   OP_ADD_BIAS  a[i] += b[i % b_cols]: one row of b added to every row of a
//   OP_SWIGLU    a[i] = silu(a[i]) * b[i], silu(g) = g / (1 + exp(-g))
//   OP_GEGLU     a[i] = gelu(a[i]) * b[i], GELU's tanh approximation (activation.h)
//   OP_SCALE     a[i] *= value
//   OP_SOFTCAP   a[i] = value * tanh(a[i] / value)

#define WG 128
layout(local_size_x = WG) in;

layout(binding = 0) buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };

layout(push_constant) uniform Params {
    uint a_off;
    uint b_off;
    uint count;
    uint b_cols;
    float value;  // scale, softcap
} p;

void main() {
    const uint i = linear_invocation(WG);
    if (i >= p.count) return;
#if defined(OP_ADD)
    a[p.a_off + i] += b[p.b_off + i];
#elif defined(OP_ADD_BIAS)
    a[p.a_off + i] += b[p.b_off + i % p.b_cols];
#elif defined(OP_GEGLU)
    const float g = a[p.a_off + i];
    // activation.h's sigmoid form; the argument clamped so that exp cannot overflow.
    const float arg = clamp(1.5957691216057308 * g * (1.0 + 0.044715 * g * g), -80.0, 80.0);
    a[p.a_off + i] = g / (1.0 + exp(-arg)) * b[p.b_off + i];
#elif defined(OP_SCALE)
    a[p.a_off + i] *= p.value;
#elif defined(OP_SOFTCAP)
    a[p.a_off + i] = p.value * safe_tanh(a[p.a_off + i] / p.value);
#else
    const float g = a[p.a_off + i];
    a[p.a_off + i] = g / (1.0 + exp(-g)) * b[p.b_off + i];
#endif
}
