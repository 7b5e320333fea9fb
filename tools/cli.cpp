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

void usage() {
    std::fprintf(stderr,
                 "usage: h2o-cli -m MODEL -p PROMPT [options]\n"
                 "  -m, --model FILE       GGUF model (default: $H2O_MODEL)\n"
                 "  -p, --prompt TEXT      prompt (default: empty, generate from BOS)\n"
                 "  -n, --n-predict N      tokens to generate (default 128)\n"
                 "  --temp T               temperature, 0 = greedy (default 0.8)\n"
                 "  --top-k K              (default 40, 0 = off)\n"
                 "  --top-p P              (default 0.95, 1 = off)\n"
                 "  --min-p P              (default 0.05, 0 = off)\n"
                 "  --repeat-penalty R     (default 1.0 = off)\n"
                 "  --repeat-last-n N      (default 64)\n"
                 "  --seed S               sampler seed (default 0x5EED)\n"
                 "  -t, --threads N        compute threads (default: cores, at most 8)\n"
                 "  -c, --ctx N            KV cache size in tokens (default: model context)\n"
                 "  --kv-budget N          KV slots per layer and kv head (default: the context, no eviction)\n"
                 "  --kv-policy NAME       eviction policy: full, h2o, window, sink_window, scissorhands, tova,\n"
                 "                         roco, random, mean_h2o (default sink_window)\n"
                 "  --kv-recent N          protected recent window in tokens (default: half the budget)\n"
                 "  --rolling              position rolling: run past the model's context length\n"
                 "  --kv-type T            KV cache format: f32 (default), f16, q8, q4, k8v4\n"
                 "  --pin-prompt           pin the prompt's tokens so eviction never drops them\n"
                 "  --backend NAME         auto, cpu, vulkan or cuda (default auto)\n"
                 "  --device N             device index of that backend (default: the best)\n"
                 "  --tokenizer FILE       sentencepiece .model file instead of the embedded vocab\n"
                 "  --json                 print one JSON summary line instead of streaming\n");
}

struct Output {
    bool stream = true;
    std::string text;
};

int on_text(const char *text, size_t length, void *user_data) {
    auto *out = static_cast<Output *>(user_data);
    out->text.append(text, length);
    if (out->stream) {
        std::fwrite(text, 1, length, stdout);
        std::fflush(stdout);
    }
    return 0;
}

bool parse_number(const char *text, double *out) {
    char *end = nullptr;
    *out = std::strtod(text, &end);
    return end && *end == '\0' && end != text;
}

}  // namespace

