#include "kv_settings.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "h2o/h2o_experimental.h"
#include "kv_head_budgets.h"
#include "kv_layer_budgets.h"

namespace h2o {

int default_thread_count() {
    const unsigned cores = std::thread::hardware_concurrency();
    return static_cast<int>(cores == 0 ? 1 : (cores > 8 ? 8 : cores));
}

namespace {

// Limits that keep every size computed from parameters far from overflow.
constexpr uint32_t kMaxContext = 1u << 22;
// kv_horizon values beyond this (H2O_KV_HORIZON_NONE aside) are refused: horizons are stored as int.
constexpr uint32_t kMaxKvHorizon = 0x7FFFFFFFu;
// n_ctx of a default session: a file's context length alone does not size a session's memory.
constexpr uint32_t kDefaultMaxContext = 4096;
constexpr uint32_t kMaxThreads = 256;
constexpr uint32_t kMaxBatch = 4096;
constexpr uint32_t kIntMax = 0x7FFFFFFFu;

uint64_t float_bits(float f) {
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof(bits));
    return bits;
}

float bits_float(uint64_t bits) {
    const auto word = static_cast<uint32_t>(bits);
    float f = 0.0f;
    std::memcpy(&f, &word, sizeof(f));
    return f;
}

// The row helpers and the table are laid out by hand, a row to a setting.
// clang-format off
// Row helpers: a stable field (to_params given) or a research key (to_params null).
constexpr CacheSetting field(const char *name, SettingWord word, uint32_t since, uint32_t word_since, uint32_t max_word,
                             uint64_t (*get)(const SessionSettings &), void (*set)(SessionSettings &, uint64_t),
                             void (*to_params)(const SessionSettings &, h2o_session_params *)) {
    return {name, -1, 0.0, 0.0, false, word, since, word_since, max_word, get, set, to_params};
}
constexpr CacheSetting research(const char *name, h2o_experimental_key key, double min, double max, bool integral, SettingWord word,
                                uint32_t since, uint32_t word_since, uint64_t (*get)(const SessionSettings &),
                                void (*set)(SessionSettings &, uint64_t)) {
    return {name, static_cast<int>(key), min, max, integral, word, since, word_since, integral ? static_cast<uint32_t>(max) : 0u,
            get, set, nullptr};
}

using S = SessionSettings;
using P = h2o_session_params;

}  // namespace

