#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// The first step of attention for one layer: per kv head, make room for the batch's n tokens by
// evicting victims as kv_policy.h specifies (exactly as KvCache::make_room does), re-rotate the
// kept keys when positions roll, take a slot for each token (KvCache::claim_slot: the most
// recently freed slot first, else the next never-used one) and store the token's key and value.
//
// One workgroup per kv head, except for the random policy: its generator is a single sequence
// over (layer, kv head) in order, so one workgroup then walks the kv heads in turn.
//
// Keys and values are rows in the formats of kv_row.glsl. Storing encodes a row exactly as
// kv_store_row() does; re-rotating a rolled key decodes it, rotates it and encodes it again, as
// KvCache::rotate_back() does.

#define WG 128
#define MAX_HEAD_DIM 256
layout(local_size_x = WG) in;

layout(binding = 0) readonly buffer K { float k_in[]; };
layout(binding = 1) readonly buffer V { float v_in[]; };
layout(binding = 2) readonly buffer Positions { int positions[]; };
layout(binding = 3) buffer Keys { uint keys[]; };
layout(binding = 4) writeonly buffer Values { uint values[]; };
// Written by one invocation and read by others of the workgroup after a barrier.
layout(binding = 5) coherent buffer Meta { uint meta[]; };
layout(binding = 6) readonly buffer Table { vec2 rollback_table[]; };  // kv_rotate_back_table: [shift][pair] (cos, sin)

layout(push_constant) uniform Params {
    uvec2 first_index;  // stream index of the batch's first token
    uvec2 recent_from;  // stream indices >= this are in the protected recent window (clamped to >= 0)
    uvec2 stale_before; // stream indices < this are stale (kv_stale_before; 0: none)
    uint k_off, v_off, pos_off, k_stride, v_stride;
    uint keys_off, values_off, table_off;  // keys/values: the rows of the layer's pool, its cells' regions in order
    uint meta_off, n_cells, n_slots, n_kv, max_batch;  // n_slots: the most a cell of this layer holds
    uint first_slot, total_slots;                      // the first slot of the layer's pool (its rows); every cell's slots
    uint layer, head_dim, n, tag, policy, sinks, pairs;
    uint flags;    // FLAG_ROLLING, FLAG_BY_PROXY (kv_ranks_by_proxy), FLAG_POSITIONS_PER_KV_HEAD, FLAG_HALVES_PAIRING
    uint formats;  // KvRowFormat of keys | of values << 8
    float prompt_share;  // kv_prompt_random_factor's share and seed
    uint prompt_seed;
} p;

// FLAG_POSITIONS_PER_KV_HEAD: positions holds n per kv head, kv head after kv head (AttentionBatch).
// FLAG_HALVES_PAIRING: the rotary pairs are the halves of the rotated dimensions (rotary.glsl).
const uint FLAG_ROLLING = 1u, FLAG_BY_PROXY = 2u, FLAG_POSITIONS_PER_KV_HEAD = 4u, FLAG_HALVES_PAIRING = 8u;
#define KEY_FORMAT (p.formats & 0xFFu)
#define VALUE_FORMAT (p.formats >> 8)

#include "kv_layout.glsl"
#include "kv_row.glsl"
#include "kv_victim_rules.h"
#include "rotary.glsl"
vec2 rollback_cos_sin(int shift, uint i) { return rollback_table[p.table_off + uint(shift) * p.pairs + i]; }
#include "kv_key_rows.glsl"

const uint NONE = 0xFFFFFFFFu;

KvLayout L;
uint cell_now;  // the cell being served (main's loop)

uvec2 stream_at(uint at) { return uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]); }
void set_stream(uint at, uvec2 s) {
    meta[L.stream + 2u * at] = s.x;
    meta[L.stream + 2u * at + 1u] = s.y;
}
// The query-agnostic scorers (kv_policy_spec.h) gather no statistics: make_room computes their
// scores into the first statistics word of each slot (score_keys), and priority() reads it.
float score_word(uint at, uint k) { return uintBitsToFloat(meta[L.stats + 5u * at + k]); }
void set_score_word(uint at, uint k, float x) { meta[L.stats + 5u * at + k] = floatBitsToUint(x); }
const uint SCORE = 0u, KEY_NORM = 1u;

