#include "eval_policies.h"

#include "common.h"
#include "h2o/h2o_experimental.h"

namespace h2o_tools {

const char *eval_policy_name(uint32_t policy) {
    if (policy == kShiftPolicy) return "shift";
    if (policy == kOraclePolicy) return "oracle";
    return policy_name(policy);
}

bool parse_eval_policy(const std::string &name, uint32_t *out) {
    if (name == "shift" || name == "oracle") {
        *out = name == "shift" ? kShiftPolicy : kOraclePolicy;
        return true;
    }
    return parse_policy(name, out);
}

std::string eval_policy_names() { return kv_policy_names() + ", shift, oracle"; }

void make_caller_evicted_window(h2o_session_params *p, uint32_t budget) {
    p->kv_policy = H2O_KV_WINDOW;
    p->kv_budget = budget;
    p->kv_sinks = 0;
    p->kv_recent = 0;
    p->kv_recent_ratio = 0.0f;
    h2o_session_params_set_experimental(p, H2O_EXP_KV_LAYER_SLOPE, 0.0);
    h2o_session_params_set_experimental(p, H2O_EXP_KV_HEAD_SHARE, 0.0);
}

}  // namespace h2o_tools
