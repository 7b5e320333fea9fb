// Random-weight models of any shape and of every architecture the runtime runs (architecture.h),
// written as GGUF, so benchmarks and tests never depend on downloads. The vocabulary is synthetic
// too (byte tokens plus made-up pieces) unless the caller writes a real one (write_vocabulary).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "status.h"
#include "tensor_types.h"

namespace h2o {

class GgufWriter;

struct SyntheticModelSpec {
    // "llama", "qwen2" (q, k and v biases), "qwen3" (per-head norms of q and k), "phi3" (fused
    // q/k/v and gate/up projections), "gemma2" or "gemma3" (Gemma's block: norms after the
    // attention and the feed-forward; gemma3 also per-head norms of q and k); each written with
    // its tensors and its rotary convention, as the converters write real ones.
    std::string architecture = "llama";
    int n_embd = 768;
    int n_layer = 12;
    int n_head = 12;
    int n_head_kv = 12;
    int head_dim = 0;  // 0: n_embd / n_head; otherwise written as attention.key_length
    int n_ff = 2048;
    int n_vocab = 32000;
    int n_ctx = 2048;
    float rope_freq_base = 10000.0f;
    // Llama only: rope_freqs.weight with Llama 3.1's per-pair frequency factors (scale 8 over an
    // original context of 8192).
    bool rope_freqs = false;
    int rope_dims = 0;  // rotated dimensions of each head (even); 0: all of them
    // phi3 only: LongRoPE's short and long per-pair factors and its attention factor, with this
    // original context (below n_ctx); 0: none.
    int long_rope_context = 0;
    // gemma2 and gemma3: attention.sliding_window (0: not written, which for gemma3 makes every
    // layer global and for gemma2 means 4096), attention.sliding_window_pattern (0: not written)
    // and the soft-capping values (0: not written).
    int sliding_window = 0;
    int sliding_window_pattern = 0;
    float attention_softcap = 0.0f;
    float output_softcap = 0.0f;
    TensorType type = TensorType::Q4_0;  // matrices; norms and biases stay F32
    bool tied_output = false;
    // The range of token_embd's values, [-scale, scale). 1 makes a tied model mostly repeat its
    // input (the embedding outweighs the layers); trained tied models are nearer 1/sqrt(n_embd).
    float embedding_scale = 1.0f;
    uint64_t seed = 1;
    // A real vocabulary of n_vocab tokens instead of the synthetic one: writes the tokenizer.*
    // metadata (h2o-synth --vocab tokenizer.json: hf_tokenizer.h's add_hf_vocabulary).
    std::function<void(GgufWriter &)> write_vocabulary;
};

Status write_synthetic_model(const SyntheticModelSpec &spec, const std::string &path);

}  // namespace h2o
