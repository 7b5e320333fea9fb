// The shape of a model as the graph and the kernels see it: its sizes, head layout, rotation
// and the variations of the Llama block it uses. The model makes it from the file's metadata
// (model.cpp) and owns it; the backends receive it with the operations that need it
// (backend.h). It lives in the backend part, not the model's, because the backends are built on
// that part alone (the layers CMakeLists.txt enforces).
#pragma once

#include <cstdint>
#include <vector>

#include "rotary_spec.h"

namespace h2o {

struct ModelShape {
    int n_embd = 0;
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;  // n_head * head_dim (the width of q) may differ from n_embd
    int n_ff = 0;
    int n_vocab = 0;
    RotarySpec rope;
    float rms_eps = 1e-5f;
    // Gemma's block (ArchitectureSpec::gemma_block); the defaults are the Llama block's.
    float embedding_scale = 1.0f;  // token embeddings are multiplied by this
    bool gelu = false;             // the feed-forward's gate goes through GELU (tanh) instead of SiLU
    bool post_norms = false;       // the attention's and feed-forward's outputs are normalised (LayerWeights)
    float attention_scale = 0.0f;  // the factor of q·k; 0: head_dim^-1/2
    // Soft-capping: a value x becomes cap * tanh(x / cap); 0: none. The attention's scores (after
    // the scale) and the final logits.
    float attention_softcap = 0.0f;
    float output_softcap = 0.0f;
    // Local layers attend to the sliding_window latest tokens only (a key of stream index j is
    // seen by the query of stream index i when i - sliding_window < j <= i), rotated by
    // local_rope; 0: no layer is local.
    int sliding_window = 0;
    std::vector<uint8_t> local_layers;  // n_layer entries, 1 for a local layer; empty: none
    RotarySpec local_rope;

    int64_t q_dim() const { return static_cast<int64_t>(n_head) * head_dim; }
    int64_t kv_dim() const { return static_cast<int64_t>(n_head_kv) * head_dim; }
    bool is_local(int layer) const { return !local_layers.empty() && local_layers[static_cast<size_t>(layer)] != 0; }
};

}  // namespace h2o
