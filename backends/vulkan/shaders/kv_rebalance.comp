#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Budgets that move between kv heads (kv_head_budgets.h), on the device: KvCache::rebalance_pool
// step for step, for one pool of cells (the layers [first_layer, end_layer)) by one workgroup, on
// the bookkeeping and rows where they live. The host hands over no more than each layer's
// parameters (the `layers` rows of the work buffer, kv_meta_layout.h) and reads back each cell's
// counts; nothing of a slot crosses. The steps, as the host rule takes them:
//   1. each cell's minimum and tokens held; when every cell can take the coming tokens and none
//      is below its minimum, nothing changes;
//   2. the candidates (evictable slots) and their priorities, and each cell's tokens per span;
//   3. the candidates in order (priority, then the older, then the earlier slot), and one
//      invocation takes victims in that order as the rule does (span minimums, cells at their
//      minimum); when the protections leave too few, the oldest unpinned tokens follow;
//   4. the victims leave, and with rolling each cell's kept keys roll back past its own victims;
//   5. each cell's new size; when one changes, the list of moves that take the kept slots to the
//      start of their cell's new region, and the cells' new places, else the victims' slots go to
//      their cells' free lists.
// The moves are made by the STEP_GATHER and STEP_SCATTER variants, many workgroups each, a chunk
// of moves at a time through the work buffer's area (every word of a chunk read before any is
// written), and STEP_CLEAR then frees the slots past each cell's kept ones.
// Sorting is a bitonic network over the work buffer, n offsets in about log2(n)^2 / 2 passes,
// each with a barrier; the common case sorts only the few candidates that can be victims
// (select_smallest).

#if defined(STEP_GATHER) || defined(STEP_SCATTER) || defined(STEP_CLEAR)
#define WG 64
#else
#define WG 256
#endif
#define MAX_HEAD_DIM 256
layout(local_size_x = WG) in;

layout(binding = 0) buffer Keys { uint keys[]; };
layout(binding = 1) buffer Values { uint values[]; };
// Written by one invocation and read by others of the workgroup after a barrier.
layout(binding = 2) coherent buffer Meta { uint meta[]; };
layout(binding = 3) coherent buffer Work { uint work[]; };
layout(binding = 4) readonly buffer Table { vec2 rollback_table[]; };  // kv_rotate_back_table: [shift][pair] (cos, sin)

layout(push_constant) uniform Params {
    uint keys_off, values_off, meta_off, work_off, table_off;
    uint first_slot, pool;         // the pool's first slot (its rows' first) and its slots
    uint first_layer, end_layer;   // its layers
    uint incoming;                 // tokens the batch brings to every cell
    uint head_dim, pairs, pairing, rolling;
    uint formats;                  // KvRowFormat of keys | of values << 8
    uint n_cells, total_slots, n_kv, max_batch;  // the meta buffer's layout (kv_meta_layout.h)
    uint sort_size, area_moves;    // the work buffer's layout; moves per chunk of the area
    uint chunk_first, direction;   // STEP_GATHER, STEP_SCATTER: the chunk's first move; which moves
} p;

// The moves a chunk makes: those going left (to a smaller slot), right, or (one chunk holds them
// all) every move.
const uint MOVES_LEFT = 1u, MOVES_RIGHT = 2u, MOVES_ALL = 3u;

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
KvRebalanceWork W;

uvec2 stream_at(uint at) { return uvec2(meta[L.stream + 2u * at], meta[L.stream + 2u * at + 1u]); }
void set_stream(uint at, uvec2 s) {
    meta[L.stream + 2u * at] = s.x;
    meta[L.stream + 2u * at + 1u] = s.y;
}
uint layer_word(uint layer, uint j) { return work[p.work_off + W.layers + KV_REBALANCE_LAYER_WORDS * layer + j]; }
uvec2 layer_index(uint layer, uint j) { return uvec2(layer_word(layer, j), layer_word(layer, j + 1u)); }
// Word i of a region of the work buffer (kv_rebalance_work).
#define WORK(region, i) work[p.work_off + W.region + (i)]

uint first_cell() { return p.first_layer * p.n_kv; }
uint pool_cells() { return (p.end_layer - p.first_layer) * p.n_kv; }

// The pool's cell whose region holds slot `at` (regions are consecutive in cell order).
uint cell_of(uint at) {
    uint lo = 0u, hi = pool_cells();
    while (hi - lo > 1u) {
        const uint mid = (lo + hi) / 2u;
        if (meta[L.cell_first + first_cell() + mid] <= at) lo = mid; else hi = mid;
    }
    return first_cell() + lo;
}

