// h2o-synth: writes a random-weight Llama model as GGUF, for benchmarks and tests.
//
//   h2o-synth -o OUT.gguf [--type Q4_0|Q8_0|Q4_K|Q6_K|F16|F32] [--dim 768] [--layers 12] [--heads 12]
//             [--kv-heads 12] [--ff 2048] [--vocab 32000] [--ctx 2048] [--tied] [--seed 1]
//
// The defaults give the ~110M-parameter shape used by the benchmarks.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.h"
#include "synthetic_model.h"

namespace {

constexpr const char *kUsage =
    "usage: h2o-synth -o OUT.gguf [--type Q4_0|Q8_0|Q4_K|Q6_K|F16|F32] [--dim 768] [--layers 12] [--heads 12]\n"
    "                 [--kv-heads 12] [--ff 2048] [--vocab 32000] [--ctx 2048] [--tied] [--seed 1]\n";

// A positive count of at most 2^24 (no model dimension here is larger).
bool parse_count(const std::string &option, const std::string &text, int *out) {
    uint64_t v = 0;
    if (!h2o_tools::parse_uint(text.c_str(), &v) || v == 0 || v > (1u << 24)) {
        std::fprintf(stderr, "h2o-synth: %s needs a whole number from 1 to 16777216, not '%s'\n", option.c_str(), text.c_str());
        return false;
    }
    *out = static_cast<int>(v);
    return true;
}

}  // namespace

int main(int argc, char **argv) {
    h2o::SyntheticModelSpec spec;
    std::string out;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (arg == "--tied") {
            spec.tied_output = true;
            continue;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "h2o-synth: %s needs a value\n%s", arg.c_str(), kUsage);
            return 2;
        }
        const std::string v = argv[++i];
        bool ok = true;
        if (arg == "-o") out = v;
        else if (arg == "--dim") ok = parse_count(arg, v, &spec.n_embd);
        else if (arg == "--layers") ok = parse_count(arg, v, &spec.n_layer);
        else if (arg == "--heads") ok = parse_count(arg, v, &spec.n_head);
        else if (arg == "--kv-heads") ok = parse_count(arg, v, &spec.n_head_kv);
        else if (arg == "--ff") ok = parse_count(arg, v, &spec.n_ff);
        else if (arg == "--vocab") ok = parse_count(arg, v, &spec.n_vocab);
        else if (arg == "--ctx") ok = parse_count(arg, v, &spec.n_ctx);
        else if (arg == "--seed") {
            ok = h2o_tools::parse_uint(v.c_str(), &spec.seed);
            if (!ok) std::fprintf(stderr, "h2o-synth: --seed needs a whole number, not '%s'\n", v.c_str());
        } else if (arg == "--type") {
            if (v == "F32") spec.type = h2o::TensorType::F32;
            else if (v == "F16") spec.type = h2o::TensorType::F16;
            else if (v == "Q8_0") spec.type = h2o::TensorType::Q8_0;
            else if (v == "Q4_0") spec.type = h2o::TensorType::Q4_0;
            else if (v == "Q4_K") spec.type = h2o::TensorType::Q4_K;
            else if (v == "Q6_K") spec.type = h2o::TensorType::Q6_K;
            else {
                std::fprintf(stderr, "h2o-synth: unknown type '%s' (F32, F16, Q8_0, Q4_0, Q4_K, Q6_K)\n", v.c_str());
                return 2;
            }
        } else {
            std::fprintf(stderr, "h2o-synth: unknown option '%s'\n%s", arg.c_str(), kUsage);
            return 2;
        }
        if (!ok) return 2;
    }
    if (out.empty()) {
        std::fprintf(stderr, "h2o-synth: -o OUT.gguf is required\n%s", kUsage);
        return 2;
    }
    const h2o::Status st = h2o::write_synthetic_model(spec, out);
    if (!st.ok()) {
        std::fprintf(stderr, "h2o-synth: %s\n", st.message.c_str());
        return 1;
    }
    std::fprintf(stderr, "wrote %s\n", out.c_str());
    return 0;
}