int main(int argc, char **argv) {
    std::string model_path, prompt, tokenizer_path;
    bool json = false, pin_prompt = false;
    h2o_generate_params gen = h2o_generate_params_default();
    gen.max_tokens = 128;
    h2o_session_params sp = h2o_session_params_default();

    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&](double *out) {
            if (i + 1 >= argc || !parse_number(argv[i + 1], out)) {
                std::fprintf(stderr, "h2o-cli: %s needs a number\n", arg.c_str());
                std::exit(2);
            }
            ++i;
        };
        auto text = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "h2o-cli: %s needs a value\n", arg.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        double v = 0;
        if (arg == "-m" || arg == "--model") model_path = text();
        else if (arg == "-p" || arg == "--prompt") prompt = text();
        else if (arg == "--tokenizer") tokenizer_path = text();
        else if (arg == "-n" || arg == "--n-predict") { value(&v); gen.max_tokens = static_cast<uint32_t>(v); }
        else if (arg == "--temp") { value(&v); gen.temperature = static_cast<float>(v); }
        else if (arg == "--top-k") { value(&v); gen.top_k = static_cast<uint32_t>(v); }
        else if (arg == "--top-p") { value(&v); gen.top_p = static_cast<float>(v); }
        else if (arg == "--min-p") { value(&v); gen.min_p = static_cast<float>(v); }
        else if (arg == "--repeat-penalty") { value(&v); gen.repeat_penalty = static_cast<float>(v); }
        else if (arg == "--repeat-last-n") { value(&v); gen.repeat_last_n = static_cast<uint32_t>(v); }
        else if (arg == "--seed") { value(&v); sp.seed = static_cast<uint64_t>(v); }
        else if (arg == "-t" || arg == "--threads") { value(&v); sp.n_threads = static_cast<uint32_t>(v); }
        else if (arg == "-c" || arg == "--ctx") { value(&v); sp.n_ctx = static_cast<uint32_t>(v); }
        else if (arg == "--kv-budget") { value(&v); sp.kv_budget = static_cast<uint32_t>(v); }
        else if (arg == "--kv-recent") { value(&v); sp.kv_recent = static_cast<uint32_t>(v); }
        else if (arg == "--kv-policy") {
            const std::string name = text();
            if (!h2o_tools::parse_policy(name, &sp.kv_policy)) {
                std::fprintf(stderr, "h2o-cli: unknown policy '%s'\n", name.c_str());
                return 2;
            }
        }
        else if (arg == "--rolling") sp.position_rolling = 1;
        else if (arg == "--kv-type") {
            const std::string name = text();
            if (!h2o_tools::parse_kv_type(name, &sp.kv_type)) {
                std::fprintf(stderr, "h2o-cli: unknown KV type '%s' (f32, f16, q8, q4, k8v4)\n", name.c_str());
                return 2;
            }
        }
        else if (arg == "--device") { value(&v); sp.device_index = static_cast<int32_t>(v); }
        else if (arg == "--backend") {
            const std::string name = text();
            if (!h2o_tools::parse_backend(name, &sp.backend)) {
                std::fprintf(stderr, "h2o-cli: unknown backend '%s' (auto, cpu, vulkan, cuda)\n", name.c_str());
                return 2;
            }
        }
        else if (arg == "--pin-prompt") pin_prompt = true;
        else if (arg == "--json") json = true;
        else if (arg == "-h" || arg == "--help") { usage(); return 0; }
        else {
            std::fprintf(stderr, "h2o-cli: unknown option '%s'\n", arg.c_str());
            usage();
            return 2;
        }
    }
    model_path = h2o_tools::resolve_model_path(model_path);
    if (model_path.empty()) {
        std::fprintf(stderr, "h2o-cli: no model given: pass -m MODEL or set H2O_MODEL\n");
        return 2;
    }

    h2o_model_params mp = h2o_model_params_default();
    mp.tokenizer_path = tokenizer_path.empty() ? nullptr : tokenizer_path.c_str();
    h2o_model *model = nullptr;
    h2o_status st = h2o_model_load(model_path.c_str(), &mp, &model);
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-cli: cannot load model: %s (%s)\n", h2o_last_error(), h2o_status_string(st));
        return 1;
    }
    h2o_session *session = nullptr;
    st = h2o_session_create(model, &sp, &session);
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-cli: cannot create session: %s (%s)\n", h2o_last_error(), h2o_status_string(st));
        h2o_model_free(model);
        return 1;
    }

    h2o_backend_info backend;
    backend.struct_size = sizeof(backend);
    h2o_session_get_backend(session, &backend);

    Output out;
    out.stream = !json;
    if (out.stream) {
        std::fwrite(prompt.data(), 1, prompt.size(), stdout);
        std::fflush(stdout);
    }
    if (pin_prompt) {
        st = h2o_session_add_text(session, prompt.c_str(), H2O_TEXT_PIN);
        if (st == H2O_OK) st = h2o_generate(session, "", &gen, on_text, &out);
    } else {
        st = h2o_generate(session, prompt.c_str(), &gen, on_text, &out);
    }
    if (out.stream) std::fputc('\n', stdout);
    h2o_generate_stats stats;
    stats.struct_size = sizeof(stats);
    h2o_session_get_stats(session, &stats);
    const double prompt_tps = stats.prompt_seconds > 0 ? stats.n_prompt_tokens / stats.prompt_seconds : 0;
    const double gen_tps = stats.generate_seconds > 0 ? stats.n_generated_tokens / stats.generate_seconds : 0;
    const double rss_mib = h2o_tools::peak_rss_bytes() / 1048576.0;
    int rc = 0;
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-cli: generation failed: %s (%s)\n", h2o_session_last_error(session), h2o_status_string(st));
        rc = 1;
    }
    if (json) {
        std::printf("{\"status\":\"%s\",\"backend\":\"%s\",\"prompt_tokens\":%u,\"generated_tokens\":%u,\"prompt_tokens_per_s\":%.2f,"
                    "\"generation_tokens_per_s\":%.2f,\"peak_rss_mib\":%.2f,\"text\":\"%s\"}\n",
                    h2o_status_string(st), h2o_tools::json_escape(backend.name).c_str(), stats.n_prompt_tokens, stats.n_generated_tokens, prompt_tps, gen_tps, rss_mib,
                    h2o_tools::json_escape(out.text).c_str());
    } else {
        std::fprintf(stderr, "\n%s | prompt: %u tokens, %.1f tok/s | generation: %u tokens, %.1f tok/s | peak RSS %.1f MiB\n",
                     backend.name, stats.n_prompt_tokens, prompt_tps, stats.n_generated_tokens, gen_tps, rss_mib);
    }
    h2o_session_free(session);
    h2o_model_free(model);
    return rc;
}