// The victim is the eligible slot with the smallest kv_batch_priority, ties going to the oldest.
float priority(uint at) {
    const uvec2 stream = stream_at(at);
    if (kv_policy_scores_keys(p.policy)) return kv_scored_priority(score_word(at, SCORE), kv_index_less(stream, p.stale_before));
    return kv_batch_priority(p.policy, (p.flags & FLAG_BY_PROXY) != 0u, load_slot_stats(L, at), kv_index_less(stream, p.stale_before), stream,
                             cell_now, p.prompt_seed, p.prompt_share);
}

bool occupied_unpinned(uint at) { return kv_slot_evictable_by_age(stream_at(at), kv_tag_pinned(meta[L.tag + at])); }

// Outside every protection: not pinned, not in the recent window, not a sink.
bool eligible(uint at) { return kv_slot_evictable(stream_at(at), kv_tag_pinned(meta[L.tag + at]), p.recent_from, p.sinks); }

// ---- retention spans ----------------------------------------------------------------------------
// Per span, the cell's tokens of it (held) and how many of those are eligible; held goes down as
// victims are taken, and a span's tokens stop being taken at its minimum (KvCache::make_room).

shared uint span_held[KV_MAX_SPANS];
shared uint span_eligible[KV_MAX_SPANS];

void count_spans(uint base, uint used) {
    const uint tid = gl_LocalInvocationIndex;
    if (tid < KV_MAX_SPANS) {
        span_held[tid] = 0u;
        span_eligible[tid] = 0u;
    }
    barrier();
    for (uint s = tid; s < used; s += WG) {
        const uint at = base + s, span = kv_tag_span(meta[L.tag + at]);
        if (span == 0u || stream_is_free(stream_at(at))) continue;
        atomicAdd(span_held[span - 1u], 1u);
        if (eligible(at)) atomicAdd(span_eligible[span - 1u], 1u);
    }
    barrier();
}

bool span_allows(uint at) {
    const uint span = kv_tag_span(meta[L.tag + at]);
    return span == 0u || kv_span_allows_eviction(span_held[span - 1u], meta[L.span_min + span - 1u]);
}

// One invocation, after span_allows(at): the victim leaves its span's count.
void leave_span(uint at) {
    const uint span = kv_tag_span(meta[L.tag + at]);
    if (span != 0u) span_held[span - 1u] -= 1u;
}

// How many eligible tokens can be taken before every span is down to its minimum.
uint takeable(uint plain_candidates) {
    uint total = plain_candidates;
    for (uint i = 0u; i < KV_MAX_SPANS; ++i) total += kv_span_takeable(span_held[i], span_eligible[i], meta[L.span_min + i]);
    return total;
}

// ---- workgroup argmin over the slots of a cell ------------------------------------------------

shared float best_priority[WG];
shared uvec2 best_stream[WG];
shared uint best_slot[WG];

// kv_victim_before, with NONE (no slot) after every slot.
bool key_less(float pa, uvec2 sa, uint slot_a, float pb, uvec2 sb, uint slot_b) {
    if (slot_b == NONE) return slot_a != NONE;
    if (slot_a == NONE) return false;
    return kv_victim_before(pa, sa, pb, sb);
}

// The slot with the smallest (priority, stream index) among eligible slots (by_age: among
// occupied unpinned slots, by stream index alone) that their spans allow to go, or NONE.
uint argmin_slot(uint base, uint used, bool by_age) {
    const uint tid = gl_LocalInvocationIndex;
    float bp = 0.0;
    uvec2 bs = uvec2(0u);
    uint bslot = NONE;
    for (uint s = tid; s < used; s += WG) {
        const uint at = base + s;
        if ((by_age ? !occupied_unpinned(at) : !eligible(at)) || !span_allows(at)) continue;
        const float pr = by_age ? 0.0 : priority(at);
        const uvec2 st = stream_at(at);
        if (key_less(pr, st, s, bp, bs, bslot)) {
            bp = pr;
            bs = st;
            bslot = s;
        }
    }
    best_priority[tid] = bp;
    best_stream[tid] = bs;
    best_slot[tid] = bslot;
    barrier();
    for (uint half_size = WG / 2u; half_size > 0u; half_size >>= 1) {
        if (tid < half_size) {
            const uint o = tid + half_size;
            if (key_less(best_priority[o], best_stream[o], best_slot[o], best_priority[tid], best_stream[tid], best_slot[tid])) {
                best_priority[tid] = best_priority[o];
                best_stream[tid] = best_stream[o];
                best_slot[tid] = best_slot[o];
            }
        }
        barrier();
    }
    const uint result = best_slot[0];
    barrier();
    return result;
}

