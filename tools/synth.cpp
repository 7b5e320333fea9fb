// h2o-synth: writes a random-weight Llama model as GGUF, for benchmarks and tests.
//
//   h2o-synth -o OUT.gguf [--type Q4_0|Q8_0|Q4_K|Q6_K|F16|F32] [--dim 768] [--layers 12] [--heads 12]
//             [--kv-heads 12] [--ff 2048] [--vocab 32000] [--ctx 2048] [--tied] [--seed 1]
//
// The defaults give the ~110M-parameter shape used by the benchmarks.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "options.h"
#include "synthetic_model.h"

namespace {

constexpr const char *kUsage =
    "usage: h2o-synth -o OUT.gguf [--type Q4_0|Q8_0|Q4_K|Q6_K|F16|F32] [--dim 768] [--layers 12] [--heads 12]\n"
    "                 [--kv-heads 12] [--ff 2048] [--vocab 32000] [--ctx 2048] [--tied] [--seed 1]\n"
    "  --version              print the library's version\n";

// The weight types a synthetic model's matrices may have.
const h2o::TensorType kTypes[] = {h2o::TensorType::F32, h2o::TensorType::F16, h2o::TensorType::Q8_0,
                                  h2o::TensorType::Q4_0, h2o::TensorType::Q4_K, h2o::TensorType::Q6_K};

std::string type_names() {
    std::string names;
    for (h2o::TensorType t : kTypes) names += (names.empty() ? "" : ", ") + std::string(h2o::type_name(t));
    return names;
}

}  // namespace

int main(int argc, char **argv) {
    h2o::SyntheticModelSpec spec;
    std::string out;
    h2o_tools::CommandLine cl("h2o-synth", kUsage);
    cl.text("-o", &out);
    // Model dimensions: positive counts of at most 2^24 (no model dimension here is larger).
    const uint64_t kMaxDimension = 1u << 24;
    cl.count("--dim", 1, kMaxDimension, &spec.n_embd);
    cl.count("--layers", 1, kMaxDimension, &spec.n_layer);
    cl.count("--heads", 1, kMaxDimension, &spec.n_head);
    cl.count("--kv-heads", 1, kMaxDimension, &spec.n_head_kv);
    cl.count("--ff", 1, kMaxDimension, &spec.n_ff);
    cl.count("--vocab", 1, kMaxDimension, &spec.n_vocab);
    cl.count("--ctx", 1, kMaxDimension, &spec.n_ctx);
    cl.count("--seed", 0, UINT64_MAX, &spec.seed);
    cl.flag("--tied", &spec.tied_output);
    cl.option("--type", [&](const std::string &name) {
        for (h2o::TensorType t : kTypes) {
            if (name == h2o::type_name(t)) {
                spec.type = t;
                return;
            }
        }
        cl.fail("unknown type '" + name + "' (known: " + type_names() + ")");
    });
    cl.parse(argc, argv);
    if (out.empty()) cl.fail("-o OUT.gguf is required");
    const h2o::Status st = h2o::write_synthetic_model(spec, out);
    if (!st.ok()) {
        std::fprintf(stderr, "h2o-synth: %s\n", st.message.c_str());
        return 1;
    }
    std::fprintf(stderr, "wrote %s\n", out.c_str());
    return 0;
}