void sync() {
    memoryBarrierBuffer();
    memoryBarrierShared();
    barrier();
}

// ---- sorting pool offsets -----------------------------------------------------------------------

const uint BY_PRIORITY = 0u, BY_AGE = 1u, BY_OFFSET = 2u;

// Whether offset a goes before offset b: by kv_victim_before (BY_PRIORITY), by stream index
// (BY_AGE), then (and BY_OFFSET alone) the earlier slot; NONE after everything.
bool goes_before(uint a, uint b, uint mode) {
    if (a == NONE) return false;
    if (b == NONE) return true;
    if (mode != BY_OFFSET) {
        const uvec2 ia = stream_at(p.first_slot + a), ib = stream_at(p.first_slot + b);
        if (mode == BY_PRIORITY) {
            const float pa = uintBitsToFloat(WORK(priority, a)), pb = uintBitsToFloat(WORK(priority, b));
            if (pa != pb || ia != ib) return kv_victim_before(pa, ia, pb, ib);
        } else if (ia != ib) {
            return kv_index_less(ia, ib);
        }
    }
    return a < b;
}

// Sorts the n offsets from work word `first` (room for the next power of two) in a mode's order.
void sort_offsets(uint first, uint n, uint mode) {
    const uint tid = gl_LocalInvocationIndex;
    uint size = 1u;
    while (size < n) size <<= 1;
    for (uint i = n + tid; i < size; i += WG) work[p.work_off + first + i] = NONE;
    sync();
    for (uint k = 2u; k <= size; k <<= 1) {
        for (uint j = k >> 1; j > 0u; j >>= 1) {
            for (uint i = tid; i < size; i += WG) {
                const uint l = i ^ j;
                if (l <= i) continue;
                const uint a = work[p.work_off + first + i], b = work[p.work_off + first + l];
                if ((i & k) == 0u ? goes_before(b, a, mode) : goes_before(a, b, mode)) {
                    work[p.work_off + first + i] = b;
                    work[p.work_off + first + l] = a;
                }
            }
            sync();
        }
    }
}

// ---- the k smallest priorities: a radix select -------------------------------------------------
// Without span minimums or raised cells the victims are the first k candidates in order, k a few
// per cell: sorting them all would cost log2(n)^2 / 2 passes over n. Instead the k-th smallest
// priority is found a byte at a time (4 passes over the candidates, a histogram of 256 bins each),
// and only the candidates up to it, its ties included, are sorted.

shared uint histogram[256];
shared uint sh_prefix, sh_rank, sh_selected;

// A priority's bits in an order that unsigned comparison keeps (0 and -0 alike, as == has them).
uint order_key(uint offset) {
    const float f = uintBitsToFloat(WORK(priority, offset));
    const uint u = f == 0.0 ? 0u : floatBitsToUint(f);
    return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
}

// Copies the n candidates of `sorted` whose priority is at most the k-th smallest (0 < k <= n) to
// `selected`, in any order, and returns their number (k, and more with ties).
uint select_smallest(uint n, uint k) {
    const uint tid = gl_LocalInvocationIndex;
    if (tid == 0u) {
        sh_prefix = 0u;
        sh_rank = k;
        sh_selected = 0u;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (uint b = tid; b < 256u; b += WG) histogram[b] = 0u;
        sync();
        const uint known = shift == 24 ? 0u : 0xFFFFFFFFu << uint(shift + 8);  // the bytes found so far
        for (uint i = tid; i < n; i += WG) {
            const uint key = order_key(WORK(sorted, i));
            if ((key & known) == sh_prefix) atomicAdd(histogram[(key >> uint(shift)) & 0xFFu], 1u);
        }
        sync();
        if (tid == 0u) {
            uint b = 0u;
            while (histogram[b] < sh_rank) sh_rank -= histogram[b++];
            sh_prefix |= b << uint(shift);
        }
        sync();
    }
    const uint threshold = sh_prefix;
    for (uint i = tid; i < n; i += WG) {
        const uint offset = WORK(sorted, i);
        if (order_key(offset) <= threshold) WORK(selected, atomicAdd(sh_selected, 1u)) = offset;
    }
    sync();
    return sh_selected;
}

// ---- taking victims (one invocation) -----------------------------------------------------------

shared uint sh_held, sh_raised, sh_count, sh_evicted, sh_resized;
shared int sh_excess;

