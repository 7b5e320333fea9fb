#include "kv_layer_budgets.h"

#include <algorithm>
#include <cmath>

#include "kv_config.h"

namespace h2o {

std::vector<int> kv_layer_budgets(int n_layer, int budget, float slope, int min_slots) {
    if (slope == 0.0f || n_layer < 2) return {};
    std::vector<int> slots(static_cast<size_t>(n_layer));
    std::vector<double> share(static_cast<size_t>(n_layer));
    int64_t given = 0;
    for (int l = 0; l < n_layer; ++l) {
        const double weight = 1.0 + slope * (2.0 * l / (n_layer - 1) - 1.0);
        share[l] = std::max<double>(min_slots, budget * weight);
        slots[l] = static_cast<int>(std::floor(share[l]));
        given += slots[l];
    }
    // Rounding (and the floor of min_slots) leave the total off by less than one slot a layer:
    // the layers furthest from their share get or give the difference, upper layers first on ties.
    const int64_t total = static_cast<int64_t>(n_layer) * budget;
    while (given != total) {
        const bool add = given < total;
        int pick = -1;
        for (int l = n_layer - 1; l >= 0; --l) {
            if (!add && slots[l] <= min_slots) continue;
            const double gap = add ? share[l] - slots[l] : slots[l] - share[l];
            if (pick < 0 || gap > (add ? share[pick] - slots[pick] : slots[pick] - share[pick])) pick = l;
        }
        slots[pick] += add ? 1 : -1;
        given += add ? 1 : -1;
    }
    return slots;
}

void kv_batch_positions(const KvConfig &kv, int64_t n_past, int64_t n_cached, int64_t n, int32_t *out, const int32_t *cell_held,
                        const int32_t *cell_slots) {
    const int cells_per_layer = kv.positions_per_kv_head() ? kv.n_head_kv : 1;
    for (int layer = 0; layer < (kv.positions_per_layer() ? kv.n_layer : 1); ++layer) {
        for (int h = 0; h < cells_per_layer; ++h) {
            const size_t cell = static_cast<size_t>(layer) * kv.n_head_kv + h;
            const int64_t slots = cell_slots ? cell_slots[cell] : kv.slots_in(layer);
            const int64_t cached = cell_held ? cell_held[cell] : std::min(n_cached, slots);
            // make_room evicts what the batch needs beyond the cell's free slots.
            const int64_t first_rank = cached - std::max<int64_t>(0, cached + n - slots);
            for (int64_t i = 0; i < n; ++i) *out++ = static_cast<int32_t>(kv.rolling ? first_rank + i : n_past + i);
        }
    }
}

}  // namespace h2o
