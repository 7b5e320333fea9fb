#include "synthetic_model.h"

#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>
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

std::vector<uint8_t> floats_bytes(const std::vector<float> &v) {
    const auto *p = reinterpret_cast<const uint8_t *>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof(float));
}

std::vector<uint8_t> ones(int64_t n) { return floats_bytes(std::vector<float>(static_cast<size_t>(n), 1.0f)); }

// n values in [center - spread, center + spread).
std::vector<uint8_t> random_vector(Random &rng, int64_t n, float center, float spread) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float &x : v) x = center + spread * rng.next();
    return floats_bytes(v);
}

// Llama 3.1's rotary frequency factors (its published rope_scaling: factor 8, low and high
// frequency factors 1 and 4, original context 8192), one per pair of `dims` rotated dimensions:
// long wavelengths are slowed by the factor, short ones kept, the band between blended.
std::vector<float> llama3_frequency_factors(int dims, float base) {
    constexpr double kFactor = 8.0, kLowFreqFactor = 1.0, kHighFreqFactor = 4.0, kOriginalContext = 8192.0;
    const double low_freq_wavelength = kOriginalContext / kLowFreqFactor, high_freq_wavelength = kOriginalContext / kHighFreqFactor;
    std::vector<float> factors(static_cast<size_t>(dims / 2));
    for (int i = 0; i < dims / 2; ++i) {
        const double freq = std::pow(static_cast<double>(base), -2.0 * i / dims);
        const double wavelength = 2.0 * std::numbers::pi / freq;
        double factor = 1.0;
        if (wavelength > low_freq_wavelength) {
            factor = kFactor;
        } else if (wavelength >= high_freq_wavelength) {
            const double smooth = (kOriginalContext / wavelength - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
            factor = 1.0 / ((1.0 - smooth) / kFactor + smooth);
        }
        factors[static_cast<size_t>(i)] = static_cast<float>(factor);
    }
    return factors;
}

// The synthetic vocabulary (sentencepiece style): <unk>, <s>, </s>, the 256 byte tokens, then
// made-up pieces.
void write_synthetic_vocabulary(int n_vocab, GgufWriter &w) {
    std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        pieces.emplace_back(name);
        types.push_back(6);
    }
    for (int i = static_cast<int>(pieces.size()); i < n_vocab; ++i) {
        pieces.push_back("\xE2\x96\x81t" + std::to_string(i));  // "▁t<i>"
        types.push_back(1);
    }
    std::vector<float> scores(n_vocab);
    for (int i = 0; i < n_vocab; ++i) scores[i] = -static_cast<float>(i);
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", pieces);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 2);
    w.add_u32("tokenizer.ggml.unknown_token_id", 0);
}

bool is_gemma(const std::string &arch) { return arch == "gemma2" || arch == "gemma3"; }

Status check_spec(const SyntheticModelSpec &spec) {
    auto invalid = [](const std::string &what) { return make_error(H2O_ERR_INVALID_ARGUMENT, what); };
    const std::string &arch = spec.architecture;
    if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "phi3" && !is_gemma(arch)) {
        return invalid("unknown architecture '" + arch + "' (llama, qwen2, qwen3, phi3, gemma2, gemma3)");
    }
    if (!is_gemma(arch) &&
        (spec.sliding_window != 0 || spec.sliding_window_pattern != 0 || spec.attention_softcap != 0.0f || spec.output_softcap != 0.0f)) {
        return invalid("sliding windows and soft-capping belong to the gemma2 and gemma3 architectures");
    }
    if (spec.sliding_window < 0 || spec.sliding_window_pattern < 0 || !(spec.attention_softcap >= 0.0f) || !(spec.output_softcap >= 0.0f))
        return invalid("the sliding window, its pattern and the soft-capping values must not be negative");
    if (spec.n_head <= 0 || spec.n_head_kv <= 0 || spec.n_head % spec.n_head_kv != 0) return invalid("kv heads must divide heads");
    if (spec.head_dim < 0 || (spec.head_dim == 0 && spec.n_embd % spec.n_head != 0)) {
        return invalid("heads must divide the embedding size unless the head size is given");
    }
    const int head_dim = spec.head_dim != 0 ? spec.head_dim : spec.n_embd / spec.n_head;
    if (head_dim % 2 != 0) return invalid("the head size must be even (it is rotated in pairs)");
    if (spec.rope_freqs && arch != "llama") return invalid("rotary frequency factors belong to the llama architecture");
    if (spec.rope_dims < 0 || spec.rope_dims % 2 != 0 || spec.rope_dims > head_dim) {
        return invalid("the rotated dimensions must be even and at most the head size");
    }
    if (spec.long_rope_context != 0 && (arch != "phi3" || spec.long_rope_context < 2 || spec.long_rope_context >= spec.n_ctx)) {
        return invalid("LongRoPE belongs to the phi3 architecture, with an original context of 2 to n_ctx - 1");
    }
    if (!(spec.rope_freq_base > 0.0f)) return invalid("the rotary frequency base must be positive");
    if (!(spec.embedding_scale > 0.0f) || !std::isfinite(spec.embedding_scale)) return invalid("the embedding scale must be positive");
    if (!spec.write_vocabulary && spec.n_vocab < 300) return invalid("the synthetic vocabulary needs at least 300 tokens");
    if (spec.n_vocab <= 0) return invalid("the vocabulary is empty");
    const int64_t block = traits(spec.type).block_elements;
    if (spec.n_embd % block != 0 || spec.n_ff % block != 0 || (static_cast<int64_t>(spec.n_head) * head_dim) % block != 0) {
        return invalid(std::string("embedding, attention (heads x head size) and feed-forward sizes must be multiples of ") +
                       std::to_string(block) + " for " + type_name(spec.type));
    }
    return Status::Ok();
}

}  // namespace

