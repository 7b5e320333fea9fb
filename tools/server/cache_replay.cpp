// h2o-cache-replay: replays a trace of chat requests against h2o-server's caches, simulated, under
// both cache policies (lib/util/cache_policy.h and the library's prefix cache: the very code the
// server and the library run), and prints the hit ratios and the time to first token.
//
//   h2o-cache-replay TRACE.jsonl... [--sessions 2,4,8] [--prefix-cache-mib 4,16,64]
//                    [--prefill-rate 240] [--kv-bytes-per-token 22528] [--kv-budget 512]
//
// A trace is one request per line (scripts/make-cache-traces.py writes them):
//   {"t": seconds, "conversation": id, "named": bool, "system": id or "", "system_tokens": n,
//    "history_tokens": n, "new_tokens": n, "reply_tokens": n}
// history_tokens: the conversation's tokens before this request, its system prompt aside.
//
// The model of the server: `sessions` live sessions, each holding one conversation (at most
// kv_budget tokens); a request whose conversation is live processes only its new tokens, any
// other processes the whole history the client sends (no state directory), its system prompt
// taken from the prefix cache when held there (the library's cache, run under the same policy:
// prefix_cache_mib of kv_bytes_per_token per token). The time to first token is
// the tokens processed at prefill_rate; requests do not wait for each other (a desktop's
// requests rarely overlap), and decoding is not counted. Defaults: the TinyLlama 1.1B shape in
// Q4_0 on two cores (240 prompt tokens per second, docs/PERFORMANCE.md; 22 layers x 4 kv heads
// x 64 x K and V in f16 per token) and h2o-server's --kv-budget.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../options.h"
#include "cache_trace.h"
#include "prefix_cache.h"
#include "reuse_policy.h"

