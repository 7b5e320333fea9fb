#include "synthetic_model.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "gguf.h"
#include "quant.h"

namespace h2o {

namespace {

// Deterministic uniform numbers in [-1, 1) (splitmix64), identical on every platform.
class Random {
public:
    explicit Random(uint64_t seed) : state_(seed) {}
    float next() {
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
    }

private:
    uint64_t state_;
};

std::vector<uint8_t> random_matrix(Random &rng, TensorType type, int64_t cols, int64_t rows, float scale) {
    std::vector<float> row(cols);
    std::vector<uint8_t> data(row_bytes(type, cols) * rows);
    for (int64_t r = 0; r < rows; ++r) {
        for (auto &v : row) v = rng.next() * scale;
        quantize_row(type, row.data(), data.data() + row_bytes(type, cols) * r, cols);
    }
    return data;
}

std::vector<uint8_t> ones(int64_t n) {
    std::vector<float> v(n, 1.0f);
    const auto *p = reinterpret_cast<const uint8_t *>(v.data());
    return std::vector<uint8_t>(p, p + n * sizeof(float));
}

}  // namespace

Status write_synthetic_model(const SyntheticModelSpec &spec, const std::string &path) {
    if (spec.n_head <= 0 || spec.n_head_kv <= 0 || spec.n_embd % spec.n_head != 0 || spec.n_head % spec.n_head_kv != 0) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "heads must divide the embedding size and kv heads must divide heads");
    }
    if (spec.n_vocab < 300) return make_error(H2O_ERR_INVALID_ARGUMENT, "the synthetic vocabulary needs at least 300 tokens");
    const int64_t block = traits(spec.type).block_elements;
    if (spec.n_embd % block != 0 || spec.n_ff % block != 0) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, std::string("embedding and feed-forward sizes must be multiples of ") +
                                                        std::to_string(block) + " for " + type_name(spec.type));
    }

    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("general.name", "synthetic");
    w.add_u32("llama.context_length", spec.n_ctx);
    w.add_u32("llama.embedding_length", spec.n_embd);
    w.add_u32("llama.feed_forward_length", spec.n_ff);
    w.add_u32("llama.block_count", spec.n_layer);
    w.add_u32("llama.attention.head_count", spec.n_head);
    w.add_u32("llama.attention.head_count_kv", spec.n_head_kv);
    w.add_u32("llama.rope.dimension_count", spec.n_embd / spec.n_head);
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);

    // Vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then made-up pieces.
    std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        pieces.emplace_back(name);
        types.push_back(6);
    }
    for (int i = static_cast<int>(pieces.size()); i < spec.n_vocab; ++i) {
        pieces.push_back("\xE2\x96\x81t" + std::to_string(i));  // "▁t<i>"
        types.push_back(1);
    }
    std::vector<float> scores(spec.n_vocab);
    for (int i = 0; i < spec.n_vocab; ++i) scores[i] = -static_cast<float>(i);
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", pieces);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 2);
    w.add_u32("tokenizer.ggml.unknown_token_id", 0);

    Random rng(spec.seed);
    const int64_t d = spec.n_embd, ff = spec.n_ff, kv = static_cast<int64_t>(spec.n_embd / spec.n_head) * spec.n_head_kv;
    // Scales of the usual initialisation (about 1/sqrt(fan_in)), so activations stay in range.
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(d));
    const float ff_scale = 1.0f / std::sqrt(static_cast<float>(ff));
    w.add_tensor("token_embd.weight", spec.type, {d, spec.n_vocab}, random_matrix(rng, spec.type, d, spec.n_vocab, 1.0f));
    w.add_tensor("output_norm.weight", TensorType::F32, {d}, ones(d));
    if (!spec.tied_output) {
        w.add_tensor("output.weight", spec.type, {d, spec.n_vocab}, random_matrix(rng, spec.type, d, spec.n_vocab, in_scale));
    }
    for (int l = 0; l < spec.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        w.add_tensor(p + "attn_norm.weight", TensorType::F32, {d}, ones(d));
        w.add_tensor(p + "attn_q.weight", spec.type, {d, d}, random_matrix(rng, spec.type, d, d, in_scale));
        w.add_tensor(p + "attn_k.weight", spec.type, {d, kv}, random_matrix(rng, spec.type, d, kv, in_scale));
        w.add_tensor(p + "attn_v.weight", spec.type, {d, kv}, random_matrix(rng, spec.type, d, kv, in_scale));
        w.add_tensor(p + "attn_output.weight", spec.type, {d, d}, random_matrix(rng, spec.type, d, d, in_scale));
        w.add_tensor(p + "ffn_norm.weight", TensorType::F32, {d}, ones(d));
        w.add_tensor(p + "ffn_gate.weight", spec.type, {d, ff}, random_matrix(rng, spec.type, d, ff, in_scale));
        w.add_tensor(p + "ffn_up.weight", spec.type, {d, ff}, random_matrix(rng, spec.type, d, ff, in_scale));
        w.add_tensor(p + "ffn_down.weight", spec.type, {ff, d}, random_matrix(rng, spec.type, ff, d, ff_scale));
    }
    return w.write(path);
}

}  // namespace h2o
