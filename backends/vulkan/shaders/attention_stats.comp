#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Folds the group-summed attention weights of a chunk of queries (from attention.comp) into the
// statistics of one layer's slots, as kv_policy_spec.h specifies: the chunk's queries are summed
// into a partial, which is then folded into the slot's statistics.
// One invocation per (slot, kv head); it walks the chunk's queries in order.

#define WG 64
layout(local_size_x = WG) in;

layout(binding = 0) buffer Meta { uint meta[]; };
layout(binding = 1) readonly buffer Scratch { float scratch[]; };

layout(push_constant) uniform Params {
    uvec2 first_index;  // stream index of the chunk's first token
    uint meta_off, n_cells, n_slots, n_kv, max_batch;  // n_slots: the most a cell of this layer holds (the scratch stride)
    uint first_slot, total_slots;                      // the first slot of the layer's pool (its rows); every cell's slots
    uint layer, scratch_off, chunk_capacity;
    uint chunk_tokens;  // tokens in this chunk
    uint t0;            // the chunk's first token within the batch
    uint n;             // tokens in the batch
    uint group;
    float decay;
    uint proxy;         // the batch's last `proxy` queries are summed into `last` (kv_is_proxy_query)
    uint window;        // a local layer's sliding window (0: a global layer)
} p;

#include "kv_layout.glsl"

void main() {
    const uint s = gl_GlobalInvocationID.x, h = gl_WorkGroupID.y;
    const KvLayout L = kv_layout(p.meta_off, p.n_cells, p.total_slots, p.n_kv, p.max_batch);
    const uint cell = p.layer * p.n_kv + h;
    if (s >= meta[L.used + cell]) return;
    const uint at = meta[L.cell_first + cell] + s;
    SlotStats chunk = kv_stats_zero();
    const uvec2 stream = uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]);
    if (!stream_is_free(stream)) {
        for (uint tt = 0u; tt < p.chunk_tokens; ++tt) {
            if (!stream_visible(stream, stream_add(p.first_index, tt), p.window)) continue;  // not (or no longer) visible
            const float w = scratch[p.scratch_off + 2u * ((tt * p.n_kv + h) * p.n_slots) + p.n_slots + s];
            const float visible = scratch[p.scratch_off + 2u * p.chunk_capacity * p.n_kv * p.n_slots + tt * p.n_kv + h];
            const uint t = p.t0 + tt;
            chunk = kv_stats_add_query(chunk, w, kv_importance_threshold(p.group, uint(visible)),
                                       kv_persistence_weight(p.decay, p.n, t), kv_is_proxy_query(p.n, t, p.proxy));
        }
    }
    // The batch's old statistics decay once, with its first chunk.
    const bool first_chunk = p.t0 == 0u;
    const SlotStats folded = kv_stats_fold(load_slot_stats(L, at), chunk, first_chunk ? kv_power(p.decay, p.n) : 1.0, first_chunk);
    const uint st = L.stats + 5u * at;
    meta[st] = floatBitsToUint(folded.accumulated);
    meta[st + 1u] = floatBitsToUint(folded.squared);
    meta[st + 2u] = floatBitsToUint(folded.steps);
    meta[st + 3u] = floatBitsToUint(folded.last);
    meta[st + 4u] = floatBitsToUint(folded.persistence);
}
