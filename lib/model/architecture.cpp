#include "architecture.h"

namespace h2o {

namespace {

using enum TensorPresence;

// Llama files carry the rotary pairs adjacent (the GGUF converter permutes the q and k rows);
// Qwen, Phi-3 and Gemma files keep the Hugging Face layout, whose pairs are the two halves.
constexpr ArchitectureSpec kArchitectures[] = {
    {"llama", RotaryPairing::Adjacent, /*qkv_bias=*/Optional, /*output_bias=*/Optional, /*qk_norm=*/Absent, /*rope_freqs=*/Optional,
     /*fused_qkv=*/Absent, /*fused_gate_up=*/false, /*long_rope=*/Absent},
    {"qwen2", RotaryPairing::Halves, /*qkv_bias=*/Required, /*output_bias=*/Absent, /*qk_norm=*/Absent, /*rope_freqs=*/Absent,
     /*fused_qkv=*/Absent, /*fused_gate_up=*/false, /*long_rope=*/Absent},
    {"qwen3", RotaryPairing::Halves, /*qkv_bias=*/Absent, /*output_bias=*/Absent, /*qk_norm=*/Required, /*rope_freqs=*/Absent,
     /*fused_qkv=*/Absent, /*fused_gate_up=*/false, /*long_rope=*/Absent},
    // Phi-3, Phi-3.5 and Phi-4-mini: fused projections, partial rotation (rope.dimension_count),
    // LongRoPE in the 128k models.
    {"phi3", RotaryPairing::Halves, /*qkv_bias=*/Absent, /*output_bias=*/Absent, /*qk_norm=*/Absent, /*rope_freqs=*/Absent,
     /*fused_qkv=*/Optional, /*fused_gate_up=*/true, /*long_rope=*/Optional},
    // Gemma 2: local layers of 4096 tokens alternating with global ones, soft-capped attention.
    {"gemma2", RotaryPairing::Halves, /*qkv_bias=*/Absent, /*output_bias=*/Absent, /*qk_norm=*/Absent, /*rope_freqs=*/Absent,
     /*fused_qkv=*/Absent, /*fused_gate_up=*/false, /*long_rope=*/Absent, /*gemma_block=*/true, /*default_window=*/4096,
     /*window_pattern=*/2, /*local_rope_base=*/0.0f, /*attention_softcap=*/true, /*wide_query_scale_layers=*/46},
    // Gemma 3: five local layers to a global one, per-head norms of q and k, local rotation of base 10000.
    {"gemma3", RotaryPairing::Halves, /*qkv_bias=*/Absent, /*output_bias=*/Absent, /*qk_norm=*/Required, /*rope_freqs=*/Absent,
     /*fused_qkv=*/Absent, /*fused_gate_up=*/false, /*long_rope=*/Absent, /*gemma_block=*/true, /*default_window=*/0,
     /*window_pattern=*/6, /*local_rope_base=*/10000.0f, /*attention_softcap=*/false, /*wide_query_scale_layers=*/62},
};

}  // namespace

const ArchitectureSpec *find_architecture(std::string_view name) {
    for (const ArchitectureSpec &a : kArchitectures) {
        if (name == a.name) return &a;
    }
    return nullptr;
}

std::string supported_architectures() {
    std::string names;
    for (const ArchitectureSpec &a : kArchitectures) names += (names.empty() ? "'" : ", '") + std::string(a.name) + "'";
    return names;
}

}  // namespace h2o
