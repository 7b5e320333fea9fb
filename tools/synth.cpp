// h2o-synth: writes a random-weight model of any architecture the runtime runs (llama, qwen2,
// qwen3, phi3, gemma2, gemma3) as GGUF, for benchmarks and tests: a synthetic vocabulary of any size, or a real
// one read from a Hugging Face tokenizer.json or copied from a GGUF file.
//
//   h2o-synth -o OUT.gguf [--arch llama|qwen2|qwen3|phi3|gemma2|gemma3] [--type Q4_0|Q5_0|Q8_0|Q4_K|Q6_K|F16|F32] [--dim 768]
//             [--layers 12] [--heads 12] [--kv-heads 12] [--head-dim N] [--ff 2048]
//             [--vocab 32000|tokenizer.json|vocab.gguf] [--ctx 2048] [--rope-base 10000] [--rope-freqs] [--rope-dims N]
//             [--long-rope CONTEXT] [--window N] [--window-pattern N] [--attn-softcap C] [--final-softcap C]
//             [--tied] [--embd-scale 1] [--seed 1]
//
// The defaults give the ~110M-parameter shape used by the benchmarks.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gguf.h"
#include "hf_tokenizer.h"
#include "options.h"
#include "synthetic_model.h"

namespace {

constexpr const char *kUsage =
    "usage: h2o-synth -o OUT.gguf [--arch llama|qwen2|qwen3|phi3|gemma2|gemma3] [--type Q4_0|Q5_0|Q8_0|Q4_K|Q6_K|F16|F32] [--dim 768]\n"
    "                 [--layers 12] [--heads 12] [--kv-heads 12] [--head-dim N] [--ff 2048]\n"
    "                 [--vocab 32000|tokenizer.json|vocab.gguf] [--ctx 2048] [--rope-base 10000] [--rope-freqs] [--rope-dims N]\n"
    "                 [--long-rope CONTEXT] [--window N] [--window-pattern N] [--attn-softcap C] [--final-softcap C]\n"
    "                 [--tied] [--embd-scale 1] [--seed 1]\n"
    "  --arch NAME            the architecture: llama (default), qwen2 (q, k and v biases), qwen3 (per-head\n"
    "                         norms of q and k), phi3 (fused q/k/v and gate/up projections), gemma2, gemma3\n"
    "                         (Gemma's block; gemma3 with per-head norms of q and k)\n"
    "  --head-dim N           the head size (default: dim / heads), written as attention.key_length\n"
    "  --vocab N|PATH         a synthetic vocabulary of N tokens, a Hugging Face tokenizer.json (or its folder:\n"
    "                         tokenizer_config.json and chat_template.jinja are read beside it), or a GGUF file\n"
    "                         whose tokenizer.* keys are copied (a model, or a vocabulary-only file)\n"
    "  --rope-base B          the rotary frequency base (default 10000)\n"
    "  --rope-freqs           llama: Llama 3.1's per-pair rotary frequency factors (rope_freqs.weight)\n"
    "  --rope-dims N          rotate only the first N dimensions of each head (default: all)\n"
    "  --long-rope CONTEXT    phi3: LongRoPE's short and long factors and attention factor, the long ones\n"
    "                         for sessions beyond CONTEXT tokens (below --ctx)\n"
    "  --window N             gemma2, gemma3: the local layers' sliding window (gemma3 without it: no local layers)\n"
    "  --window-pattern N     gemma2, gemma3: every N-th layer is global (defaults: 2 and 6)\n"
    "  --attn-softcap C       gemma2: soft-cap the attention scores at C\n"
    "  --final-softcap C      gemma2, gemma3: soft-cap the logits at C\n"
    "  --tied                 no output matrix: the output projection reuses token_embd\n"
    "  --embd-scale S         token_embd's values in [-S, S) (default 1, which makes a tied model mostly repeat\n"
    "                         its input; trained tied models are nearer 1/sqrt(dim))\n"
    "  --version              print the library's version\n";

// The weight types a synthetic model's matrices may have.
const h2o::TensorType kTypes[] = {h2o::TensorType::F32,  h2o::TensorType::F16,  h2o::TensorType::Q8_0, h2o::TensorType::Q4_0,
                                  h2o::TensorType::Q5_0, h2o::TensorType::Q4_K, h2o::TensorType::Q6_K};

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
    std::string vocab_path;  // a tokenizer.json, its folder, or a GGUF file
    cl.option("--vocab", [&](const std::string &value) {
        if (!value.empty() && value.find_first_not_of("0123456789") == std::string::npos) {
            spec.n_vocab = static_cast<int>(cl.to_count(value, 1, kMaxDimension));
        } else {
            vocab_path = value;
        }
    });
    cl.option("--arch", [&](const std::string &name) {
        if (name != "llama" && name != "qwen2" && name != "qwen3" && name != "phi3" && name != "gemma2" && name != "gemma3")
            cl.fail("unknown architecture '" + name + "' (known: llama, qwen2, qwen3, phi3, gemma2, gemma3)");
        spec.architecture = name;
    });
    cl.count("--head-dim", 2, 1024, &spec.head_dim);
    cl.number("--rope-base", h2o_tools::above(0), &spec.rope_freq_base);
    cl.flag("--rope-freqs", &spec.rope_freqs);
    cl.count("--rope-dims", 2, 1024, &spec.rope_dims);
    cl.count("--long-rope", 2, kMaxDimension, &spec.long_rope_context);
    cl.number("--embd-scale", h2o_tools::above(0), &spec.embedding_scale);
    cl.count("--window", 1, kMaxDimension, &spec.sliding_window);
    cl.count("--window-pattern", 1, kMaxDimension, &spec.sliding_window_pattern);
    cl.number("--attn-softcap", h2o_tools::above(0), &spec.attention_softcap);
    cl.number("--final-softcap", h2o_tools::above(0), &spec.output_softcap);
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
    if (spec.rope_freqs && spec.architecture != "llama") cl.fail("--rope-freqs belongs to --arch llama");
    if (spec.long_rope_context != 0 && spec.architecture != "phi3") cl.fail("--long-rope belongs to --arch phi3");
    const bool gemma = spec.architecture == "gemma2" || spec.architecture == "gemma3";
    if (!gemma &&
        (spec.sliding_window != 0 || spec.sliding_window_pattern != 0 || spec.attention_softcap != 0.0f || spec.output_softcap != 0.0f))
        cl.fail("--window, --window-pattern and the soft-caps belong to --arch gemma2 and gemma3");
    if (!vocab_path.empty()) {
        int32_t n_tokens = 0;
        const h2o::Status read = h2o::read_vocabulary(vocab_path, &n_tokens, &spec.write_vocabulary);
        if (read.code == H2O_ERR_INVALID_ARGUMENT) {
            cl.fail("--vocab needs a number, a tokenizer.json (or its folder) or a GGUF file, not '" + vocab_path + "'");
        }
        if (!read.ok()) {
            std::fprintf(stderr, "h2o-synth: %s\n", read.message.c_str());
            return 1;
        }
        spec.n_vocab = n_tokens;
    }
    const h2o::Status st = h2o::write_synthetic_model(spec, out);
    if (!st.ok()) {
        std::fprintf(stderr, "h2o-synth: %s\n", st.message.c_str());
        return 1;
    }
    std::fprintf(stderr, "wrote %s\n", out.c_str());
    return 0;
}