// In the snapshot header's order. Versions: 2 added the horizon, 4 gave the slope the word that
// 2 and 3 left zero, 5 the prompt eviction settings, 6 the head share (and a reserved word that 7
// gave to sharing across layers), 8 sinks under every policy, 9 the rebalancing interval.
const CacheSetting kCacheSettings[] = {
    field("n_ctx", SettingWord::U32, 1, 1, kIntMax, [](const S &s) -> uint64_t { return uint64_t(s.n_ctx); },
          [](S &s, uint64_t v) { s.n_ctx = int(v); }, [](const S &s, P *p) { p->n_ctx = uint32_t(s.n_ctx); }),
    field("kv_budget", SettingWord::U32, 1, 1, kIntMax, [](const S &s) -> uint64_t { return uint64_t(s.kv_budget); },
          [](S &s, uint64_t v) { s.kv_budget = int(v); }, [](const S &s, P *p) { p->kv_budget = uint32_t(s.kv_budget); }),
    field("kv_policy", SettingWord::U32, 1, 1, kKvPolicyCount - 1, [](const S &s) -> uint64_t { return uint64_t(s.policy.policy); },
          [](S &s, uint64_t v) { s.policy.policy = KvPolicy(v); }, [](const S &s, P *p) { p->kv_policy = uint32_t(s.policy.policy); }),
    field("kv_recent", SettingWord::U32, 1, 1, kIntMax, [](const S &s) -> uint64_t { return uint64_t(s.policy.recent); },
          [](S &s, uint64_t v) { s.policy.recent = int(v); },
          [](const S &s, P *p) {
              p->kv_recent = uint32_t(s.policy.recent);
              p->kv_recent_ratio = 0.0f;  // with kv_recent 0 the window is 0 too
          }),
    field("kv_sinks", SettingWord::U32, 1, 1, kIntMax, [](const S &s) -> uint64_t { return uint64_t(s.policy.sinks); },
          [](S &s, uint64_t v) { s.policy.sinks = int(v); }, [](const S &s, P *p) { p->kv_sinks = uint32_t(s.policy.sinks); }),
    field("kv_type", SettingWord::U32, 1, 1, kKvTypeCount - 1, [](const S &s) -> uint64_t { return uint64_t(s.kv_type); },
          [](S &s, uint64_t v) { s.kv_type = KvType(v); }, [](const S &s, P *p) { p->kv_type = uint32_t(s.kv_type); }),
    field("position_rolling", SettingWord::U32, 1, 1, 1, [](const S &s) -> uint64_t { return s.rolling ? 1 : 0; },
          [](S &s, uint64_t v) { s.rolling = v != 0; },
          [](const S &s, P *p) {
              p->position_rolling = s.rolling ? 1 : 0;
              // kv_overflow resolves into rolling (and the policy): a cache that does not roll
              // asked for the old contract, or never evicts (H2O_KV_FULL), where both agree.
              p->kv_overflow = s.rolling ? H2O_KV_OVERFLOW_EVICT : H2O_KV_OVERFLOW_ERROR;
          }),
    field("n_batch", SettingWord::U32, 1, 1, kIntMax, [](const S &s) -> uint64_t { return uint64_t(s.n_batch); },
          [](S &s, uint64_t v) { s.n_batch = int(v); }, [](const S &s, P *p) { p->n_batch = uint32_t(s.n_batch); }),
    field("seed", SettingWord::U64, 1, 1, 0, [](const S &s) -> uint64_t { return s.seed; },
          [](S &s, uint64_t v) {
              s.seed = v;
              s.policy.seed = v;
          },
          [](const S &s, P *p) { p->seed = s.seed; }),
    field("kv_horizon", SettingWord::U32, 2, 2, kIntMax, [](const S &s) -> uint64_t { return uint64_t(s.policy.horizon); },
          [](S &s, uint64_t v) { s.policy.horizon = int(v); },
          [](const S &s, P *p) { p->kv_horizon = s.policy.horizon ? uint32_t(s.policy.horizon) : H2O_KV_HORIZON_NONE; }),
    research("kv_layer_slope", H2O_EXP_KV_LAYER_SLOPE, -kMaxKvLayerSlope, kMaxKvLayerSlope, false, SettingWord::F32, 4, 2,
             [](const S &s) { return float_bits(s.kv_layer_slope); }, [](S &s, uint64_t v) { s.kv_layer_slope = bits_float(v); }),
    research("kv_prompt_proxy", H2O_EXP_KV_PROMPT_PROXY, 0, kMaxKvPromptProxy, true, SettingWord::U32, 5, 5,
             [](const S &s) -> uint64_t { return uint64_t(s.policy.prompt_proxy); }, [](S &s, uint64_t v) { s.policy.prompt_proxy = int(v); }),
    research("kv_prompt_random_share", H2O_EXP_KV_PROMPT_RANDOM_SHARE, 0, 1, false, SettingWord::F32, 5, 5,
             [](const S &s) { return float_bits(s.policy.prompt_random_share); },
             [](S &s, uint64_t v) { s.policy.prompt_random_share = bits_float(v); }),
    research("kv_head_share", H2O_EXP_KV_HEAD_SHARE, 0, kMaxKvHeadShare, false, SettingWord::F32, 6, 6,
             [](const S &s) { return float_bits(s.kv_head_share); }, [](S &s, uint64_t v) { s.kv_head_share = bits_float(v); }),
    research("kv_share_across_layers", H2O_EXP_KV_SHARE_ACROSS_LAYERS, 0, 1, true, SettingWord::U32, 7, 6,
             [](const S &s) -> uint64_t { return s.kv_share_across_layers ? 1 : 0; }, [](S &s, uint64_t v) { s.kv_share_across_layers = v != 0; }),
    research("kv_sinks_every_policy", H2O_EXP_KV_SINKS_EVERY_POLICY, 0, 1, true, SettingWord::U32, 8, 8,
             [](const S &s) -> uint64_t { return s.kv_sinks_every_policy ? 1 : 0; }, [](S &s, uint64_t v) { s.kv_sinks_every_policy = v != 0; }),
    research("kv_rebalance_interval", H2O_EXP_KV_REBALANCE_INTERVAL, 0, kMaxKvRebalanceInterval, true, SettingWord::U32, 9, 9,
             [](const S &s) -> uint64_t { return uint64_t(s.kv_rebalance_interval); }, [](S &s, uint64_t v) { s.kv_rebalance_interval = int(v); }),
};
// clang-format on
const size_t kCacheSettingCount = sizeof(kCacheSettings) / sizeof(kCacheSettings[0]);