Status write_synthetic_model(const SyntheticModelSpec &spec, const std::string &path) {
    H2O_TRY(check_spec(spec));
    const std::string &arch = spec.architecture;
    const int head_dim = spec.head_dim != 0 ? spec.head_dim : spec.n_embd / spec.n_head;
    auto key = [&arch](const char *option) { return arch + "." + option; };

    GgufWriter w;
    w.add_string("general.architecture", arch);
    w.add_string("general.name", "synthetic");
    w.add_u32(key("context_length"), spec.n_ctx);
    w.add_u32(key("embedding_length"), spec.n_embd);
    w.add_u32(key("feed_forward_length"), spec.n_ff);
    w.add_u32(key("block_count"), spec.n_layer);
    w.add_u32(key("attention.head_count"), spec.n_head);
    w.add_u32(key("attention.head_count_kv"), spec.n_head_kv);
    if (spec.head_dim != 0) {
        w.add_u32(key("attention.key_length"), head_dim);
        w.add_u32(key("attention.value_length"), head_dim);
    }
    const int rope_dims = spec.rope_dims != 0 ? spec.rope_dims : head_dim;
    w.add_u32(key("rope.dimension_count"), rope_dims);
    if (spec.long_rope_context != 0) {
        // The attention factor Phi-3's converter writes for its LongRoPE models.
        const double scale = static_cast<double>(spec.n_ctx) / spec.long_rope_context;
        w.add_u32(key("rope.scaling.original_context_length"), spec.long_rope_context);
        w.add_f32(key("rope.scaling.attn_factor"),
                  static_cast<float>(std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(spec.long_rope_context)))));
    }
    w.add_f32(key("rope.freq_base"), spec.rope_freq_base);
    w.add_f32(key("attention.layer_norm_rms_epsilon"), arch == "llama" ? 1e-5f : 1e-6f);
    if (spec.sliding_window != 0) w.add_u32(key("attention.sliding_window"), spec.sliding_window);
    if (spec.sliding_window_pattern != 0) w.add_u32(key("attention.sliding_window_pattern"), spec.sliding_window_pattern);
    if (spec.attention_softcap != 0.0f) w.add_f32(key("attn_logit_softcapping"), spec.attention_softcap);
    if (spec.output_softcap != 0.0f) w.add_f32(key("final_logit_softcapping"), spec.output_softcap);

    if (spec.write_vocabulary) {
        spec.write_vocabulary(w);
    } else {
        write_synthetic_vocabulary(spec.n_vocab, w);
        // Gemma's sentencepiece vocabulary adds no space before the text.
        if (is_gemma(arch)) w.add_bool("tokenizer.ggml.add_space_prefix", false);
    }

    Random rng(spec.seed);
    const int64_t d = spec.n_embd, ff = spec.n_ff;
    const int64_t qd = static_cast<int64_t>(spec.n_head) * head_dim, kv = static_cast<int64_t>(head_dim) * spec.n_head_kv;
    // Scales of the usual initialisation (about 1/sqrt(fan_in)), so activations stay in range.
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(d));
    const float out_scale = 1.0f / std::sqrt(static_cast<float>(qd));
    const float ff_scale = 1.0f / std::sqrt(static_cast<float>(ff));
    w.add_tensor("token_embd.weight", spec.type, {d, spec.n_vocab}, random_matrix(rng, spec.type, d, spec.n_vocab, spec.embedding_scale));
    w.add_tensor("output_norm.weight", TensorType::F32, {d}, ones(d));
    if (!spec.tied_output) {
        w.add_tensor("output.weight", spec.type, {d, spec.n_vocab}, random_matrix(rng, spec.type, d, spec.n_vocab, in_scale));
    }
    if (spec.rope_freqs) {
        w.add_tensor("rope_freqs.weight", TensorType::F32, {head_dim / 2},
                     floats_bytes(llama3_frequency_factors(head_dim, spec.rope_freq_base)));
    }
    if (spec.long_rope_context != 0) {
        // Made-up factors of LongRoPE's kind: near 1 within the original context, growing with
        // the pair's wavelength beyond it.
        std::vector<float> short_factors(static_cast<size_t>(rope_dims / 2)), long_factors(short_factors.size());
        for (size_t i = 0; i < short_factors.size(); ++i) {
            const double x = static_cast<double>(i) / static_cast<double>(short_factors.size());
            short_factors[i] = static_cast<float>(1.0 + 0.1 * x);
            long_factors[i] = static_cast<float>(1.0 + 15.0 * x * x);
        }
        w.add_tensor("rope_factors_long.weight", TensorType::F32, {rope_dims / 2}, floats_bytes(long_factors));
        w.add_tensor("rope_factors_short.weight", TensorType::F32, {rope_dims / 2}, floats_bytes(short_factors));
    }
    // Fused projections (phi3) hold the parts' rows one after the other: the same values, in the
    // same order of drawing, as the separate matrices.
    const bool fused = arch == "phi3";
    auto joined = [](std::vector<uint8_t> a, const std::vector<uint8_t> &b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
    };
    for (int l = 0; l < spec.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        w.add_tensor(p + "attn_norm.weight", TensorType::F32, {d}, ones(d));
        std::vector<uint8_t> q = random_matrix(rng, spec.type, d, qd, in_scale);
        std::vector<uint8_t> k = random_matrix(rng, spec.type, d, kv, in_scale);
        std::vector<uint8_t> v = random_matrix(rng, spec.type, d, kv, in_scale);
        if (fused) {
            w.add_tensor(p + "attn_qkv.weight", spec.type, {d, qd + 2 * kv}, joined(joined(std::move(q), k), v));
        } else {
            w.add_tensor(p + "attn_q.weight", spec.type, {d, qd}, std::move(q));
            w.add_tensor(p + "attn_k.weight", spec.type, {d, kv}, std::move(k));
            w.add_tensor(p + "attn_v.weight", spec.type, {d, kv}, std::move(v));
        }
        w.add_tensor(p + "attn_output.weight", spec.type, {qd, d}, random_matrix(rng, spec.type, qd, d, out_scale));
        w.add_tensor(p + "ffn_norm.weight", TensorType::F32, {d}, ones(d));
        std::vector<uint8_t> gate = random_matrix(rng, spec.type, d, ff, in_scale);
        std::vector<uint8_t> up = random_matrix(rng, spec.type, d, ff, in_scale);
        if (fused) {
            w.add_tensor(p + "ffn_up.weight", spec.type, {d, 2 * ff}, joined(std::move(gate), up));
        } else {
            w.add_tensor(p + "ffn_gate.weight", spec.type, {d, ff}, std::move(gate));
            w.add_tensor(p + "ffn_up.weight", spec.type, {d, ff}, std::move(up));
        }
        w.add_tensor(p + "ffn_down.weight", spec.type, {ff, d}, random_matrix(rng, spec.type, ff, d, ff_scale));
        if (arch == "qwen2") {
            // Biases of the size the projections' outputs have, so they matter.
            w.add_tensor(p + "attn_q.bias", TensorType::F32, {qd}, random_vector(rng, qd, 0.0f, 0.5f));
            w.add_tensor(p + "attn_k.bias", TensorType::F32, {kv}, random_vector(rng, kv, 0.0f, 0.5f));
            w.add_tensor(p + "attn_v.bias", TensorType::F32, {kv}, random_vector(rng, kv, 0.0f, 0.5f));
        }
        if (is_gemma(arch)) {
            // The norms of the attention's and the feed-forward's outputs, away from 1.
            w.add_tensor(p + "post_attention_norm.weight", TensorType::F32, {d}, random_vector(rng, d, 1.0f, 0.5f));
            w.add_tensor(p + "post_ffw_norm.weight", TensorType::F32, {d}, random_vector(rng, d, 1.0f, 0.5f));
        }
        if (arch == "qwen3" || arch == "gemma3") {
            // Norm weights away from 1, so a weight applied to the wrong element shows.
            w.add_tensor(p + "attn_q_norm.weight", TensorType::F32, {head_dim}, random_vector(rng, head_dim, 1.0f, 0.5f));
            w.add_tensor(p + "attn_k_norm.weight", TensorType::F32, {head_dim}, random_vector(rng, head_dim, 1.0f, 0.5f));
        }
    }
    return w.write(path);
}

}  // namespace h2o