// ---- the random policy's generator (kv_victim_rules.h), its state in the cache's metadata -------

uvec2 next_random() {
    const uvec2 state = kv_random_step(uvec2(meta[L.rng], meta[L.rng + 1u]));
    meta[L.rng] = state.x;
    meta[L.rng + 1u] = state.y;
    return kv_random_draw(state);
}

// ---- rows of keys and values (kv_row.glsl) ------------------------------------------------------

// The first word of the key row of the slot at index `at`.
uint key_row_of(uint at) { return p.keys_off + (at - p.first_slot) * kv_row_words(KEY_FORMAT, p.head_dim); }

// Encodes kv_row into the value row starting at word `row`.
void store_value(uint row) {
    const uint header = kv_encode_header(VALUE_FORMAT, p.head_dim), skip = kv_header_words(VALUE_FORMAT);
    if (skip != 0u) values[row] = header;
    for (uint w = 0u; w + skip < kv_row_words(VALUE_FORMAT, p.head_dim); ++w) {
        values[row + skip + w] = kv_encode_word(VALUE_FORMAT, p.head_dim, w);
    }
}

// ---- the query-agnostic scorers' scores (KvCache::score_keys) ---------------------------------

float row_norm() {
    float sum = 0.0;
    for (uint j = 0u; j < p.head_dim; ++j) sum += kv_row[j] * kv_row[j];
    return sqrt(sum);
}

shared float anchor[MAX_HEAD_DIM];

// The scores of a cell's held slots into their SCORE words; every invocation calls it.
void score_keys(uint base, uint used) {
    const uint tid = gl_LocalInvocationIndex;
    if (p.policy == KV_POLICY_KEY_NORM) {
        for (uint s = tid; s < used; s += WG) {
            if (stream_is_free(stream_at(base + s))) continue;
            load_key(key_row_of(base + s));
            set_score_word(base + s, SCORE, kv_key_norm_priority(row_norm()));
        }
    } else if (p.policy == KV_POLICY_KEY_DIFF) {
        for (uint s = tid; s < used; s += WG) {
            if (stream_is_free(stream_at(base + s))) continue;
            load_key(key_row_of(base + s));
            set_score_word(base + s, KEY_NORM, row_norm());
        }
        memoryBarrierBuffer();
        barrier();
        // The anchor, the mean of the unit keys (unscaled), a dimension per invocation, summed in
        // slot order as the CPU sums it.
        for (uint j = tid; j < p.head_dim; j += WG) {
            float sum = 0.0;
            for (uint s = 0u; s < used; ++s) {
                if (stream_is_free(stream_at(base + s))) continue;
                const float norm = score_word(base + s, KEY_NORM);
                if (norm > 0.0) sum += key_element(key_row_of(base + s), j) / norm;
            }
            anchor[j] = sum;
        }
        barrier();
        float anchor_sum = 0.0;
        for (uint j = 0u; j < p.head_dim; ++j) anchor_sum += anchor[j] * anchor[j];
        const float anchor_norm = sqrt(anchor_sum);
        for (uint s = tid; s < used; s += WG) {
            if (stream_is_free(stream_at(base + s))) continue;
            load_key(key_row_of(base + s));
            float dot = 0.0;
            for (uint j = 0u; j < p.head_dim; ++j) dot += kv_row[j] * anchor[j];
            const float norms = score_word(base + s, KEY_NORM) * anchor_norm;
            set_score_word(base + s, SCORE, kv_key_diff_priority(norms > 0.0 ? dot / norms : 0.0));
        }
    }
    memoryBarrierBuffer();
    barrier();
}

