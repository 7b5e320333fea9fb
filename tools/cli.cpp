// h2o-cli: generate text from a prompt with a GGUF Llama model.
//
//   h2o-cli -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
//           [--repeat-penalty R] [--seed S] [-t THREADS] [-c CTX] [--kv-* ...] [--tokenizer FILE] [--json]
//
// Streams the prompt followed by the generated text to stdout and a summary to stderr. With
// --json nothing is streamed: one JSON object with the text and the figures goes to stdout.
// Every option is checked before the model is loaded: a usage error exits with status 2.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common.h"
#include "options.h"
#include "session_options.h"
#include "h2o/h2o.h"

namespace {

// Generation's limits as h2o_generate_params documents them (the library checks them again).
constexpr uint64_t kMaxRepeatLastN = 4096;

std::string usage(const h2o_generate_params &gen, const h2o_session_params &sp) {
    // The defaults printed are the library's own (read from the initialised parameters).
    char text[2048];
    std::snprintf(text, sizeof(text),
                  "usage: h2o-cli -m MODEL -p PROMPT [options]\n"
                  "  -m, --model FILE       GGUF model (default: $H2O_MODEL)\n"
                  "  -p, --prompt TEXT      prompt (default: empty, generate from BOS)\n"
                  "  -n, --n-predict N      tokens to generate, at least 1 (default %u)\n"
                  "  --temp T               temperature, >= 0; 0 = greedy (default %g)\n"
                  "  --top-k K              (default %u, 0 = off)\n"
                  "  --top-p P              in (0, 1] (default %g, 1 = off)\n"
                  "  --min-p P              in [0, 1] (default %g, 0 = off)\n"
                  "  --repeat-penalty R     > 0 (default %g, 1 = off)\n"
                  "  --repeat-last-n N      0 to %llu (default %u)\n"
                  "  --seed S               sampler seed (default %llu)\n"
                  "  -c, --ctx N            longest stream in tokens, 0 or at least 2 (default 0: the model's\n"
                  "                         context, at most 4096)\n",
                  gen.max_tokens, gen.temperature, gen.top_k, gen.top_p, gen.min_p, gen.repeat_penalty,
                  static_cast<unsigned long long>(kMaxRepeatLastN), gen.repeat_last_n, static_cast<unsigned long long>(sp.seed));
    return text + h2o_tools::session_options_help(sp) +
           "  --pin-prompt           pin the prompt's tokens so eviction never drops them\n"
           "  --backend NAME         " +
           h2o_tools::backend_names() + " (default " + h2o_backend_kind_name(sp.backend) +
           ";\n"
           "                         h2o-info lists the devices)\n"
           "  --device N             device index of that backend (default: the best)\n"
           "  --tokenizer FILE       sentencepiece .model file instead of the embedded vocab\n"
           "  --grammar FILE         constrain the reply to a GBNF grammar (its rule root)\n"
           "  --json-schema FILE     constrain the reply to JSON that the schema in FILE accepts\n"
           "  --json                 print one JSON summary line instead of streaming\n"
           "  --version              print the library's version\n";
}

}  // namespace