const CacheSetting *experimental_setting(uint32_t key) {
    for (const CacheSetting &row : kCacheSettings) {
        if (row.experimental_key >= 0 && static_cast<uint32_t>(row.experimental_key) == key) return &row;
    }
    return nullptr;
}

double cache_setting_value(const CacheSetting &row, const SessionSettings &settings) {
    const uint64_t bits = row.get(settings);
    return row.word == SettingWord::F32 ? static_cast<double>(bits_float(bits)) : static_cast<double>(bits);
}

double research_setting_value(const CacheSetting &row, double value) {
    // Beyond float's range the conversion is undefined; such a value is outside every row's range.
    if (row.word != SettingWord::F32 || !(std::fabs(value) <= std::numeric_limits<float>::max())) return value;
    return static_cast<double>(static_cast<float>(value));
}

Status check_research_value(const CacheSetting &row, double value) {
    const double v = research_setting_value(row, value);
    if (!(v >= row.min && v <= row.max) || (row.integral && v != std::floor(v))) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(row.name) + " " + number_text(value) + " must " +
                                                        (row.integral ? "be a whole number in [" : "lie in [") + number_text(row.min) +
                                                        ", " + number_text(row.max) + "]");
    }
    return Status::Ok();
}

bool same_cache_settings(const SessionSettings &a, const SessionSettings &b) {
    return std::all_of(std::begin(kCacheSettings), std::end(kCacheSettings),
                       [&](const CacheSetting &row) { return row.get(a) == row.get(b); });
}

uint64_t cache_settings_hash(const SessionSettings &settings) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the rows' values
    for (const CacheSetting &row : kCacheSettings) h = (h ^ row.get(settings)) * 0x100000001b3ull;
    return h;
}

void write_cache_settings(const SessionSettings &settings, ByteWriter *out) {
    for (const CacheSetting &row : kCacheSettings) {
        const uint64_t bits = row.get(settings);
        if (row.word == SettingWord::U64) {
            out->put<uint64_t>(bits);
        } else {
            out->put<uint32_t>(static_cast<uint32_t>(bits));
        }
    }
}

size_t cache_settings_bytes(uint32_t version) {
    size_t bytes = 0;
    for (const CacheSetting &row : kCacheSettings) {
        if (version >= row.word_version) bytes += row.word == SettingWord::U64 ? 8 : 4;
    }
    return bytes;
}

Status read_cache_settings(ByteReader *in, uint32_t version, SessionSettings *settings) {
    for (const CacheSetting &row : kCacheSettings) {
        if (version < row.word_version) {
            row.set(*settings, 0);
            continue;
        }
        uint64_t bits = 0;
        if (row.word == SettingWord::U64) {
            H2O_TRY(in->get(row.name, &bits));
        } else {
            uint32_t word = 0;
            H2O_TRY(in->get(row.name, &word));
            bits = word;
        }
        if (version < row.snapshot_version && bits != 0) {
            return make_error(H2O_ERR_STATE_FORMAT,
                              std::string("not a valid session snapshot: its settings are out of range (the word that "
                                          "format version ") +
                                  std::to_string(version) + " reserves for " + row.name + " is not zero)");
        }
        if (row.word == SettingWord::U32 && bits > row.max_word) {
            return make_error(H2O_ERR_STATE_FORMAT, std::string("not a valid session snapshot: its settings are out of range (") +
                                                        row.name + " " + std::to_string(bits) + ")");
        }
        row.set(*settings, bits);
    }
    return Status::Ok();
}

