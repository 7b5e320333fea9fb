// h2o-bench: prompt-processing and decode speed of a model, median of repeated runs.
//
//   h2o-bench -m MODEL [-p 512] [-n 128] [-r 5] [-t THREADS] [--depth D]
//             [--kv-budget B] [--kv-policy NAME] [--rolling] [--kv-type f32|f16|q8|q4|k8v4]
//             [--kv-head-share S [--kv-share-across-layers]]
//             [--backend cpu,vulkan,...] [-c CTX] [--state] [--ttft N]
//
// pp: one batched decode of P tokens into an empty session. tg: N single-token decodes after
// `depth` tokens are already cached (the sampler is not involved, as in llama.cpp's llama-bench).
// Each tg figure comes with the bytes a decoded token reads (bandwidth.h) and, on the CPU, the
// share of the machine's read bandwidth that makes.
// --state: size and speed of a snapshot of the session after the runs (save and load).
// --ttft N: time to first token of new sessions whose first N tokens are a shared system prompt,
// without and with the model's prefix cache.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bandwidth.h"
#include "common.h"
#include "kv_settings.h"
#include "options.h"
#include "session_options.h"
#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

[[noreturn]] void die(const char *what, h2o_status st, const char *message) {
    std::fprintf(stderr, "h2o-bench: %s: %s (%s)\n", what, message, h2o_status_string(st));
    std::exit(1);
}

double seconds_since(double start) { return h2o_tools::now_seconds() - start; }

void measure_state(h2o_session *session, h2o_model *model, int reps) {
    size_t bound = 0, size = 0;
    h2o_status st = h2o_session_state_size(session, &bound);
    if (st != H2O_OK) die("state size", st, h2o_session_last_error(session));
    std::vector<uint8_t> buffer(bound);
    std::vector<double> save_s, load_s;
    for (int r = 0; r < reps; ++r) {
        double t0 = h2o_tools::now_seconds();
        st = h2o_session_save_to_buffer(session, buffer.data(), buffer.size(), &size);
        if (st != H2O_OK) die("snapshot", st, h2o_session_last_error(session));
        save_s.push_back(seconds_since(t0));
        h2o_session *loaded = nullptr;
        t0 = h2o_tools::now_seconds();
        st = h2o_session_load_from_buffer(model, buffer.data(), size, nullptr, &loaded);
        if (st != H2O_OK) die("load snapshot", st, h2o_last_error());
        load_s.push_back(seconds_since(t0));
        h2o_session_free(loaded);
    }
    h2o_memory_report mem;
    mem.struct_size = sizeof(mem);
    h2o_session_memory(session, &mem);
    std::printf(
        "snapshot: %.2f MiB (%.1f%% of the %.2f MiB KV cache); save %.1f ms (%.0f MB/s of KV), load %.1f ms (median; min %.1f, max %.1f)\n",
        size / 1048576.0, 100.0 * size / mem.kv_bytes, mem.kv_bytes / 1048576.0, 1e3 * median(save_s), mem.kv_bytes / 1e6 / median(save_s),
        1e3 * median(load_s), 1e3 * *std::min_element(load_s.begin(), load_s.end()), 1e3 * *std::max_element(load_s.begin(), load_s.end()));
}

