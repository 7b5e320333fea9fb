// Shared by every kernel. Included right after "#version 450" and the include extension, so the
// #extension lines below still come before any other token.
//
// Conventions (see vk_backend.h): every tensor is bound as a storage buffer window and
// addressed by a 32-bit word offset from push constants; floats are stored as raw words.
// USE_SUBGROUPS is defined for the variant compiled against Vulkan 1.1 subgroup arithmetic; the
// other variant reduces through shared memory only.

#ifdef USE_SUBGROUPS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

// A large 1-D problem is dispatched as a 2-D grid of workgroups (the x count is limited to 65535);
// this is the linear index of an invocation in such a grid.
uint linear_invocation(uint wg_size) {
    return gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * wg_size;
}

// 64-bit stream indices are kept as (low word, high word) pairs, since shaderInt64 is optional.
// Free slots hold -1, i.e. (0xFFFFFFFF, 0xFFFFFFFF).
bool stream_is_free(uvec2 s) { return int(s.y) < 0; }
// a <= b for non-negative indices.
bool stream_le(uvec2 a, uvec2 b) { return a.y < b.y || (a.y == b.y && a.x <= b.x); }
bool stream_lt(uvec2 a, uvec2 b) { return a.y < b.y || (a.y == b.y && a.x < b.x); }
uvec2 stream_add(uvec2 a, uint b) {
    uint carry;
    uint lo = uaddCarry(a.x, b, carry);
    return uvec2(lo, a.y + carry);
}

// Whether a query at stream index q sees the token at stream index st: a stored token not after
// it and, in a local layer (window > 0), less than `window` tokens before it.
bool stream_visible(uvec2 st, uvec2 q, uint window) {
    if (stream_is_free(st) || !stream_le(st, q)) return false;
    return window == 0u || !stream_le(stream_add(st, window), q);
}

// tanh without the overflow of exp(2x): beyond |x| = 15 tanh is +-1 in float anyway.
float safe_tanh(float x) { return tanh(clamp(x, -15.0, 15.0)); }