// ---- one kv head ------------------------------------------------------------------------------

shared uint sh_used, sh_free_count, sh_count;
shared uint scan[WG];

void evict(uint base, uint h, uint victim_index, uint slot) {
    // One invocation: record the victim's stream index (for rolling), free the slot, push it.
    const uint at = base + slot;
    const uvec2 s = stream_at(at);
    meta[L.victims + 2u * (h * p.max_batch + victim_index)] = s.x;
    meta[L.victims + 2u * (h * p.max_batch + victim_index) + 1u] = s.y;
    set_stream(at, uvec2(NONE));
    meta[L.free_list + base + sh_free_count] = slot;
    sh_free_count += 1u;
}

// Candidates in slot order into L.candidates (the random policy shuffles this list). Returns
// their number.
uint compact_candidates(uint base, uint used) {
    const uint tid = gl_LocalInvocationIndex;
    uint total = 0u;
    for (uint first = 0u; first < used; first += WG) {
        const uint s = first + tid;
        const bool take = s < used && eligible(base + s);
        scan[tid] = take ? 1u : 0u;
        barrier();
        // Inclusive Hillis-Steele scan.
        for (uint offset = 1u; offset < WG; offset <<= 1) {
            const uint add = tid >= offset ? scan[tid - offset] : 0u;
            barrier();
            scan[tid] += add;
            barrier();
        }
        if (take) meta[L.candidates + total + scan[tid] - 1u] = s;
        total += scan[WG - 1u];
        barrier();
    }
    return total;
}

void make_room(uint cell, uint h) {
    const uint tid = gl_LocalInvocationIndex;
    const uint base = meta[L.cell_first + cell];
    const uint used = sh_used;
    const int needed = int(p.n) - int(meta[L.cell_slots + cell] - used + sh_free_count);
    if (needed <= 0) return;  // uniform: every invocation sees the same shared values

    count_spans(base, used);
    if (tid == 0u) sh_count = 0u;
    barrier();
    uint mine = 0u;
    for (uint s = tid; s < used; s += WG) mine += eligible(base + s) && kv_tag_span(meta[L.tag + base + s]) == 0u ? 1u : 0u;
    atomicAdd(sh_count, mine);
    barrier();
    // The policy's choice stands only when enough candidates can be taken (KvCache::make_room).
    const bool enough = takeable(sh_count) >= uint(needed);
    uint n_victims = 0u;

    if (p.policy == KV_POLICY_RANDOM) {
        // Partial Fisher-Yates over the candidates in slot order, one draw each until enough are
        // taken or none is left; the draws are made (and the generator advances) even when the
        // fallback below then replaces the choice.
        const uint n_candidates = compact_candidates(base, used);
        memoryBarrierBuffer();
        barrier();
        if (tid == 0u) {
            uint taken = 0u;
            for (uint i = 0u; i < n_candidates && taken < uint(needed); ++i) {
                const uint j = i + kv_random_below(next_random(), n_candidates - i);
                const uint a = meta[L.candidates + i];
                meta[L.candidates + i] = meta[L.candidates + j];
                meta[L.candidates + j] = a;
                const uint slot = meta[L.candidates + i];
                if (!span_allows(base + slot)) continue;
                leave_span(base + slot);
                meta[L.candidates + taken] = slot;
                ++taken;
            }
            if (taken == uint(needed)) {
                for (uint i = 0u; i < taken; ++i) evict(base, h, i, meta[L.candidates + i]);
            }
        }
        memoryBarrierBuffer();
        barrier();
        if (enough) n_victims = uint(needed);
    } else if (enough) {
        if (kv_policy_scores_keys(p.policy)) score_keys(base, used);
        for (uint i = 0u; i < uint(needed); ++i) {
            const uint slot = argmin_slot(base, used, false);
            if (tid == 0u) {
                leave_span(base + slot);
                evict(base, h, i, slot);
            }
            memoryBarrierBuffer();
            barrier();
        }
        n_victims = uint(needed);
    }
    if (!enough) {
        // Everything evictable is protected by the windows: the oldest unpinned tokens go, span
        // minimums still kept.
        count_spans(base, used);
        for (uint i = 0u; i < uint(needed); ++i) {
            const uint slot = argmin_slot(base, used, true);
            if (slot == NONE) break;
            if (tid == 0u) {
                leave_span(base + slot);
                evict(base, h, i, slot);
            }
            memoryBarrierBuffer();
            barrier();
            ++n_victims;
        }
    }

    if ((p.flags & FLAG_ROLLING) != 0u && n_victims > 0u) {
        // Each kept token moves back one rank per evicted token that preceded it in the stream.
        for (uint s = tid; s < used; s += WG) {
            const uint at = base + s;
            const uvec2 st = stream_at(at);
            if (stream_is_free(st)) continue;
            int shift = 0;
            for (uint i = 0u; i < n_victims; ++i) {
                const uint v = L.victims + 2u * (h * p.max_batch + i);
                if (stream_lt(uvec2(meta[v], meta[v + 1u]), st)) ++shift;
            }
            if (shift == 0) continue;
            meta[L.position + at] = uint(int(meta[L.position + at]) - shift);
            const uint pairing = (p.flags & FLAG_HALVES_PAIRING) != 0u ? PAIRING_HALVES : PAIRING_ADJACENT;
            roll_key_back(key_row_of(at), shift, pairing, p.pairs);
        }
    }
}