// KvCache::rebalance_pool's take: the candidate at `offset` is a victim unless its span keeps it,
// or it would not lower the excess once `needed` are taken (its cell holds no more than its
// minimum).
void take(uint offset, int needed) {
    const uint at = p.first_slot + offset, c = cell_of(at);
    const int held = int(WORK(held, c)), minimum = int(WORK(minimum, c));
    if (int(sh_evicted) >= needed && held <= minimum) return;
    const uint span = kv_tag_span(meta[L.tag + at]);
    if (span != 0u) {
        const uint span_held = WORK(span_held, c * KV_MAX_SPANS + span - 1u);
        if (!kv_span_allows_eviction(span_held, meta[L.span_min + span - 1u])) return;
        WORK(span_held, c * KV_MAX_SPANS + span - 1u) = span_held - 1u;
    }
    if (held > minimum) sh_excess -= 1;
    WORK(held, c) = uint(held - 1);
    WORK(victims, sh_evicted) = offset;
    sh_evicted += 1u;
}

#if defined(STEP_GATHER) || defined(STEP_SCATTER)
// A chunk of the moves: one invocation per word of a moved slot (key row, value row, token words).
void main() {
    L = kv_layout(p.meta_off, p.n_cells, p.total_slots, p.n_kv, p.max_batch);
    W = kv_rebalance_work(p.n_cells / p.n_kv, p.n_cells, p.sort_size, 0u);
    const uint n_moves = WORK(scalars, 0u);
    if (p.chunk_first >= n_moves) return;
    const uint n = min(p.area_moves, n_moves - p.chunk_first);
    const uint key_words = kv_row_words(KEY_FORMAT, p.head_dim), value_words = kv_row_words(VALUE_FORMAT, p.head_dim);
    const uint row_words = key_words + value_words, slot_words = row_words + KV_TOKEN_WORDS;
    for (uint k = gl_GlobalInvocationID.x; k < n * slot_words; k += gl_NumWorkGroups.x * WG) {
        const uint i = p.chunk_first + k / slot_words, w = k % slot_words;
        const uint from = WORK(moves, 2u * i), to = WORK(moves, 2u * i + 1u);
        if (to == from || (p.direction == MOVES_LEFT && to > from) || (p.direction == MOVES_RIGHT && to < from)) continue;
#if defined(STEP_GATHER)
        uint word;
        if (w < key_words) {
            word = keys[p.keys_off + (from - p.first_slot) * key_words + w];
        } else if (w < row_words) {
            word = values[p.values_off + (from - p.first_slot) * value_words + w - key_words];
        } else {
            word = meta[kv_token_word(L, from, w - row_words)];
        }
        WORK(area, k) = word;
#else
        const uint word = WORK(area, k);
        if (w < key_words) {
            keys[p.keys_off + (to - p.first_slot) * key_words + w] = word;
        } else if (w < row_words) {
            values[p.values_off + (to - p.first_slot) * value_words + w - key_words] = word;
        } else {
            meta[kv_token_word(L, to, w - row_words)] = word;
        }
#endif
    }
}
#elif defined(STEP_CLEAR)
// After the moves: in a rebalancing that changed the regions, every slot past its cell's kept
// ones holds nothing.
void main() {
    L = kv_layout(p.meta_off, p.n_cells, p.total_slots, p.n_kv, p.max_batch);
    W = kv_rebalance_work(p.n_cells / p.n_kv, p.n_cells, p.sort_size, 0u);
    if (WORK(scalars, 1u) == 0u) return;
    for (uint offset = gl_GlobalInvocationID.x; offset < p.pool; offset += gl_NumWorkGroups.x * WG) {
        const uint at = p.first_slot + offset, c = cell_of(at);
        if (at - meta[L.cell_first + c] < meta[L.used + c]) continue;
        set_stream(at, uvec2(NONE));
        meta[L.tag + at] = 0u;
    }
}
#else
void main() {
    L = kv_layout(p.meta_off, p.n_cells, p.total_slots, p.n_kv, p.max_batch);
    W = kv_rebalance_work(p.n_cells / p.n_kv, p.n_cells, p.sort_size, 0u);
    const uint tid = gl_LocalInvocationIndex, nc = pool_cells(), c0 = first_cell();
    if (tid == 0u) {
        WORK(scalars, 0u) = 0u;  // no moves, the regions as they are, unless step 5 says otherwise
        WORK(scalars, 1u) = 0u;
    }

    // 1. Minimums and tokens held; the excess is how far the cells' sizes would pass the pool's
    //    slots if each kept what it holds or its minimum.
    if (tid == 0u) {
        sh_held = 0u;
        sh_raised = 0u;
        sh_count = 0u;
        sh_evicted = 0u;
        sh_resized = 0u;
        sh_excess = -int(p.pool);
    }
    sync();
    for (uint i = tid; i < nc; i += WG) {
        const uint c = c0 + i;
        const int minimum = int(layer_word(c / p.n_kv, 0u)), held = int(meta[L.used + c]) - int(meta[L.free_count + c]);
        WORK(minimum, c) = uint(minimum);
        WORK(held, c) = uint(held);
        atomicAdd(sh_held, uint(held));
        atomicAdd(sh_excess, max(held, minimum));
        if (int(meta[L.cell_slots + c]) < minimum) atomicOr(sh_raised, 1u);
        for (uint k = 0u; k < KV_MAX_SPANS; ++k) WORK(span_held, c * KV_MAX_SPANS + k) = 0u;
    }
    sync();
    const int needed = int(sh_held) + int(nc * p.incoming) - int(p.pool);
    if (needed <= 0 && sh_raised == 0u) return;  // every cell can take the coming tokens

    // 2. Candidates, with their priorities, and each cell's tokens per span.
    for (uint offset = tid; offset < p.pool; offset += WG) {
        const uint at = p.first_slot + offset, c = cell_of(at), layer = c / p.n_kv;
        if (at - meta[L.cell_first + c] >= meta[L.used + c]) continue;
        const uvec2 index = stream_at(at);
        const uint tag = meta[L.tag + at], span = kv_tag_span(tag);
        if (!kv_index_free(index) && span != 0u) atomicAdd(WORK(span_held, c * KV_MAX_SPANS + span - 1u), 1u);
        if (!kv_slot_evictable(index, kv_tag_pinned(tag), layer_index(layer, 3u), layer_word(layer, 2u))) continue;
        const bool stale = kv_index_less(index, layer_index(layer, 5u));
        WORK(priority, offset) = floatBitsToUint(kv_victim_priority(layer_word(layer, 1u), load_slot_stats(L, at), stale));
        WORK(sorted, atomicAdd(sh_count, 1u)) = offset;
    }
    sync();

    // 3. Victims in the policy's order. Span minimums and raised cells may pass over any number of
    //    candidates; without them the first `needed` are the victims.
    bool any_span_minimum = false;
    for (uint k = 0u; k < KV_MAX_SPANS; ++k) any_span_minimum = any_span_minimum || int(meta[L.span_min + k]) > 0;
    const uint n_candidates = sh_count;
    const bool passes_over = any_span_minimum || sh_excess > 0;
    const uint ranked = passes_over ? n_candidates : min(n_candidates, uint(max(needed, 0)));
    uint order = W.sorted;  // the candidates in order, at least the first `ranked`
    if (ranked == n_candidates) {
        sort_offsets(W.sorted, n_candidates, BY_PRIORITY);
    } else if (ranked > 0u) {
        order = W.selected;
        sort_offsets(W.selected, select_smallest(n_candidates, ranked), BY_PRIORITY);
    }
    if (tid == 0u) {
        for (uint i = 0u; i < ranked && (int(sh_evicted) < needed || sh_excess > 0); ++i) take(work[p.work_off + order + i], needed);
    }
    sync();
    if (sh_excess > 0) {
        // The protections (the recent window, sinks) left too few: the oldest unpinned tokens of
        // the cells above their minimum go.
        for (uint offset = tid; offset < p.pool; offset += WG) WORK(mark, offset) = 0u;
        if (tid == 0u) sh_count = 0u;
        sync();
        for (uint i = tid; i < sh_evicted; i += WG) WORK(mark, WORK(victims, i)) = 1u;
        sync();
        for (uint offset = tid; offset < p.pool; offset += WG) {
            const uint at = p.first_slot + offset;
            if (kv_slot_evictable_by_age(stream_at(at), kv_tag_pinned(meta[L.tag + at])) && WORK(mark, offset) == 0u)
                WORK(sorted, atomicAdd(sh_count, 1u)) = offset;
        }
        sync();
        const uint n_oldest = sh_count;
        sort_offsets(W.sorted, n_oldest, BY_AGE);
        if (tid == 0u) {
            for (uint i = 0u; i < n_oldest && sh_excess > 0; ++i) take(WORK(sorted, i), needed);
        }
        sync();
    }

    // 4. The victims leave, in slot order (each cell's a run of them); with rolling, each cell's
    //    kept keys roll back one position per victim of its own that preceded them.
    const uint evicted = sh_evicted;
    sort_offsets(W.victims, evicted, BY_OFFSET);
    for (uint i = tid; i < evicted; i += WG) {
        const uint at = p.first_slot + WORK(victims, i);
        const uvec2 index = stream_at(at);
        WORK(victim_stream, 2u * i) = index.x;
        WORK(victim_stream, 2u * i + 1u) = index.y;
        set_stream(at, uvec2(NONE));
        meta[L.tag + at] = 0u;
    }
    for (uint i = tid; i < nc; i += WG) {
        // The cell's victims: [first, end) of the sorted victims.
        const uint c = c0 + i, start = meta[L.cell_first + c] - p.first_slot, end = start + meta[L.cell_slots + c];
        uint lo = 0u, hi = evicted;
        while (lo < hi) {
            const uint mid = (lo + hi) / 2u;
            if (WORK(victims, mid) < start) lo = mid + 1u; else hi = mid;
        }
        uint v_end = lo;
        while (v_end < evicted && WORK(victims, v_end) < end) ++v_end;
        WORK(victim_first, c) = lo;
        WORK(victim_end, c) = v_end;
    }
    sync();
    if (p.rolling != 0u) {
        for (uint offset = tid; offset < p.pool; offset += WG) {
            const uint at = p.first_slot + offset, c = cell_of(at);
            if (at - meta[L.cell_first + c] >= meta[L.used + c]) continue;
            const uvec2 index = stream_at(at);
            if (kv_index_free(index)) continue;
            int shift = 0;
            for (uint v = WORK(victim_first, c); v < WORK(victim_end, c); ++v) {
                if (kv_index_less(uvec2(WORK(victim_stream, 2u * v), WORK(victim_stream, 2u * v + 1u)), index)) ++shift;
            }
            if (shift == 0) continue;
            meta[L.position + at] = uint(int(meta[L.position + at]) - shift);
            roll_key_back(p.keys_off + offset * kv_row_words(KEY_FORMAT, p.head_dim), shift, p.pairing, p.pairs);
        }
    }

    // 5. Each cell's new region: what it kept, at least its minimum, then the rest shared evenly.
    for (uint i = tid; i < nc; i += WG) {
        const uint c = c0 + i, base = meta[L.cell_first + c];
        uint kept = 0u;
        for (uint s = 0u; s < meta[L.used + c]; ++s) kept += kv_index_free(stream_at(base + s)) ? 0u : 1u;
        WORK(kept, c) = kept;
        WORK(slots, c) = max(kept, WORK(minimum, c));
    }
    sync();
    if (tid == 0u) {
        uint given = 0u;
        for (uint i = 0u; i < nc; ++i) given += WORK(slots, c0 + i);
        const uint left = p.pool - given;
        uint region = p.first_slot, move = 0u;
        for (uint i = 0u; i < nc; ++i) {
            const uint c = c0 + i, slots = WORK(slots, c) + left / nc + (i < left % nc ? 1u : 0u);
            WORK(slots, c) = slots;
            WORK(region, c) = region;
            WORK(move_base, c) = move;
            if (slots != meta[L.cell_slots + c]) sh_resized = 1u;
            region += slots;
            move += WORK(kept, c);
        }
        sh_count = move;
    }
    sync();
    if (sh_resized != 0u) {
        // Each kept slot's destination: cells in (layer, kv head) order, kept slots in slot order.
        // Sources and destinations both increase along that order, so the slots that go left
        // move in increasing order, then those that go right in decreasing order.
        for (uint i = tid; i < nc; i += WG) {
            const uint c = c0 + i, base = meta[L.cell_first + c];
            uint next = 0u;
            for (uint s = 0u; s < meta[L.used + c]; ++s) {
                if (kv_index_free(stream_at(base + s))) continue;
                const uint move = WORK(move_base, c) + next;
                WORK(moves, 2u * move) = base + s;
                WORK(moves, 2u * move + 1u) = WORK(region, c) + next;
                ++next;
            }
        }
        sync();
        // The cells take their regions (the moves and STEP_CLEAR follow).
        for (uint i = tid; i < nc; i += WG) {
            const uint c = c0 + i;
            meta[L.cell_first + c] = WORK(region, c);
            meta[L.cell_slots + c] = WORK(slots, c);
            meta[L.used + c] = WORK(kept, c);
            meta[L.free_count + c] = 0u;
        }
        if (tid == 0u) {
            WORK(scalars, 0u) = sh_count;
            WORK(scalars, 1u) = 1u;
        }
    } else {
        // The regions stay: the victims' slots are free in place, as make_room frees them.
        for (uint i = tid; i < nc; i += WG) {
            const uint c = c0 + i, base = meta[L.cell_first + c];
            uint count = meta[L.free_count + c];
            for (uint v = WORK(victim_first, c); v < WORK(victim_end, c); ++v) {
                meta[L.free_list + base + count] = p.first_slot + WORK(victims, v) - base;
                ++count;
            }
            meta[L.free_count + c] = count;
        }
    }
}
#endif