// New sessions that all begin with the same system prompt of n tokens, then one token of their
// own: the time from creating the session to the logits of that token.
void measure_ttft(const std::string &model_path, uint32_t threads, uint32_t budget, const std::vector<int32_t> &tokens, int n, int reps) {
    for (uint64_t cache_bytes : {uint64_t{0}, uint64_t{256} << 20}) {
        h2o_model_params mp;
        h2o_model_params_init(&mp, sizeof mp);
        mp.prefix_cache_bytes = cache_bytes;
        h2o_model *model = nullptr;
        h2o_status st = h2o_model_load(model_path.c_str(), &mp, &model);
        if (st != H2O_OK) die("cannot load model", st, h2o_last_error());
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.n_threads = threads;
        sp.kv_budget = budget;
        sp.backend = H2O_BACKEND_CPU;
        std::vector<double> times;
        for (int r = 0; r <= reps; ++r) {  // with the cache, the first session fills it: not counted
            const double t0 = h2o_tools::now_seconds();
            h2o_session *session = nullptr;
            st = h2o_session_create(model, &sp, &session);
            if (st == H2O_OK) st = h2o_session_decode(session, tokens.data(), n);
            if (st == H2O_OK) st = h2o_session_decode(session, &tokens[n], 1);
            if (st != H2O_OK) die("ttft", st, session ? h2o_session_last_error(session) : h2o_last_error());
            if (r > 0 || cache_bytes == 0) times.push_back(seconds_since(t0));
            h2o_session_free(session);
        }
        std::printf("time to first token after a %d-token system prompt, prefix cache %s: %.2f ms (median; min %.2f, max %.2f)\n", n,
                    cache_bytes ? "on" : "off", 1e3 * median(times), 1e3 * *std::min_element(times.begin(), times.end()),
                    1e3 * *std::max_element(times.begin(), times.end()));
        h2o_model_free(model);
    }
}

// Tokens per second of sampled generation (temperature 1, the library's other defaults) with and
// without a JSON schema, interleaved over `reps` rounds of n tokens each: a constrained reply that
// ends (its grammar complete) starts over from the same prompt until n tokens are made. The
// difference per token is what the grammar costs: its mask and its state.
void measure_constrained(h2o_session *session, const std::string &schema, int n, int reps) {
    std::vector<double> free_tps, constrained_tps;
    for (int r = 0; r < reps; ++r) {
        for (const bool constrained : {false, true}) {
            h2o_generate_params gen;
            h2o_generate_params_init(&gen, sizeof gen);
            gen.temperature = 1.0f;
            gen.stop_at_eos = 0;
            if (constrained) {
                gen.json_schema = schema.data();
                gen.json_schema_len = schema.size();
            }
            int made = 0;
            double seconds = 0.0;
            while (made < n) {
                h2o_session_reset(session);
                gen.max_tokens = static_cast<uint32_t>(n - made);
                h2o_status st = h2o_generate(session, "Reply in JSON:", 14, &gen, nullptr, nullptr);
                if (st != H2O_OK) die("constrained generation failed", st, h2o_session_last_error(session));
                h2o_generate_stats stats;
                stats.struct_size = sizeof stats;
                h2o_session_get_stats(session, &stats);
                made += static_cast<int>(stats.n_generated_tokens);
                seconds += stats.generate_seconds;
                if (stats.n_generated_tokens == 0) die("constrained generation made no token", H2O_ERR_INTERNAL, "");
            }
            (constrained ? constrained_tps : free_tps).push_back(made / seconds);
        }
    }
    const double f = median(free_tps), c = median(constrained_tps);
    std::printf(
        "generation at temperature 1: %.1f tok/s free (min %.1f, max %.1f), %.1f with the schema (min %.1f, max %.1f): "
        "the grammar takes %.1f%% of a token\n",
        f, *std::min_element(free_tps.begin(), free_tps.end()), *std::max_element(free_tps.begin(), free_tps.end()), c,
        *std::min_element(constrained_tps.begin(), constrained_tps.end()),
        *std::max_element(constrained_tps.begin(), constrained_tps.end()), 100.0 * (1.0 / c - 1.0 / f) / (1.0 / c));
}