int main(int argc, char **argv) {
    std::string model_path, prompt, tokenizer_path, grammar_path, schema_path;
    bool json = false, pin_prompt = false;
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 128;
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);

    h2o_tools::CommandLine cl("h2o-cli", usage(gen, sp));
    cl.text({"-m", "--model"}, &model_path);
    cl.text({"-p", "--prompt"}, &prompt);
    cl.text("--tokenizer", &tokenizer_path);
    cl.text("--grammar", &grammar_path);
    cl.text("--json-schema", &schema_path);
    cl.count({"-n", "--n-predict"}, 1, UINT32_MAX, &gen.max_tokens);
    cl.number("--temp", h2o_tools::at_least(0), &gen.temperature);
    cl.count("--top-k", 0, UINT32_MAX, &gen.top_k);
    cl.number("--top-p", h2o_tools::Range{0, 1, true, false}, &gen.top_p);
    cl.number("--min-p", h2o_tools::closed(0, 1), &gen.min_p);
    cl.number("--repeat-penalty", h2o_tools::above(0), &gen.repeat_penalty);
    cl.count("--repeat-last-n", 0, kMaxRepeatLastN, &gen.repeat_last_n);
    cl.count("--seed", 0, UINT64_MAX, &sp.seed);
    cl.option({"-c", "--ctx"}, [&](const std::string &v) {
        sp.n_ctx = static_cast<uint32_t>(cl.to_count(v, 0, 1u << 22));
        if (sp.n_ctx == 1) cl.fail("--ctx must be 0 (the model's context) or at least 2, not 1");
    });
    h2o_tools::add_session_options(cl, &sp);
    cl.option("--backend", [&](const std::string &name) {
        if (!h2o_tools::parse_backend(name, &sp.backend))
            cl.fail("unknown backend '" + name + "' (known: " + h2o_tools::backend_names() + ")");
    });
    cl.count("--device", 0, INT32_MAX, &sp.device_index);
    cl.flag("--pin-prompt", &pin_prompt);
    cl.flag("--json", &json);
    cl.parse(argc, argv);
    h2o_tools::check_session_options(cl, sp);
    model_path = h2o_tools::resolve_model_path(model_path);
    if (model_path.empty()) cl.fail("no model given: pass -m MODEL or set H2O_MODEL");
    if (!grammar_path.empty() && !schema_path.empty()) cl.fail("--grammar and --json-schema exclude each other");
    // The grammar's text is read before the model loads, so a missing file is said at once.
    std::string constraint;
    if (!grammar_path.empty() || !schema_path.empty()) {
        const std::string &path = grammar_path.empty() ? schema_path : grammar_path;
        std::string error;
        if (!h2o_tools::read_file(path, &constraint, &error)) cl.fail(error);
        (grammar_path.empty() ? gen.json_schema : gen.grammar) = constraint.c_str();
        (grammar_path.empty() ? gen.json_schema_len : gen.grammar_len) = constraint.size();
    }

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
    h2o_kv_usage usage;
    usage.struct_size = sizeof usage;
    h2o_session_get_kv_usage(session, &usage);
    int rc = 0;
    if (st != H2O_OK) {
        std::fprintf(stderr, "h2o-cli: generation failed: %s (%s)\n", error.c_str(), h2o_status_string(st));
        rc = 1;
    }
    if (json) {
        std::printf(
            "{\"status\":\"%s\",\"backend\":\"%s\",\"prompt_tokens\":%u,\"generated_tokens\":%u,\"prompt_tokens_per_s\":%.2f,"
            "\"generation_tokens_per_s\":%.2f,\"peak_rss_mib\":%.2f,\"kv_capacity\":%u,\"evicted_tokens\":%llu,"
            "\"evicting_since\":%llu,\"text\":\"%s\"}\n",
            h2o_status_string(st), h2o_tools::json_escape(backend.name).c_str(), stats.n_prompt_tokens, stats.n_generated_tokens,
            prompt_tps, gen_tps, rss_mib, usage.capacity, static_cast<unsigned long long>(usage.n_evicted),
            static_cast<unsigned long long>(usage.evicting_since), h2o_tools::json_escape(text).c_str());
    } else {
        std::fprintf(stderr, "\n%s | prompt: %u tokens, %.1f tok/s | generation: %u tokens, %.1f tok/s | peak RSS %.1f MiB", backend.name,
                     stats.n_prompt_tokens, prompt_tps, stats.n_generated_tokens, gen_tps, rss_mib);
        // Said plainly when it happened: the model no longer sees the whole stream.
        if (usage.n_evicted > 0)
            std::fprintf(stderr, " | cache full after %llu tokens: %llu evicted, %u kept",
                         static_cast<unsigned long long>(usage.evicting_since), static_cast<unsigned long long>(usage.n_evicted),
                         usage.capacity);
        std::fputc('\n', stderr);
    }
    h2o_session_free(session);
    return rc;
}
