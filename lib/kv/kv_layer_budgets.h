// How a session's KV budget spreads across layers (kv_layer_slope), and the per-layer geometry
// of a KvConfig (kv_config.h) that every backend lays its cache out by.
//
// Layer l of L gets budget * (1 + slope * (2l / (L - 1) - 1)) slots, rounded so that the layers
// together hold exactly L * budget: the memory of a uniform cache. Giving upper layers more slots
// than lower ones costs less perplexity at the same memory, where PyramidKV's shape (more below)
// costs more (docs/EVALUATION.md, "Budgets across layers").
// On a model with sliding-window layers, l and L count its global layers (the session gives a
// local layer its window).
#pragma once

#include <cstdint>
#include <vector>

namespace h2o {

struct KvConfig;

// kv_layer_slope's accepted range: at 1 the bottom layer would get no slots.
constexpr float kMaxKvLayerSlope = 0.9f;
// The fewest slots a layer is given: a session's smallest budget.
constexpr int kMinKvLayerSlots = 2;

// Slots of each layer; empty when slope is 0 or there is one layer (every layer `budget`).
// Every entry is at least min_slots (and budget >= min_slots).
std::vector<int> kv_layer_budgets(int n_layer, int budget, float slope, int min_slots);

// The rotary positions of a batch of n tokens whose first has stream index n_past, as
// LlamaGraph::evaluate takes them: n positions, or n per layer, layer after layer, when
// kv.positions_per_layer(), and within a layer n per kv head when kv.positions_per_kv_head().
// Without rolling they are stream positions; with it, each cell's ranks once it has evicted
// room for the batch. n_cached: the tokens held by the layers with the most slots (a layer with
// fewer holds min(n_cached, its slots)). Once the heads' budgets have moved, cell_held and
// cell_slots ([layer][kv head], from KvStore::rebalance_kv) say what each cell holds instead;
// null: every cell of a layer holds the same.
void kv_batch_positions(const KvConfig &kv, int64_t n_past, int64_t n_cached, int64_t n, int32_t *out, const int32_t *cell_held = nullptr,
                        const int32_t *cell_slots = nullptr);

}  // namespace h2o
