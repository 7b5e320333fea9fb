// Word offsets of the regions of the Vulkan backend's KV bookkeeping buffer ("meta"), written once
// in the subset of C++ and GLSL that kv_policy_spec.h keeps to: the host code (vulkan_backend.cpp)
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

#ifdef __cplusplus
// Words of the whole buffer, for cells of at most max_slots slots.
inline KV_UINT kv_meta_words(const KvLayout &l, KV_UINT max_slots) { return l.candidates + max_slots; }
#endif

#ifdef __cplusplus
}  // namespace h2o
#endif

#endif  // H2O_KV_META_LAYOUT_H