// What a custom sampler pays for the grammar's whole-vocabulary mask (h2o_grammar_apply) against
// a decoded token, on n tokens of a greedy constrained reply (started again when complete): the
// upper bound of the mask's cost, since h2o_generate checks fewer tokens where it can.
void measure_full_mask(h2o_session *session, h2o_model *model, const std::string &schema, int n) {
    h2o_model_info info;
    info.struct_size = sizeof info;
    h2o_model_get_info(model, &info);
    h2o_grammar *grammar = nullptr;
    h2o_status st = h2o_grammar_create(model, nullptr, 0, schema.data(), schema.size(), &grammar);
    if (st != H2O_OK) die("the schema is refused", st, h2o_last_error());
    const std::string prompt = "Reply in JSON:";
    std::vector<float> logits(info.n_vocab);
    std::vector<double> mask_s, decode_s;
    bool fresh = true;
    while (static_cast<int>(mask_s.size()) < n) {
        if (fresh) {
            h2o_session_reset(session);
            h2o_grammar_reset(grammar);
            st = h2o_session_add_text(session, prompt.data(), prompt.size(), 0);
            if (st != H2O_OK) die("cannot process the prompt", st, h2o_session_last_error(session));
            fresh = false;
        }
        h2o_session_get_logits(session, logits.data(), logits.size());
        double t0 = h2o_tools::now_seconds();
        h2o_grammar_apply(grammar, logits.data(), logits.size());
        mask_s.push_back(seconds_since(t0));
        const int32_t token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (h2o_grammar_accept(grammar, token) != H2O_OK) die("the mask let a refused token through", H2O_ERR_INTERNAL, "");
        if (h2o_grammar_state(grammar) == 2) {
            fresh = true;
            continue;
        }
        t0 = h2o_tools::now_seconds();
        st = h2o_session_decode(session, &token, 1);
        if (st != H2O_OK) die("cannot decode", st, h2o_session_last_error(session));
        decode_s.push_back(seconds_since(t0));
    }
    h2o_grammar_free(grammar);
    if (decode_s.empty()) die("the schema's replies end after one token: nothing to measure", H2O_ERR_INVALID_ARGUMENT, "");
    double mean = 0.0;
    for (double t : mask_s) mean += t / static_cast<double>(mask_s.size());
    const double decode = median(decode_s);
    std::sort(mask_s.begin(), mask_s.end());
    // The mean is the cost over a reply; the median and p90 tell structure from string contents.
    std::printf(
        "whole-vocabulary mask (%u tokens): %.2f ms per token on average (median %.2f, p90 %.2f, max %.2f), %.1f ms per "
        "decoded token (median): the mask is %.1f%% of a constrained token\n",
        info.n_vocab, 1e3 * mean, 1e3 * mask_s[mask_s.size() / 2], 1e3 * mask_s[mask_s.size() * 9 / 10], 1e3 * mask_s.back(), 1e3 * decode,
        100.0 * mean / (mean + decode));
}

}  // namespace