h2o_session_params default_session_params() {
    h2o_session_params p;
    std::memset(&p, 0, sizeof(p));
    p.struct_size = sizeof(p);
    p.seed = 0x5EED;
    p.kv_policy = H2O_KV_SCISSORHANDS;
    p.kv_recent_ratio = -1.0f;  // the policy's own (kKvPolicyTraits)
    p.kv_sinks = 4;
    p.backend = H2O_BACKEND_AUTO;
    p.device_index = -1;
    p.kv_type = H2O_KV_TYPE_F16;            // h2o.h says why
    p.kv_overflow = H2O_KV_OVERFLOW_EVICT;  // a session never runs out
    // Every research setting 0 (off) but the rebalancing interval, whose 0 means every batch.
    p.experimental[H2O_EXP_KV_REBALANCE_INTERVAL] = H2O_KV_REBALANCE_INTERVAL_DEFAULT;
    return p;
}

h2o_session_params params_for(const SessionSettings &settings, const h2o_session_params &host) {
    h2o_session_params p = host;
    for (const CacheSetting &row : kCacheSettings) {
        if (row.to_params) {
            row.to_params(settings, &p);
        } else {
            p.experimental[row.experimental_key] = cache_setting_value(row, settings);
        }
    }
    return p;
}

namespace {

Status bad(std::string message) { return make_error(H2O_ERR_INVALID_ARGUMENT, std::move(message)); }

// A research setting as resolution reads it, checked against its row: the array is public, so a
// caller may have bypassed h2o_session_params_set_experimental.
Status research_value(const h2o_session_params &p, h2o_experimental_key key, double *value) {
    const CacheSetting &row = *experimental_setting(key);
    H2O_TRY(check_research_value(row, p.experimental[key]));
    *value = research_setting_value(row, p.experimental[key]);
    return Status::Ok();
}

std::string statistics_policies() {
    std::string names;
    for (uint32_t i = 0; i < kKvPolicyCount; ++i) {
        if (!kv_policy_uses_statistics(i)) continue;
        names += (names.empty() ? "" : ", ") + std::string(kKvPolicyTraits[i].name);
    }
    return names;
}

}  // namespace

