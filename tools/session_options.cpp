#include "session_options.h"

#include <cstdio>

#include "common.h"

namespace h2o_tools {

namespace {

// The library's limits on these settings (h2o.h); it checks them again when the session is made.
constexpr uint64_t kMaxThreads = 256;
constexpr uint64_t kMaxBudget = 1u << 22;  // no cache is longer than the longest n_ctx
constexpr uint64_t kMaxPromptProxy = 4096;
constexpr double kMaxHeadShare = 0.9;

// The options that only change how a cache evicts.
const char *const kEvictionOptions[] = {"--kv-policy", "--kv-recent", "--kv-prompt-proxy", "--kv-head-share",
                                        "--kv-share-across-layers"};

}  // namespace

void add_session_options(CommandLine &cl, h2o_session_params *params) {
    cl.count({"-t", "--threads"}, 0, kMaxThreads, &params->n_threads);
    cl.option("--kv-budget", [&cl, params](const std::string &v) {
        params->kv_budget = static_cast<uint32_t>(cl.to_count(v, 0, kMaxBudget));
        if (params->kv_budget == 1) cl.fail("--kv-budget must be 0 (a full cache, no eviction) or at least 2, not 1");
    });
    cl.option("--kv-policy", [&cl, params](const std::string &name) {
        if (!parse_policy(name, &params->kv_policy)) cl.fail("unknown policy '" + name + "' (known: " + kv_policy_names() + ")");
    });
    cl.count("--kv-recent", 0, kMaxBudget, &params->kv_recent);
    cl.count("--kv-prompt-proxy", 0, kMaxPromptProxy, &params->kv_prompt_proxy);
    cl.number("--kv-head-share", closed(0, kMaxHeadShare), &params->kv_head_share);
    cl.flag("--kv-share-across-layers", [params]() { params->kv_share_across_layers = 1; });
    cl.flag("--rolling", [params]() { params->position_rolling = 1; });
    cl.option("--kv-type", [&cl, params](const std::string &name) {
        if (!parse_kv_type(name, &params->kv_type)) cl.fail("unknown KV type '" + name + "' (known: " + kv_type_names() + ")");
    });
}

std::string session_options_help(const h2o_session_params &defaults) {
    char text[2048];
    std::snprintf(text, sizeof(text),
                  "  -t, --threads N        compute threads, 0 to %llu (default 0: the cores, at most 8)\n"
                  "  --kv-budget N          KV slots per layer and kv head (default 0: a full cache, as long as the\n"
                  "                         context, that never evicts; the eviction options below need a\n"
                  "                         budget or --rolling)\n"
                  "  --kv-policy NAME       eviction policy: %s (default %s)\n"
                  "  --kv-recent N          protected recent window in tokens (default 0: the policy's share)\n"
                  "  --kv-prompt-proxy N    one-shot prompt eviction: a long prompt's victims by the attention\n"
                  "                         of the last N queries read, at most %llu (default 0: by the policy)\n"
                  "  --kv-head-share S      share of each layer's slots that moves between its kv heads by\n"
                  "                         their attention, in [0, %g] (default 0: fixed budgets)\n"
                  "  --kv-share-across-layers  move those slots between the kv heads of every layer (needs\n"
                  "                         --kv-head-share)\n"
                  "  --rolling              position rolling: run past the model's context length\n"
                  "  --kv-type T            KV cache format: %s (default %s)\n",
                  static_cast<unsigned long long>(kMaxThreads), kv_policy_names().c_str(), policy_name(defaults.kv_policy),
                  static_cast<unsigned long long>(kMaxPromptProxy), kMaxHeadShare, kv_type_names().c_str(),
                  kv_type_name(defaults.kv_type));
    return text;
}

void check_session_options(const CommandLine &cl, const h2o_session_params &params) {
    if (params.kv_share_across_layers && params.kv_head_share == 0.0f) {
        cl.fail("--kv-share-across-layers moves the slots of --kv-head-share between layers: give a head share above 0");
    }
    const bool evicts = params.kv_budget > 0 || params.position_rolling;
    for (const char *option : kEvictionOptions) {
        if (!evicts && cl.given(option)) {
            cl.fail(std::string(option) + " shapes eviction, and without --kv-budget (or --rolling) the cache is full and never evicts");
        }
    }
    if (params.kv_budget > 0 && params.kv_recent > params.kv_budget) {
        cl.fail("--kv-recent " + std::to_string(params.kv_recent) + " exceeds --kv-budget " + std::to_string(params.kv_budget));
    }
}

}  // namespace h2o_tools
