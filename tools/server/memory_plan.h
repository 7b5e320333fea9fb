// The memory h2o-server may use, known before it takes a request: the weights, `sessions`
// fixed-size sessions, the prefix cache and one snapshot buffer. Nothing else grows with the
// number or the length of conversations (their records are a few hundred bytes each).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "h2o/h2o.h"

namespace h2o_server {

struct MemoryPlan {
    uint64_t weight_bytes = 0;           // the model's weights (memory-mapped, shared)
    uint64_t session_bytes = 0;          // one session: KV cache, statistics, activations, scratch
    uint32_t sessions = 0;               // live sessions at most
    uint64_t prefix_cache_bytes = 0;     // processed system prompts kept
    uint64_t snapshot_buffer_bytes = 0;  // the one snapshot being saved or restored
    uint64_t bound_bytes = 0;            // the sum: what the server can need at most
};

// Measures a session of these settings (made and freed here). false with *error when the
// session cannot be made.
bool plan_memory(h2o_model *model, const h2o_session_params &params, uint32_t sessions, uint64_t prefix_cache_bytes, MemoryPlan *out,
                 std::string *error);
std::string describe(const MemoryPlan &plan);
nlohmann::json to_json(const MemoryPlan &plan);

}  // namespace h2o_server