Status resolve_session_settings(const h2o_session_params &p, const ResolveContext &context, SessionSettings *out) {
    if (p.n_ctx == 1)
        return bad("n_ctx must be at least 2 (0: the model's context length, at most " + std::to_string(kDefaultMaxContext) + ")");
    if (p.n_ctx > kMaxContext) return bad("n_ctx " + std::to_string(p.n_ctx) + " exceeds the maximum " + std::to_string(kMaxContext));
    if (p.n_threads > kMaxThreads)
        return bad("n_threads " + std::to_string(p.n_threads) + " exceeds the maximum " + std::to_string(kMaxThreads));
    if (p.n_batch > kMaxBatch) return bad("n_batch " + std::to_string(p.n_batch) + " exceeds the maximum " + std::to_string(kMaxBatch));
    if (p.kv_policy >= kKvPolicyCount) return bad("kv_policy " + std::to_string(p.kv_policy) + " is not a known policy");
    if (!(p.kv_recent_ratio <= 1.0f)) return bad("kv_recent_ratio must be at most 1 (negative: the policy's default)");
    if (p.backend > H2O_BACKEND_CUDA) return bad("backend " + std::to_string(p.backend) + " is not a known backend kind");
    if (p.device_index < -1) return bad("device_index must be -1 (best) or a device index");
    if (p.kv_type >= kKvTypeCount) return bad("kv_type " + std::to_string(p.kv_type) + " is not a known KV format");
    if (p.position_rolling != 0 && p.position_rolling != 1) return bad("position_rolling must be 0 or 1");
    if (p.kv_overflow > H2O_KV_OVERFLOW_ERROR)
        return bad("kv_overflow " + std::to_string(p.kv_overflow) + " is not a known overflow behaviour (0: evict, 1: error)");
    double layer_slope = 0, prompt_proxy = 0, prompt_random_share = 0, head_share = 0, across_layers = 0, sinks_every_policy = 0,
           rebalance_interval = 0;
    H2O_TRY(research_value(p, H2O_EXP_KV_LAYER_SLOPE, &layer_slope));
    H2O_TRY(research_value(p, H2O_EXP_KV_PROMPT_PROXY, &prompt_proxy));
    H2O_TRY(research_value(p, H2O_EXP_KV_PROMPT_RANDOM_SHARE, &prompt_random_share));
    H2O_TRY(research_value(p, H2O_EXP_KV_HEAD_SHARE, &head_share));
    H2O_TRY(research_value(p, H2O_EXP_KV_SHARE_ACROSS_LAYERS, &across_layers));
    H2O_TRY(research_value(p, H2O_EXP_KV_SINKS_EVERY_POLICY, &sinks_every_policy));
    H2O_TRY(research_value(p, H2O_EXP_KV_REBALANCE_INTERVAL, &rebalance_interval));

    SessionSettings s;
    s.backend = p.backend;
    s.device_index = p.device_index;
    s.kv_type = static_cast<KvType>(p.kv_type);
    s.n_ctx = static_cast<int>(p.n_ctx ? p.n_ctx : std::min<uint32_t>(static_cast<uint32_t>(context.n_ctx_train), kDefaultMaxContext));
    s.kv_budget = (p.kv_budget == 0 || p.kv_budget > static_cast<uint32_t>(s.n_ctx)) ? s.n_ctx : static_cast<int>(p.kv_budget);
    // An endless session (the default) evicts once full and rolls its positions; H2O_KV_FULL
    // never evicts, whatever kv_overflow says.
    const bool endless = p.kv_overflow == H2O_KV_OVERFLOW_EVICT && p.kv_policy != H2O_KV_FULL;
    s.rolling = p.position_rolling != 0 || endless;
    if (s.kv_budget < 2) return bad("kv_budget must be at least 2 (0: n_ctx slots)");
    const bool evicting = s.kv_budget < s.n_ctx || s.rolling;
    s.policy.policy = evicting ? static_cast<KvPolicy>(p.kv_policy) : KvPolicy::Full;
    const KvPolicyTraits &traits = kv_policy_traits(s.policy.policy);
    const bool never_evicts = s.policy.policy == KvPolicy::Full;
    const bool ranks_by_attention = kv_policy_uses_statistics(s.policy.policy);

    const float ratio = p.kv_recent_ratio >= 0.0f ? p.kv_recent_ratio : traits.default_recent_ratio;
    const uint32_t recent = p.kv_recent ? p.kv_recent : static_cast<uint32_t>(ratio * s.kv_budget);
    if (recent > static_cast<uint32_t>(s.kv_budget))
        return bad("kv_recent " + std::to_string(recent) + " exceeds kv_budget " + std::to_string(s.kv_budget));
    s.policy.recent = traits.has_recent_window ? static_cast<int>(recent) : 0;

    // Budgets move between the global layers' cells; a model's local layers hold their windows,
    // and the global layers' cells are not one region of the cache (they lie between local ones).
    if (context.n_local_layers > 0 && evicting && head_share > 0.0 && across_layers != 0) {
        return bad(
            "kv_share_across_layers is not supported for models with sliding-window layers yet (the global layers' "
            "cells lie between the local layers' windows); kv_head_share moves slots within each global layer");
    }
    s.kv_layer_slope = evicting ? static_cast<float>(layer_slope) : 0.0f;
    const std::vector<int> layer_budgets =
        kv_layer_budgets(context.n_layer - context.n_local_layers, s.kv_budget, s.kv_layer_slope, kMinKvLayerSlots);
    const int smallest_budget = layer_budgets.empty() ? s.kv_budget : *std::min_element(layer_budgets.begin(), layer_budgets.end());
    s.kv_sinks_every_policy = !never_evicts && sinks_every_policy != 0;
    const bool keeps_sinks = traits.keeps_sinks || s.kv_sinks_every_policy;
    if (keeps_sinks && p.kv_sinks >= static_cast<uint32_t>(smallest_budget)) {
        return bad("kv_sinks " + std::to_string(p.kv_sinks) + " must be smaller than kv_budget " + std::to_string(smallest_budget) +
                   (layer_budgets.empty() ? "" : " (the smallest layer's, with this kv_layer_slope)") + " for the " +
                   kv_policy_name(s.policy.policy) + " policy");
    }
    s.policy.sinks = keeps_sinks ? static_cast<int>(p.kv_sinks) : 0;

    // The horizon ranks tokens by age, so only the policies that rank by a score (attention
    // statistics, or the query-agnostic scorers' keys) have one.
    const uint64_t horizon = p.kv_horizon == H2O_KV_HORIZON_NONE ? 0
                             : p.kv_horizon != 0                 ? p.kv_horizon
                                                 // in half budgets: 1.5 budgets is 3 * budget / 2, exactly
                                                 : static_cast<uint64_t>(traits.default_horizon * 2.0f) * s.kv_budget / 2;
    const bool ranks_by_score = ranks_by_attention || kv_policy_scores_keys(static_cast<uint32_t>(s.policy.policy));
    if (ranks_by_score && horizon != 0 && horizon < static_cast<uint64_t>(s.kv_budget)) {
        return bad("kv_horizon " + std::to_string(horizon) + " is smaller than kv_budget " + std::to_string(s.kv_budget) +
                   " (it would evict tokens the budget has room for; H2O_KV_HORIZON_NONE: no horizon)");
    }
    if (horizon > static_cast<uint64_t>(kMaxKvHorizon)) {
        return bad("kv_horizon " + std::to_string(horizon) + " exceeds the maximum " + std::to_string(kMaxKvHorizon));
    }
    s.policy.horizon = ranks_by_score ? static_cast<int>(horizon) : 0;

    // Ranking by proxy attention and moving budgets by it need the statistics; a full cache never
    // evicts, so it ignores them.
    if (!never_evicts && prompt_proxy != 0 && !ranks_by_attention) {
        return bad("kv_prompt_proxy needs a policy that gathers attention statistics (" + statistics_policies() + "), not " +
                   kv_policy_name(s.policy.policy));
    }
    s.policy.prompt_proxy = never_evicts ? 0 : static_cast<int>(prompt_proxy);
    s.policy.prompt_random_share = s.policy.prompt_proxy > 0 ? static_cast<float>(prompt_random_share) : 0.0f;
    if (!never_evicts && head_share > 0.0 && !ranks_by_attention) {
        return bad("kv_head_share needs a policy that gathers attention statistics (" + statistics_policies() + "), not " +
                   kv_policy_name(s.policy.policy));
    }
    s.kv_head_share = never_evicts ? 0.0f : static_cast<float>(head_share);
    if (!never_evicts && across_layers != 0 && s.kv_head_share == 0.0f) {
        return bad("kv_share_across_layers moves kv_head_share's slots between layers: set a kv_head_share above 0");
    }
    s.kv_share_across_layers = s.kv_head_share > 0.0f && across_layers != 0;
    s.kv_rebalance_interval = s.kv_head_share > 0.0f ? static_cast<int>(rebalance_interval) : 0;

    s.policy.seed = p.seed;
    s.seed = p.seed;
    s.n_threads = p.n_threads ? static_cast<int>(p.n_threads) : context.default_threads;
    s.n_batch = static_cast<int>(p.n_batch ? p.n_batch : 256);
    s.max_memory_bytes = p.max_memory_bytes;
    *out = s;
    return Status::Ok();
}

}  // namespace h2o
