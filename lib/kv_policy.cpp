#include "kv_policy.h"

#include <algorithm>
#include <cstring>

#include "h2o/h2o.h"

namespace h2o {

// The public header numbers the policies too; both must agree with kv_policy_spec.h.
static_assert(H2O_KV_FULL == KV_POLICY_FULL && H2O_KV_H2O == KV_POLICY_H2O && H2O_KV_WINDOW == KV_POLICY_WINDOW &&
              H2O_KV_SINK_WINDOW == KV_POLICY_SINK_WINDOW && H2O_KV_SCISSORHANDS == KV_POLICY_SCISSORHANDS &&
              H2O_KV_TOVA == KV_POLICY_TOVA && H2O_KV_ROCO == KV_POLICY_ROCO && H2O_KV_RANDOM == KV_POLICY_RANDOM &&
              H2O_KV_MEAN_H2O == KV_POLICY_MEAN_H2O && H2O_KV_MEAN_H2O + 1 == KV_POLICY_COUNT);

const char *const kKvPolicyNames[kKvPolicyCount] = {"full", "h2o", "window", "sink_window", "scissorhands",
                                                    "tova", "roco", "random", "mean_h2o"};

const char *kv_policy_name(KvPolicy policy) {
    const auto i = static_cast<uint32_t>(policy);
    return i < kKvPolicyCount ? kKvPolicyNames[i] : "unknown";
}

bool parse_kv_policy(const char *name, KvPolicy *out) {
    for (uint32_t i = 0; i < kKvPolicyCount; ++i) {
        if (std::strcmp(name, kKvPolicyNames[i]) == 0) {
            *out = static_cast<KvPolicy>(i);
            return true;
        }
    }
    return false;
}

int64_t kv_recent_from(const KvPolicyConfig &config, int64_t next_index, int n) {
    return std::max<int64_t>(0, next_index - std::max(0, config.recent - n));
}

int64_t kv_stale_before(const KvPolicyConfig &config, int64_t next_index, int n) {
    if (config.horizon <= 0) return 0;
    const int64_t newest = next_index + n - 1;
    return newest - config.horizon + 1 > 0 ? newest - config.horizon + 1 : 0;
}

}  // namespace h2o
