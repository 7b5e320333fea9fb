// h2o-eval: perplexity and greedy agreement of KV-cache eviction policies, through the public API.
//
//   h2o-eval -m MODEL -f TEXT [--policies full,h2o,window,...] [--budgets 32,64,128] [--chunk 512]
//            [--chunks N] [--recent N | --recent-ratio R] [--sinks N] [--stream TOKENS]
//            [--segment N] [--context N] [--tail N] [--horizon N|none] [--layer-slope S] [--rolling 0|1] [--n-ctx N]
//            [--prompt N] [--n-batch N] [--prompt-proxy W] [--prompt-random-share R] [--head-share S]
//            [--across-layers] [--rebalance-interval N]
//            [-t THREADS] [-j JOBS] [--json] [--svg FILE] [--quiet]
//   h2o-eval -m MODEL -f TEXT --retention 128,512,2048 [--trials N] [--passage N] [--min-shares LIST] [policies, budgets...]
//
// Chunk mode (default, the "chunk-512" protocol of ../shared/README.md): the whole text is
// tokenized without BOS, cut into consecutive chunks of chunk-1 tokens, and each chunk, behind a
// BOS, is fed to a fresh session one token at a time. Every token after BOS is scored with the
// log-softmax (double precision) of the previous step's logits. Greedy agreement compares each
// step's argmax with the full cache's argmax at the same position. With --prompt N, each chunk's
// first N tokens (BOS included) are read as one prompt, in the session's batches, and only the
// tokens after them are scored: the protocol that compares how prompts are evicted (--prompt-proxy).
//
// Stream mode (--stream TOKENS): BOS and the first TOKENS tokens of the text (repeated when it is
// shorter) go through one session per configuration, token by token, with position rolling on
// unless --rolling 0; the perplexity is reported per segment of --segment tokens and overall.
// The last --tail segments are compared with their in-context perplexity: each of their tokens
// scored by a fresh full cache holding only the --context - 1 tokens before it (default 512: the
// context stories260K was trained with). A rolling window of --context slots is not that: the
// keys and values it keeps were computed when their tokens saw older ones. The reference costs a
// fresh prompt of --context - 1 tokens per scored token, hence only for the tail.
//
// Retention mode (--retention LIST): see eval_retention.h.
//
// Besides the library's policies, `shift` is llama.cpp's context shift (eval_shift.h): the
// strategy most runtimes use at a full context, as a baseline; and `oracle` evicts by the
// attention still to come (eval_oracle.h), the best eviction there is to compare with: beside a
// window at the same budget it says what share of the window's loss each policy wins back.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "eval_retention.h"
#include "eval_oracle.h"
#include "eval_shift.h"
#include "options.h"
#include "session_options.h"
#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "svg_plot.h"

