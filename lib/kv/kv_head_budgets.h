// Budgets per kv head (Ada-KV, within the fixed slots): how a pool of cells' slots move between
// them by their attention. A pool is a layer's kv heads, or with share_across_layers every kv
// head of every layer (KvConfig::pool_first_layer): budgets across layers from the same
// statistics. KvCache::rebalance_heads (kv_head_budgets.cpp) is the rule's reference
// implementation; the CPU backend runs it on its cache. The Vulkan backend runs the same steps
// where its cache lives (kv_rebalance.comp, on the victim rules of kv_victim_rules.h), and its
// parity tests compare the two byte for byte. The CUDA backend runs the reference on a host copy
// of its bookkeeping alone (KvCache::init_bookkeeping), which records the rotations and moves
// the rows need (KvRowEdits) for its kv_rebalance_*_kernel to do them.
//
// A layer of n_kv cells of B slots has n_kv * B slots in all, allocated once; with head_share s,
// each cell keeps at least B - floor(s * B) of them (KvConfig::min_cell_slots) and the rest move
// within the pool. Before a batch of n tokens that holds a stream index divisible by the interval
// (KvConfig::rebalance_interval; every batch when it is 0 or 1: kv_rebalance_due), in every pool
// whose cells cannot all take n more:
//   - the pool evicts, across all its cells at once, the tokens its layers' policies value least
//     (the smallest kv_victim_priority; stale tokens first; ties: the older, then the earlier
//     cell), as many as n tokens in every cell need beyond the pool's free slots. Pinned tokens,
//     the recent window (counting the n incoming tokens), sinks and each cell's span minimums are
//     kept, as by make_room;
//   - each cell's region is then to hold what it kept, at least its minimum, and an even share of
//     the slots left over (earlier cells take the remainder). When that changes no cell's size,
//     the victims' slots go to their cells' free lists as make_room's do; otherwise the kept slots
//     move, in slot order, to the start of their cell's new region (cells in (layer, kv head)
//     order), so each backend's cache has the same slots in the same places.
// Pins and span minimums may need more than a cell's minimum: the session passes a floor (what
// the batch needs held from eviction, plus the batch) and a cell's minimum is raised to it
// (KvConfig::cell_minimum). A pool with a cell below its raised minimum rebalances at once,
// whatever the interval: it also evicts, in the same order, from the cells above their minimum
// until every cell fits, and when the protections leave too few, their oldest unpinned tokens
// (make_room's fallback). KvConfig::max_held_from_eviction is the largest floor, less one, that
// every pool can give all its cells, and what the session lets be pinned.
// Each cell then takes the batch within its region, evicting by the policy if it must (a cell
// raised to its minimum may have fewer free slots than n); so do the batches between
// rebalancings, which keep the regions: a cell then holds min(what it held + n, its slots). The
// interval trades how fast regions follow the statistics for the cost of ranking the pool and
// moving its slots, which before every generated token made decoding markedly slower than with
// fixed budgets (docs/EVALUATION.md measures both). A head whose attention is spread over
// many tokens keeps more of them than one that attends to few: the tokens the latter does not
// attend to rank lowest in the pool. Needs a policy that gathers statistics. Across layers the
// policies' priorities are compared between layers as they are: well for the sums of attention
// (H2O, Scissorhands, RoCo, mean H2O), badly for TOVA's last-query weights (see docs/EVALUATION.md).
// With rolling, a cell's rotary positions are ranks among its own tokens: the victims' cells roll
// their kept keys back as make_room does, and since a pool's cells then hold different numbers
// of tokens, a batch's positions are given per cell (KvConfig::positions_per_kv_head,
// kv_batch_positions from each cell's tokens held and slots after rebalancing).
#pragma once

#include "kv_config.h"

namespace h2o {

// The largest head_share: every cell keeps at least a tenth of its layer's budget.
constexpr float kMaxKvHeadShare = 0.9f;
// The longest rebalancing interval accepted (kv_rebalance_interval), in stream tokens.
constexpr int kMaxKvRebalanceInterval = 1 << 20;

// Whether a batch of n tokens from stream index next_index moves the budgets: when one of its
// tokens' stream indices is a multiple of the interval (every batch with an interval of 0 or 1).
// Counted in stream indices, so a session restored from a snapshot, or forked, keeps the schedule.
inline bool kv_rebalance_due(int interval, int64_t next_index, int64_t n) {
    if (interval <= 1) return true;
    const int64_t next_multiple = (next_index + interval - 1) / interval * interval;
    return next_multiple < next_index + n;
}

}  // namespace h2o
