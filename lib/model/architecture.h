// The model architectures the graph runs, described as data: the tensors each one has beyond the
// common Llama set, and how its rotary dimensions pair up. Model reads a file through its
// architecture's description; what that implies reaches the graph and the backends as ModelShape
// and ModelWeights (a bias or norm that is there or not, RotarySpec), never as the name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rotary.h"

namespace h2o {

enum class TensorPresence : uint8_t {
    Absent,    // a file that has it is refused (the graph would not use it)
    Optional,  // used when the file has it
    Required,  // a file without it is refused
};

struct ArchitectureSpec {
    const char *name;  // general.architecture, and the prefix of its metadata keys
    RotaryPairing rope_pairing;
    TensorPresence qkv_bias;     // blk.N.attn_q.bias, attn_k.bias, attn_v.bias: added after the projections
    TensorPresence output_bias;  // blk.N.attn_output.bias
    TensorPresence qk_norm;      // blk.N.attn_q_norm.weight, attn_k_norm.weight [head_dim]: RMSNorm of
                                 // each head of q and k before the rotation
    TensorPresence rope_freqs;   // rope_freqs.weight [rope dims / 2]: per-pair frequency factors
    // blk.N.attn_qkv.weight [n_embd, q + k + v]: q, k and v's projections as one matrix, whose rows
    // are q's, then k's, then v's (Optional: separate attn_q/k/v when the file has those instead).
    TensorPresence fused_qkv;
    // blk.N.ffn_up.weight [n_embd, 2 * n_ff] holds the gate's rows, then the up projection's (no
    // ffn_gate.weight).
    bool fused_gate_up;
    // rope_factors_long.weight and rope_factors_short.weight [rope dims / 2] (LongRoPE, Phi-3's
    // 128k models): per-pair frequency factors for contexts beyond rope.scaling.original_context_length
    // and within it, with the magnitude rope.scaling.attn_factor (Model::rotary_for_context).
    TensorPresence long_rope;
    // Gemma's block (gemma_block): token embeddings times sqrt(n_embd), a GELU (tanh) feed-forward,
    // blk.N.post_attention_norm.weight and post_ffw_norm.weight [n_embd] normalising the attention's
    // and the feed-forward's outputs before the residual adds, the final logits soft-capped by
    // final_logit_softcapping when the file gives one, and layers that attend to a sliding window.
    bool gemma_block = false;
    // With gemma_block: attention.sliding_window's value when the file has none (0: then no layer
    // is local), every layer but each window_pattern-th (attention.sliding_window_pattern: 1-based
    // position in each group) local, their rotation based on rope.freq_base_swa or
    // local_rope_base (0: the global base), the attention scores soft-capped by
    // attn_logit_softcapping (Gemma 2), and the layer count of the model whose queries are scaled
    // by (n_embd / n_head)^-1/2 instead of head_dim^-1/2 (the 27B's: its files do not say).
    uint32_t default_window = 0;
    uint32_t window_pattern = 0;
    float local_rope_base = 0.0f;
    bool attention_softcap = false;
    uint32_t wide_query_scale_layers = 0;
};

// The description of `name`, or null when the graph does not run it.
const ArchitectureSpec *find_architecture(std::string_view name);

// The names the graph runs, quoted, for messages: "'llama', 'qwen2', 'qwen3', 'phi3'".
std::string supported_architectures();

}  // namespace h2o