namespace {

using h2o_tools::eval_policy_name;

std::string usage() {
    char text[8192];
    std::snprintf(text, sizeof(text),
                  "usage: h2o-eval -m MODEL -f TEXT [options]\n"
                  "  -m, --model FILE       GGUF model (default: $H2O_MODEL)\n"
                  "  -f, --file FILE        UTF-8 text to score\n"
                  "  --policies LIST        comma-separated policies (default full,h2o,window,sink_window):\n"
                  "                         %s\n"
                  "                         (shift: llama.cpp's context shift, BOS kept, always rolling;\n"
                  "                         oracle: eviction by the attention still to come, chunk mode)\n"
                  "  --budgets LIST         KV slots per (layer, kv head), comma-separated (default 32,64,128);\n"
                  "                         'full' ignores them\n"
                  "  --chunk N              chunk length with BOS (default 512)\n"
                  "  --chunks N             chunks to score (default 10)\n"
                  "  --recent N             protected recent window in tokens (default: --recent-ratio)\n"
                  "  --recent-ratio R       recent window as a fraction of the budget (default: the\n"
                  "                         policy's, 0.875 for scissorhands, 0.5 for the others)\n"
                  "  --sinks N              attention sinks for sink_window and mean_h2o (default 4)\n"
                  "  --kv-type T            KV cache format: f32 (default), f16, q8, q4, k8v4\n"
                  "  --stream TOKENS        stream mode: one stream of BOS + TOKENS tokens per configuration\n"
                  "  --segment N            stream mode: report perplexity per N tokens (default 1000)\n"
                  "  --context N            stream mode: the in-context reference scores each token of\n"
                  "                         the tail with the N-1 tokens before it (default 512; 0: none)\n"
                  "  --tail N               stream mode: segments compared with the reference (default 2)\n"
                  "  --horizon N|none       kv_horizon: heavy hitters N or more tokens back go first\n"
                  "                         (default: the policy's, 1.5 budgets for scissorhands)\n"
                  "  --layer-slope S        kv_layer_slope in %s: the budget's slope across layers,\n"
                  "                         the same memory (default: the library's)\n"
                  "  --prompt N             chunk mode: read each chunk's first N tokens as one prompt and\n"
                  "                         score the tokens after them\n"
                  "  --n-batch N            session n_batch: tokens read at once (default 1, or the\n"
                  "                         library's 256 with --prompt; retention mode reads its text so)\n"
                  "  --prompt-proxy W       kv_prompt_proxy: one-shot prompt eviction by the attention of\n"
                  "                         the last W queries of the previous batch (default 0: off)\n"
                  "  --prompt-random-share R  kv_prompt_random_share in %s (default 0)\n"
                  "  --head-share S         kv_head_share in %s: the share of each layer's slots that\n"
                  "                         moves between its kv heads, for the policies that gather\n"
                  "                         attention statistics (default 0: fixed budgets per head)\n"
                  "  --across-layers        kv_share_across_layers: the head share's slots move between\n"
                  "                         the kv heads of every layer (needs --head-share)\n"
                  "  --rebalance-interval N kv_rebalance_interval: the head share's slots move every N\n"
                  "                         stream tokens (default: the library's; 1: every batch)\n"
                  "  --retention LIST       retention mode: a passage, N tokens of other text, the passage\n"
                  "                         again, for each N in LIST; the repeat's NLL, pinned and not\n"
                  "  --trials N             retention mode: passages to average over (default 8)\n"
                  "  --passage N            retention mode: tokens per passage (default 24)\n"
                  "  --min-shares LIST      retention mode: also with the passage as a retention span\n"
                  "                         keeping each of these shares of the budget (0..1]\n"
                  "  --rolling 0|1          position rolling (default: 0 in chunk mode, 1 in stream mode)\n"
                  "  --n-ctx N              session n_ctx; the full cache's size (default: chunk length,\n"
                  "                         or TOKENS + 1 in stream mode)\n"
                  "  -t, --threads N        compute threads per session (default: library default)\n"
                  "  -j, --jobs N           configurations evaluated at the same time (default 1)\n"
                  "  --json                 one JSON object per line and configuration instead of a table\n"
                  "  --svg FILE             write a perplexity chart as SVG\n"
                  "  --quiet                no progress (a line every 5 s of a long run) or library messages on stderr\n"
                  "  --version              print the library's version\n",
                  h2o_tools::eval_policy_names().c_str(), h2o_tools::experimental_range(H2O_EXP_KV_LAYER_SLOPE).text().c_str(),
                  h2o_tools::experimental_range(H2O_EXP_KV_PROMPT_RANDOM_SHARE).text().c_str(),
                  h2o_tools::experimental_range(H2O_EXP_KV_HEAD_SHARE).text().c_str());
    return text;
}

[[noreturn]] void usage_error(const std::string &message) { h2o_tools::usage_error("h2o-eval", message); }

struct Options {
    std::string model_path, text_path, svg_path;
    std::vector<uint32_t> policies = {H2O_KV_FULL, H2O_KV_H2O, H2O_KV_WINDOW, H2O_KV_SINK_WINDOW};
    std::vector<uint32_t> budgets = {32, 64, 128};
    uint32_t chunk = 512, chunks = 10;
    uint32_t recent = 0;         // 0: recent_ratio of the budget
    float recent_ratio = -1.0f;  // negative: the policy's default
    uint32_t sinks = 4;
    uint32_t kv_type = H2O_KV_TYPE_F32;
    uint32_t stream = 0;  // 0: chunk mode
    uint32_t segment = 1000;
    uint32_t context = 512;        // stream mode: the in-context reference's context (0: none)
    uint32_t tail = 2;             // stream mode: segments compared with the reference
    uint32_t horizon = 0;          // kv_horizon (0: the policy's default)
    bool has_layer_slope = false;  // else the library's default kv_layer_slope
    float layer_slope = 0.0f;
    uint32_t prompt = 0;        // chunk mode: tokens read as one prompt before scoring (0: none)
    uint32_t n_batch = 0;       // session n_batch (0: 1, or the library's default with --prompt)
    uint32_t prompt_proxy = 0;  // kv_prompt_proxy
    float prompt_random_share = 0.0f;
    float head_share = 0.0f;
    bool across_layers = false;                                       // kv_share_across_layers
    uint32_t rebalance_interval = H2O_KV_REBALANCE_INTERVAL_DEFAULT;  // kv_rebalance_interval
    bool repeats = false;                                             // stream mode: the text is shorter than the stream
    std::vector<uint32_t> retention;                                  // retention mode: the lengths of other text (empty: off)
    uint32_t trials = 8, passage = 24;
    std::vector<float> min_shares;  // retention mode: the passage as a retention span of these shares
    int rolling = -1;               // -1: the mode's default
    uint32_t n_ctx = 0;             // 0: the mode's default
    uint32_t threads = 0, jobs = 1;
    bool json = false, quiet = false;
};

Options parse_options(int argc, char **argv) {
    Options o;
    h2o_tools::CommandLine cl("h2o-eval", usage());
    cl.text({"-m", "--model"}, &o.model_path);
    cl.text({"-f", "--file"}, &o.text_path);
    cl.option("--policies", [&](const std::string &list) {
        o.policies.clear();
        for (const std::string &name : h2o_tools::split(list, ',')) {
            uint32_t p;
            if (!h2o_tools::parse_eval_policy(name, &p))
                cl.fail("unknown policy '" + name + "' (known: " + h2o_tools::eval_policy_names() + ")");
            if (std::find(o.policies.begin(), o.policies.end(), p) == o.policies.end()) o.policies.push_back(p);
        }
    });
    cl.option("--budgets", [&](const std::string &list) {
        o.budgets.clear();
        for (const std::string &item : h2o_tools::split(list, ',')) {
            uint64_t b = 0;
            if (!h2o_tools::parse_uint(item.c_str(), &b)) cl.fail("budget '" + item + "' is not a whole number");
            if (b < 2) cl.fail("budget " + item + " is too small: a budget must be at least 2");
            if (b > (1u << 22)) cl.fail("budget " + item + " is too large");
            if (std::find(o.budgets.begin(), o.budgets.end(), b) == o.budgets.end()) o.budgets.push_back(static_cast<uint32_t>(b));
        }
    });
    cl.count("--chunk", 2, 1u << 22, &o.chunk);
    cl.count("--chunks", 1, 1u << 30, &o.chunks);
    cl.count("--recent", 1, 1u << 22, &o.recent);
    cl.number("--recent-ratio", h2o_tools::closed(0, 1), &o.recent_ratio);
    cl.option("--kv-type", [&](const std::string &name) {
        if (!h2o_tools::parse_kv_type(name, &o.kv_type))
            cl.fail("unknown --kv-type '" + name + "' (known: " + h2o_tools::kv_type_names() + ")");
    });
    cl.count("--sinks", 0, 1u << 22, &o.sinks);
    cl.count("--stream", 1, (1u << 22) - 1, &o.stream);
    cl.count("--segment", 1, 1u << 30, &o.segment);
    cl.option("--context", [&](const std::string &v) {
        o.context = static_cast<uint32_t>(cl.to_count(v, 0, 1u << 22));
        if (o.context == 1) cl.fail("--context must be 0 (no reference) or at least 2");
    });
    cl.option("--retention", [&](const std::string &list) {
        for (const std::string &item : h2o_tools::split(list, ','))
            o.retention.push_back(static_cast<uint32_t>(cl.to_count(item, 1, 1u << 20)));
    });
    cl.count("--trials", 1, 1000, &o.trials);
    cl.count("--passage", 2, 4096, &o.passage);
    cl.option("--min-shares", [&](const std::string &list) {
        for (const std::string &item : h2o_tools::split(list, ',')) {
            o.min_shares.push_back(static_cast<float>(cl.to_number(item, h2o_tools::Range{0, 1, true, false})));
        }
    });
    cl.count("--tail", 1, 1u << 30, &o.tail);
    cl.option("--horizon", [&](const std::string &v) {
        o.horizon = v == "none" ? H2O_KV_HORIZON_NONE : static_cast<uint32_t>(cl.to_count(v, 2, 0x7FFFFFFF));
    });
    cl.option("--layer-slope", [&](const std::string &v) {
        o.has_layer_slope = true;
        o.layer_slope = static_cast<float>(cl.to_number(v, h2o_tools::experimental_range(H2O_EXP_KV_LAYER_SLOPE)));
    });
    cl.count("--prompt", 1, 1u << 22, &o.prompt);
    cl.count("--n-batch", 1, 4096, &o.n_batch);
    const h2o_tools::Range proxy = h2o_tools::experimental_range(H2O_EXP_KV_PROMPT_PROXY);
    cl.count("--prompt-proxy", static_cast<uint64_t>(proxy.min), static_cast<uint64_t>(proxy.max), &o.prompt_proxy);
    cl.number("--prompt-random-share", h2o_tools::experimental_range(H2O_EXP_KV_PROMPT_RANDOM_SHARE), &o.prompt_random_share);
    cl.number("--head-share", h2o_tools::experimental_range(H2O_EXP_KV_HEAD_SHARE), &o.head_share);
    cl.flag("--across-layers", &o.across_layers);
    cl.count("--rebalance-interval", 1, 1u << 20, &o.rebalance_interval);
    cl.count("--rolling", 0, 1, &o.rolling);
    cl.count("--n-ctx", 2, 1u << 22, &o.n_ctx);
    cl.count({"-t", "--threads"}, 1, 256, &o.threads);
    cl.count({"-j", "--jobs"}, 1, 256, &o.jobs);
    cl.flag("--json", &o.json);
    cl.text("--svg", &o.svg_path);
    cl.flag("--quiet", &o.quiet);
    cl.parse(argc, argv);
    const bool recent_given = cl.given("--recent"), ratio_given = cl.given("--recent-ratio");
    if (recent_given && ratio_given) usage_error("give --recent or --recent-ratio, not both");
    o.model_path = h2o_tools::resolve_model_path(o.model_path);
    if (o.model_path.empty()) usage_error("no model given: pass -m MODEL or set H2O_MODEL");
    if (o.text_path.empty()) usage_error("no text given: pass -f TEXT");
    if (o.policies.empty()) usage_error("--policies is empty");
    if (!o.retention.empty() && o.stream > 0) usage_error("give --stream or --retention, not both");
    if (!o.min_shares.empty() && o.retention.empty()) usage_error("--min-shares is for --retention mode");
    if (o.prompt > 0 && (o.stream > 0 || !o.retention.empty())) usage_error("--prompt is for chunk mode");
    if (std::find(o.policies.begin(), o.policies.end(), h2o_tools::kOraclePolicy) != o.policies.end() &&
        (o.stream > 0 || !o.retention.empty() || o.prompt > 0)) {
        usage_error("the oracle runs in chunk mode, token by token (no --stream, --retention or --prompt): it records a chunk's square");
    }
    if (o.across_layers && o.head_share == 0.0f) usage_error("--across-layers moves the --head-share's slots: give a head share");
    if (cl.given("--rebalance-interval") && o.head_share == 0.0f)
        usage_error("--rebalance-interval times the --head-share's moves: give a head share");
    if (o.prompt > 0 && o.prompt + 1 >= o.chunk) usage_error("--prompt must leave tokens of the chunk to score");
    if (o.rolling < 0) o.rolling = o.stream > 0 || !o.retention.empty() ? 1 : 0;
    if (!o.retention.empty()) return o;                             // each trial sizes its own sessions
    const uint32_t length = o.stream > 0 ? o.stream + 1 : o.chunk;  // tokens of one sequence, BOS included
    if (o.n_ctx == 0) o.n_ctx = length;
    if (!o.rolling && o.n_ctx < length) {
        usage_error("--n-ctx " + std::to_string(o.n_ctx) + " is shorter than the " + std::to_string(length) +
                    " tokens of a sequence; raise it or turn on --rolling 1");
    }
    return o;
}

// One (policy, budget) pair. The full cache has budget n_ctx.
struct Config {
    uint32_t policy;
    uint32_t budget;
};

// How the session divides its budget, as the library reports it (h2o_session_get_kv_layout):
// protected first tokens, protected recent window, and the rest chosen by the policy.
struct Split {
    uint32_t sinks = 0, recent = 0, rest = 0;
    std::string text;
};

Split budget_split(const h2o_kv_layout &layout) {
    Split s;
    if (layout.policy == H2O_KV_FULL) {
        s.text = "no eviction";
        return s;
    }
    s.sinks = layout.sinks;
    // Window policies evict the oldest unprotected token: everything else is their window.
    const bool window = layout.policy == H2O_KV_WINDOW || layout.policy == H2O_KV_SINK_WINDOW;
    s.recent = window ? layout.budget - s.sinks : std::min(layout.recent, layout.budget - s.sinks);
    s.rest = layout.budget - s.sinks - s.recent;
    if (s.sinks) s.text = std::to_string(s.sinks) + " sinks + ";
    if (s.recent) s.text += std::to_string(s.recent) + " recent";
    if (s.rest) {
        const char *kind = layout.policy == H2O_KV_RANDOM ? " random" : layout.policy == H2O_KV_TOVA ? " by last attention" : " heavy";
        s.text += (s.recent ? " + " : "") + std::to_string(s.rest) + kind;
    }
    return s;
}

std::string config_label(const Config &c) { return std::string(eval_policy_name(c.policy)) + "/" + std::to_string(c.budget); }

h2o_session_params session_params(const Options &o, const Config &c) {
    h2o_session_params p;
    h2o_session_params_init(&p, sizeof p);
    p.n_ctx = o.n_ctx;
    p.n_threads = o.threads;
    // Scored tokens go in one at a time; what is read at once (--prompt, a retention trial's
    // text) goes in batches of n_batch.
    p.n_batch = o.n_batch ? o.n_batch : o.prompt > 0 ? 0 : 1;
    p.kv_budget = c.policy == H2O_KV_FULL ? 0 : c.budget;
    p.kv_policy = c.policy;
    p.kv_recent = o.recent;
    p.kv_recent_ratio = o.recent_ratio;
    p.kv_sinks = o.sinks;
    p.kv_type = o.kv_type;
    p.kv_horizon = o.horizon;
    // Budgets per head follow attention statistics: the window policies keep theirs fixed.
    h2o_kv_policy_info policy{};
    policy.struct_size = sizeof(policy);
    h2o_kv_policy_get_info(c.policy, &policy);
    const float head_share = policy.gathers_statistics ? o.head_share : 0.0f;
    const std::pair<uint32_t, double> research[] = {{H2O_EXP_KV_LAYER_SLOPE, o.has_layer_slope ? o.layer_slope : 0.0f},
                                                    {H2O_EXP_KV_PROMPT_PROXY, o.prompt_proxy},
                                                    {H2O_EXP_KV_PROMPT_RANDOM_SHARE, o.prompt_random_share},
                                                    {H2O_EXP_KV_HEAD_SHARE, head_share},
                                                    {H2O_EXP_KV_SHARE_ACROSS_LAYERS, head_share > 0.0f && o.across_layers ? 1 : 0},
                                                    {H2O_EXP_KV_REBALANCE_INTERVAL, o.rebalance_interval}};
    for (const auto &[key, value] : research) {
        // The options were checked against the same ranges already.
        if (h2o_session_params_set_experimental(&p, key, value) != H2O_OK) usage_error(h2o_last_error());
    }
    p.position_rolling = o.rolling;
    // Absolute positions (--rolling 0) are the evaluations' own protocol: the cache evicts within
    // n_ctx positions, as it always did, rather than rolling as a default session does.
    if (!o.rolling) p.kv_overflow = H2O_KV_OVERFLOW_ERROR;
    if (c.policy == h2o_tools::kShiftPolicy) h2o_tools::make_shift_params(&p, c.budget);
    if (c.policy == h2o_tools::kOraclePolicy) h2o_tools::make_oracle_params(&p, c.budget);
    return p;
}

// The first position of a sequence that is scored: after BOS, or after the prompt.
size_t scored_from(const Options &o) { return std::max<size_t>(1, o.prompt); }

// Per scored token: -log p(token | prefix) and the argmax of the logits that predicted it.
struct Run {
    std::vector<double> nll;
    std::vector<int32_t> argmax;
    uint64_t kv_bytes = 0;
    h2o_kv_layout layout{};
    double layer_slope = 0;  // the session's resolved kv_layer_slope
    double seconds = 0;
    std::string error;  // empty: success
};

double sum(const std::vector<double> &values) {
    double total = 0;
    for (double v : values) total += v;
    return total;
}

// Says when a progress line is due: every kInterval seconds, asked from any thread (the first
// thread to ask after that time gets true).
class Ticker {
public:
    static constexpr double kInterval = 5.0;
    Ticker() : next_(h2o_tools::now_seconds() + kInterval) {}
    bool due() {
        const double now = h2o_tools::now_seconds();
        double next = next_.load();
        return now >= next && next_.compare_exchange_strong(next, now + kInterval);
    }

private:
    std::atomic<double> next_;
};

// Progress lines on stderr, from any worker thread.
class Progress {
public:
    Progress(bool quiet, size_t total) : quiet_(quiet), total_(total) {}