namespace {

using h2o_server::CachePolicy;

using Request = h2o_server::TraceRequest;

struct Setup {
    uint32_t sessions = 2;
    uint64_t prefix_cache_bytes = 0;
    double prefill_rate = 240;
    uint64_t kv_bytes_per_token = 22528;
    uint64_t kv_budget = 512;
};

struct Result {
    uint64_t continuing = 0, live_hits = 0;       // requests of a conversation seen before; of those, live
    uint64_t prefix_lookups = 0, prefix_hits = 0;  // system prompts processed; of those, from the prefix cache
    double mean_ttft = 0, p99_ttft = 0;
};

bool read_trace(const std::string &path, std::vector<Request> *out, std::string *error) {
    std::ifstream in(path);
    if (!in) {
        *error = "cannot read " + path;
        return false;
    }
    std::string line;
    for (size_t number = 1; std::getline(in, line); ++number) {
        if (line.empty()) continue;
        Request r;
        std::string why;
        if (!h2o_server::parse_trace_request(line, &r, &why)) {
            *error = path + ":" + std::to_string(number) + ": " + why;
            return false;
        }
        if (!out->empty() && r.t < out->back().t) {
            *error = path + ":" + std::to_string(number) + ": requests must come in time order";
            return false;
        }
        out->push_back(r);
    }
    return true;
}

// The library's prefix cache itself (lib/model/prefix_cache.h), under the policy replayed, on
// the trace's clock. A system prompt is a token sequence of its length that begins with a number
// of its own, so that no prompt is a prefix of another; its saved state is kept at kStateBytes a
// token and the capacity scaled to match, so that the cache holds what kv_bytes_per_token would
// let it hold without the replayer allocating it.
class SystemPrompts {
public:
    static constexpr uint64_t kStateBytes = 64;
    SystemPrompts(uint64_t capacity, uint64_t kv_bytes_per_token, h2o::CachePolicy policy, const double *now)
        : cache_(scaled(capacity, kv_bytes_per_token), policy, [now] { return *now; }) {}
    // Whether the prompt was held; it is kept afterwards as the policy chooses.
    bool use(const std::string &id, uint64_t n_tokens) {
        const int32_t number = numbers_.try_emplace(id, static_cast<int32_t>(numbers_.size())).first->second;
        std::vector<int32_t> tokens(n_tokens);
        tokens[0] = number;
        for (size_t i = 1; i < tokens.size(); ++i) tokens[i] = -static_cast<int32_t>(i);
        size_t matched = 0;
        if (cache_.find(0, true, tokens.data(), tokens.size(), &matched)) return true;
        cache_.insert(0, true, tokens.data(), tokens.size(), std::vector<uint8_t>(n_tokens * kStateBytes));
        return false;
    }

private:
    // What the cache counts a token at (its state and the token itself) over what it stands for.
    static uint64_t scaled(uint64_t capacity, uint64_t kv_bytes_per_token) {
        const double per_token = static_cast<double>(kStateBytes + sizeof(int32_t));
        return static_cast<uint64_t>(static_cast<double>(capacity) * per_token / static_cast<double>(kv_bytes_per_token));
    }
    h2o::PrefixCache cache_;
    std::map<std::string, int32_t> numbers_;
};

struct Conversation {
    bool live = false;
    uint64_t release = 0;  // order of its last turn's end
    double last_t = 0;
    uint32_t turns = 0;
    uint64_t tokens_held = 0;
    bool named = false, counted_gone = false;
};

Result replay(const std::vector<Request> &trace, CachePolicy policy, const Setup &setup) {
    h2o_server::ReuseEstimator estimator;
    double now = 0;
    SystemPrompts prefix(setup.prefix_cache_bytes, setup.kv_bytes_per_token, policy, &now);
    std::map<std::string, Conversation> conversations;
    uint32_t live = 0;
    uint64_t clock = 0;
    Result result;
    std::vector<double> ttft;
    ttft.reserve(trace.size());
    for (const Request &r : trace) {
        now = r.t;
        // What the server learns as time passes: conversations idle past the horizon are gone.
        for (auto &[id, c] : conversations) {
            const size_t category = h2o_server::reuse_category(c.named, c.turns);
            if (!c.counted_gone && r.t - c.last_t > estimator.horizon_seconds(category)) {
                estimator.ended(category);
                c.counted_gone = true;
            }
        }
        Conversation &c = conversations[r.conversation];
        if (c.turns > 0) {
            ++result.continuing;
            estimator.reused(h2o_server::reuse_category(c.named, c.turns), r.t - c.last_t);
            c.counted_gone = false;
        }
        c.named = c.named || r.named;
        uint64_t processed = r.new_tokens;
        if (c.live) {
            ++result.live_hits;
        } else {
            if (live == setup.sessions) {
                std::vector<std::string> ids;
                std::vector<h2o_server::CacheCandidate> candidates;
                for (auto &[id, other] : conversations) {
                    if (!other.live) continue;
                    ids.push_back(id);
                    candidates.push_back({other.release, r.t - other.last_t, h2o_server::reuse_category(other.named, other.turns),
                                          other.tokens_held, 1});
                }
                conversations[ids[h2o_server::give_up_order(policy, estimator, candidates).front()]].live = false;
                --live;
            }
            c.live = true;
            ++live;
            processed += r.history_tokens + r.system_tokens;
            if (!r.system.empty() && r.system_tokens > 0) {
                ++result.prefix_lookups;
                if (prefix.use(r.system, r.system_tokens)) {
                    ++result.prefix_hits;
                    processed -= r.system_tokens;
                }
            }
        }
        ttft.push_back(static_cast<double>(processed) / setup.prefill_rate);
        ++c.turns;
        c.last_t = r.t;
        c.release = ++clock;
        c.tokens_held = std::min(setup.kv_budget, r.system_tokens + r.history_tokens + r.new_tokens + r.reply_tokens);
    }
    if (!ttft.empty()) {
        double sum = 0;
        for (double x : ttft) sum += x;
        result.mean_ttft = sum / static_cast<double>(ttft.size());
        std::sort(ttft.begin(), ttft.end());
        result.p99_ttft = ttft[std::min(ttft.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(ttft.size())))];
    }
    return result;
}

