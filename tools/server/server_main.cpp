// h2o-server: a local server of the OpenAI chat-completions protocol where every conversation
// lives in a fixed-size session (its system message pinned) and, with --state-dir, survives
// restarts. Built on the public C API only.
//
//   h2o-server -m MODEL [--host 127.0.0.1] [--port 8080] [--kv-budget B] [--kv-policy P]
//              [--sessions N] [--state-dir DIR] [--max-memory BYTES] [...]
#include <httplib.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <thread>
#include <vector>

#include "../common.h"
#include "../options.h"
#include "../session_options.h"
#include "http_routes.h"

namespace {

struct ServerOptions {
    std::string model_path, host = "127.0.0.1", state_dir, chat_format, cors, record_trace;
    std::vector<std::string> aliases;
    uint32_t port = 8080, sessions = 4, parallel = 1, queue = 32, max_tokens_default = 256;
    uint32_t session_wait = 30;
    uint64_t max_memory = 0, prefix_cache = 16u << 20, max_body = 8u << 20;
    uint64_t state_max_bytes = 0, state_max_age = 0;
    std::string cache_policy_name = "reuse";
    h2o_server::CachePolicy cache_policy = h2o_server::CachePolicy::kReuse;  // read from the name
    bool no_rolling = false;
};

std::string usage(const h2o_session_params &sp) {
    return "usage: h2o-server -m MODEL [options]\n"
           "  -m, --model FILE       GGUF model (default: $H2O_MODEL)\n"
           "  --host ADDRESS         address to listen on (default 127.0.0.1: this machine only)\n"
           "  --port N               port (default 8080; 0: any free port, printed at startup)\n"
           "  --cors ORIGIN          let web pages of ORIGIN (e.g. http://localhost:3000, or *) call the\n"
           "                         server from a browser (default: none)\n"
           "  --alias NAME           the model's id in the protocol (default: the file's name). A request\n"
           "                         for any model gets this one, unless --alias is given more than\n"
           "                         once: then only those names are served (the first is the id)\n"
           "  --chat-format NAME     llama2, zephyr, chatml, llama3, phi3, mistral, gemma\n"
           "                         (default: the one the model's template describes)\n"
           "  --sessions N           conversations with a live session at once (default 4); past it an\n"
           "                         idle one gives its session up, chosen by --cache-policy\n"
           "  --state-dir DIR        save every conversation there after each turn and restore it\n"
           "                         when it continues, also after a restart (default: none)\n"
           "  --state-max-bytes BYTES  keep the state directory's files within BYTES: past it\n"
           "                         conversations that hold no session and serve no request are removed,\n"
           "                         chosen by --cache-policy, at startup and after each turn (default: none)\n"
           "  --state-max-age SECONDS  remove conversations not used for that long, likewise (default: none)\n"
           "  --cache-policy NAME    which idle conversation gives up its session first, or its file past\n"
           "                         --state-max-bytes, and which system prompt leaves the prefix cache:\n"
           "                         reuse (the lowest expected saving: its chance of coming back, learned\n"
           "                         per kind of conversation or prompt, times the tokens it holds) or lru\n"
           "                         (the least recently used) (default reuse)\n"
           "  --record-trace FILE    append a line for each request to FILE, for h2o-cache-replay: its time,\n"
           "                         conversation and system prompt (by digests, no text) and its token\n"
           "                         counts (default: none)\n"
           "  --max-memory BYTES     refuse to start when weights, sessions, prefix cache and the\n"
           "                         snapshot buffer could need more (default: no limit)\n"
           "  --session-wait SECONDS how long a request waits for a session when all are busy before\n"
           "                         it gets 503 (default 30)\n"
           "  --parallel N           requests computing at once, taking turns token by token (default 1;\n"
           "                         each uses -t threads)\n"
           "  --queue N              requests admitted at once, waiting or running; more get 429 (default 32)\n"
           "  --prefix-cache BYTES   processed system prompts kept for new conversations (default 16 MiB)\n"
           "  --max-body BYTES       largest request body; larger ones get 413 (default 8 MiB)\n"
           "  -n, --max-tokens N     reply length when a request gives no max_tokens (default 256)\n"
           "  --seed S               sampler seed of new sessions (default " +
           std::to_string(sp.seed) + "; a request's seed overrides it)\n" + h2o_tools::session_options_help(sp) +
           "  --no-rolling           positions do not roll: a conversation ends at the context length\n"
           "                         (default: they roll, so a conversation never has to end)\n"
           "  --version              print the library's version\n";
}

std::string base_name(const std::string &path) {
    std::string name = path.substr(path.find_last_of('/') + 1);
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
    return name;
}

// glibc keeps blocks freed by a thread in that thread's cache (tcache), which malloc_trim does not
// return; over many requests served by many threads those caches hold the high-water marks of
// the requests (measured: +3.8% of resident memory over 1000 turns of one conversation, against
// +0.5% without them). The cache is a start-up setting, so the server starts itself again once
// with it off (if that fails, it runs with the cache).
void restart_without_thread_caches(char **argv) {
    const char *tunables = std::getenv("GLIBC_TUNABLES");
    if (tunables && std::strstr(tunables, "glibc.malloc.tcache_count")) return;  // done, or the user's choice
    std::string value = tunables && *tunables ? std::string(tunables) + ":" : "";
    value += "glibc.malloc.tcache_count=0";
    setenv("GLIBC_TUNABLES", value.c_str(), 1);
    execv("/proc/self/exe", argv);
}

// Reads the command line (a usage error ends the program) into the options, the sessions'
// settings and the sampling defaults.
ServerOptions parse_options(int argc, char **argv, h2o_session_params *sp, h2o_generate_params *gen) {
    ServerOptions opt;
    h2o_session_params_init(sp, sizeof *sp);
    sp->kv_budget = 512;       // a conversation's cache: fixed, whatever its length
    sp->position_rolling = 1;  // and never at an end (--no-rolling)
    h2o_generate_params_init(gen, sizeof *gen);

    h2o_tools::CommandLine cl("h2o-server", usage(*sp));
    cl.text({"-m", "--model"}, &opt.model_path);
    cl.text("--host", &opt.host);
    cl.count("--port", 0, 65535, &opt.port);
    cl.option("--alias", [&opt](const std::string &name) { opt.aliases.push_back(name); });
    cl.text("--cors", &opt.cors);
    cl.text("--chat-format", &opt.chat_format);
    cl.count("--sessions", 1, 4096, &opt.sessions);
    cl.text("--state-dir", &opt.state_dir);
    cl.text("--record-trace", &opt.record_trace);
    cl.count("--state-max-bytes", 1, UINT64_MAX, &opt.state_max_bytes);
    cl.count("--state-max-age", 1, UINT64_MAX / 2, &opt.state_max_age);
    cl.text("--cache-policy", &opt.cache_policy_name);
    cl.count("--max-memory", 1, UINT64_MAX, &opt.max_memory);
    cl.count("--session-wait", 0, 3600, &opt.session_wait);
    cl.count("--parallel", 1, 256, &opt.parallel);
    cl.count("--queue", 1, 4096, &opt.queue);
    cl.count("--prefix-cache", 0, UINT64_MAX, &opt.prefix_cache);
    cl.count("--max-body", 1024, 1ull << 32, &opt.max_body);
    cl.count({"-n", "--max-tokens"}, 1, 4096, &opt.max_tokens_default);
    cl.count("--seed", 0, UINT64_MAX, &sp->seed);
    h2o_tools::add_session_options(cl, sp);
    cl.flag("--no-rolling", &opt.no_rolling);
    cl.parse(argc, argv);
    if (opt.no_rolling) {
        sp->position_rolling = 0;
        sp->kv_overflow = H2O_KV_OVERFLOW_ERROR;  // the old contract: the conversation ends at the context
    }
    h2o_tools::check_session_options(cl, *sp);
    opt.model_path = h2o_tools::resolve_model_path(opt.model_path);
    if (opt.model_path.empty()) cl.fail("no model given: pass -m MODEL or set H2O_MODEL");
    if (!opt.state_dir.empty() && opt.state_dir.back() == '/') opt.state_dir.pop_back();
    if (!h2o_server::parse_cache_policy(opt.cache_policy_name, &opt.cache_policy)) cl.fail("--cache-policy must be reuse or lru");
    if (opt.state_dir.empty() && (opt.state_max_bytes || opt.state_max_age))
        cl.fail("--state-max-bytes and --state-max-age bound the state directory: give --state-dir too");
    gen->max_tokens = opt.max_tokens_default;
    return opt;
}

}  // namespace

