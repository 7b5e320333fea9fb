// Budgets per kv head (Ada-KV, within the fixed slots): how a layer's slots move between its kv
// heads by their attention. KvCache::rebalance_heads (kv_head_budgets.cpp) is the rule's one
// implementation; the CPU backend runs it on its cache, device backends on a host copy of theirs.
//
// A layer of n_kv cells of B slots has n_kv * B slots in all, allocated once; with head_share s,
// each cell keeps at least B - floor(s * B) of them (KvConfig::min_cell_slots) and the rest move.
// Before each batch that starts at a multiple of `interval` stream tokens (kv_rebalance_interval;
// Session::evaluate ends evicting batches there), in every layer whose cells cannot all take
// `interval` more tokens:
//   - the layer evicts, across all its cells at once, the tokens its policy values least (the
//     smallest kv_victim_priority; stale tokens first; ties: the older, then the lower kv head),
//     as many as the next `interval` tokens of every cell need beyond the layer's free slots.
//     Pinned tokens, the recent window (counting the `interval` incoming tokens), sinks and each
//     cell's span minimums are kept, as by make_room;
//   - each cell's new region holds what it kept, at least its minimum, and an even share of the
//     slots left over (lower kv heads take the remainder);
//   - the kept slots move, in slot order, to the start of their cell's new region (cells in kv head
//     order, layer by layer), so each backend's cache has the same slots in the same places.
// Between rebalancings each cell evicts within its region by the policy, as with fixed budgets.
// A head whose attention is spread over many tokens keeps more of them than one that attends to
// few, since the few it does not attend to rank lowest in the layer. Needs a policy that gathers
// statistics; not yet with rolling, whose rank positions would differ between a layer's heads.
#pragma once

#include "backend.h"

namespace h2o {

// The largest head_share: every cell keeps at least a tenth of its layer's budget.
constexpr float kMaxKvHeadShare = 0.9f;

// Tokens between rebalancings: a quarter of the smallest cell, as a batch that evicts is at most
// a quarter of the evictable slots (Session::evaluate).
inline int kv_rebalance_interval(const KvConfig &config) { return config.min_cell_slots() / 4 > 1 ? config.min_cell_slots() / 4 : 1; }

}  // namespace h2o
