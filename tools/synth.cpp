// h2o-synth: writes a random-weight Llama model as GGUF, for benchmarks and tests.
//
//   h2o-synth -o OUT.gguf [--type Q4_0|Q8_0|Q4_K|Q6_K|F16|F32] [--dim 768] [--layers 12] [--heads 12]
//             [--kv-heads 12] [--ff 2048] [--vocab 32000] [--ctx 2048] [--tied] [--seed 1]
//
// The defaults give the ~110M-parameter shape used by the benchmarks.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "synthetic_model.h"

int main(int argc, char **argv) {
    h2o::SyntheticModelSpec spec;
    std::string out;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--tied") {
            spec.tied_output = true;
            continue;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "h2o-synth: %s needs a value\n", arg.c_str());
            return 2;
        }
        const std::string v = argv[++i];
        if (arg == "-o") out = v;
        else if (arg == "--dim") spec.n_embd = std::atoi(v.c_str());
        else if (arg == "--layers") spec.n_layer = std::atoi(v.c_str());
        else if (arg == "--heads") spec.n_head = std::atoi(v.c_str());
        else if (arg == "--kv-heads") spec.n_head_kv = std::atoi(v.c_str());
        else if (arg == "--ff") spec.n_ff = std::atoi(v.c_str());
        else if (arg == "--vocab") spec.n_vocab = std::atoi(v.c_str());
        else if (arg == "--ctx") spec.n_ctx = std::atoi(v.c_str());
        else if (arg == "--seed") spec.seed = std::strtoull(v.c_str(), nullptr, 10);
        else if (arg == "--type") {
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
            std::fprintf(stderr, "h2o-synth: unknown option '%s'\n", arg.c_str());
            return 2;
        }
    }
    if (out.empty()) {
        std::fprintf(stderr, "usage: h2o-synth -o OUT.gguf [--type Q4_0] [--dim 768] [--layers 12] [--heads 12] "
                             "[--kv-heads 12] [--ff 2048] [--vocab 32000] [--ctx 2048] [--tied] [--seed 1]\n");
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