void claim_and_store(uint cell, uint h) {
    const uint tid = gl_LocalInvocationIndex;
    const uint base = meta[L.cell_first + cell];
    if (tid == 0u) {
        for (uint t = 0u; t < p.n; ++t) {
            uint slot;
            if (sh_free_count > 0u) {
                sh_free_count -= 1u;
                slot = meta[L.free_list + base + sh_free_count];
            } else {
                slot = sh_used;
                sh_used += 1u;
            }
            meta[L.batch_slot + h * p.max_batch + t] = slot;
            const uint at = base + slot;
            set_stream(at, stream_add(p.first_index, t));
            const uint head_positions = (p.flags & FLAG_POSITIONS_PER_KV_HEAD) != 0u ? h * p.n : 0u;
            meta[L.position + at] = uint(positions[p.pos_off + head_positions + t]);
            meta[L.tag + at] = p.tag;
            for (uint k = 0u; k < 5u; ++k) meta[L.stats + 5u * at + k] = 0u;  // kv_stats_zero()
        }
        meta[L.used + cell] = sh_used;
        meta[L.free_count + cell] = sh_free_count;
    }
    memoryBarrierBuffer();
    barrier();
    // One invocation per token: a quantized row is encoded as a whole (its scale depends on all
    // of its elements).
    const uint key_words = kv_row_words(KEY_FORMAT, p.head_dim), value_words = kv_row_words(VALUE_FORMAT, p.head_dim);
    for (uint t = tid; t < p.n; t += WG) {
        const uint slot = meta[L.batch_slot + h * p.max_batch + t];
        for (uint d = 0u; d < p.head_dim; ++d) kv_row[d] = k_in[p.k_off + t * p.k_stride + h * p.head_dim + d];
        store_key(p.keys_off + (base - p.first_slot + slot) * key_words);
        for (uint d = 0u; d < p.head_dim; ++d) kv_row[d] = v_in[p.v_off + t * p.v_stride + h * p.head_dim + d];
        store_value(p.values_off + (base - p.first_slot + slot) * value_words);
    }
}

void main() {
    L = kv_layout(p.meta_off, p.n_cells, p.total_slots, p.n_kv, p.max_batch);
    for (uint h = gl_WorkGroupID.x; h < p.n_kv; h += gl_NumWorkGroups.x) {
        const uint cell = p.layer * p.n_kv + h;
        cell_now = cell;
        if (gl_LocalInvocationIndex == 0u) {
            sh_used = meta[L.used + cell];
            sh_free_count = meta[L.free_count + cell];
        }
        barrier();
        make_room(cell, h);
        barrier();
        claim_and_store(cell, h);
        memoryBarrierBuffer();
        barrier();
    }
}
