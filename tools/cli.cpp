// h2o-cli: generate text from a prompt with a GGUF Llama model.
//
//   h2o-cli -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
//           [--repeat-penalty R] [--seed S] [-t THREADS] [-c CTX] [--tokenizer FILE] [--json]
//
// Streams the prompt followed by the generated text to stdout and a summary to stderr. With
// --json nothing is streamed: one JSON object with the text and the figures goes to stdout.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common.h"
#include "h2o/h2o.h"

namespace {

void usage(const h2o_generate_params &gen, const h2o_session_params &sp) {
    // The defaults printed are the library's own (read from the initialised parameters).
    std::fprintf(stderr,
                 "usage: h2o-cli -m MODEL -p PROMPT [options]\n"
                 "  -m, --model FILE       GGUF model (default: $H2O_MODEL)\n"
                 "  -p, --prompt TEXT      prompt (default: empty, generate from BOS)\n"
                 "  -n, --n-predict N      tokens to generate, at least 1 (default %u)\n"
                 "  --temp T               temperature, 0 = greedy (default %g)\n"
                 "  --top-k K              (default %u, 0 = off)\n"
                 "  --top-p P              (default %g, 1 = off)\n"
                 "  --min-p P              (default %g, 0 = off)\n"
                 "  --repeat-penalty R     (default %g = off)\n"
                 "  --repeat-last-n N      (default %u)\n"
                 "  --seed S               sampler seed (default %llu)\n"
                 "  -t, --threads N        compute threads (default: cores, at most 8)\n"
                 "  -c, --ctx N            longest stream in tokens (default: the model's context, at most 4096)\n"
                 "  --kv-budget N          KV slots per layer and kv head (default: the context, no eviction)\n"
                 "  --kv-policy NAME       eviction policy: %s (default %s)\n"
                 "  --kv-recent N          protected recent window in tokens (default: the policy's share)\n"
                 "  --kv-prompt-proxy N    one-shot prompt eviction: a long prompt's victims by the attention\n"
                 "                         of the last N queries read (default 0: by the policy)\n"
                 "  --kv-head-share S      share of each layer's slots that moves between its kv heads by\n"
                 "                         their attention, in [0, 0.9] (default 0: fixed budgets)\n"
                 "  --kv-share-across-layers  move those slots between the kv heads of every layer\n"
                 "  --rolling              position rolling: run past the model's context length\n"
                 "  --kv-type T            KV cache format: %s (default %s)\n"
                 "  --pin-prompt           pin the prompt's tokens so eviction never drops them\n"
                 "  --backend NAME         %s (default %s)\n"
                 "  --device N             device index of that backend (default: the best)\n"
                 "  --tokenizer FILE       sentencepiece .model file instead of the embedded vocab\n"
                 "  --json                 print one JSON summary line instead of streaming\n",
                 gen.max_tokens, gen.temperature, gen.top_k, gen.top_p, gen.min_p, gen.repeat_penalty, gen.repeat_last_n,
                 static_cast<unsigned long long>(sp.seed), h2o_tools::kv_policy_names().c_str(), h2o_tools::policy_name(sp.kv_policy),
                 h2o_tools::kv_type_names().c_str(), h2o_tools::kv_type_name(sp.kv_type), h2o_tools::backend_names().c_str(),
                 h2o_backend_kind_name(sp.backend));
}

[[noreturn]] void usage_error(const std::string &message) {
    std::fprintf(stderr, "h2o-cli: %s (see --help)\n", message.c_str());
    std::exit(2);
}

}  // namespace

