#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Rotates the leading 2 * pairs dimensions of every head of q and k in place, pair i (as `pairing`
// says: adjacent (x[2i], x[2i+1]), or halves (x[i], x[i + pairs])) by positions[t] times its
// frequency from the table (RotarySpec::inv_freq); with pos_head_stride, by the position of token
// t in the head's kv head. One invocation per (token, head of q then k, pair).

#define WG 64
layout(local_size_x = WG) in;

layout(binding = 0) buffer Q { float q[]; };
layout(binding = 1) buffer K { float k[]; };
layout(binding = 2) readonly buffer Positions { int positions[]; };
layout(binding = 3) readonly buffer Table { uvec2 turn_fractions[]; };  // per pair, see rotary.glsl

layout(push_constant) uniform Params {
    uint q_off;
    uint k_off;
    uint pos_off;
    uint table_off;  // in uvec2 units
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint pairs;      // rope_dims / 2
    uint n;
    uint q_stride;   // floats per token row
    uint k_stride;
    uint pos_head_stride;  // 0: one position per token; n: n per kv head, kv head after kv head
    uint pairing;          // PAIRING_ADJACENT or PAIRING_HALVES (rotary.glsl)
    float magnitude;       // RotarySpec::magnitude: cosine and sine are scaled by it
} p;

#include "rotary.glsl"

void main() {
    const uint i = linear_invocation(WG);
    const uint heads = p.n_head + p.n_head_kv;
    if (i >= p.n * heads * p.pairs) return;
    const uint pair = i % p.pairs, head = (i / p.pairs) % heads, t = i / (p.pairs * heads);
    // A query head takes its kv head's positions.
    const uint kv_head = head < p.n_head ? head / (p.n_head / p.n_head_kv) : head - p.n_head;
    const vec2 cs = rotary_cos_sin(positions[p.pos_off + kv_head * p.pos_head_stride + t], turn_fractions[p.table_off + pair]) * p.magnitude;
    const uvec2 e = rotary_pair_elements(p.pairing, pair, p.pairs);
    if (head < p.n_head) {
        const uint at = p.q_off + t * p.q_stride + head * p.head_dim;
        const vec2 r = rotate_pair(vec2(q[at + e.x], q[at + e.y]), cs);
        q[at + e.x] = r.x;
        q[at + e.y] = r.y;
    } else {
        const uint at = p.k_off + t * p.k_stride + (head - p.n_head) * p.head_dim;
        const vec2 r = rotate_pair(vec2(k[at + e.x], k[at + e.y]), cs);
        k[at + e.x] = r.x;
        k[at + e.y] = r.y;
    }
}