    void note(const std::string &line) {
        if (quiet_) return;
        std::lock_guard<std::mutex> lock(mutex_);
        std::fprintf(stderr, "h2o-eval: %s\n", line.c_str());
    }
    void finished(const std::string &label, const Run &run) {
        char buf[256];
        const double mean = run.nll.empty() ? 0 : sum(run.nll) / run.nll.size();
        std::lock_guard<std::mutex> lock(mutex_);
        ++done_;
        if (quiet_) return;
        if (run.error.empty()) {
            std::snprintf(buf, sizeof(buf), "[%zu/%zu] %s: ppl %.4f over %zu tokens in %.1f s", done_, total_, label.c_str(),
                          std::exp(mean), run.nll.size(), run.seconds);
        } else {
            std::snprintf(buf, sizeof(buf), "[%zu/%zu] %s: failed", done_, total_, label.c_str());
        }
        std::fprintf(stderr, "h2o-eval: %s\n", buf);
    }

private:
    bool quiet_;
    size_t total_, done_ = 0;
    std::mutex mutex_;
};

// The in-context reference of a stream's tail: per scored token from `first` (an index into a
// run's nll, i.e. stream position first + 1) on, -log p and argmax from a fresh full cache.
struct InContext {
    size_t first = 0;
    std::vector<double> nll;
    std::vector<int32_t> argmax;
    double ppl = NAN;  // over the whole tail
    double seconds = 0;
    std::string error;
};

// Scores stream tokens from index `first` of a run's nll on (stream position first + 1) each
// with a fresh full cache of the --context - 1 tokens before it, o.jobs sessions at a time.
InContext score_in_context(h2o_model *model, size_t n_vocab, const Options &o, const std::vector<int32_t> &stream, size_t first,
                           Progress &progress) {
    InContext ref;
    ref.first = first;
    const size_t count = stream.size() - 1 - first;
    ref.nll.resize(count);
    ref.argmax.resize(count);
    const double start = h2o_tools::now_seconds();
    std::atomic<size_t> next{0}, done{0};
    Ticker ticker;
    std::mutex error_mutex;
    auto worker = [&]() {
        h2o_session_params p;
        h2o_session_params_init(&p, sizeof p);
        p.n_ctx = o.context;
        p.n_batch = o.context;
        p.n_threads = o.threads;
        p.kv_type = o.kv_type;
        h2o_session *session = nullptr;
        h2o_status st = h2o_session_create(model, &p, &session);
        std::vector<float> logits(n_vocab);
        for (size_t i = next++; i < count && st == H2O_OK; i = next++) {
            const size_t position = first + 1 + i;  // of the scored token; BOS is 0
            const size_t from = position >= o.context ? position - (o.context - 1) : 0;
            st = h2o_session_reset(session);
            if (st == H2O_OK) st = h2o_session_decode(session, &stream[from], position - from);
            if (st == H2O_OK) st = h2o_session_get_logits(session, logits.data(), logits.size());
            if (st == H2O_OK) ref.nll[i] = h2o_tools::negative_log_prob(logits, stream[position], &ref.argmax[i]);
            const size_t finished = ++done;
            if (ticker.due()) {
                char buf[160];
                std::snprintf(buf, sizeof(buf), "  in-context reference: %zu/%zu tokens, %.0f s", finished, count,
                              h2o_tools::now_seconds() - start);
                progress.note(buf);
            }
        }
        if (st != H2O_OK) {
            std::lock_guard<std::mutex> lock(error_mutex);
            ref.error = std::string("the in-context reference failed: ") + (session ? h2o_session_last_error(session) : h2o_last_error()) +
                        " (" + h2o_status_string(st) + ")";
        }
        h2o_session_free(session);
    };
    std::vector<std::thread> workers;
    for (size_t j = 1; j < std::min<size_t>(o.jobs, count); ++j) workers.emplace_back(worker);
    worker();
    for (std::thread &t : workers) t.join();
    ref.seconds = h2o_tools::now_seconds() - start;
    return ref;
}

// Feeds every sequence (BOS first) to one session, token by token, scoring each token after BOS
// (with --prompt, the first o.prompt tokens at once, scoring the tokens after them).
Run evaluate(h2o_model *model, size_t n_vocab, const Options &o, const Config &config, const std::vector<std::vector<int32_t>> &sequences,
             Progress &progress) {
    Run run;
    const double start = h2o_tools::now_seconds();
    const h2o_session_params params = session_params(o, config);
    h2o_session *session = nullptr;
    h2o_status st = h2o_session_create(model, &params, &session);
    if (st != H2O_OK) {
        run.error = std::string("cannot create the session: ") + h2o_last_error() + " (" + h2o_status_string(st) + ")";
        return run;
    }
    h2o_memory_report memory;
    memory.struct_size = sizeof(memory);
    if (h2o_session_memory(session, &memory) == H2O_OK) run.kv_bytes = memory.kv_bytes;
    run.layout.struct_size = sizeof(run.layout);
    h2o_session_get_kv_layout(session, &run.layout);
    h2o_session_get_experimental(session, H2O_EXP_KV_LAYER_SLOPE, &run.layer_slope);
    std::unique_ptr<h2o_tools::Oracle> oracle;
    if (config.policy == h2o_tools::kOraclePolicy)
        oracle = std::make_unique<h2o_tools::Oracle>(model, session_params(o, Config{H2O_KV_FULL, o.n_ctx}));

    std::vector<float> logits(n_vocab);
    size_t total = 0;
    for (const auto &seq : sequences) total += seq.size() - scored_from(o);
    run.nll.reserve(total);
    run.argmax.reserve(total);
    Ticker ticker;
    for (size_t s = 0; s < sequences.size() && run.error.empty(); ++s) {
        const std::vector<int32_t> &seq = sequences[s];
        st = h2o_session_reset(session);
        if (oracle && st == H2O_OK) st = oracle->record(seq);
        size_t first = 0;  // the first token fed alone
        if (o.prompt > 0 && st == H2O_OK) {
            st = h2o_tools::decode_as(config.policy, session, seq.data(), o.prompt);
            if (st == H2O_OK) st = h2o_session_get_logits(session, logits.data(), logits.size());
            first = o.prompt;
        }
        for (size_t i = first; i < seq.size() && st == H2O_OK; ++i) {
            if (i > 0) {
                int32_t argmax = 0;
                run.nll.push_back(h2o_tools::negative_log_prob(logits, seq[i], &argmax));
                run.argmax.push_back(argmax);
            }
            if (i + 1 == seq.size()) break;  // the last token predicts nothing we score
            if (oracle) st = oracle->make_room(session, i);
            if (st == H2O_OK) st = h2o_tools::decode_as(config.policy, session, &seq[i], 1);
            if (st == H2O_OK) st = h2o_session_get_logits(session, logits.data(), logits.size());
            if (ticker.due()) {
                char buf[160];
                std::snprintf(buf, sizeof(buf), "  %s: %zu/%zu tokens, ppl so far %.4f", config_label(config).c_str(), run.nll.size(),
                              total, std::exp(sum(run.nll) / std::max<size_t>(1, run.nll.size())));
                progress.note(buf);
            }
        }
        if (st != H2O_OK && oracle && !oracle->error().empty()) {
            run.error = "sequence " + std::to_string(s) + ": " + oracle->error();
        } else if (st != H2O_OK) {
            run.error = "decoding sequence " + std::to_string(s) + " failed: " + h2o_session_last_error(session) + " (" +
                        h2o_status_string(st) + ")";
        }
    }
    h2o_session_free(session);
    run.seconds = h2o_tools::now_seconds() - start;
    return run;
}

// What a row of the report says about one configuration.
struct Summary {
    Config config;
    Split split;
    const Run *run;
    double mean_nll, ppl;
    double agreement;  // NaN without a full-cache baseline
    std::vector<double> segment_ppl;
    // Stream mode with a reference: the tail's perplexity and greedy agreement with the reference.
    double tail_ppl = NAN, tail_agreement = NAN;
    // With a window and the oracle at the same budget: the share of the window's excess
    // perplexity over the oracle's that this configuration removes (window 0, oracle 1).
    double gap_closed = NAN;
};

// Summary::gap_closed of every row that has both references.
void measure_gap_closed(std::vector<Summary> *rows) {
    auto ppl_of = [&](uint32_t policy, uint32_t budget) {
        for (const Summary &r : *rows) {
            if (r.config.policy == policy && r.config.budget == budget) return r.ppl;
        }
        return double{NAN};
    };
    for (Summary &r : *rows) {
        const double window = ppl_of(H2O_KV_WINDOW, r.config.budget), oracle = ppl_of(h2o_tools::kOraclePolicy, r.config.budget);
        if (std::isfinite(window) && std::isfinite(oracle) && window > oracle) r.gap_closed = (window - r.ppl) / (window - oracle);
    }
}

double mean_of(const std::vector<double> &values, size_t first, size_t end) {
    double total = 0;
    for (size_t i = first; i < end; ++i) total += values[i];
    return total / static_cast<double>(end - first);
}

Summary summarize(const Options &o, const Config &config, const Run &run, const Run *baseline, const InContext *reference) {
    Summary s{config, budget_split(run.layout), &run, 0, 0, NAN, {}};
    if (config.policy == h2o_tools::kShiftPolicy) s.split.text = "BOS + newest half to all, shifted";
    if (config.policy == h2o_tools::kOraclePolicy) s.split.text = "by the attention to come";
    s.mean_nll = sum(run.nll) / static_cast<double>(run.nll.size());
    s.ppl = std::exp(s.mean_nll);
    if (baseline) {
        size_t agree = 0;
        for (size_t i = 0; i < run.argmax.size(); ++i) agree += run.argmax[i] == baseline->argmax[i];
        s.agreement = static_cast<double>(agree) / static_cast<double>(run.argmax.size());
    }
    if (o.stream > 0) {
        for (size_t first = 0; first < run.nll.size(); first += o.segment) {
            s.segment_ppl.push_back(std::exp(mean_of(run.nll, first, std::min(run.nll.size(), first + o.segment))));
        }
    }
    if (reference) {
        s.tail_ppl = std::exp(mean_of(run.nll, reference->first, run.nll.size()));
        size_t agree = 0;
        for (size_t i = 0; i < reference->argmax.size(); ++i) agree += run.argmax[reference->first + i] == reference->argmax[i];
        s.tail_agreement = static_cast<double>(agree) / static_cast<double>(reference->argmax.size());
    }
    return s;
}

// JSON has no NaN or infinity.
std::string json_number(double v, const char *fmt = "%.6f") {
    if (!std::isfinite(v)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof(buf), fmt, v);
    return buf;
}

void print_json(const Options &o, const std::vector<Summary> &rows, const Summary *full, const InContext *reference) {
    for (const Summary &r : rows) {
        std::string line = "{\"mode\":\"" + std::string(o.stream ? "stream" : "chunks") + "\"";
        line += ",\"policy\":\"" + std::string(eval_policy_name(r.config.policy)) + "\"";
        line += ",\"budget\":" + std::to_string(r.config.budget);
        line += ",\"sinks\":" + std::to_string(r.split.sinks) + ",\"recent\":" + std::to_string(r.split.recent) +
                ",\"heavy\":" + std::to_string(r.split.rest);
        line += ",\"horizon\":" + std::to_string(r.run->layout.horizon);
        line += ",\"layer_slope\":" + json_number(r.run->layer_slope, "%g");
        line += ",\"rolling\":" + std::string(o.rolling ? "true" : "false");
        line += ",\"tokens\":" + std::to_string(r.run->nll.size());
        line += ",\"mean_nll\":" + json_number(r.mean_nll) + ",\"ppl\":" + json_number(r.ppl);
        line += ",\"ppl_vs_full_pct\":" + json_number(full ? 100 * (r.ppl / full->ppl - 1) : NAN, "%.3f");
        line += ",\"greedy_agreement\":" + json_number(r.agreement);
        line += ",\"oracle_gap_closed_pct\":" + json_number(100 * r.gap_closed, "%.2f");
        line += ",\"kv_bytes\":" + std::to_string(r.run->kv_bytes) + ",\"seconds\":" + json_number(r.run->seconds, "%.2f");
        if (o.stream) {
            line += ",\"segment_tokens\":" + std::to_string(o.segment) + ",\"segment_ppl\":[";
            for (size_t i = 0; i < r.segment_ppl.size(); ++i) line += (i ? "," : "") + json_number(r.segment_ppl[i], "%.4f");
            line += "]";
        }
        if (reference) {
            const double reference_ppl = reference->ppl;
            line += ",\"tail_first_token\":" + std::to_string(reference->first + 1) + ",\"tail_ppl\":" + json_number(r.tail_ppl, "%.4f");
            line += ",\"tail_in_context_ppl\":" + json_number(reference_ppl, "%.4f");
            line += ",\"tail_vs_in_context_pct\":" + json_number(100 * (r.tail_ppl / reference_ppl - 1), "%.3f");
            line += ",\"tail_greedy_agreement\":" + json_number(r.tail_agreement);
        }
        std::printf("%s}\n", line.c_str());
    }
}

void print_table(const Options &o, const std::vector<Summary> &rows, const Summary *full, const InContext *reference,
                 const std::string &setup) {
    std::printf("%s", setup.c_str());
    std::printf("%-13s %7s  %-31s %9s %7s %9s %9s %8s %7s\n", "policy", "budget", "split", "KV KiB", "tokens", "mean NLL", "ppl", "vs full",
                "agree");
    for (const Summary &r : rows) {
        char vs_full[32] = "-", agree[32] = "-";
        if (full) std::snprintf(vs_full, sizeof(vs_full), "%+.2f%%", 100 * (r.ppl / full->ppl - 1));
        if (std::isfinite(r.agreement)) std::snprintf(agree, sizeof(agree), "%.4f", r.agreement);
        std::printf("%-13s %7u  %-31s %9.1f %7zu %9.4f %9.4f %8s %7s\n", eval_policy_name(r.config.policy), r.config.budget,
                    r.split.text.c_str(), r.run->kv_bytes / 1024.0, r.run->nll.size(), r.mean_nll, r.ppl, vs_full, agree);
    }
    if (std::any_of(rows.begin(), rows.end(), [](const Summary &r) { return std::isfinite(r.gap_closed); })) {
        std::printf("\nof the perplexity a window loses against the oracle at its budget, the share each removes\n");
        for (const Summary &r : rows) {
            if (std::isfinite(r.gap_closed)) std::printf("  %-22s %+7.1f%%\n", config_label(r.config).c_str(), 100 * r.gap_closed);
        }
    }
    if (!o.stream) return;
    if (reference) {
        const double reference_ppl = reference->ppl;
        std::printf(
            "\ntokens %zu-%u against their in-context perplexity %.4f (each scored by a fresh full cache with\n"
            "the %u tokens before it; %.1f s); agree = greedy agreement with it\n",
            reference->first + 1, o.stream, reference_ppl, o.context - 1, reference->seconds);
        for (const Summary &r : rows) {
            std::printf("  %-22s ppl %.4f  %+6.2f%%  agree %.4f\n", config_label(r.config).c_str(), r.tail_ppl,
                        100 * (r.tail_ppl / reference_ppl - 1), r.tail_agreement);
        }
    }
    // Per segment: one row per segment, one perplexity column per configuration.
    std::printf("\nperplexity per segment of %u tokens (token range = stream positions scored; BOS is 0)\n", o.segment);
    std::printf("%7s  %-13s", "segment", "tokens");
    if (reference) std::printf(" %10s", "in-context");
    std::vector<int> widths;
    for (const Summary &r : rows) {
        const std::string label = config_label(r.config);
        widths.push_back(static_cast<int>(std::max<size_t>(label.size(), 9)));
        std::printf(" %*s", widths.back(), label.c_str());
    }
    std::printf("\n");
    const size_t n_segments = rows.empty() ? 0 : rows[0].segment_ppl.size();
    for (size_t s = 0; s < n_segments; ++s) {
        const size_t first = s * o.segment + 1, last = std::min<size_t>((s + 1) * o.segment, o.stream);
        const std::string range = std::to_string(first) + "-" + std::to_string(last);
        std::printf("%7zu  %-13s", s, range.c_str());
        if (reference && s * o.segment >= reference->first) {
            const size_t from = s * o.segment - reference->first;
            std::printf(" %10.4f", std::exp(mean_of(reference->nll, from, std::min(reference->nll.size(), from + o.segment))));
        } else if (reference) {
            std::printf(" %10s", "-");
        }
        for (size_t i = 0; i < rows.size(); ++i) std::printf(" %*.4f", widths[i], rows[i].segment_ppl[s]);
        std::printf("\n");
    }
}

h2o_tools::Plot make_plot(const Options &o, const std::vector<Summary> &rows, const Summary *full, const std::string &model_name) {
    h2o_tools::Plot plot;
    plot.y_label = "perplexity";
    if (o.stream) {
        plot.title = "h2o-eval: perplexity per " + std::to_string(o.segment) + "-token segment (" + model_name +
                     (o.rolling ? ", position rolling)" : ", absolute positions)");
        plot.x_label = "tokens into the stream (end of segment)";
        plot.x_from_zero = true;
        double lo = INFINITY, hi = 0;
        for (const Summary &r : rows) {
            h2o_tools::PlotSeries series;
            series.label = config_label(r.config);
            for (size_t s = 0; s < r.segment_ppl.size(); ++s) {
                series.x.push_back(static_cast<double>(std::min<size_t>((s + 1) * o.segment, o.stream)));
                series.y.push_back(r.segment_ppl[s]);
                lo = std::min(lo, r.segment_ppl[s]);
                hi = std::max(hi, r.segment_ppl[s]);
            }
            plot.series.push_back(series);
        }
        // A cache past the trained context can explode; a log axis keeps the others readable.
        plot.log_y = hi > 8 * lo;
        if (plot.log_y) plot.y_label = "perplexity (log scale)";
        return plot;
    }
    plot.title = "h2o-eval: perplexity vs KV budget (" + model_name + ", " + std::to_string(o.chunks) + " chunks of " +
                 std::to_string(o.chunk) + ")";
    plot.x_label = "KV budget per (layer, kv head), log scale";
    plot.log_x = true;
    plot.x_ticks.assign(o.budgets.begin(), o.budgets.end());
    if (full) plot.lines.push_back({"full cache (" + std::to_string(full->config.budget) + ")", full->ppl});
    for (uint32_t policy : o.policies) {
        if (policy == H2O_KV_FULL) continue;
        h2o_tools::PlotSeries series;
        series.label = eval_policy_name(policy);
        for (const Summary &r : rows) {
            if (r.config.policy != policy) continue;
            series.x.push_back(r.config.budget);
            series.y.push_back(r.ppl);
        }
        plot.series.push_back(series);
    }
    return plot;
}

std::string base_name(const std::string &path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The two comment lines above the table.
std::string setup_text(const Options &o, size_t scored, double seconds) {
    char line[512];
    if (o.stream) {
        std::snprintf(line, sizeof(line),
                      "# h2o-eval  %s on %s: stream of BOS + %u tokens, token by token, n_ctx %u, position rolling %s\n",
                      base_name(o.model_path).c_str(), base_name(o.text_path).c_str(), o.stream, o.n_ctx, o.rolling ? "on" : "off");
    } else {
        std::snprintf(
            line, sizeof(line), "# h2o-eval  %s on %s: %u chunks of BOS + %u tokens (%zu scored, token by token), position rolling %s\n",
            base_name(o.model_path).c_str(), base_name(o.text_path).c_str(), o.chunks, o.chunk - 1, scored, o.rolling ? "on" : "off");
    }
    std::string text = line;
    if (o.repeats) text += "# the text is shorter than the stream: the stream goes round it again\n";
    const std::string horizon = o.horizon == 0                     ? "by policy default"
                                : o.horizon == H2O_KV_HORIZON_NONE ? "none"
                                                                   : std::to_string(o.horizon);
    const std::string recent = o.recent             ? std::to_string(o.recent) + " tokens"
                               : o.recent_ratio < 0 ? "by policy default"
                                                    : "ratio " + json_number(o.recent_ratio, "%g");
    const std::string slope = o.has_layer_slope ? json_number(o.layer_slope, "%g") : "by library default";
    std::snprintf(line, sizeof(line), "# KV %s, kv_sinks %u, recent window %s, horizon %s, layer slope %s; %.1f s\n",
                  h2o_tools::kv_type_name(o.kv_type), o.sinks, recent.c_str(), horizon.c_str(), slope.c_str(), seconds);
    text += line;
    text += o.prompt > 0 ? "# each chunk's first " + std::to_string(o.prompt) + " tokens read as one prompt; " : "# ";
    text += o.prompt_proxy > 0 ? "prompt eviction one-shot: proxy " + std::to_string(o.prompt_proxy) + " queries, random share " +
                                     json_number(o.prompt_random_share, "%g") + "\n"
                               : "prompt eviction by the policy\n";
    if (o.head_share > 0.0f) {
        text += "# budgets per kv head: head share " + json_number(o.head_share, "%g") +
                (o.across_layers ? ", across layers" : ", within each layer") + ", moved every " + std::to_string(o.rebalance_interval) +
                " tokens (policies with statistics)\n";
    }
    return text;
}

// The text as tokens, without BOS. Exits on failure (2 for text that is not UTF-8).
std::vector<int32_t> tokenize_text(h2o_model *model, const Options &o, const std::string &text) {
    std::vector<int32_t> tokens;
    const h2o_status st = h2o_tools::tokenize(model, text, 0, &tokens);
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-eval: cannot tokenize '%s': %s (%s)\n", o.text_path.c_str(), h2o_last_error(), h2o_status_string(st));
        std::exit(st == H2O_ERR_INVALID_TEXT ? 2 : 1);
    }
    return tokens;
}

// The sequences every configuration sees, each starting with BOS: one stream, or the chunks (then
// o->chunks becomes the number of whole chunks there are, at most the number asked for).
std::vector<std::vector<int32_t>> make_sequences(Options *o, const std::vector<int32_t> &tokens, int32_t bos) {
    std::vector<std::vector<int32_t>> sequences;
    if (o->stream > 0) {
        // A stream longer than the text goes round it again: a cache of a few hundred tokens cannot
        // remember the text's first pass, so a repeat reads as new text (to the full cache it
        // does not: compare repeated streams with the in-context reference only).
        o->repeats = tokens.size() < o->stream;
        if (o->repeats && !o->quiet) {
            std::fprintf(stderr, "h2o-eval: note: the text has %zu tokens: the stream of %u goes round it %.1f times\n", tokens.size(),
                         o->stream, static_cast<double>(o->stream) / tokens.size());
        }
        sequences.push_back({bos});
        for (size_t i = 0; i < o->stream; ++i) sequences[0].push_back(tokens[i % tokens.size()]);
        return sequences;
    }
    const size_t per_chunk = o->chunk - 1;
    const size_t available = tokens.size() / per_chunk;
    if (available == 0) {
        usage_error("'" + o->text_path + "' has " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of " +
                    std::to_string(per_chunk));
    }
    if (available < o->chunks && !o->quiet) {
        std::fprintf(stderr, "h2o-eval: note: the text has %zu tokens: only %zu chunks of %zu\n", tokens.size(), available, per_chunk);
    }
    o->chunks = static_cast<uint32_t>(std::min<size_t>(o->chunks, available));
    for (size_t c = 0; c < o->chunks; ++c) {
        sequences.push_back({bos});
        sequences.back().insert(sequences.back().end(), tokens.begin() + c * per_chunk, tokens.begin() + (c + 1) * per_chunk);
    }
    return sequences;
}

}  // namespace

