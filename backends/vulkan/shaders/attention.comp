#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Causal attention of a chunk of the batch's queries over one layer's KV slots (after
// kv_claim.comp stored the batch). One workgroup per (kv head, token): it handles the group of
// query heads sharing that kv head one after the other, so the group-summed weight of every slot,
// which the statistics need, is formed without atomics:
//   1. logits q.k * scale of the visible slots (stream index in [0, query index]), with an online
//      max and sum of exponentials per invocation, combined over the workgroup;
//   2. each slot's weight exp(logit - max) / sum into `weights` and added into `group_weights`;
//   3. out = sum over slots of weight * value, the slots split among groups of invocations.
// attention_stats.comp then folds group_weights into the slots' statistics.

#define WG 128
#define MAX_HEAD_DIM 256
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) writeonly buffer Out { float out_data[]; };
layout(binding = 2) readonly buffer Keys { float keys[]; };
layout(binding = 3) readonly buffer Values { float values[]; };
layout(binding = 4) readonly buffer Meta { uint meta[]; };
// Per (token of the chunk, kv head): n_slots weights of the current query head, n_slots group
// weights, and (after both) one visible-slot count per (token, kv head). Written and read back
// by the same workgroup.
layout(binding = 5) coherent buffer Scratch { float scratch[]; };

layout(push_constant) uniform Params {
    uvec2 first_index;  // stream index of the chunk's first token
    uint q_off, q_stride, out_off, out_stride;
    uint keys_off, values_off, meta_off, scratch_off;
    uint n_cells, n_slots, n_kv, max_batch;
    uint layer, head_dim, group;
    uint chunk_capacity;  // tokens the scratch holds (the visible counts follow the weights)
    float scale;
} p;

#include "kv_layout.glsl"
#include "reduce.glsl"

shared float q_shared[MAX_HEAD_DIM];
shared float partial[WG];

void main() {
    const uint tid = gl_LocalInvocationIndex;
    const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    const KvLayout L = kv_layout(p.meta_off, p.n_cells, p.n_slots, p.n_kv, p.max_batch);
    const uint cell = p.layer * p.n_kv + h;
    const uint used = meta[L.used + cell];
    const uvec2 query_index = stream_add(p.first_index, t);
    const uint hd = p.head_dim;
    const uint row = (t * p.n_kv + h) * p.n_slots;
    const uint weights_at = p.scratch_off + 2u * row;        // this query head's weights
    const uint group_at = weights_at + p.n_slots;             // summed over the group
    const uint visible_at = p.scratch_off + 2u * p.chunk_capacity * p.n_kv * p.n_slots + t * p.n_kv + h;
    const uint kv_base = h * p.n_slots;

    float visible = 0.0;
    for (uint s = tid; s < used; s += WG) {
        const uint at = cell * p.n_slots + s;
        const uvec2 st = uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]);
        if (!stream_is_free(st) && stream_le(st, query_index)) visible += 1.0;
    }
    visible = workgroup_sum(visible);

    for (uint g = 0u; g < p.group; ++g) {
        const uint head = h * p.group + g;
        for (uint d = tid; d < hd; d += WG) q_shared[d] = q[p.q_off + t * p.q_stride + head * hd + d];
        barrier();

        // 1. online max / sum of exponentials
        float m = -1.0 / 0.0, l = 0.0;
        for (uint s = tid; s < used; s += WG) {
            const uint at = cell * p.n_slots + s;
            const uvec2 st = uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]);
            if (stream_is_free(st) || !stream_le(st, query_index)) continue;
            float dot_qk = 0.0;
            const uint key = p.keys_off + (kv_base + s) * hd;
            for (uint d = 0u; d < hd; ++d) dot_qk += q_shared[d] * keys[key + d];
            const float x = dot_qk * p.scale;
            if (x > m) {
                l = l * exp(m - x) + 1.0;
                m = x;
            } else {
                l += exp(x - m);
            }
        }
        const float m_all = workgroup_max(m);
        const float l_all = workgroup_sum(m == -1.0 / 0.0 ? 0.0 : l * exp(m - m_all));
        const float inv = 1.0 / l_all;

        // 2. weights
        for (uint s = tid; s < used; s += WG) {
            const uint at = cell * p.n_slots + s;
            const uvec2 st = uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]);
            float w = 0.0;
            if (!stream_is_free(st) && stream_le(st, query_index)) {
                float dot_qk = 0.0;
                const uint key = p.keys_off + (kv_base + s) * hd;
                for (uint d = 0u; d < hd; ++d) dot_qk += q_shared[d] * keys[key + d];
                w = exp(dot_qk * p.scale - m_all) * inv;
            }
            scratch[weights_at + s] = w;
            scratch[group_at + s] = (g == 0u ? 0.0 : scratch[group_at + s]) + w;
        }
        memoryBarrierBuffer();
        barrier();

        // 3. out = sum_s w_s v_s. With head_dim <= WG, WG / head_dim groups of invocations each take
        // every (WG / head_dim)-th slot and their partial sums are added in shared memory.
        const uint out_row = p.out_off + t * p.out_stride + head * hd;
        if (hd <= WG) {
            const uint parts = WG / hd, part = tid / hd, d = tid % hd;
            float acc = 0.0;
            if (part < parts) {
                for (uint s = part; s < used; s += parts) {
                    const float w = scratch[weights_at + s];
                    if (w != 0.0) acc += w * values[p.values_off + (kv_base + s) * hd + d];
                }
            }
            partial[tid] = acc;
            barrier();
            if (tid < hd) {
                float sum = 0.0;
                for (uint k = 0u; k < parts; ++k) sum += partial[k * hd + tid];
                out_data[out_row + tid] = sum;
            }
        } else {
            for (uint d = tid; d < hd; d += WG) {
                float acc = 0.0;
                for (uint s = 0u; s < used; ++s) {
                    const float w = scratch[weights_at + s];
                    if (w != 0.0) acc += w * values[p.values_off + (kv_base + s) * hd + d];
                }
                out_data[out_row + d] = acc;
            }
        }
        barrier();  // q_shared, partial and the weights row are reused by the next head
    }
    if (tid == 0u) scratch[visible_at] = visible;
}
