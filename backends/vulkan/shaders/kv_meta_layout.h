// Word offsets of the regions of the Vulkan backend's KV bookkeeping buffer ("meta"), written once
// in the subset of C++ and GLSL that kv_policy_spec.h keeps to: the host code (vk_kv.cpp, vk_attention.cpp)
// and the shaders (through kv_layout.glsl) include this same file. `slots` is every cell's slots
// together, a cell being one (layer, kv head): the cells of layer l share the layer's
// n_kv * KvConfig::slots_in(l) slots from KvConfig::first_slot_of(l), each a region of them in kv
// head order (slots_in(l) each unless the heads' budgets move: kv_head_budgets.h; with
// share_across_layers a cell's region may lie anywhere in the cache, cells still in (layer, kv
// head) order), so a slot region is indexed by cell_first[cell] + slot.
//
//   stream      2 words per slot: the stream index as (low, high); -1 (both words ~0) when free
//   position    1 word per slot: rotary position (int)
//   tag         1 word per slot: the token's retention tag (kv_make_tag: pinned, span)
//   stats       5 floats per slot: SlotStats of kv_policy_spec.h (for the key scorers, which
//               gather none, their score and key norm while kv_claim.comp makes room)
//   free_list   1 word per slot: per cell, a stack of the slots freed by eviction
//   used        1 word per cell: slots [0, used) have been written at least once
//   free_count  1 word per cell: entries on the cell's free-list stack
//   cell_first  1 word per cell: the cell's first slot
//   cell_slots  1 word per cell: the cell's number of slots
//   rng         2 words: xorshift64* state of the random policy
//   span_min    KV_MAX_SPANS words: each retention span's minimum per cell, in tokens
//   batch_slot  n_kv * max_batch words: slot taken by each token of the current batch, per kv head
//   victims     2 words * n_kv * max_batch: stream indices evicted for the current batch
//   candidates  the largest cell's slots in words: scratch for the random policy; the buffer's
//               end (kv_meta_words)
#ifndef H2O_KV_META_LAYOUT_H
#define H2O_KV_META_LAYOUT_H

#include "kv_policy_spec.h"

#ifdef __cplusplus
namespace h2o {
#endif

struct KvLayout {
    KV_UINT stream, position, tag, stats, free_list, used, free_count, cell_first, cell_slots, rng, span_min, batch_slot, victims,
        candidates;
};

KV_FN KvLayout kv_layout(KV_UINT base, KV_UINT n_cells, KV_UINT slots, KV_UINT n_kv, KV_UINT max_batch) {
    KvLayout l;
    l.stream = base;
    l.position = l.stream + 2u * slots;
    l.tag = l.position + slots;
    l.stats = l.tag + slots;
    l.free_list = l.stats + 5u * slots;
    l.used = l.free_list + slots;
    l.free_count = l.used + n_cells;
    l.cell_first = l.free_count + n_cells;
    l.cell_slots = l.cell_first + n_cells;
    l.rng = l.cell_slots + n_cells;
    l.span_min = l.rng + 2u;
    l.batch_slot = l.span_min + KV_MAX_SPANS;
    l.victims = l.batch_slot + n_kv * max_batch;
    l.candidates = l.victims + 2u * n_kv * max_batch;
    return l;
}

// The words of a slot that go with its token when rebalancing moves it (kv_rebalance.comp): its
// stream index (2 words), position, tag and statistics (5); the j-th of slot `slot`.
const KV_UINT KV_TOKEN_WORDS = 9u;
KV_FN KV_UINT kv_token_word(KvLayout l, KV_UINT slot, KV_UINT j) {
    if (j < 2u) return l.stream + 2u * slot + j;
    if (j == 2u) return l.position + slot;
    if (j == 3u) return l.tag + slot;
    return l.stats + 5u * slot + j - 4u;
}

// The work buffer of rebalancing on the device (kv_rebalance.comp), in words:
//   scalars       2 words: the moves the rule left to make, and whether the regions changed
//   layers        KV_REBALANCE_LAYER_WORDS per layer, from the host before each rebalancing: the
//                 cells' minimum (KvConfig::cell_minimum), the policy, its sinks, recent_from and
//                 stale_before (2 words each: kv_recent_from, kv_stale_before)
//   minimum, held, kept, slots, region, move_base, victim_first, victim_end
//                 1 word per cell each: the rule's counts of KvCache::rebalance_pool, each cell's
//                 new first slot, its first move, and its victims' range in `victims`
//   span_held     KV_MAX_SPANS words per cell: tokens held of each retention span
//   priority      sort_size floats, by offset in the pool: kv_victim_priority
//   mark          sort_size words: the victims, for the oldest-first fallback
//   sorted        sort_size words: the candidates
//   selected      sort_size words: those of them up to the k-th smallest priority (select_smallest)
//   victims       sort_size words: pool offsets
//   victim_stream 2 * sort_size words: each victim's stream index
//   moves         2 * sort_size words: (from, to) of each kept slot
//   area          area_words: a chunk of moved rows and token words
// sort_size is a power of two, at least the largest pool's slots (the bitonic sort's length).
const KV_UINT KV_REBALANCE_LAYER_WORDS = 8u;
struct KvRebalanceWork {
    KV_UINT scalars, layers, minimum, held, kept, slots, region, move_base, victim_first, victim_end, span_held, priority, mark, sorted, selected,
        victims, victim_stream, moves, area, end;
};

KV_FN KvRebalanceWork kv_rebalance_work(KV_UINT n_layer, KV_UINT n_cells, KV_UINT sort_size, KV_UINT area_words) {
    KvRebalanceWork w;
    w.scalars = 0u;
    w.layers = 2u;
    w.minimum = w.layers + KV_REBALANCE_LAYER_WORDS * n_layer;
    w.held = w.minimum + n_cells;
    w.kept = w.held + n_cells;
    w.slots = w.kept + n_cells;
    w.region = w.slots + n_cells;
    w.move_base = w.region + n_cells;
    w.victim_first = w.move_base + n_cells;
    w.victim_end = w.victim_first + n_cells;
    w.span_held = w.victim_end + n_cells;
    w.priority = w.span_held + KV_MAX_SPANS * n_cells;
    w.mark = w.priority + sort_size;
    w.sorted = w.mark + sort_size;
    w.selected = w.sorted + sort_size;
    w.victims = w.selected + sort_size;
    w.victim_stream = w.victims + sort_size;
    w.moves = w.victim_stream + 2u * sort_size;
    w.area = w.moves + 2u * sort_size;
    w.end = w.area + area_words;
    return w;
}

#ifdef __cplusplus
// Words of the whole buffer, for cells of at most max_slots slots.
inline KV_UINT kv_meta_words(const KvLayout &l, KV_UINT max_slots) { return l.candidates + max_slots; }
#endif

#ifdef __cplusplus
}  // namespace h2o
#endif

#endif  // H2O_KV_META_LAYOUT_H