std::vector<uint64_t> parse_list(const std::string &text) {
    std::vector<uint64_t> values;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t comma = text.find(',', start);
        const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        char *end = nullptr;
        const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v == 0) return {};
        values.push_back(v);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return values;
}

}  // namespace

int main(int argc, char **argv) {
    std::string sessions_text = "2,4,8", prefix_text = "4,16,64";
    Setup setup;
    uint32_t prefill_rate = 240;
    uint64_t bytes_per_token = setup.kv_bytes_per_token, budget = setup.kv_budget;
    h2o_tools::CommandLine cl("h2o-cache-replay",
                              "usage: h2o-cache-replay TRACE.jsonl... [--sessions 2,4,8] [--prefix-cache-mib 4,16,64]\n"
                              "                        [--prefill-rate 240] [--kv-bytes-per-token 22528] [--kv-budget 512]\n"
                              "Replays traces of chat requests against h2o-server's caches, simulated, under the lru and\n"
                              "reuse cache policies, and prints hit ratios and times to first token (the model of the\n"
                              "server: the comment at the top of tools/server/cache_replay.cpp).\n");
    cl.text("--sessions", &sessions_text);
    cl.text("--prefix-cache-mib", &prefix_text);
    cl.count("--prefill-rate", 1, 1000000, &prefill_rate);
    cl.count("--kv-bytes-per-token", 1, 1u << 30, &bytes_per_token);
    cl.count("--kv-budget", 1, 1u << 24, &budget);
    std::vector<std::string> traces;
    cl.positional([&traces](const std::string &path) { traces.push_back(path); });
    cl.parse(argc, argv);
    const std::vector<uint64_t> session_counts = parse_list(sessions_text), prefix_sizes = parse_list(prefix_text);
    if (traces.empty()) cl.fail("no trace given");
    if (session_counts.empty()) cl.fail("--sessions takes whole numbers above 0, separated by commas");
    if (prefix_sizes.empty()) cl.fail("--prefix-cache-mib takes whole numbers above 0, separated by commas");
    setup.prefill_rate = prefill_rate;
    setup.kv_bytes_per_token = bytes_per_token;
    setup.kv_budget = budget;

    std::printf("| trace | sessions | prefix cache | policy | live hits | prefix hits | mean TTFT (s) | p99 TTFT (s) | mean vs lru |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string &path : traces) {
        std::vector<Request> trace;
        std::string error;
        if (!read_trace(path, &trace, &error)) {
            std::fprintf(stderr, "h2o-cache-replay: %s\n", error.c_str());
            return 1;
        }
        std::string name = path.substr(path.find_last_of('/') + 1);
        for (const uint64_t sessions : session_counts) {
            for (const uint64_t mib : prefix_sizes) {
                setup.sessions = static_cast<uint32_t>(sessions);
                setup.prefix_cache_bytes = mib << 20;
                const Result lru = replay(trace, CachePolicy::kLru, setup);
                for (const CachePolicy policy : {CachePolicy::kLru, CachePolicy::kReuse}) {
                    const Result r = policy == CachePolicy::kLru ? lru : replay(trace, policy, setup);
                    auto share = [](uint64_t part, uint64_t whole) { return whole ? 100.0 * part / whole : 0.0; };
                    std::printf("| %s | %llu | %llu MiB | %s | %.1f%% of %llu | %.1f%% | %.3f | %.2f | %.2fx |\n", name.c_str(),
                                static_cast<unsigned long long>(sessions), static_cast<unsigned long long>(mib),
                                h2o_server::cache_policy_name(policy), share(r.live_hits, r.continuing),
                                static_cast<unsigned long long>(r.continuing), share(r.prefix_hits, r.prefix_lookups), r.mean_ttft,
                                r.p99_ttft, lru.mean_ttft > 0 ? r.mean_ttft / lru.mean_ttft : 1.0);
                }
            }
        }
    }
    return 0;
}
