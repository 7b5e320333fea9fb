#include "kv_config.h"

#include <algorithm>
#include <cmath>

namespace h2o {

int KvConfig::max_slots() const { return layer_slots.empty() ? n_slots : *std::max_element(layer_slots.begin(), layer_slots.end()); }

int KvConfig::min_slots() const {
    if (layer_slots.empty()) return n_slots;
    int fewest = -1;
    for (int l = 0; l < n_layer; ++l) {
        if (!is_window_layer(l) && (fewest < 0 || slots_in(l) < fewest)) fewest = slots_in(l);
    }
    return fewest < 0 ? n_slots : fewest;
}

int KvConfig::min_cell_slots(int layer) const {
    const int slots = slots_in(layer);
    if (is_window_layer(layer)) return slots;  // a window's slots never move
    return slots - static_cast<int>(std::floor(static_cast<double>(head_share) * slots));
}

int KvConfig::max_cell_slots(int layer) const {
    int64_t others_fewest = 0;  // every other cell of the pool at its fewest
    for (int l = pool_first_layer(layer); l < pool_end_layer(layer); ++l)
        others_fewest += static_cast<int64_t>(n_head_kv) * min_cell_slots(l);
    others_fewest -= min_cell_slots(layer);
    return static_cast<int>(pool_slots(layer) - others_fewest);
}

int KvConfig::min_cell_slots() const {
    int fewest = -1;
    for (int l = 0; l < n_layer; ++l) {
        if (!is_window_layer(l) && (fewest < 0 || min_cell_slots(l) < fewest)) fewest = min_cell_slots(l);
    }
    return fewest < 0 ? min_cell_slots(0) : fewest;
}

int KvConfig::max_cell_slots() const {
    int most = max_cell_slots(0);
    for (int l = 1; l < n_layer; ++l) most = std::max(most, max_cell_slots(l));
    return most;
}

int KvConfig::cell_minimum(int layer, int floor) const {
    return is_window_layer(layer) ? min_cell_slots(layer) : std::max(min_cell_slots(layer), floor);
}

int KvConfig::max_held_from_eviction() const {
    if (head_share <= 0.0f) return min_cell_slots() - 1;
    int most = -1;
    for (int layer = 0; layer < n_layer; layer = pool_end_layer(layer)) {
        // The largest floor the pool's cells can all have: the cells' minimums, raised to it,
        // within the pool's slots (a sum that grows with the floor, so found by bisection).
        auto fits = [&](int64_t floor) {
            int64_t total = 0;
            for (int l = layer; l < pool_end_layer(layer); ++l)
                total += static_cast<int64_t>(n_head_kv) * cell_minimum(l, static_cast<int>(floor));
            return total <= pool_slots(layer);
        };
        bool global = false;
        for (int l = layer; l < pool_end_layer(layer); ++l) global |= !is_window_layer(l);
        if (!global) continue;
        int64_t low = 0, high = pool_slots(layer);  // fits(low); the answer is below high + 1
        while (low < high) {
            const int64_t mid = (low + high + 1) / 2;
            if (fits(mid)) {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        most = most < 0 ? static_cast<int>(low) : std::min(most, static_cast<int>(low));
    }
    return most - 1;
}

int64_t KvConfig::first_slot_of(int layer) const {
    int64_t slots = 0;
    for (int l = 0; l < layer; ++l) slots += slots_in(l);
    return slots * n_head_kv;
}

KvPolicyConfig KvConfig::policy_in(int layer) const {
    const int slots = slots_in(layer);
    if (is_window_layer(layer)) {
        KvPolicyConfig window;
        window.policy = KvPolicy::Window;
        window.recent = slots;
        return window;
    }
    KvPolicyConfig p = policy;
    if (slots != n_slots && n_slots > 0) {
        p.recent = static_cast<int>(std::lround(static_cast<double>(policy.recent) * slots / n_slots));
        p.recent = std::min(p.recent, slots);
    }
    return p;
}

}  // namespace h2o
