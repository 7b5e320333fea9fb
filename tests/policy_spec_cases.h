// Cases that run kv_policy_spec.h's functions, compiled by every compiler the spec serves: the
// host C++ compiler (test_kv_policy_spec.cpp) and, where the CUDA toolkit is present, nvcc for the
// host and the device (cuda/policy_spec_cuda.cu). The test compares the results bit for bit.
#pragma once

#include "kv_policy_spec.h"

namespace h2o {

// One case: a slot's statistics, one query's weight and context, the batch's size.
struct SpecCase {
    SlotStats old;
    float w, decay;
    KV_UINT group, visible, n, t, policy;
    bool stale;
    KV_UINT proxy;  // kv_is_proxy_query's: how many of the batch's last queries `last` sums
    bool first_part;
    KV_UINT index_low, index_high, cell, seed;  // kv_prompt_random_factor's arguments
    float share;
};

struct SpecResult {
    SlotStats after;  // old after a batch whose queries are this case's query repeated at t and n-1
    float priority_before, priority_after;
    float threshold, persistence_weight;
    float random_factor, prompt_priority;  // kv_prompt_random_factor, kv_prompt_priority of `after`
};

KV_FN SpecResult evaluate_spec_case(SpecCase c) {
    SpecResult r;
    r.threshold = kv_importance_threshold(c.group, c.visible);
    r.persistence_weight = kv_persistence_weight(c.decay, c.n, c.t);
    // Two partials, as two threads would sum them: query t and the batch's last query.
    const SlotStats first =
        kv_stats_add_query(kv_stats_zero(), c.w, r.threshold, r.persistence_weight, kv_is_proxy_query(c.n, c.t, c.proxy));
    const SlotStats last = kv_stats_add_query(kv_stats_zero(), 0.5f * c.w, r.threshold, 1.0f, true);
    r.after = kv_stats_fold(c.old, kv_stats_add(first, last), kv_power(c.decay, c.n), c.first_part);
    r.priority_before = kv_victim_priority(c.policy, c.old, c.stale);
    r.priority_after = kv_victim_priority(c.policy, r.after, c.stale);
    r.random_factor = kv_prompt_random_factor(c.index_low, c.index_high, c.cell, c.seed, c.share);
    r.prompt_priority = kv_prompt_priority(r.after, c.stale, r.random_factor);
    return r;
}

// Runs the cases compiled by nvcc: on the host, and on the first CUDA device when there is one.
// Defined in cuda/policy_spec_cuda.cu; device_error receives why the device run did not happen
// (empty when it did).
void evaluate_spec_cases_cuda_host(const SpecCase *cases, int n, SpecResult *out);
bool evaluate_spec_cases_cuda_device(const SpecCase *cases, int n, SpecResult *out, char *device_error, int error_size);

}  // namespace h2o
