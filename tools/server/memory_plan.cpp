#include "memory_plan.h"

#include <cstdio>

namespace h2o_server {

bool plan_memory(h2o_model *model, const h2o_session_params &params, uint32_t sessions, uint64_t prefix_cache_bytes, MemoryPlan *out,
                 std::string *error) {
    h2o_session *session = nullptr;
    if (h2o_session_create(model, &params, &session) != H2O_OK) {
        *error = std::string("cannot make a session with these settings: ") + h2o_last_error();
        return false;
    }
    h2o_memory_report report;
    report.struct_size = sizeof report;
    h2o_session_memory(session, &report);
    h2o_session_free(session);
    h2o_model_info info;
    info.struct_size = sizeof info;
    h2o_model_get_info(model, &info);
    MemoryPlan plan;
    plan.weight_bytes = report.weight_bytes;
    plan.session_bytes = report.kv_bytes + report.scratch_bytes;
    plan.sessions = sessions;
    plan.prefix_cache_bytes = prefix_cache_bytes;
    // A snapshot holds the cache and its bookkeeping (compressed, so less), the last logits and
    // the sampler's history: bounded by the cache, the logits and a margin for the rest.
    plan.snapshot_buffer_bytes = report.kv_bytes + 4ull * info.n_vocab + (1u << 20);
    plan.bound_bytes = plan.weight_bytes + plan.session_bytes * sessions + plan.prefix_cache_bytes + plan.snapshot_buffer_bytes;
    *out = plan;
    return true;
}

std::string describe(const MemoryPlan &plan) {
    auto mib = [](uint64_t bytes) { return bytes / 1048576.0; };
    char text[320];
    std::snprintf(text, sizeof text,
                  "memory bound %.1f MiB = weights %.1f + %u sessions x %.2f + prefix cache %.1f + snapshot buffer %.2f (MiB)",
                  mib(plan.bound_bytes), mib(plan.weight_bytes), plan.sessions, mib(plan.session_bytes), mib(plan.prefix_cache_bytes),
                  mib(plan.snapshot_buffer_bytes));
    return text;
}

nlohmann::json to_json(const MemoryPlan &plan) {
    return nlohmann::json{{"weight_bytes", plan.weight_bytes},
                          {"session_bytes", plan.session_bytes},
                          {"sessions", plan.sessions},
                          {"prefix_cache_bytes", plan.prefix_cache_bytes},
                          {"snapshot_buffer_bytes", plan.snapshot_buffer_bytes},
                          {"bound_bytes", plan.bound_bytes}};
}

}  // namespace h2o_server
