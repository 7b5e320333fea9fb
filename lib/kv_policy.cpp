#include "kv_policy.h"

#include <cmath>
#include <cstring>

namespace h2o {

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

bool kv_policy_uses_statistics(KvPolicy policy) {
    switch (policy) {
        case KvPolicy::H2O:
        case KvPolicy::Scissorhands:
        case KvPolicy::Tova:
        case KvPolicy::RoCo:
        case KvPolicy::MeanH2O:
            return true;
        default:
            return false;
    }
}

double kv_priority(const KvPolicyConfig &config, const SlotStats &s, int64_t stream_index) {
    switch (config.policy) {
        case KvPolicy::H2O:
            return s.accumulated;
        case KvPolicy::Scissorhands:
            return s.persistence;
        case KvPolicy::Tova:
            return s.last;
        case KvPolicy::RoCo: {
            // Mean attention since entry; the standard deviation, scaled far below any real
            // difference of means, only breaks ties between tokens with equal means.
            const double steps = s.steps > 0 ? s.steps : 1.0;
            const double mean = s.accumulated / steps;
            const double variance = std::fmax(0.0, s.squared / steps - mean * mean);
            return mean + 1e-3 * std::sqrt(variance);
        }
        case KvPolicy::MeanH2O:
            return s.steps > 0 ? s.accumulated / s.steps : 0.0;
        case KvPolicy::Full:
        case KvPolicy::Window:
        case KvPolicy::SinkWindow:
        case KvPolicy::Random:
            break;
    }
    // Window-like policies: the oldest token goes first.
    return static_cast<double>(stream_index);
}

int64_t kv_stale_before(const KvPolicyConfig &config, int64_t next_index, int n) {
    if (config.horizon <= 0) return 0;
    const int64_t newest = next_index + n - 1;
    return newest - config.horizon + 1 > 0 ? newest - config.horizon + 1 : 0;
}

double kv_victim_priority(const KvPolicyConfig &config, const SlotStats &stats, int64_t stream_index, int64_t stale_before) {
    return stream_index < stale_before ? -1.0 : kv_priority(config, stats, stream_index);
}

}  // namespace h2o
