#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Expected Attention (kv_policy_spec.h) for one global layer, before kv_claim.comp makes room:
// per kv head, folds the batch's queries into the cell's running query statistics (as
// KvCache::observe_queries does), then scores the cell's held slots (KvCache::score_keys) into the
// first statistics word of each slot, which kv_claim.comp's priority() reads. The policy gathers
// no attention statistics, so those words are free.
//
// The query statistics are a region of the bookkeeping buffer after kv_meta_layout.h's: per
// cell, the queries seen, the first position of the latest batch, the means per query head and
// dimension, then the variances (KvImage::query_stats). Sums run in the CPU's order; sine and
// cosine come from the turn fractions of rotary.glsl, so scores agree with the CPU to rounding.

#define WG 128
#define MAX_HEAD_DIM 256
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer Q { float q_in[]; };
layout(binding = 1) readonly buffer Positions { int positions[]; };
layout(binding = 2) readonly buffer Keys { uint keys[]; };
layout(binding = 3) readonly buffer Values { uint values[]; };
layout(binding = 4) coherent buffer Meta { uint meta[]; };
layout(binding = 5) readonly buffer Table { uvec2 turn_fractions[]; };

layout(push_constant) uniform Params {
    uint q_off, q_stride, pos_off, keys_off, values_off, table_off;
    uint meta_off, n_cells, total_slots, n_kv, max_batch, first_slot;
    uint query_off;  // the query statistics' first word
    uint layer, head_dim, group, n, pairs;
    uint flags;    // FLAG_POSITIONS_PER_KV_HEAD, FLAG_HALVES_PAIRING (as kv_claim.comp's)
    uint formats;  // KvRowFormat of keys | of values << 8
    float scale;  // of q·k
} p;

const uint FLAG_POSITIONS_PER_KV_HEAD = 4u, FLAG_HALVES_PAIRING = 8u;
#define KEY_FORMAT (p.formats & 0xFFu)
#define VALUE_FORMAT (p.formats >> 8)

#include "kv_layout.glsl"
#include "kv_row.glsl"
#include "rotary.glsl"

KvLayout L;

float word_float(uint at) { return uintBitsToFloat(meta[at]); }
void set_word_float(uint at, float x) { meta[at] = floatBitsToUint(x); }
bool held(uint at) { return int(meta[L.stream + 2u * at + 1u]) >= 0; }

// Decodes a key row or a value row into kv_row.
void load_key(uint row) {
    const uint data = row + kv_header_words(KEY_FORMAT), per_word = kv_elements_per_word(KEY_FORMAT);
    for (uint j = 0u; j < p.head_dim; ++j) kv_row[j] = kv_element(KEY_FORMAT, keys[row], keys[data + j / per_word], j);
}
void load_value(uint row) {
    const uint data = row + kv_header_words(VALUE_FORMAT), per_word = kv_elements_per_word(VALUE_FORMAT);
    for (uint j = 0u; j < p.head_dim; ++j) kv_row[j] = kv_element(VALUE_FORMAT, values[row], values[data + j / per_word], j);
}

// One query value x into a dimension's mean and variance (KvCache::observe_queries).
void fold(uint mean, uint variance, float x, float rate) {
    const float d = x - word_float(mean);
    set_word_float(variance, kv_query_variance(word_float(variance), d, rate));
    set_word_float(mean, kv_query_mean(word_float(mean), d, rate));
}

// The cell's running statistics after the batch's queries: one invocation per (query head,
// rotary pair or unrotated dimension), each walking the tokens in order.
void observe(uint cell, uint h, uint stats) {
    const uint tid = gl_LocalInvocationIndex, hd = p.head_dim, dims = 2u * p.pairs;
    const uint units = p.pairs + (hd - dims);
    const uint pairing = (p.flags & FLAG_HALVES_PAIRING) != 0u ? PAIRING_HALVES : PAIRING_ADJACENT;
    const uint head_positions = (p.flags & FLAG_POSITIONS_PER_KV_HEAD) != 0u ? h * p.n : 0u;
    const float count = word_float(stats), window = kv_expected_attention_queries();
    for (uint u = tid; u < p.group * units; u += WG) {
        const uint g = u / units, i = u % units;
        const uint mean = stats + 2u + g * hd, variance = mean + p.group * hd;
        const uint q_head = p.q_off + (h * p.group + g) * hd;
        const bool rotated = i < p.pairs;
        const uvec2 e = rotated ? rotary_pair_elements(pairing, i, p.pairs) : uvec2(dims + (i - p.pairs));
        for (uint t = 0u; t < p.n; ++t) {
            const float rate = kv_query_rate(min(count + float(t), window), window);
            vec2 x = vec2(q_in[q_head + t * p.q_stride + e.x], q_in[q_head + t * p.q_stride + e.y]);
            if (rotated) x = rotate_pair(x, rotary_cos_sin(-positions[p.pos_off + head_positions + t], turn_fractions[p.table_off + i]));
            fold(mean + e.x, variance + e.x, x.x, rate);
            if (rotated) fold(mean + e.y, variance + e.y, x.y, rate);
        }
    }
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        set_word_float(stats, min(count + float(p.n), window));
        set_word_float(stats + 1u, float(positions[p.pos_off + head_positions]));
    }
    memoryBarrierBuffer();
    barrier();
}