int main(int argc, char **argv) {
    std::string model_path, schema_path;
    int n_prompt = 512, n_gen = 128, reps = 5, depth = 0, n_ctx = 0, ttft = 0;
    bool state = false, json = false;
    h2o_session_params base;  // every measured session's settings but n_ctx, n_batch and the backend
    h2o_session_params_init(&base, sizeof base);
    std::vector<uint32_t> backends = {H2O_BACKEND_CPU};
    const std::string usage =
        "usage: h2o-bench -m MODEL [-p 512] [-n 128] [-r 5] [-t THREADS] [--depth D] [--kv-budget B] [--kv-policy NAME]\n"
        "                 [--rolling] [--kv-type T] [--kv-head-share S [--kv-share-across-layers]] [--backend B[,B...]]\n"
        "                 [-c CTX] [--state] [--ttft N] [--json-schema FILE] [--json]\n"
        "  -m, --model FILE       GGUF model (default: $H2O_MODEL)\n"
        "  -p N                   prompt tokens read in one batch, 0 to skip (default 512)\n"
        "  -n N                   tokens decoded one at a time, 0 to skip (default 128)\n"
        "  -r N                   repetitions; the median, min and max are printed (default 5)\n"
        "  --depth D              tokens already cached before the -n decodes (default 0)\n"
        "  -c, --ctx N            session context (default and at least: what -p, -n and --depth need;\n"
        "                         an endless session, the default, takes N as given and runs past it)\n"
        "  --backend LIST         comma-separated backends, each measured: " +
        h2o_tools::backend_names() +
        " (default cpu)\n"
        "  --state                size and speed of a snapshot of the session (save and load)\n"
        "  --ttft N               time to first token after a shared N-token system prompt, prefix cache\n"
        "                         off and on (needs -p, or --depth, plus -n of at least N + 1)\n"
        "  --json-schema FILE     sampled generation of -n tokens with and without this schema, and the\n"
        "                         share of a token its grammar takes\n"
        "  --json                 one JSON object per line and measurement (pp, tg) instead of text\n"
        "  --version              print the library's version\n" +
        h2o_tools::session_options_help(base);

    h2o_tools::CommandLine cl("h2o-bench", usage);
    cl.text({"-m", "--model"}, &model_path);
    // Counts go up to bounds that keep the sizes sane.
    cl.count("-p", 0, 1 << 20, &n_prompt);
    cl.count("-n", 0, 1 << 24, &n_gen);
    cl.count("-r", 1, 1000, &reps);
    cl.count("--depth", 0, 1 << 24, &depth);
    cl.count({"-c", "--ctx"}, 0, 1 << 22, &n_ctx);
    cl.count("--ttft", 1, 1 << 16, &ttft);
    h2o_tools::add_session_options(cl, &base);
    cl.option("--backend", [&](const std::string &list) {
        backends.clear();
        for (const std::string &name : h2o_tools::split(list, ',')) {
            uint32_t kind;
            if (!h2o_tools::parse_backend(name, &kind))
                cl.fail("unknown backend '" + name + "' (known: " + h2o_tools::backend_names() + ")");
            backends.push_back(kind);
        }
    });
    cl.flag("--state", &state);
    cl.text("--json-schema", &schema_path);
    cl.flag("--json", &json);
    cl.parse(argc, argv);
    h2o_tools::check_session_options(cl, base);
    if (json && (state || ttft > 0 || !schema_path.empty()))
        cl.fail("--json reports the -p and -n measurements; run --state, --ttft and --json-schema without it");
    std::string schema;
    if (!schema_path.empty()) {
        std::string error;
        if (!h2o_tools::read_file(schema_path, &schema, &error)) cl.fail(error);
        if (n_gen == 0) cl.fail("--json-schema measures -n generated tokens: give -n a count");
    }
    if (n_prompt == 0 && n_gen == 0 && ttft == 0) cl.fail("-p 0 and -n 0 leave nothing to measure: give -p or -n a count");
    // The token ids the measurements read: the longer of the prompt and the depth, then -n more.
    const size_t n_tokens = static_cast<size_t>(std::max(n_prompt, depth)) + static_cast<size_t>(n_gen);
    if (ttft > 0 && static_cast<size_t>(ttft) + 1 > n_tokens) {
        cl.fail("--ttft " + std::to_string(ttft) + " reads " + std::to_string(ttft + 1) +
                " tokens: give -p (or --depth) plus -n of at least that");
    }
    model_path = h2o_tools::resolve_model_path(model_path);
    if (model_path.empty()) cl.fail("no model given: pass -m MODEL or set H2O_MODEL");
    // Whether the cache evicts once full, and rolls: the default does both (kv_overflow).
    const bool endless = base.kv_overflow == H2O_KV_OVERFLOW_EVICT && base.kv_policy != H2O_KV_FULL;
    const bool evicts = endless || base.kv_budget > 0 || base.position_rolling;
    const bool rolls = endless || base.position_rolling;

    // The CPU's decode figures are given as a share of this machine's read bandwidth, probed
    // with the same threads in a child process before the model loads (its buffer would
    // otherwise count in the peak RSS reported below).
    const bool on_cpu = std::find(backends.begin(), backends.end(), uint32_t{H2O_BACKEND_CPU}) != backends.end();
    const int probe_threads = base.n_threads ? static_cast<int>(base.n_threads) : h2o::default_thread_count();
    const double read_bandwidth = on_cpu && n_gen > 0 ? h2o_tools::probe_read_bandwidth_apart(probe_threads) : 0.0;
    std::string unread;
    const uint64_t weights_per_token = n_gen > 0 ? h2o_tools::decode_weight_bytes(model_path, &unread) : 0;

    h2o_model *model = nullptr;
    h2o_status st = h2o_model_load(model_path.c_str(), nullptr, &model);
    if (st != H2O_OK) die("cannot load model", st, h2o_last_error());
    h2o_model_info info;
    info.struct_size = sizeof(info);
    h2o_model_get_info(model, &info);

    // Arbitrary but fixed token ids (BOS first), so every run does the same work.
    std::vector<int32_t> tokens(n_tokens);
    uint32_t x = 12345;
    for (auto &t : tokens) {
        x = x * 1664525u + 1013904223u;
        t = static_cast<int32_t>((x >> 8) % info.n_vocab);
    }
    if (info.bos_token >= 0 && !tokens.empty()) tokens[0] = info.bos_token;

    if (!json) {
        std::printf("model: %s (%.1f M params, %.1f MiB of weights)\n", model_path.c_str(), info.n_params / 1e6,
                    info.weight_bytes / 1048576.0);
        if (read_bandwidth > 0)
            std::printf(
                "memory read bandwidth: %.1f GB/s with %d threads (probe: best of 5 reads of 1 GiB, 4 prefetched streams a thread)\n",
                read_bandwidth / 1e9, probe_threads);
    }
    if (!json) {
        std::string kv = "full cache";
        if (evicts) {
            kv = (base.kv_budget ? std::to_string(base.kv_budget) + " slots" : std::string("the context's slots")) + ", policy " +
                 h2o_tools::policy_name(base.kv_policy) + (rolls ? ", rolling" : "");
            // The research settings in use, by name.
            for (uint32_t key = 0; h2o_experimental_name(key); ++key) {
                double value = 0.0;
                if (h2o_session_params_get_experimental(&base, key, &value) == H2O_OK && value != 0.0) {
                    kv += std::string(", ") + h2o_experimental_name(key) + " " + h2o_tools::number_text(value);
                }
            }
        }
        std::printf("threads: %s, repetitions: %d, KV %s: %s\n",
                    base.n_threads ? std::to_string(base.n_threads).c_str() : "default (cores, at most 8)", reps,
                    h2o_tools::kv_type_name(base.kv_type), kv.c_str());
    }
    // Several backends are measured in one run, so that their figures can be compared.
    for (const uint32_t backend : backends) {
        h2o_session_params sp = base;
        // The prompt in one batch; the depth, like a prompt, in batches of the library's default
        // size (it was once fed a token at a time, which made --depth runs slow to start).
        sp.n_batch = static_cast<uint32_t>(std::max({n_prompt, std::min(depth, 256), 1}));
        // Without -c, a context for the whole run; an endless session (the default) runs past its
        // context, so a -c given is its size as given (room for the prompt at least).
        const int whole_run = std::max(n_prompt, depth + n_gen) + 1;
        const int needed = endless && n_ctx > 0 ? n_prompt + 1 : whole_run;
        sp.n_ctx = static_cast<uint32_t>(std::max(n_ctx, needed));
        sp.backend = backend;
        h2o_session *session = nullptr;
        st = h2o_session_create(model, &sp, &session);
        if (st != H2O_OK) die("cannot create session", st, h2o_last_error());
        h2o_device_traffic created, before, after;
        created.struct_size = before.struct_size = after.struct_size = sizeof(h2o_device_traffic);
        h2o_session_get_device_traffic(session, &created);

        h2o_kv_layout layout;
        layout.struct_size = sizeof(layout);
        h2o_session_get_kv_layout(session, &layout);
        // Resident memory just after the first eviction and after the last token (of the last
        // run): an endless session's must not grow in between. Decode index of the first eviction:
        const int first_eviction = evicts && layout.budget > 0 ? static_cast<int>(layout.budget) - depth : -1;
        uint64_t rss_filled = 0, rss_end = 0;

        std::vector<double> pp, tg;
        for (int r = 0; r < reps; ++r) {
            if (n_prompt > 0) {
                h2o_session_reset(session);
                const double t0 = h2o_tools::now_seconds();
                st = h2o_session_decode(session, tokens.data(), n_prompt);
                if (st != H2O_OK) die("prompt decode failed", st, h2o_session_last_error(session));
                pp.push_back(n_prompt / (h2o_tools::now_seconds() - t0));
            }
            if (n_gen > 0) {
                h2o_session_reset(session);
                if (depth > 0) {
                    st = h2o_session_decode(session, tokens.data(), depth);
                    if (st != H2O_OK) die("depth decode failed", st, h2o_session_last_error(session));
                }
                h2o_session_get_device_traffic(session, &before);
                const double t0 = h2o_tools::now_seconds();
                for (int i = 0; i < n_gen; ++i) {
                    st = h2o_session_decode(session, &tokens[depth + i], 1);
                    if (st != H2O_OK) die("decode failed", st, h2o_session_last_error(session));
                    if (i == first_eviction) rss_filled = h2o_tools::current_rss_bytes();
                }
                tg.push_back(n_gen / (h2o_tools::now_seconds() - t0));
                if (rss_filled > 0) rss_end = h2o_tools::current_rss_bytes();
                h2o_session_get_device_traffic(session, &after);
            }
        }
        h2o_memory_report mem;
        mem.struct_size = sizeof(mem);
        h2o_session_memory(session, &mem);
        h2o_kv_usage kv_usage;  // of the last measurement's stream
        kv_usage.struct_size = sizeof kv_usage;
        h2o_session_get_kv_usage(session, &kv_usage);
        // What one decoded token read on average: the weights, and the KV rows of the tokens it
        // attended to (the cached ones, at most the budget when the cache evicts).
        const double cap = evicts && layout.budget > 0 ? layout.budget : static_cast<double>(sp.n_ctx);
        double attended = 0.0;
        for (int i = 0; i < n_gen; ++i) attended += std::min(cap, static_cast<double>(depth + i + 1));
        const double bytes_per_token =
            weights_per_token == 0
                ? 0.0
                : static_cast<double>(weights_per_token) +
                      static_cast<double>(h2o_tools::kv_bytes_per_cached_token(base.kv_type, info.n_layer, info.n_head_kv, info.head_dim)) *
                          attended / std::max(1, n_gen);
        const double read_rate = tg.empty() ? 0.0 : bytes_per_token * median(tg);  // bytes per second
        const double share = backend == H2O_BACKEND_CPU && read_bandwidth > 0 ? read_rate / read_bandwidth : 0.0;
        h2o_backend_info device;
        device.struct_size = sizeof(device);
        h2o_session_get_backend(session, &device);
        if (json) {
            // One line per measurement, with everything needed to compare it with another.
            const std::string common =
                "\"model\":\"" + h2o_tools::json_escape(model_path) + "\",\"params\":" + std::to_string(info.n_params) + ",\"backend\":\"" +
                h2o_tools::json_escape(device.name) + "\",\"threads\":" + std::to_string(base.n_threads) + ",\"kv_type\":\"" +
                h2o_tools::kv_type_name(base.kv_type) + "\",\"kv_budget\":" + std::to_string(base.kv_budget) + ",\"kv_policy\":\"" +
                (evicts ? h2o_tools::policy_name(base.kv_policy) : "full") + "\",\"rolling\":" + (rolls ? "true" : "false") +
                ",\"repetitions\":" + std::to_string(reps);
            auto line = [&](const char *test, int n, int at_depth, const std::vector<double> &v, const std::string &reads) {
                std::string samples;
                for (double sample : v) samples += (samples.empty() ? "" : ",") + std::to_string(sample);
                std::printf(
                    "{\"test\":\"%s%d\",\"tokens\":%d,\"depth\":%d,%s,\"tokens_per_second\":{\"median\":%.3f,\"min\":%.3f,"
                    "\"max\":%.3f,\"samples\":[%s]},\"kv_bytes\":%llu,\"scratch_bytes\":%llu,\"evicted_tokens\":%llu%s}\n",
                    test, n, n, at_depth, common.c_str(), median(v), *std::min_element(v.begin(), v.end()),
                    *std::max_element(v.begin(), v.end()), samples.c_str(), static_cast<unsigned long long>(mem.kv_bytes),
                    static_cast<unsigned long long>(mem.scratch_bytes), static_cast<unsigned long long>(kv_usage.n_evicted), reads.c_str());
            };
            if (!pp.empty()) line("pp", n_prompt, 0, pp, "");
            std::string reads;
            if (bytes_per_token > 0) {
                reads = ",\"bytes_read_per_token\":" + std::to_string(static_cast<uint64_t>(bytes_per_token)) +
                        ",\"read_bytes_per_second\":" + std::to_string(static_cast<uint64_t>(read_rate));
                if (share > 0) reads += ",\"bandwidth_share\":" + std::to_string(share);
            }
            if (rss_end > 0)
                reads += ",\"rss_after_fill_bytes\":" + std::to_string(rss_filled) + ",\"rss_end_bytes\":" + std::to_string(rss_end);
            if (!tg.empty()) line("tg", n_gen, depth, tg, reads);
            h2o_session_free(session);
            continue;
        }
        std::printf("\nbackend: %s\n", device.name);
        std::printf("session memory: weights %.2f MiB, KV %.2f MiB, scratch %.2f MiB\n", mem.weight_bytes / 1048576.0,
                    mem.kv_bytes / 1048576.0, mem.scratch_bytes / 1048576.0);
        if (!pp.empty())
            std::printf("pp%-5d %8.1f tok/s (median; min %.1f, max %.1f)\n", n_prompt, median(pp), *std::min_element(pp.begin(), pp.end()),
                        *std::max_element(pp.begin(), pp.end()));
        if (!tg.empty())
            std::printf("tg%-5d %8.1f tok/s (median; min %.1f, max %.1f) at depth %d\n", n_gen, median(tg),
                        *std::min_element(tg.begin(), tg.end()), *std::max_element(tg.begin(), tg.end()), depth);
        if (kv_usage.n_evicted > 0)
            std::printf("the cache filled after %llu tokens: the last run evicted %llu\n",
                        static_cast<unsigned long long>(kv_usage.evicting_since), static_cast<unsigned long long>(kv_usage.n_evicted));
        if (rss_end > 0) {
            std::printf("resident memory just after the first eviction %.2f MiB, after the last token %.2f MiB (%+.2f%%)\n",
                        rss_filled / 1048576.0, rss_end / 1048576.0, 100.0 * (double(rss_end) / double(rss_filled) - 1.0));
        }
        if (!tg.empty() && bytes_per_token > 0) {
            std::printf("  reads %.1f MB per token (weights %.1f MB, KV %.1f MB): %.1f GB/s", bytes_per_token / 1e6,
                        weights_per_token / 1e6, (bytes_per_token - static_cast<double>(weights_per_token)) / 1e6, read_rate / 1e9);
            if (share > 0) std::printf(", %.0f%% of the probed read bandwidth", 100.0 * share);
            std::printf("\n");
        } else if (!tg.empty() && !unread.empty()) {
            std::printf("  (bytes read per token unknown: %s)\n", unread.c_str());
        }
        if (!tg.empty() && after.submissions > 0) {
            std::printf(
                "per decoded token: %.1f bytes to the device, %.1f bytes back, %.2f submissions; device memory of the "
                "session's own (the model's weights apart) %.2f MiB after creation, %.2f MiB after the run\n",
                double(after.bytes_to_device - before.bytes_to_device) / n_gen, double(after.bytes_to_host - before.bytes_to_host) / n_gen,
                double(after.submissions - before.submissions) / n_gen, created.device_memory_bytes / 1048576.0,
                after.device_memory_bytes / 1048576.0);
        }
        if (state) measure_state(session, model, reps);
        if (!schema.empty()) {
            measure_constrained(session, schema, n_gen, reps);
            measure_full_mask(session, model, schema, n_gen);
        }
        h2o_session_free(session);
    }
    if (ttft > 0) measure_ttft(model_path, base.n_threads, base.kv_budget, tokens, ttft, reps);
    if (json) {
        std::printf("{\"test\":\"peak_rss\",\"bytes\":%llu}\n", static_cast<unsigned long long>(h2o_tools::peak_rss_bytes()));
    } else {
        std::printf("peak RSS: %.1f MiB\n", h2o_tools::peak_rss_bytes() / 1048576.0);
    }
    h2o_model_free(model);
    return 0;
}
