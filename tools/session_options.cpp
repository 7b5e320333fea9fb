#include "session_options.h"

#include <cstdio>

#include "common.h"
#include "h2o/h2o_experimental.h"

namespace h2o_tools {

namespace {

// The library's limits on these fields of h2o_session_params (h2o.h); it checks them again when
// the session is made. The research settings' limits come from h2o_experimental_bounds.
constexpr uint64_t kMaxThreads = 256;
constexpr uint64_t kMaxBudget = 1u << 22;  // no cache is longer than the longest n_ctx

// The options that only change how a cache evicts.
const char *const kEvictionOptions[] = {"--kv-policy", "--kv-recent", "--kv-prompt-proxy", "--kv-head-share", "--kv-share-across-layers",
                                        "--kv-exp"};

// Sets a research setting (h2o_experimental.h), failing the command line with the library's reason.
void set_experimental(CommandLine &cl, h2o_session_params *params, uint32_t key, double value, const std::string &option) {
    if (h2o_session_params_set_experimental(params, key, value) != H2O_OK) cl.fail(option + ": " + h2o_last_error());
}

std::string experimental_names() {
    std::string names;
    for (uint32_t key = 0; h2o_experimental_name(key); ++key) names += (key ? ", " : "") + std::string(h2o_experimental_name(key));
    return names;
}

// Reads a research setting's value within its bounds, then sets it (the library checks whole
// numbers where it needs them).
void read_experimental(CommandLine &cl, h2o_session_params *params, uint32_t key, const std::string &value, const std::string &option) {
    set_experimental(cl, params, key, cl.to_number(value, experimental_range(key)), option);
}

double experimental(const h2o_session_params &params, uint32_t key) {
    double value = 0.0;
    h2o_session_params_get_experimental(&params, key, &value);
    return value;
}

}  // namespace

Range experimental_range(uint32_t key) {
    double min = 0.0, max = 0.0;
    h2o_experimental_bounds(key, &min, &max);
    return closed(min, max);
}

void add_session_options(CommandLine &cl, h2o_session_params *params) {
    cl.count({"-t", "--threads"}, 0, kMaxThreads, &params->n_threads);
    cl.option("--kv-budget", [&cl, params](const std::string &v) {
        params->kv_budget = static_cast<uint32_t>(cl.to_count(v, 0, kMaxBudget));
        if (params->kv_budget == 1) cl.fail("--kv-budget must be 0 (the context's slots) or at least 2, not 1");
    });
    cl.option("--kv-policy", [&cl, params](const std::string &name) {
        if (!parse_policy(name, &params->kv_policy)) cl.fail("unknown policy '" + name + "' (known: " + kv_policy_names() + ")");
    });
    cl.count("--kv-recent", 0, kMaxBudget, &params->kv_recent);
    cl.option("--kv-prompt-proxy",
              [&cl, params](const std::string &v) { read_experimental(cl, params, H2O_EXP_KV_PROMPT_PROXY, v, "--kv-prompt-proxy"); });
    cl.option("--kv-head-share",
              [&cl, params](const std::string &v) { read_experimental(cl, params, H2O_EXP_KV_HEAD_SHARE, v, "--kv-head-share"); });
    cl.flag("--kv-share-across-layers",
            [&cl, params]() { set_experimental(cl, params, H2O_EXP_KV_SHARE_ACROSS_LAYERS, 1, "--kv-share-across-layers"); });
    // Any research setting by its name: the library lists and checks them.
    cl.option("--kv-exp", [&cl, params](const std::string &v) {
        const size_t eq = v.find('=');
        uint32_t key = 0;
        if (eq == std::string::npos || h2o_experimental_from_name(v.substr(0, eq).c_str(), &key) != H2O_OK) {
            cl.fail("--kv-exp takes NAME=VALUE with NAME one of: " + experimental_names());
        }
        read_experimental(cl, params, key, v.substr(eq + 1), "--kv-exp " + v);
    });
    cl.flag("--rolling", [params]() { params->position_rolling = 1; });
    cl.option("--kv-overflow", [&cl, params](const std::string &v) {
        if (v == "evict")
            params->kv_overflow = H2O_KV_OVERFLOW_EVICT;
        else if (v == "error")
            params->kv_overflow = H2O_KV_OVERFLOW_ERROR;
        else
            cl.fail("--kv-overflow takes evict or error, not '" + v + "'");
    });
    cl.option("--kv-type", [&cl, params](const std::string &name) {
        if (!parse_kv_type(name, &params->kv_type)) cl.fail("unknown KV type '" + name + "' (known: " + kv_type_names() + ")");
    });
}

std::string session_options_help(const h2o_session_params &defaults) {
    // The program's own defaults, which are not always the library's (h2o-server's cache is 512
    // slots that roll).
    char budget[256];
    if (defaults.kv_budget == 0) {
        std::snprintf(budget, sizeof budget,
                      "(default 0: as many as the context; when\n"
                      "                         they are full the policy evicts and positions roll, see --kv-overflow)");
    } else {
        std::snprintf(budget, sizeof budget,
                      "(default %u: a fixed cache that evicts by\n"
                      "                         the policy when full; 0: as many as the context)",
                      defaults.kv_budget);
    }
    char text[3072];
    std::snprintf(text, sizeof(text),
                  "  -t, --threads N        compute threads, 0 to %llu (default 0: the cores, at most 8)\n"
                  "  --kv-budget N          KV slots per layer and kv head %s\n"
                  "  --kv-policy NAME       eviction policy: %s (default %s)\n"
                  "  --kv-recent N          protected recent window in tokens (default 0: the policy's share)\n"
                  "  --kv-prompt-proxy N    one-shot prompt eviction: a long prompt's victims by the attention\n"
                  "                         of the last N queries read, at most %llu (default 0: by the policy)\n"
                  "  --kv-head-share S      share of each layer's slots that moves between its kv heads by\n"
                  "                         their attention, in [0, %g] (default 0: fixed budgets)\n"
                  "  --kv-share-across-layers  move those slots between the kv heads of every layer (needs\n"
                  "                         --kv-head-share)\n"
                  "  --kv-exp NAME=VALUE    a research setting of h2o_experimental.h by name (repeatable):\n"
                  "                         %s\n"
                  "  --rolling              position rolling: run past the model's context length%s\n"
                  "  --kv-overflow MODE     when the cache is full: evict (default: evict by the policy, roll\n"
                  "                         positions, never stop) or error (stop at the context's end, as a\n"
                  "                         plain full cache does, unless --kv-budget or --rolling say otherwise)\n"
                  "  --kv-type T            KV cache format: %s (default %s)\n",
                  static_cast<unsigned long long>(kMaxThreads), budget, kv_policy_names().c_str(), policy_name(defaults.kv_policy),
                  static_cast<unsigned long long>(experimental_range(H2O_EXP_KV_PROMPT_PROXY).max),
                  experimental_range(H2O_EXP_KV_HEAD_SHARE).max, experimental_names().c_str(),
                  defaults.position_rolling ? " (on by default)" : " (implied by --kv-overflow evict)", kv_type_names().c_str(),
                  kv_type_name(defaults.kv_type));
    return text;
}

void check_session_options(const CommandLine &cl, const h2o_session_params &params) {
    if (experimental(params, H2O_EXP_KV_SHARE_ACROSS_LAYERS) != 0.0 && experimental(params, H2O_EXP_KV_HEAD_SHARE) == 0.0) {
        cl.fail("--kv-share-across-layers moves the slots of --kv-head-share between layers: give a head share above 0");
    }
    const bool evicts = params.kv_overflow == H2O_KV_OVERFLOW_EVICT || params.kv_budget > 0 || params.position_rolling;
    for (const char *option : kEvictionOptions) {
        if (!evicts && cl.given(option)) {
            cl.fail(std::string(option) + " shapes eviction, and with --kv-overflow error and no --kv-budget (or --rolling) the " +
                    "cache never evicts");
        }
    }
    if (params.kv_budget > 0 && params.kv_recent > params.kv_budget) {
        cl.fail("--kv-recent " + std::to_string(params.kv_recent) + " exceeds --kv-budget " + std::to_string(params.kv_budget));
    }
}

}  // namespace h2o_tools