int main(int argc, char **argv) {
    std::string model_path, prompt, tokenizer_path;
    bool json = false, pin_prompt = false;
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 128;
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);

    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto text = [&]() -> std::string {
            if (i + 1 >= argc) usage_error(arg + " needs a value");
            return argv[++i];
        };
        // Whole numbers in [0, max]: a sign, a fraction or trailing text is refused.
        auto count = [&](uint64_t max) -> uint64_t {
            const std::string t = text();
            uint64_t v = 0;
            if (!h2o_tools::parse_uint(t.c_str(), &v) || v > max) {
                usage_error(arg + " needs a whole number from 0 to " + std::to_string(max) + ", not '" + t + "'");
            }
            return v;
        };
        auto real = [&]() -> float {
            const std::string t = text();
            double v = 0;
            if (!h2o_tools::parse_double(t.c_str(), &v)) usage_error(arg + " needs a number, not '" + t + "'");
            return static_cast<float>(v);
        };
        if (arg == "-m" || arg == "--model") model_path = text();
        else if (arg == "-p" || arg == "--prompt") prompt = text();
        else if (arg == "--tokenizer") tokenizer_path = text();
        else if (arg == "-n" || arg == "--n-predict") gen.max_tokens = static_cast<uint32_t>(count(UINT32_MAX));
        else if (arg == "--temp") gen.temperature = real();
        else if (arg == "--top-k") gen.top_k = static_cast<uint32_t>(count(UINT32_MAX));
        else if (arg == "--top-p") gen.top_p = real();
        else if (arg == "--min-p") gen.min_p = real();
        else if (arg == "--repeat-penalty") gen.repeat_penalty = real();
        else if (arg == "--repeat-last-n") gen.repeat_last_n = static_cast<uint32_t>(count(UINT32_MAX));
        else if (arg == "--seed") sp.seed = count(UINT64_MAX);
        else if (arg == "-t" || arg == "--threads") sp.n_threads = static_cast<uint32_t>(count(UINT32_MAX));
        else if (arg == "-c" || arg == "--ctx") sp.n_ctx = static_cast<uint32_t>(count(UINT32_MAX));
        else if (arg == "--kv-budget") sp.kv_budget = static_cast<uint32_t>(count(UINT32_MAX));
        else if (arg == "--kv-recent") sp.kv_recent = static_cast<uint32_t>(count(UINT32_MAX));
        else if (arg == "--kv-policy") {
            const std::string name = text();
            if (!h2o_tools::parse_policy(name, &sp.kv_policy)) usage_error("unknown policy '" + name + "' (known: " + h2o_tools::kv_policy_names() + ")");
        }
        else if (arg == "--kv-prompt-proxy") sp.kv_prompt_proxy = static_cast<uint32_t>(count(UINT32_MAX));
        else if (arg == "--kv-head-share") sp.kv_head_share = static_cast<float>(real());  // the library checks its range
        else if (arg == "--kv-share-across-layers") sp.kv_share_across_layers = 1;
        else if (arg == "--rolling") sp.position_rolling = 1;
        else if (arg == "--kv-type") {
            const std::string name = text();
            if (!h2o_tools::parse_kv_type(name, &sp.kv_type)) usage_error("unknown KV type '" + name + "' (known: " + h2o_tools::kv_type_names() + ")");
        }
        else if (arg == "--device") sp.device_index = static_cast<int32_t>(count(INT32_MAX));
        else if (arg == "--backend") {
            const std::string name = text();
            if (!h2o_tools::parse_backend(name, &sp.backend)) usage_error("unknown backend '" + name + "' (known: " + h2o_tools::backend_names() + ")");
        }
        else if (arg == "--pin-prompt") pin_prompt = true;
        else if (arg == "--json") json = true;
        else if (arg == "-h" || arg == "--help") { usage(gen, sp); return 0; }
        else usage_error("unknown option '" + arg + "'");
    }
    model_path = h2o_tools::resolve_model_path(model_path);
    if (model_path.empty()) usage_error("no model given: pass -m MODEL or set H2O_MODEL");

    h2o_model_params mp;
    h2o_model_params_init(&mp, sizeof mp);
    mp.tokenizer_path = tokenizer_path.empty() ? nullptr : tokenizer_path.c_str();
    h2o_model *model = nullptr;
    h2o_status st = h2o_model_load(model_path.c_str(), &mp, &model);
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-cli: cannot load model: %s (%s)\n", h2o_last_error(), h2o_status_string(st));
        return 1;
    }
    h2o_session *session = nullptr;
    st = h2o_session_create(model, &sp, &session);
    h2o_model_free(model);  // the session keeps the model alive
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-cli: cannot create session: %s (%s)\n", h2o_last_error(), h2o_status_string(st));
        return 1;
    }

    h2o_backend_info backend;
    backend.struct_size = sizeof(backend);
    h2o_session_get_backend(session, &backend);

    // The prompt is processed first and echoed only once it is accepted; then the text is
    // pulled piece by piece. Only --json keeps the whole text (streaming keeps nothing).
    std::string text, error;
    if (pin_prompt) {
        st = h2o_session_add_text(session, prompt.data(), prompt.size(), H2O_TEXT_PIN);
        if (st == H2O_OK) st = h2o_generate_begin(session, "", 0, &gen);
    } else {
        st = h2o_generate_begin(session, prompt.data(), prompt.size(), &gen);
    }
    if (st == H2O_OK && !json) {
        std::fwrite(prompt.data(), 1, prompt.size(), stdout);
        std::fflush(stdout);
    }
    for (uint32_t reason = H2O_STOP_NONE; st == H2O_OK && reason == H2O_STOP_NONE;) {
        const char *piece = nullptr;
        size_t length = 0;
        st = h2o_generate_next(session, &piece, &length, &reason);
        if (st != H2O_OK) break;
        if (json) {
            text.append(piece, length);
        } else {
            std::fwrite(piece, 1, length, stdout);
            std::fflush(stdout);
        }
    }
    if (st != H2O_OK) error = h2o_session_last_error(session);  // before another call replaces it
    if (!json) std::fputc('\n', stdout);
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    h2o_session_get_stats(session, &stats);
    const double prompt_tps = stats.prompt_seconds > 0 ? stats.n_prompt_tokens / stats.prompt_seconds : 0;
    const double gen_tps = stats.generate_seconds > 0 ? stats.n_generated_tokens / stats.generate_seconds : 0;
    const double rss_mib = h2o_tools::peak_rss_bytes() / 1048576.0;
    int rc = 0;
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-cli: generation failed: %s (%s)\n", error.c_str(), h2o_status_string(st));
        rc = 1;
    }
    if (json) {
        std::printf("{\"status\":\"%s\",\"backend\":\"%s\",\"prompt_tokens\":%u,\"generated_tokens\":%u,\"prompt_tokens_per_s\":%.2f,"
                    "\"generation_tokens_per_s\":%.2f,\"peak_rss_mib\":%.2f,\"text\":\"%s\"}\n",
                    h2o_status_string(st), h2o_tools::json_escape(backend.name).c_str(), stats.n_prompt_tokens, stats.n_generated_tokens, prompt_tps, gen_tps, rss_mib,
                    h2o_tools::json_escape(text).c_str());
    } else {
        std::fprintf(stderr, "\n%s | prompt: %u tokens, %.1f tok/s | generation: %u tokens, %.1f tok/s | peak RSS %.1f MiB\n",
                     backend.name, stats.n_prompt_tokens, prompt_tps, stats.n_generated_tokens, gen_tps, rss_mib);
    }
    h2o_session_free(session);
    return rc;
}
