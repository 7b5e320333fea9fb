#include "eval_policies.h"

#include "common.h"

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

}  // namespace h2o_tools