int main(int argc, char **argv) {
    Options o = parse_options(argc, argv);

    std::string text, error;
    if (!h2o_tools::read_file(o.text_path, &text, &error)) usage_error("cannot read '" + o.text_path + "': " + error);
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) usage_error("'" + o.text_path + "' has no text");
    // Fail now rather than after a long run.
    if (!o.svg_path.empty() && !h2o_tools::write_file(o.svg_path, "", &error)) {
        usage_error("cannot write '" + o.svg_path + "': " + error);
    }
    // Configurations in the order asked for; the full cache has n_ctx slots.
    std::vector<Config> configs;
    for (uint32_t p : o.policies) {
        if (p == H2O_KV_FULL) {
            configs.push_back({p, o.n_ctx});
            continue;
        }
        for (uint32_t b : o.budgets) {
            if (o.recent > b) usage_error("--recent " + std::to_string(o.recent) + " exceeds budget " + std::to_string(b));
            if (o.sinks >= b) usage_error("--sinks " + std::to_string(o.sinks) + " must be smaller than budget " + std::to_string(b));
            configs.push_back({p, b});
        }
    }
    const bool full_requested = std::find(o.policies.begin(), o.policies.end(), H2O_KV_FULL) != o.policies.end();
    for (uint32_t b : o.budgets) {
        if (o.retention.empty() && b >= o.n_ctx && !o.rolling && !o.quiet && configs.size() > (full_requested ? 1u : 0u)) {
            std::fprintf(stderr, "h2o-eval: note: budget %u >= n_ctx %u: those sessions never evict (like 'full')\n", b, o.n_ctx);
        }
    }
    if (o.quiet) h2o_set_log_callback(nullptr, nullptr, H2O_LOG_NONE);

    h2o_model *model = nullptr;
    h2o_status st = h2o_model_load(o.model_path.c_str(), nullptr, &model);
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-eval: cannot load model '%s': %s (%s)\n", o.model_path.c_str(), h2o_last_error(), h2o_status_string(st));
        return st == H2O_ERR_IO ? 2 : 1;  // a path that cannot be opened is a usage error
    }
    h2o_model_info info;
    info.struct_size = sizeof(info);
    h2o_model_get_info(model, &info);
    if (info.bos_token < 0) {
        std::fprintf(stderr, "h2o-eval: the model has no BOS token, which every sequence starts with\n");
        h2o_model_free(model);
        return 1;
    }
    if (!o.retention.empty()) {
        h2o_tools::RetentionOptions r;
        r.policies = o.policies;
        r.budgets = o.budgets;
        r.lengths = o.retention;
        r.trials = o.trials;
        r.passage_tokens = o.passage;
        r.min_shares = o.min_shares;
        r.jobs = o.jobs;
        r.json = o.json;
        r.session_params = [&o](uint32_t policy, uint32_t budget) { return session_params(o, Config{policy, budget}); };
        const int rc = h2o_tools::run_retention(model, text, r);
        h2o_model_free(model);
        return rc;
    }
    const std::vector<std::vector<int32_t>> sequences = make_sequences(&o, tokenize_text(model, o, text), info.bos_token);

    // The full cache runs first: the others compare their argmaxes with it. Chunk mode always
    // needs it; a long stream only when it is asked for.
    const Config full_config{H2O_KV_FULL, o.n_ctx};
    const bool have_full = full_requested || o.stream == 0;
    const double start = h2o_tools::now_seconds();
    Progress progress(o.quiet, configs.size() + (have_full && !full_requested ? 1 : 0));
    Run full_run;
    if (have_full) {
        full_run = evaluate(model, info.n_vocab, o, full_config, sequences, progress);
        progress.finished(config_label(full_config), full_run);
    }
    std::vector<Run> runs(configs.size());
    // The others, o.jobs at a time, each with its own session. Rows of 'full' use full_run.
    std::atomic<size_t> next{0};
    auto worker = [&]() {
        for (size_t i = next++; i < configs.size(); i = next++) {
            if (configs[i].policy == H2O_KV_FULL) continue;
            runs[i] = evaluate(model, info.n_vocab, o, configs[i], sequences, progress);
            progress.finished(config_label(configs[i]), runs[i]);
        }
    };
    std::vector<std::thread> workers;
    for (size_t j = 1; j < std::min<size_t>(o.jobs, configs.size()); ++j) workers.emplace_back(worker);
    worker();
    for (std::thread &t : workers) t.join();
    // The stream's tail against its in-context perplexity.
    InContext reference;
    const bool have_reference = o.stream > 0 && o.context > 0;
    if (have_reference) {
        const size_t n_segments = (o.stream + o.segment - 1) / o.segment;
        reference = score_in_context(model, info.n_vocab, o, sequences[0], (n_segments - std::min<size_t>(o.tail, n_segments)) * o.segment,
                                     progress);
        if (reference.error.empty()) reference.ppl = std::exp(mean_of(reference.nll, 0, reference.nll.size()));
    }
    const double seconds = h2o_tools::now_seconds() - start;
    auto run_of = [&](size_t i) -> const Run & { return configs[i].policy == H2O_KV_FULL ? full_run : runs[i]; };

    int rc = 0;
    if (!full_run.error.empty()) {
        std::fprintf(stderr, "h2o-eval: %s: %s\n", config_label(full_config).c_str(), full_run.error.c_str());
        rc = 1;
    }
    for (size_t i = 0; i < configs.size(); ++i) {
        if (configs[i].policy == H2O_KV_FULL || runs[i].error.empty()) continue;
        std::fprintf(stderr, "h2o-eval: %s: %s\n", config_label(configs[i]).c_str(), runs[i].error.c_str());
        rc = 1;
    }
    if (!reference.error.empty()) {
        std::fprintf(stderr, "h2o-eval: %s\n", reference.error.c_str());
        rc = 1;
    }
    if (rc) {
        h2o_model_free(model);
        return rc;
    }

    const Run *baseline = have_full ? &full_run : nullptr;
    const InContext *tail_reference = have_reference ? &reference : nullptr;
    std::vector<Summary> rows;
    for (size_t i = 0; i < configs.size(); ++i) rows.push_back(summarize(o, configs[i], run_of(i), baseline, tail_reference));
    measure_gap_closed(&rows);
    const Summary full_summary = have_full ? summarize(o, full_config, full_run, baseline, tail_reference) : Summary{};
    const Summary *full = have_full ? &full_summary : nullptr;

    if (o.json) {
        print_json(o, rows, full, tail_reference);
    } else {
        print_table(o, rows, full, tail_reference, setup_text(o, sequences.size() * (sequences[0].size() - scored_from(o)), seconds));
    }
    if (!o.svg_path.empty()) {
        const std::string svg = h2o_tools::render_svg(make_plot(o, rows, full, base_name(o.model_path)));
        if (!h2o_tools::write_file(o.svg_path, svg, &error)) {
            std::fprintf(stderr, "h2o-eval: cannot write '%s': %s\n", o.svg_path.c_str(), error.c_str());
            rc = 1;
        } else if (!o.quiet) {
            std::fprintf(stderr, "h2o-eval: wrote the chart to %s\n", o.svg_path.c_str());
        }
    }
    h2o_model_free(model);
    return rc;
}