// Per rotary pair, the average rotation over the cell's next T positions (KvCache::score_keys):
// cos and sin of θ(p + (T - 1) / 2), that is of θ/2 times 2p + T - 1, times the Dirichlet
// kernel sin(θT/2) / (T sin(θ/2)).
shared vec2 rotation[MAX_HEAD_DIM / 2];
shared float top_logit, sum_exp;

void score(uint cell, uint stats) {
    const uint tid = gl_LocalInvocationIndex, hd = p.head_dim;
    const uint base = meta[L.cell_first + cell], used = meta[L.used + cell];
    const int first = int(word_float(stats + 1u));
    const uint T = meta[L.cell_slots + cell];
    for (uint i = tid; i < p.pairs; i += WG) {
        const uvec2 g = turn_fractions[p.table_off + i];
        const uvec2 half_turns = uvec2((g.x >> 1) | (g.y << 31), g.y >> 1);
        const float s_half = rotary_cos_sin(1, half_turns).y;
        const float spread = abs(s_half) < 1e-12 ? 1.0 : rotary_cos_sin(int(T), half_turns).y / (float(T) * s_half);
        rotation[i] = rotary_cos_sin(2 * first + int(T) - 1, half_turns) * spread;
    }
    for (uint s = tid; s < used; s += WG) set_word_float(L.stats + 5u * (base + s), 0.0);
    memoryBarrierBuffer();
    barrier();
    const uint pairing = (p.flags & FLAG_HALVES_PAIRING) != 0u ? PAIRING_HALVES : PAIRING_ADJACENT;
    const uint key_words = kv_row_words(KEY_FORMAT, hd), value_words = kv_row_words(VALUE_FORMAT, hd);
    for (uint g = 0u; g < p.group; ++g) {
        const uint mean = stats + 2u + g * hd, variance = mean + p.group * hd;
        // Each held slot's logit into its second statistics word.
        for (uint s = tid; s < used; s += WG) {
            const uint at = base + s;
            if (!held(at)) continue;
            load_key(p.keys_off + (at - p.first_slot) * key_words);
            float z = 0.0;
            for (uint i = 0u; i < p.pairs; ++i) {
                const uvec2 e = rotary_pair_elements(pairing, i, p.pairs);
                const vec2 r = rotation[i];
                const float u1 = kv_expected_pair_u_first(kv_row[e.x], kv_row[e.y], r.x, r.y);
                const float u2 = kv_expected_pair_u_second(kv_row[e.x], kv_row[e.y], r.x, r.y);
                z += kv_expected_logit_term(u1, word_float(mean + e.x), word_float(variance + e.x), p.scale) +
                     kv_expected_logit_term(u2, word_float(mean + e.y), word_float(variance + e.y), p.scale);
            }
            for (uint j = 2u * p.pairs; j < hd; ++j) {
                z += kv_expected_logit_term(kv_row[j], word_float(mean + j), word_float(variance + j), p.scale);
            }
            set_word_float(L.stats + 5u * at + 1u, z);
        }
        memoryBarrierBuffer();
        barrier();
        // The softmax's maximum and sum in slot order, as the CPU sums it.
        if (tid == 0u) {
            float top = uintBitsToFloat(0xFF800000u), sum = 0.0;  // -infinity
            for (uint s = 0u; s < used; ++s) {
                if (held(base + s)) top = max(top, word_float(L.stats + 5u * (base + s) + 1u));
            }
            for (uint s = 0u; s < used; ++s) {
                if (held(base + s)) sum += exp(word_float(L.stats + 5u * (base + s) + 1u) - top);
            }
            top_logit = top;
            sum_exp = sum;
        }
        barrier();
        for (uint s = tid; s < used; s += WG) {
            const uint at = base + s;
            if (!held(at)) continue;
            const float w = exp(word_float(L.stats + 5u * at + 1u) - top_logit) / (sum_exp * float(p.group));
            set_word_float(L.stats + 5u * at, word_float(L.stats + 5u * at) + w);
        }
        memoryBarrierBuffer();
        barrier();
    }
    for (uint s = tid; s < used; s += WG) {
        const uint at = base + s;
        if (!held(at)) continue;
        load_value(p.values_off + (at - p.first_slot) * value_words);
        float sum = 0.0;
        for (uint j = 0u; j < hd; ++j) sum += kv_row[j] * kv_row[j];
        set_word_float(L.stats + 5u * at, kv_expected_attention_priority(word_float(L.stats + 5u * at), sqrt(sum)));
    }
}

void main() {
    L = kv_layout(p.meta_off, p.n_cells, p.total_slots, p.n_kv, p.max_batch);
    const uint words = 2u + 2u * p.group * p.head_dim;
    for (uint h = gl_WorkGroupID.x; h < p.n_kv; h += gl_NumWorkGroups.x) {
        const uint cell = p.layer * p.n_kv + h, stats = p.query_off + cell * words;
        observe(cell, h, stats);
        // Scores are read only when the batch must evict (kv_claim.comp's make_room).
        const uint room = meta[L.cell_slots + cell] - meta[L.used + cell] + meta[L.free_count + cell];
        if (p.n > room) score(cell, stats);
        memoryBarrierBuffer();
        barrier();
    }
}