int main(int argc, char **argv) {
    restart_without_thread_caches(argv);
    h2o_session_params sp;
    h2o_generate_params gen;
    ServerOptions opt = parse_options(argc, argv, &sp, &gen);

    // One malloc arena: per-thread arenas would each keep the high-water mark of the requests
    // their thread served (a request's JSON follows the client's history).
    mallopt(M_ARENA_MAX, 1);
    // Signals are taken by one thread (below), so every other thread starts with them blocked.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client that left is seen as a failed write

    h2o_model_params mp;
    h2o_model_params_init(&mp, sizeof mp);
    mp.prefix_cache_bytes = opt.prefix_cache;
    mp.prefix_cache_policy = opt.cache_policy == h2o_server::CachePolicy::kLru ? H2O_CACHE_POLICY_LRU : H2O_CACHE_POLICY_REUSE;
    h2o_model *model = nullptr;
    if (h2o_model_load(opt.model_path.c_str(), &mp, &model) != H2O_OK) {
        std::fprintf(stderr, "h2o-server: cannot load model: %s\n", h2o_last_error());
        return 1;
    }
    // Freed last, after the store's sessions (declared below, so destroyed first).
    const std::unique_ptr<h2o_model, void (*)(h2o_model *)> model_owner(model, h2o_model_free);
    const std::vector<std::string> model_names = opt.aliases.empty() ? std::vector<std::string>{base_name(opt.model_path)} : opt.aliases;
    const std::string &model_id = model_names.front();

    h2o_server::TurnContext context;
    context.model = model;
    context.chat_format = opt.chat_format;
    context.defaults = gen;
    h2o_server::TurnContext::Evictions evictions;
    context.evictions = &evictions;
    // The chat format is checked now rather than at the first request.
    {
        std::string probe;
        std::vector<h2o_server::Message> one{{"user", "hi"}};
        if (auto error = h2o_server::format_conversation(context, one, 1, true, "", &probe)) {
            std::fprintf(stderr, "h2o-server: %s%s\n", error->message.c_str(),
                         opt.chat_format.empty() ? " (give one with --chat-format)" : "");
            return 1;
        }
    }
    h2o_server::MemoryPlan plan;
    std::string error;
    if (!h2o_server::plan_memory(model, sp, opt.sessions, opt.prefix_cache, &plan, &error)) {
        std::fprintf(stderr, "h2o-server: %s\n", error.c_str());
        return 1;
    }
    std::fprintf(stderr, "h2o-server: %s\n", h2o_server::describe(plan).c_str());
    if (opt.max_memory && plan.bound_bytes > opt.max_memory) {
        std::fprintf(stderr, "h2o-server: that is more than --max-memory %llu: lower --sessions or --kv-budget\n",
                     static_cast<unsigned long long>(opt.max_memory));
        return 1;
    }

    h2o_server::StoreSettings store_settings;
    store_settings.model = model;
    store_settings.session_params = sp;
    store_settings.max_sessions = opt.sessions;
    store_settings.state_dir = opt.state_dir;
    store_settings.session_wait = std::chrono::seconds(opt.session_wait);
    store_settings.state_max_bytes = opt.state_max_bytes;
    store_settings.state_max_age = std::chrono::seconds(opt.state_max_age);
    store_settings.cache_policy = opt.cache_policy;
    h2o_server::ConversationStore store(store_settings);
    if (!store.open_state_dir(&error)) {
        std::fprintf(stderr, "h2o-server: %s\n", error.c_str());
        return 1;
    }
    h2o_server::ComputeGate gate(opt.parallel);
    context.store = &store;
    context.gate = &gate;
    std::unique_ptr<h2o_server::TraceRecorder> trace;
    if (!opt.record_trace.empty()) {
        if (!h2o_server::TraceRecorder::open(opt.record_trace, &trace, &error)) {
            std::fprintf(stderr, "h2o-server: %s\n", error.c_str());
            return 1;
        }
        context.trace = trace.get();
    }

    httplib::Server server;
    const uint32_t http_threads = opt.queue + 4;  // every admitted request has a thread
    server.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
    h2o_server::Endpoints endpoints;
    endpoints.model = model;
    endpoints.model_id = model_id;
    endpoints.model_names = model_names;
    endpoints.context = &context;
    endpoints.store = &store;
    endpoints.plan = plan;
    endpoints.max_sessions = opt.sessions;
    endpoints.queue = opt.queue;
    endpoints.max_body = opt.max_body;
    endpoints.cors_origin = opt.cors;
    h2o_server::add_routes(server, endpoints);

    if (opt.port == 0) {
        const int port = server.bind_to_any_port(opt.host);
        if (port < 0) {
            std::fprintf(stderr, "h2o-server: cannot listen on %s\n", opt.host.c_str());
            return 1;
        }
        opt.port = static_cast<uint32_t>(port);
    } else if (!server.bind_to_port(opt.host, static_cast<int>(opt.port))) {
        std::fprintf(stderr, "h2o-server: cannot listen on %s:%u (in use?)\n", opt.host.c_str(), opt.port);
        return 1;
    }
    // SIGTERM or SIGINT: running generations stop at their next token, the server stops taking
    // requests, and the live conversations are saved.
    std::thread signal_thread([&] {
        int received = 0;
        sigwait(&signals, &received);
        endpoints.stopping = true;
        store.cancel_all();
        server.stop();
    });
    std::fprintf(stderr, "h2o-server: model %s, listening on http://%s:%u\n", model_id.c_str(), opt.host.c_str(), opt.port);
    server.listen_after_bind();
    if (!endpoints.stopping) {
        // listen failed on its own: wake the signal thread so that it can be joined.
        endpoints.stopping = true;
        pthread_kill(signal_thread.native_handle(), SIGTERM);
    }
    signal_thread.join();
    store.save_all();
    std::fprintf(stderr, "h2o-server: stopped; live conversations %s\n", opt.state_dir.empty() ? "dropped (no --state-dir)" : "saved");
    return 0;
}
