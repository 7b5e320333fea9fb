#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Folds the group-summed attention weights of a chunk of queries (from attention.comp) into the
// statistics of one layer's slots (kv_policy.h), with the CPU backend's formulation: over a batch
// of n queries, persistence becomes decay^n * old + sum of decay^(n-1-t) for every query t that
// found the slot important (w > group / visible), and `last` is the last query's weight.
// One invocation per (slot, kv head); it walks the chunk's queries in order.

#define WG 64
layout(local_size_x = WG) in;

layout(binding = 0) buffer Meta { uint meta[]; };
layout(binding = 1) readonly buffer Scratch { float scratch[]; };

layout(push_constant) uniform Params {
    uvec2 first_index;  // stream index of the chunk's first token
    uint meta_off, n_cells, n_slots, n_kv, max_batch;
    uint layer, scratch_off, chunk_capacity;
    uint chunk_tokens;  // tokens in this chunk
    uint t0;            // the chunk's first token within the batch
    uint n;             // tokens in the batch
    uint group;
    float decay;
} p;

#include "kv_layout.glsl"

float power(float x, uint k) {
    float r = 1.0;
    for (; k > 0u; k >>= 1) {
        if ((k & 1u) != 0u) r *= x;
        x *= x;
    }
    return r;
}

void main() {
    const uint s = gl_GlobalInvocationID.x, h = gl_WorkGroupID.y;
    const KvLayout L = kv_layout(p.meta_off, p.n_cells, p.n_slots, p.n_kv, p.max_batch);
    const uint cell = p.layer * p.n_kv + h;
    if (s >= meta[L.used + cell]) return;
    const uint at = cell * p.n_slots + s;
    const uint st = L.stats + 5u * at;
    float accumulated = uintBitsToFloat(meta[st + STAT_ACCUMULATED]);
    float squared = uintBitsToFloat(meta[st + STAT_SQUARED]);
    float steps = uintBitsToFloat(meta[st + STAT_STEPS]);
    float last = uintBitsToFloat(meta[st + STAT_LAST]);
    float persistence = uintBitsToFloat(meta[st + STAT_PERSISTENCE]);
    if (p.t0 == 0u) persistence *= power(p.decay, p.n);

    const uvec2 stream = uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]);
    if (!stream_is_free(stream)) {
        for (uint tt = 0u; tt < p.chunk_tokens; ++tt) {
            if (!stream_le(stream, stream_add(p.first_index, tt))) continue;  // not yet visible
            const float w = scratch[p.scratch_off + 2u * ((tt * p.n_kv + h) * p.n_slots) + p.n_slots + s];
            const float visible = scratch[p.scratch_off + 2u * p.chunk_capacity * p.n_kv * p.n_slots + tt * p.n_kv + h];
            const uint t = p.t0 + tt;
            accumulated += w;
            squared += w * w;
            steps += 1.0;
            if (w > float(p.group) / visible) persistence += power(p.decay, p.n - 1u - t);
            if (t == p.n - 1u) last = w;
        }
    }
    meta[st + STAT_ACCUMULATED] = floatBitsToUint(accumulated);
    meta[st + STAT_SQUARED] = floatBitsToUint(squared);
    meta[st + STAT_STEPS] = floatBitsToUint(steps);
    meta[st + STAT_LAST] = floatBitsToUint(last);
    meta[st + STAT_PERSISTENCE] = floatBitsToUint(persistence);
}
