// The shape of a session's KV cache (KvConfig): the cells, one (layer, kv head) each, their
// slots, the element format, the policy and the rules that move slots between cells. The session
// makes it from its settings; every backend lays its cache out by it.
#pragma once

#include <cstdint>
#include <vector>

#include "kv_format.h"
#include "kv_policy.h"
#include "rotary_spec.h"

namespace h2o {

// A session's KV cache: a fixed number of slots per (layer, kv head), allocated once. Which slot a
// new token takes (a free one, or the victim chosen by the eviction policy) is decided inside the
// attention operation, per (layer, kv head), where the attention statistics live.
struct KvConfig {
    int n_layer = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int n_slots = 0;  // slots of each (layer, kv head), or their mean over layers (layer_slots)
    // Slots of each layer's cells when layers get different budgets (n_layer entries; the global
    // layers' sum to their count * n_slots: the same memory); empty: n_slots in every layer. The cells are laid out
    // layer by layer, n_head_kv cells of slots_in(layer) slots each.
    std::vector<int> layer_slots;
    // Sliding-window layers (ModelShape::local_layers): n_layer entries, a local layer's window in
    // tokens (0: a global layer); empty: every layer global. A local layer's cells are a plain
    // window: its slots (layer_slots) hold the window and one batch, its tokens go oldest first
    // whatever the policy (policy_in), are never pinned nor in a span (the graph stores them
    // untagged) and are rotated by local_rope. Pins, spans and the policy's chunking count the
    // global layers alone (min_slots, min_cell_slots); budgets move between global layers only
    // (a layer slope spreads the budget over them, a head share moves slots within each of them).
    std::vector<int> layer_window;
    RotarySpec local_rope;
    KvType type = KvType::F32;  // element format of stored keys and values
    KvPolicyConfig policy;      // as the session set it, for a layer of n_slots slots (policy_in)
    // Position rolling: rotary positions are ranks in the cache (0 = the oldest kept token), not
    // stream indices. Keys are stored rotated by their rank; when eviction removes a token, the
    // keys of the tokens after it are rotated back by one position per removed predecessor.
    bool rolling = false;
    RotarySpec rope;  // the model's (ModelShape::rope): how rolled keys are rotated back
    // Query heads per kv head, and the scale of q·k in attention: what Expected Attention
    // (kv_policy_spec.h) models the queries of a cell with.
    int query_group = 1;
    float attention_scale = 1.0f;
    // Budgets per kv head (kv_head_budgets.h): the share of each layer's slots that rebalancing
    // moves between its kv heads by their attention; 0: every cell keeps slots_in(layer).
    float head_share = 0.0f;
    // With head_share: the slots move between the cells of every layer (one pool: the whole
    // cache) instead of between the kv heads of each layer (a pool per layer). Not with local
    // layers (layer_window), whose windows would split the pool.
    bool share_across_layers = false;
    // With head_share: budgets move before the batches kv_rebalance_due picks, every this many
    // stream tokens (0 or 1: every batch).
    int rebalance_interval = 0;

    int slots_in(int layer) const { return layer_slots.empty() ? n_slots : layer_slots[static_cast<size_t>(layer)]; }
    bool is_window_layer(int layer) const { return !layer_window.empty() && layer_window[static_cast<size_t>(layer)] != 0; }
    const RotarySpec &rope_in(int layer) const { return is_window_layer(layer) ? local_rope : rope; }
    int max_slots() const;
    int min_slots() const;
    // The fewest slots a cell of `layer` is given when its heads' budgets move (head_share), and
    // the most: the rest of its pool's slots at every other cell's fewest.
    int min_cell_slots(int layer) const;
    int max_cell_slots(int layer) const;
    // The layers whose cells share slots when budgets move: [pool_first_layer, pool_end_layer)
    // of `layer`'s pool (the layer itself, or every layer with share_across_layers).
    int pool_first_layer(int layer) const { return share_across_layers ? 0 : layer; }
    int pool_end_layer(int layer) const { return share_across_layers ? n_layer : layer + 1; }
    // The slots of `layer`'s pool, and the most slots and cells any pool has.
    int64_t pool_slots(int layer) const { return first_slot_of(pool_end_layer(layer)) - first_slot_of(pool_first_layer(layer)); }
    int64_t max_pool_slots() const { return share_across_layers ? total_slots() : static_cast<int64_t>(max_slots()) * n_head_kv; }
    int max_pool_cells() const { return (share_across_layers ? n_layer : 1) * n_head_kv; }
    // Over the global layers: what a cell may hold at least (pins, span minimums and a batch must
    // fit there); over all layers: at most (the size of per-cell scratch).
    int min_cell_slots() const;
    int max_cell_slots() const;
    // The most tokens a cell of a global layer may hold from eviction (pins and span minimums)
    // while keeping a slot to evict into. Fixed budgets: min_cell_slots() - 1. When budgets move,
    // a cell may be raised above its minimum to hold them (kv_head_budgets.h: a pool's floor):
    // one less than the largest floor every pool can give all its cells at once.
    int max_held_from_eviction() const;
    // A cell's fewest slots for a batch that needs `floor` of them (pins, span minimums and the
    // batch): min_cell_slots(layer), raised to the floor in a global layer.
    int cell_minimum(int layer, int floor) const;
    // Slots of all cells before the first cell of `layer` (layer == n_layer: all slots).
    int64_t first_slot_of(int layer) const;
    int64_t total_slots() const { return first_slot_of(n_layer); }
    // A cell's first slot while every cell has its layer's budget (after clearing; always when
    // the heads' budgets stay put): the cells in (layer, kv head) order.
    int64_t uniform_cell_first(int layer, int kv_head) const {
        return first_slot_of(layer) + static_cast<int64_t>(kv_head) * slots_in(layer);
    }
    // The policy of one layer's cells: the recent window is the same share of the layer's slots
    // as of n_slots; sinks and horizon are counted in stream tokens and stay as they are. A local
    // layer's: the window policy over all its slots (the oldest go first).
    KvPolicyConfig policy_in(int layer) const;
    // Whether a batch's rotary positions differ between layers, and between a layer's kv heads:
    // with rolling, each cell's ranks count its own tokens (kv_batch_positions), and the cells of
    // a layer hold different numbers of them when their budgets move.
    bool positions_per_kv_head() const { return rolling && head_share > 0.0f; }
    bool positions_per_layer() const { return rolling && (!layer_slots.empty() || head_share > 0.0f); }
    // How many sets of n positions a batch of n tokens has (kv_batch_positions).
    int position_sets() const { return (positions_per_layer() ? n_layer : 1) * (positions_per_kv_head() ? n_head_kv : 1); }
};

}  // namespace h2o
