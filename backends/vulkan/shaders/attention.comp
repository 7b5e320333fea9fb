#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Causal attention of a chunk of the batch's queries over one layer's KV slots (after
// kv_claim.comp stored the batch). One workgroup per (kv head, token): it handles the group of
// query heads sharing that kv head one after the other, so the group-summed weight of every slot,
// which the statistics need, is formed without atomics:
//   1. logits q.k * scale of the visible slots (stream index in [0, query index], and in a local
//      layer within the window before it), soft-capped when the model says so, with an online
//      max and sum of exponentials per invocation, combined over the workgroup;
//   2. each slot's weight exp(logit - max) / sum into `weights` and added into `group_weights`;
//   3. out = sum over slots of weight * value, the slots split among groups of invocations.
// attention_stats.comp then folds group_weights into the slots' statistics.

#define WG 128
#define MAX_HEAD_DIM 256
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) writeonly buffer Out { float out_data[]; };
// Rows in the formats of kv_row.glsl, read in place.
layout(binding = 2) readonly buffer Keys { uint keys[]; };
layout(binding = 3) readonly buffer Values { uint values[]; };
layout(binding = 4) readonly buffer Meta { uint meta[]; };
// Per (token of the chunk, kv head): n_slots weights of the current query head, n_slots group
// weights, and (after both) one visible-slot count per (token, kv head). Written and read back
// by the same workgroup.
layout(binding = 5) coherent buffer Scratch { float scratch[]; };

layout(push_constant) uniform Params {
    uvec2 first_index;  // stream index of the chunk's first token
    uint q_off, q_stride, out_off, out_stride;
    uint keys_off, values_off, meta_off, scratch_off;
    uint n_cells, n_slots, n_kv, max_batch;  // n_slots: the most a cell of this layer holds (the scratch stride)
    uint first_slot, total_slots;            // the first slot of the layer's pool (its rows); every cell's slots
    uint layer, head_dim, group;
    uint chunk_capacity;  // tokens the scratch holds (the visible counts follow the weights)
    float scale;
    uint key_format, value_format;  // KvRowFormat
    uint window;     // a local layer's sliding window (0: a global layer)
    float softcap;   // scores become softcap * tanh(score / softcap); 0: as they are
} p;

#include "kv_layout.glsl"
#include "kv_row.glsl"
#include "reduce.glsl"

shared float q_shared[MAX_HEAD_DIM];
shared float partial[WG];

// q_shared · the key row starting at word `row`, computed on the stored form (kv_row_format.h).
float key_dot(uint row) {
    const uint hd = p.head_dim;
    float sum = 0.0;
    switch (p.key_format) {
        case KV_F16:
            for (uint d = 0u; d < hd; ++d) sum += q_shared[d] * unpackHalf2x16(keys[row + d / 2u])[d & 1u];
            return sum;
        case KV_Q8:
            for (uint d = 0u; d < hd; ++d) sum += q_shared[d] * kv_q8(keys[row + 1u + d / 4u], d);
            return uintBitsToFloat(keys[row]) * sum;
        case KV_Q4: {
            // q · (min + scale * c) = min * sum(q) + scale * sum(q c)
            float sum_q = 0.0;
            for (uint d = 0u; d < hd; ++d) {
                sum_q += q_shared[d];
                sum += q_shared[d] * kv_q4(keys[row + 1u + d / 8u], d);
            }
            const vec2 scale_min = unpackHalf2x16(keys[row]);
            return scale_min.y * sum_q + scale_min.x * sum;
        }
        default:
            for (uint d = 0u; d < hd; ++d) sum += q_shared[d] * uintBitsToFloat(keys[row + d]);
            return sum;
    }
}

// w * element d of the value row starting at word `row`, computed on the stored form.
float weighted_value(uint row, uint d, float w) {
    switch (p.value_format) {
        case KV_F16: return w * unpackHalf2x16(values[row + d / 2u])[d & 1u];
        case KV_Q8: return (w * uintBitsToFloat(values[row])) * kv_q8(values[row + 1u + d / 4u], d);
        case KV_Q4: {
            const vec2 scale_min = unpackHalf2x16(values[row]);
            return w * scale_min.y + (w * scale_min.x) * kv_q4(values[row + 1u + d / 8u], d);
        }
        default: return w * uintBitsToFloat(values[row + d]);
    }
}

// The scaled and (softcap) capped score of a slot.
float score(uint row) {
    const float x = key_dot(row) * p.scale;
    return p.softcap == 0.0 ? x : p.softcap * safe_tanh(x / p.softcap);
}

void main() {
    const uint tid = gl_LocalInvocationIndex;
    const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    const KvLayout L = kv_layout(p.meta_off, p.n_cells, p.total_slots, p.n_kv, p.max_batch);
    const uint cell = p.layer * p.n_kv + h, cell_base = meta[L.cell_first + cell];
    const uint used = meta[L.used + cell];
    const uvec2 query_index = stream_add(p.first_index, t);
    const uint hd = p.head_dim;
    const uint row = (t * p.n_kv + h) * p.n_slots;
    const uint weights_at = p.scratch_off + 2u * row;        // this query head's weights
    const uint group_at = weights_at + p.n_slots;             // summed over the group
    const uint visible_at = p.scratch_off + 2u * p.chunk_capacity * p.n_kv * p.n_slots + t * p.n_kv + h;
    const uint kv_base = cell_base - p.first_slot;  // the cell's first row in the keys and values bound
    const uint key_words = kv_row_words(p.key_format, hd), value_words = kv_row_words(p.value_format, hd);

    float visible = 0.0;
    for (uint s = tid; s < used; s += WG) {
        const uint at = cell_base + s;
        const uvec2 st = uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]);
        if (stream_visible(st, query_index, p.window)) visible += 1.0;
    }
    visible = workgroup_sum(visible);

    for (uint g = 0u; g < p.group; ++g) {
        const uint head = h * p.group + g;
        for (uint d = tid; d < hd; d += WG) q_shared[d] = q[p.q_off + t * p.q_stride + head * hd + d];
        barrier();

        // 1. online max / sum of exponentials
        float m = -1.0 / 0.0, l = 0.0;
        for (uint s = tid; s < used; s += WG) {
            const uint at = cell_base + s;
            const uvec2 st = uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]);
            if (!stream_visible(st, query_index, p.window)) continue;
            const float x = score(p.keys_off + (kv_base + s) * key_words);
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
            const uint at = cell_base + s;
            const uvec2 st = uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]);
            float w = 0.0;
            if (stream_visible(st, query_index, p.window)) {
                w = exp(score(p.keys_off + (kv_base + s) * key_words) - m_all) * inv;
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
                    if (w != 0.0) acc += weighted_value(p.values_off + (kv_base + s) * value_words, d, w);
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
                    if (w != 0.0) acc += weighted_value(p.values_off + (kv_base + s) * value_words, d, w);
                }
                out_data[out_row + d] = acc;
            }
        }
        barrier();  // q_shared, partial and the weights row are reused by the next head
    }
    if (tid == 0u) scratch[visible_at] = visible;
}
