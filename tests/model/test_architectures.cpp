// The architectures beyond the original Llama graph (lib/model/architecture.h), on synthetic models made
// here: Llama 3 style (rotary frequency factors, tied embeddings, a 128k vocabulary), Qwen 2 (q, k
// and v biases, rotary pairs of halves), Qwen 3 (per-head norms of q and k, heads wider than the
// embedding) and Phi-3 (fused projections, partial rotation, LongRoPE). The CPU backend against a direct double-precision evaluation of each
// architecture's definition; every cache feature on each; the files each refuses.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "doctest/doctest.h"
#include "gguf.h"
#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "kv_cache.h"
#include "model.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace {

using namespace h2o;

const char *const kArchitectures[] = {"llama", "qwen2", "qwen3", "phi3"};

// A small model of `arch` with what sets it apart: llama with Llama 3.1 frequency factors and tied
// embeddings; qwen2 with its biases and an output matrix of its own; qwen3 with 32-wide heads
// (q: 4 x 32 = 128 wide over a 64-wide embedding) and tied embeddings; phi3 with fused
// projections, half of each head rotated and LongRoPE's long factors in sessions beyond 256 tokens
// of context (the sessions here have 512).
SyntheticModelSpec small_spec(const std::string &arch, TensorType type = TensorType::F32) {
    SyntheticModelSpec s;
    s.architecture = arch;
    s.n_embd = 64;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 96;
    s.n_vocab = 320;
    s.n_ctx = 1024;
    s.type = type;
    s.seed = 11;
    if (arch == "llama") {
        s.rope_freqs = true;
        s.tied_output = true;
        s.rope_freq_base = 500000.0f;
    } else if (arch == "qwen2") {
        s.rope_freq_base = 1000000.0f;
    } else if (arch == "phi3") {
        s.rope_dims = 8;
        s.long_rope_context = 256;
    } else {
        s.head_dim = 32;
        s.tied_output = true;
        s.rope_freq_base = 1000000.0f;
    }
    return s;
}

std::string write_model(const SyntheticModelSpec &spec, const std::string &name) {
    const std::string path = h2o_test::temp_path(name);
    const Status st = write_synthetic_model(spec, path);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return path;
}

std::string small_model(const std::string &arch) { return write_model(small_spec(arch), "arch-" + arch + ".gguf"); }

// ---- a direct evaluation of each architecture's definition -------------------------------------

// The forward pass written from the architectures' definitions, in double precision, reading the
// GGUF file itself (F32 tensors): no code of the runtime but the GGUF reader.
class Reference {
public:
    // n_ctx: the context of the session it stands for (which chooses LongRoPE's factors).
    explicit Reference(const std::string &path, int n_ctx = 512) {
        REQUIRE(GgufFile::open(path, &file_).ok());
        std::string_view arch;
        REQUIRE(file_->get_string("general.architecture", &arch).ok());
        arch_ = std::string(arch);
        d_ = u32("embedding_length");
        layers_ = u32("block_count");
        heads_ = u32("attention.head_count");
        kv_heads_ = u32("attention.head_count_kv");
        ff_ = u32("feed_forward_length");
        head_dim_ = file_->find(arch_ + ".attention.key_length") ? u32("attention.key_length") : d_ / heads_;
        float base = 0, eps = 0;
        REQUIRE(file_->get_f32(arch_ + ".rope.freq_base", &base).ok());
        REQUIRE(file_->get_f32(arch_ + ".attention.layer_norm_rms_epsilon", &eps).ok());
        base_ = base;
        eps_ = eps;
        vocab_ = static_cast<int>(file_->find_tensor("token_embd.weight")->ne[1]);
        rope_dims_ = u32("rope.dimension_count");
        float magnitude = 1.0f;
        if (file_->find(arch_ + ".rope.scaling.attn_factor")) REQUIRE(file_->get_f32(arch_ + ".rope.scaling.attn_factor", &magnitude).ok());
        magnitude_ = magnitude;
        // LongRoPE: the long factors in a context beyond the original one, as llama.cpp chooses.
        factors_ = tensor("rope_freqs.weight");
        if (tensor("rope_factors_long.weight")) {
            factors_ = n_ctx > u32("rope.scaling.original_context_length") ? tensor("rope_factors_long.weight")
                                                                           : tensor("rope_factors_short.weight");
        }
    }

    // The logits after the last of `tokens`, from position 0, with every token attended.
    std::vector<double> logits(const std::vector<int32_t> &tokens) const {
        const int qd = heads_ * head_dim_, kvd = kv_heads_ * head_dim_, group = heads_ / kv_heads_;
        std::vector<std::vector<std::vector<double>>> keys(layers_), values(layers_);
        std::vector<double> x;
        for (size_t p = 0; p < tokens.size(); ++p) {
            x = row("token_embd.weight", tokens[p], d_);
            for (int l = 0; l < layers_; ++l) {
                const std::string b = "blk." + std::to_string(l) + ".";
                const std::vector<double> xn = rms_norm(x, tensor(b + "attn_norm.weight"));
                // Fused q/k/v (phi3): one matrix whose rows are q's, then k's, then v's.
                const bool fused = tensor(b + "attn_qkv.weight") != nullptr;
                std::vector<double> q = fused ? matvec(b + "attn_qkv.weight", xn, qd) : matvec(b + "attn_q.weight", xn, qd),
                                    k = fused ? matvec(b + "attn_qkv.weight", xn, kvd, qd) : matvec(b + "attn_k.weight", xn, kvd),
                                    v = fused ? matvec(b + "attn_qkv.weight", xn, kvd, qd + kvd) : matvec(b + "attn_v.weight", xn, kvd);
                add(&q, b + "attn_q.bias");
                add(&k, b + "attn_k.bias");
                add(&v, b + "attn_v.bias");
                if (tensor(b + "attn_q_norm.weight")) {
                    per_head_norm(&q, tensor(b + "attn_q_norm.weight"));
                    per_head_norm(&k, tensor(b + "attn_k_norm.weight"));
                }
                rotate(&q, static_cast<int>(p));
                rotate(&k, static_cast<int>(p));
                keys[l].push_back(k);
                values[l].push_back(v);
                std::vector<double> out(qd, 0.0);
                for (int h = 0; h < heads_; ++h) {
                    const int kv = h / group;
                    std::vector<double> score(p + 1);
                    double top = -1e300;
                    for (size_t j = 0; j <= p; ++j) {
                        double dot = 0;
                        for (int i = 0; i < head_dim_; ++i) dot += q[h * head_dim_ + i] * keys[l][j][kv * head_dim_ + i];
                        score[j] = dot / std::sqrt(static_cast<double>(head_dim_));
                        top = std::max(top, score[j]);
                    }
                    double sum = 0;
                    for (double &s : score) sum += (s = std::exp(s - top));
                    for (size_t j = 0; j <= p; ++j) {
                        for (int i = 0; i < head_dim_; ++i) out[h * head_dim_ + i] += score[j] / sum * values[l][j][kv * head_dim_ + i];
                    }
                }
                std::vector<double> proj = matvec(b + "attn_output.weight", out, d_);
                add(&proj, b + "attn_output.bias");
                for (int i = 0; i < d_; ++i) x[i] += proj[i];
                const std::vector<double> fn = rms_norm(x, tensor(b + "ffn_norm.weight"));
                // Fused gate and up (phi3): ffn_up's rows are the gate's, then up's.
                const bool fused_ffn = !tensor(b + "ffn_gate.weight");
                const std::vector<double> g = fused_ffn ? matvec(b + "ffn_up.weight", fn, ff_) : matvec(b + "ffn_gate.weight", fn, ff_),
                                          u = fused_ffn ? matvec(b + "ffn_up.weight", fn, ff_, ff_) : matvec(b + "ffn_up.weight", fn, ff_);
                std::vector<double> h(ff_);
                for (int i = 0; i < ff_; ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
                const std::vector<double> down = matvec(b + "ffn_down.weight", h, d_);
                for (int i = 0; i < d_; ++i) x[i] += down[i];
            }
        }
        const std::vector<double> xn = rms_norm(x, tensor("output_norm.weight"));
        return matvec(tensor("output.weight") ? "output.weight" : "token_embd.weight", xn, vocab_);
    }

private:
    int u32(const char *option) const {
        uint32_t v = 0;
        REQUIRE(file_->get_u32(arch_ + "." + option, &v).ok());
        return static_cast<int>(v);
    }
    const float *tensor(const std::string &name) const {
        const GgufTensor *t = file_->find_tensor(name);
        if (t) REQUIRE(t->type == TensorType::F32);
        return t ? reinterpret_cast<const float *>(t->data) : nullptr;
    }
    std::vector<double> row(const std::string &name, int r, int cols) const {
        const float *t = tensor(name);
        return std::vector<double>(t + static_cast<size_t>(r) * cols, t + static_cast<size_t>(r + 1) * cols);
    }
    // Rows [first_row, first_row + rows) of the matrix times `in`.
    std::vector<double> matvec(const std::string &name, const std::vector<double> &in, int rows, int first_row = 0) const {
        const float *w = tensor(name) + static_cast<size_t>(first_row) * in.size();
        std::vector<double> out(rows, 0.0);
        for (int r = 0; r < rows; ++r) {
            for (size_t c = 0; c < in.size(); ++c) out[r] += w[static_cast<size_t>(r) * in.size() + c] * in[c];
        }
        return out;
    }
    void add(std::vector<double> *x, const std::string &bias) const {
        if (const float *b = tensor(bias)) {
            for (size_t i = 0; i < x->size(); ++i) (*x)[i] += b[i];
        }
    }
    std::vector<double> rms_norm(const std::vector<double> &x, const float *w) const {
        double ss = 0;
        for (double v : x) ss += v * v;
        const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps_);
        std::vector<double> out(x.size());
        for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * w[i];
        return out;
    }
    void per_head_norm(std::vector<double> *x, const float *w) const {
        for (size_t h = 0; h * head_dim_ < x->size(); ++h) {
            const std::vector<double> head(x->begin() + static_cast<std::ptrdiff_t>(h * head_dim_),
                                           x->begin() + static_cast<std::ptrdiff_t>((h + 1) * head_dim_));
            const std::vector<double> normed = rms_norm(head, w);
            std::copy(normed.begin(), normed.end(), x->begin() + static_cast<std::ptrdiff_t>(h * head_dim_));
        }
    }
    // The first rope_dims of each head turn (the rest stay): Llama's GGUF layout pairs neighbours,
    // Qwen's and Phi-3's (Hugging Face's rotate_half) the halves of those dimensions. Pair i turns
    // by pos * base^(-2i/rope_dims), divided by its frequency factor where the file has them, and
    // is scaled by LongRoPE's attention factor.
    void rotate(std::vector<double> *x, int pos) const {
        const int half = rope_dims_ / 2;
        for (size_t h = 0; h * head_dim_ < x->size(); ++h) {
            double *head = x->data() + h * head_dim_;
            for (int i = 0; i < half; ++i) {
                double theta = pos * std::pow(base_, -2.0 * i / rope_dims_);
                if (factors_) theta /= factors_[i];
                double &a = arch_ == "llama" ? head[2 * i] : head[i];
                double &b = arch_ == "llama" ? head[2 * i + 1] : head[i + half];
                const double a0 = a, b0 = b;
                a = magnitude_ * (a0 * std::cos(theta) - b0 * std::sin(theta));
                b = magnitude_ * (a0 * std::sin(theta) + b0 * std::cos(theta));
            }
        }
    }

    std::unique_ptr<GgufFile> file_;
    std::string arch_;
    int d_ = 0, layers_ = 0, heads_ = 0, kv_heads_ = 0, ff_ = 0, head_dim_ = 0, vocab_ = 0, rope_dims_ = 0;
    double base_ = 0, eps_ = 0, magnitude_ = 1;
    const float *factors_ = nullptr;  // per pair, or none
};

// ---- sessions through the public API -------------------------------------------------------------

h2o_session_params cpu_session(uint32_t policy, int rolling, uint32_t budget = 24) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_threads = 2;
    sp.backend = H2O_BACKEND_CPU;
    sp.kv_budget = budget;
    sp.n_ctx = 512;
    sp.n_batch = 16;
    sp.kv_policy = policy;
    sp.position_rolling = rolling;
    sp.kv_type = H2O_KV_TYPE_F16;
    sp.seed = 99;
    return sp;
}

std::string generate(h2o_session *session, const std::string &prompt, uint32_t n, float temperature = 0.0f) {
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = n;
    gen.temperature = temperature;
    gen.stop_at_eos = 0;
    std::string text;
    const h2o_status st = h2o_generate(session, prompt.data(), prompt.size(), &gen, h2o_test::append_text, &text);
    REQUIRE_MESSAGE(st == H2O_OK, h2o_last_error());
    return text;
}

std::vector<uint8_t> save(h2o_session *session) {
    size_t bound = 0, size = 0;
    REQUIRE(h2o_session_state_size(session, &bound) == H2O_OK);
    std::vector<uint8_t> bytes(bound);
    REQUIRE(h2o_session_save_to_buffer(session, bytes.data(), bytes.size(), &size) == H2O_OK);
    bytes.resize(size);
    return bytes;
}

// A pinned sentence, a retention span, then a generation long enough to evict (budget 24).
std::string pinned_span_and_generation(h2o_session *session) {
    const std::string pinned = "Lily.", span = " Max ran.";
    REQUIRE_MESSAGE(h2o_session_add_text(session, pinned.data(), pinned.size(), H2O_TEXT_PIN) == H2O_OK,
                    std::string(h2o_session_last_error(session)));
    REQUIRE_MESSAGE(h2o_session_add_span_text(session, 1, 0.1f, span.data(), span.size(), 0) == H2O_OK,
                    std::string(h2o_session_last_error(session)));
    return generate(session, " Once upon a time", 48);
}

// The model's logits after `tokens` (a full F32 cache) through the public API.
std::vector<float> session_logits(const std::string &path, const std::vector<int32_t> &tokens) {
    h2o_session_params sp = cpu_session(H2O_KV_FULL, 0, 0);
    sp.kv_type = H2O_KV_TYPE_F32;
    sp.n_batch = 8;  // the prompt in batches, then the last token alone
    h2o_test::ApiSession s;
    REQUIRE_MESSAGE(s.open(path, sp), h2o_last_error());
    REQUIRE(h2o_session_decode(s.session, tokens.data(), tokens.size() - 1) == H2O_OK);
    REQUIRE(h2o_session_decode(s.session, &tokens.back(), 1) == H2O_OK);
    h2o_model_info info;
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(s.model, &info) == H2O_OK);
    std::vector<float> logits(info.n_vocab);
    REQUIRE(h2o_session_get_logits(s.session, logits.data(), logits.size()) == H2O_OK);
    return logits;
}

std::vector<int32_t> some_tokens(int n, int vocab) {
    std::vector<int32_t> tokens = {1};
    for (int i = 1; i < n; ++i) tokens.push_back(3 + (i * 37 + i * i * 11) % (vocab - 3));
    return tokens;
}

TEST_CASE("architectures: each model loads with the shape and rotary description its metadata and tensors give") {
    for (const char *arch : kArchitectures) {
        CAPTURE(arch);
        std::unique_ptr<Model> model;
        const Status st = Model::load(small_model(arch), "", &model);
        REQUIRE_MESSAGE(st.ok(), st.message);
        const ModelShape &s = model->shape();
        CHECK(std::string(model->architecture().name) == arch);
        CHECK(s.n_embd == 64);
        CHECK(s.head_dim == (std::string(arch) == "qwen3" ? 32 : 16));
        CHECK(s.q_dim() == 4 * s.head_dim);
        const bool phi3 = std::string(arch) == "phi3";
        CHECK(s.rope.dims == (phi3 ? s.head_dim / 2 : s.head_dim));
        CHECK(s.rope.pairing == (std::string(arch) == "llama" ? RotaryPairing::Adjacent : RotaryPairing::Halves));
        // llama: Llama 3.1's factors; phi3: LongRoPE's short ones, its long ones beyond 256 tokens.
        const bool factors = std::string(arch) == "llama" || phi3;
        CHECK(s.rope.freq_factors.size() == (factors ? static_cast<size_t>(s.rope.pairs()) : 0u));
        CHECK(model->rotary_for_context(256) == s.rope);
        CHECK((model->rotary_for_context(257) == s.rope) == !phi3);
        CHECK(s.rope.magnitude == (phi3 ? doctest::Approx(std::sqrt(1.0 + std::log(1024.0 / 256) / std::log(256.0))) : 1.0));
        const bool tied = model->weights().output.data == model->weights().token_embd.data;
        CHECK(tied == (std::string(arch) == "llama" || std::string(arch) == "qwen3"));
        const LayerWeights &l = model->weights().layers[1];
        CHECK(l.bq.present() == (std::string(arch) == "qwen2"));
        CHECK(l.q_norm.present() == (std::string(arch) == "qwen3"));
        if (phi3) {
            // The fused projections' parts: consecutive rows of one tensor each.
            CHECK(l.wq.name == "blk.1.attn_qkv.weight");
            CHECK(l.wv.name == "blk.1.attn_qkv.weight");
            CHECK(static_cast<const uint8_t *>(l.wk.data) == static_cast<const uint8_t *>(l.wq.data) + l.wq.rows * 64 * sizeof(float));
            CHECK(static_cast<const uint8_t *>(l.wv.data) == static_cast<const uint8_t *>(l.wk.data) + l.wk.rows * 64 * sizeof(float));
            CHECK(l.w_gate.name == "blk.1.ffn_up.weight");
            CHECK(static_cast<const uint8_t *>(l.w_up.data) ==
                  static_cast<const uint8_t *>(l.w_gate.data) + l.w_gate.rows * 64 * sizeof(float));
        }
    }
}

TEST_CASE("architectures: CPU logits equal a direct double-precision evaluation of each architecture's definition") {
    for (const char *arch : kArchitectures) {
        CAPTURE(arch);
        const std::string path = small_model(arch);
        const std::vector<int32_t> tokens = some_tokens(21, 320);
        const std::vector<float> got = session_logits(path, tokens);
        const std::vector<double> want = Reference(path).logits(tokens);
        double scale = 0, worst = 0;
        for (double v : want) scale = std::max(scale, std::fabs(v));
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
        CHECK(scale > 0.1);
        CHECK(worst <= 1e-4 * scale);
    }
}

TEST_CASE("architectures: the CPU rope turns each pairing's pairs by their frequencies, factors and linear scaling included") {
    auto cpu = make_cpu_backend(1, 4);
    ModelShape shape;
    shape.n_head = 2;
    shape.n_head_kv = 1;
    shape.head_dim = 16;
    shape.rope.freq_base = 500000.0f;
    const std::vector<float> factors = {1.0f, 1.0f, 1.5f, 2.5f, 4.0f, 6.0f, 8.0f, 8.0f};
    for (RotaryPairing pairing : {RotaryPairing::Adjacent, RotaryPairing::Halves}) {
        for (int dims : {16, 12}) {
            for (bool with_factors : {false, true}) {
                shape.rope.dims = dims;
                shape.rope.pairing = pairing;
                shape.rope.freq_factors =
                    with_factors ? std::vector<float>(factors.begin(), factors.begin() + dims / 2) : std::vector<float>{};
                shape.rope.freq_scale = with_factors ? 0.25f : 1.0f;
                for (int32_t position : {0, 3, 4095, 131071, 1000000}) {
                    CAPTURE(static_cast<int>(pairing));
                    CAPTURE(dims);
                    CAPTURE(with_factors);
                    CAPTURE(position);
                    std::vector<float> q_in(32), k_in(16);
                    for (size_t i = 0; i < q_in.size(); ++i) q_in[i] = std::sin(0.7f * static_cast<float>(i) + 0.3f);
                    for (size_t i = 0; i < k_in.size(); ++i) k_in[i] = std::cos(0.4f * static_cast<float>(i));
                    Tensor q, k, pos;
                    REQUIRE(cpu->alloc(TensorType::F32, 32, 1, &q).ok());
                    REQUIRE(cpu->alloc(TensorType::F32, 16, 1, &k).ok());
                    REQUIRE(cpu->alloc(TensorType::I32, 1, 1, &pos).ok());
                    REQUIRE(cpu->upload(q, q_in.data(), q_in.size() * sizeof(float)).ok());
                    REQUIRE(cpu->upload(k, k_in.data(), k_in.size() * sizeof(float)).ok());
                    REQUIRE(cpu->upload(pos, &position, sizeof position).ok());
                    REQUIRE(cpu->rope(q, k, pos, 1, shape, false).ok());
                    std::vector<float> q_out(32);
                    REQUIRE(cpu->download(q, q_out.data(), q_out.size() * sizeof(float)).ok());
                    // The definition, head by head: pair i is (2i, 2i + 1) or (i, i + dims / 2).
                    std::vector<double> want(q_in.begin(), q_in.end());
                    for (int h = 0; h < 2; ++h) {
                        for (int i = 0; i < dims / 2; ++i) {
                            double theta = position * std::pow(500000.0, -2.0 * i / dims) * shape.rope.freq_scale;
                            if (with_factors) theta /= factors[static_cast<size_t>(i)];
                            const int a = h * 16 + (pairing == RotaryPairing::Adjacent ? 2 * i : i);
                            const int b = a + (pairing == RotaryPairing::Adjacent ? 1 : dims / 2);
                            want[a] = q_in[a] * std::cos(theta) - q_in[b] * std::sin(theta);
                            want[b] = q_in[a] * std::sin(theta) + q_in[b] * std::cos(theta);
                        }
                    }
                    // |x| <= 1: two rounded products and their sum, within a few float ulps of 1.
                    for (size_t i = 0; i < want.size(); ++i) CHECK(std::fabs(q_out[i] - want[i]) <= 1e-6);
                    if (dims == 12) CHECK(q_out[13] == q_in[13]);  // beyond the rotated dimensions
                }
            }
        }
    }
}

TEST_CASE(
    "architectures: rolling rotates kept keys back as a fresh rotation at their new rank, for pairs of halves with frequency factors") {
    for (KvType type : {KvType::F32, KvType::F16}) {
        CAPTURE(static_cast<int>(type));
        KvConfig c;
        c.n_layer = 1;
        c.n_head_kv = 1;
        c.head_dim = 8;
        c.n_slots = 4;
        c.type = type;
        c.policy.policy = KvPolicy::Window;
        c.rolling = true;
        c.rope.dims = 8;
        c.rope.freq_base = 10000.0f;
        c.rope.pairing = RotaryPairing::Halves;
        c.rope.freq_factors = {1.0f, 2.0f, 4.0f, 8.0f};
        KvCache cache;
        REQUIRE(cache.init(c).ok());
        const float key[8] = {1.0f, 0.5f, -0.25f, 2.0f, -1.5f, 0.75f, 0.125f, -0.5f};
        // The key turned to `rank`, pairs (i, i + 4), pair i at rank / 10000^(i/4) / factor_i.
        auto rotated = [&](int rank, float *out) {
            for (int i = 0; i < 4; ++i) {
                const double theta = rank * std::pow(10000.0, -2.0 * i / 8) / c.rope.freq_factors[static_cast<size_t>(i)];
                out[i] = static_cast<float>(key[i] * std::cos(theta) - key[i + 4] * std::sin(theta));
                out[i + 4] = static_cast<float>(key[i] * std::sin(theta) + key[i + 4] * std::cos(theta));
            }
        };
        for (int s = 0; s < 4; ++s) {
            const int slot = cache.claim_slot(0, 0, s, s, 0);
            float row[8];
            rotated(s, row);
            kv_store_row(kv_key_format(type), row, 8, cache.cell(0, 0).keys + slot * cache.key_row_bytes());
        }
        CHECK(cache.make_room(0, 0, 1, 4) == 1);  // the window evicts stream index 0
        for (int s = 1; s < 4; ++s) {
            float got[8], expected[8];
            kv_load_row(kv_key_format(type), cache.cell(0, 0).keys + s * cache.key_row_bytes(), 8, got);
            rotated(s - 1, expected);
            CHECK(cache.cell(0, 0).position[s] == s - 1);
            // |key| <= 2: F32 to rounding; F16 to about its ulp at 2 (each store rounds once).
            for (int d = 0; d < 8; ++d) CHECK(std::fabs(got[d] - expected[d]) <= (type == KvType::F32 ? 1e-5 : 3e-3));
        }
    }
}

TEST_CASE("architectures: every eviction policy, rolling or not, with pins and a retention span, generates the same text twice") {
    for (const char *arch : kArchitectures) {
        const std::string path = small_model(arch);
        for (uint32_t policy = 1; h2o_kv_policy_name(policy); ++policy) {
            for (int rolling : {0, 1}) {
                CAPTURE(arch);
                CAPTURE(h2o_kv_policy_name(policy));
                CAPTURE(rolling);
                h2o_test::ApiSession a, b;
                REQUIRE_MESSAGE(a.open(path, cpu_session(policy, rolling)), h2o_last_error());
                REQUIRE(b.open(path, cpu_session(policy, rolling)));
                const std::string text = pinned_span_and_generation(a.session);
                CHECK(!text.empty());
                CHECK(pinned_span_and_generation(b.session) == text);
                h2o_kv_layout layout;
                layout.struct_size = sizeof layout;
                REQUIRE(h2o_session_get_kv_layout(a.session, &layout) == H2O_OK);
            }
        }
    }
}

// A snapshot of `sp`'s session after an evicting generation continues as the original does, and a
// fork continues as its source.
void check_snapshot_and_fork(const std::string &path, const h2o_session_params &sp) {
    h2o_test::ApiSession original;
    REQUIRE_MESSAGE(original.open(path, sp), h2o_last_error());
    pinned_span_and_generation(original.session);
    const std::vector<uint8_t> snapshot = save(original.session);
    h2o_session *loaded = nullptr, *fork = nullptr;
    REQUIRE_MESSAGE(h2o_session_load_from_buffer(original.model, snapshot.data(), snapshot.size(), nullptr, &loaded) == H2O_OK,
                    h2o_last_error());
    CHECK(save(loaded) == snapshot);
    REQUIRE(h2o_session_fork(original.session, &fork) == H2O_OK);
    const std::string from_loaded = generate(loaded, " The end.", 24, 0.8f);
    const std::string from_fork = generate(fork, " The end.", 24, 0.8f);
    CHECK(generate(original.session, " The end.", 24, 0.8f) == from_loaded);
    CHECK(from_fork == from_loaded);
    h2o_session_free(loaded);
    h2o_session_free(fork);
}

TEST_CASE("architectures: snapshots and forks continue exactly, with fixed and moving budgets and one-shot prompt eviction") {
    for (const char *arch : kArchitectures) {
        const std::string path = small_model(arch);
        for (int rolling : {0, 1}) {
            CAPTURE(arch);
            CAPTURE(rolling);
            check_snapshot_and_fork(path, cpu_session(H2O_KV_SCISSORHANDS, rolling));
            h2o_session_params moving = cpu_session(H2O_KV_H2O, rolling, 48);
            moving.experimental[H2O_EXP_KV_LAYER_SLOPE] = 0.25f;
            moving.experimental[H2O_EXP_KV_HEAD_SHARE] = 0.5f;
            check_snapshot_and_fork(path, moving);
            moving.experimental[H2O_EXP_KV_SHARE_ACROSS_LAYERS] = 1;
            check_snapshot_and_fork(path, moving);
            h2o_session_params prompt = cpu_session(H2O_KV_TOVA, rolling);
            prompt.experimental[H2O_EXP_KV_PROMPT_PROXY] = 6;
            prompt.experimental[H2O_EXP_KV_PROMPT_RANDOM_SHARE] = 0.3f;
            check_snapshot_and_fork(path, prompt);
        }
    }
}

TEST_CASE("architectures: the prefix cache gives a second session the first one's continuation") {
    for (const char *arch : kArchitectures) {
        CAPTURE(arch);
        h2o_model_params mp;
        h2o_model_params_init(&mp, sizeof mp);
        mp.prefix_cache_bytes = 64u << 20;
        h2o_model *model = nullptr;
        REQUIRE(h2o_model_load(small_model(arch).c_str(), &mp, &model) == H2O_OK);
        const std::string prompt = "Once upon a time, there was a little dog named Max. He liked to run.";
        std::string first, second;
        for (std::string *text : {&first, &second}) {
            h2o_session *session = nullptr;
            const h2o_session_params sp = cpu_session(H2O_KV_FULL, 0, 0);
            REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
            *text = generate(session, prompt, 16);
            h2o_session_free(session);
        }
        h2o_prefix_cache_stats stats;
        stats.struct_size = sizeof stats;
        REQUIRE(h2o_model_get_prefix_cache_stats(model, &stats) == H2O_OK);
        CHECK(stats.hits == 1);
        CHECK(second == first);
        h2o_model_free(model);
    }
}

TEST_CASE("architectures: a Llama 3 shape with a tied 128k vocabulary samples over every logit and saves its state") {
    SyntheticModelSpec spec = small_spec("llama", TensorType::Q8_0);
    spec.n_vocab = 128256;
    const std::string path = write_model(spec, "arch-llama-128k.gguf");
    h2o_test::ApiSession s;
    REQUIRE_MESSAGE(s.open(path, cpu_session(H2O_KV_H2O, 1)), h2o_last_error());
    h2o_model_info info;
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(s.model, &info) == H2O_OK);
    CHECK(info.n_vocab == 128256);
    generate(s.session, "Once upon a time", 30, 0.8f);
    // The last logits cover the whole vocabulary and come back with a snapshot.
    std::vector<float> logits(128256), loaded_logits(128256);
    REQUIRE(h2o_session_get_logits(s.session, logits.data(), logits.size()) == H2O_OK);
    CHECK(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
    CHECK(*std::max_element(logits.begin() + 100000, logits.end()) != 0.0f);
    const std::vector<uint8_t> snapshot = save(s.session);
    h2o_session *loaded = nullptr;
    REQUIRE(h2o_session_load_from_buffer(s.model, snapshot.data(), snapshot.size(), nullptr, &loaded) == H2O_OK);
    REQUIRE(h2o_session_get_logits(loaded, loaded_logits.data(), loaded_logits.size()) == H2O_OK);
    CHECK(loaded_logits == logits);
    CHECK(generate(loaded, "", 12, 0.8f) == generate(s.session, "", 12, 0.8f));
    h2o_session_free(loaded);
}

// ---- files the loader refuses ---------------------------------------------------------------------

// A copy of the GGUF at `source` with metadata and tensors changed: keys in `drop_keys` and tensors
// in `drop_tensors` left out, then `add` given the writer for what replaces them.
std::string edited_copy(const std::string &source, const std::string &name, const std::set<std::string> &drop_keys,
                        const std::set<std::string> &drop_tensors, const std::function<void(GgufWriter &)> &add) {
    std::unique_ptr<GgufFile> file;
    REQUIRE(GgufFile::open(source, &file).ok());
    GgufWriter w;
    for (const GgufKeyValue &kv : file->metadata()) {
        if (!drop_keys.count(std::string(kv.key))) w.add_copy(kv);
    }
    for (const GgufTensor &t : file->tensors()) {
        if (drop_tensors.count(std::string(t.name))) continue;
        std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        w.add_tensor(std::string(t.name), t.type, ne, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }
    add(w);
    const std::string path = h2o_test::temp_path(name);
    REQUIRE(w.write(path).ok());
    return path;
}

std::vector<uint8_t> floats(size_t n, float value) {
    std::vector<float> v(n, value);
    const auto *p = reinterpret_cast<const uint8_t *>(v.data());
    return std::vector<uint8_t>(p, p + n * sizeof(float));
}

TEST_CASE("architectures: files that do not match their architecture are refused, naming the key or tensor") {
    const std::string llama = small_model("llama"), qwen2 = small_model("qwen2"), qwen3 = small_model("qwen3"), phi3 = small_model("phi3");
    SyntheticModelSpec gemma_spec = small_spec("qwen3");
    gemma_spec.architecture = "gemma3";
    gemma_spec.sliding_window = 4;
    const std::string gemma3 = write_model(gemma_spec, "arch-gemma3.gguf");
    struct Case {
        const char *name;
        std::string source;
        std::set<std::string> drop_keys, drop_tensors;
        std::function<void(GgufWriter &)> add;
        h2o_status code;
        const char *message;
    };
    const auto nothing = [](GgufWriter &) {};
    const std::vector<Case> cases = {
        {"unknown architecture",
         llama,
         {"general.architecture"},
         {},
         [](GgufWriter &w) { w.add_string("general.architecture", "gemma4"); },
         H2O_ERR_UNSUPPORTED,
         "'gemma4' is not supported (general.architecture; this runtime runs 'llama', 'qwen2', 'qwen3', 'phi3', 'gemma2', 'gemma3')"},
        {"a Gemma file without the norm after the feed-forward",
         gemma3,
         {},
         {"blk.1.post_ffw_norm.weight"},
         nothing,
         H2O_ERR_MODEL_FORMAT,
         "missing tensor 'blk.1.post_ffw_norm.weight'"},
        {"a sliding-window pattern of 0",
         gemma3,
         {},
         {},
         [](GgufWriter &w) { w.add_u32("gemma3.attention.sliding_window_pattern", 0); },
         H2O_ERR_MODEL_FORMAT,
         "gemma3.attention.sliding_window_pattern 0 is out of range"},
        {"a negative logit soft-cap",
         gemma3,
         {},
         {},
         [](GgufWriter &w) { w.add_f32("gemma3.final_logit_softcapping", -30.0f); },
         H2O_ERR_MODEL_FORMAT,
         "gemma3.final_logit_softcapping must be a positive number"},
        {"a fused projection of the wrong height",
         phi3,
         {},
         {"blk.1.attn_qkv.weight"},
         [](GgufWriter &w) {
             w.add_tensor("blk.1.attn_qkv.weight", TensorType::F32, {64, 96}, floats(64 * 96, 0.0f));
         },
         H2O_ERR_MODEL_FORMAT,
         "tensor 'blk.1.attn_qkv.weight' has shape [64 x 96], expected [64 x 128]"},
        {"a separate gate in a Phi-3 file",
         phi3,
         {},
         {},
         [](GgufWriter &w) {
             w.add_tensor("blk.0.ffn_gate.weight", TensorType::F32, {64, 96}, floats(64 * 96, 0.0f));
         },
         H2O_ERR_UNSUPPORTED,
         "tensor 'blk.0.ffn_gate.weight' is not part of the 'phi3' architecture"},
        {"LongRoPE's long factors alone",
         phi3,
         {},
         {"rope_factors_short.weight"},
         nothing,
         H2O_ERR_MODEL_FORMAT,
         "only one of 'rope_factors_long.weight' and 'rope_factors_short.weight'"},
        {"LongRoPE without its original context",
         phi3,
         {"phi3.rope.scaling.original_context_length"},
         {},
         nothing,
         H2O_ERR_MODEL_FORMAT,
         "phi3.rope.scaling.original_context_length is missing"},
        {"LongRoPE scaling in a Llama file",
         llama,
         {},
         {},
         [](GgufWriter &w) { w.add_string("llama.rope.scaling.type", "longrope"); },
         H2O_ERR_UNSUPPORTED,
         "llama.rope.scaling.type 'longrope' is not supported (only 'none' and 'linear')"},
        {"a negative attention factor",
         phi3,
         {"phi3.rope.scaling.attn_factor"},
         {},
         [](GgufWriter &w) { w.add_f32("phi3.rope.scaling.attn_factor", -1.0f); },
         H2O_ERR_MODEL_FORMAT,
         "phi3.rope.scaling.attn_factor must be a positive number"},
        {"a missing bias", qwen2, {}, {"blk.1.attn_k.bias"}, nothing, H2O_ERR_MODEL_FORMAT, "missing tensor 'blk.1.attn_k.bias'"},
        {"a bias of the wrong size",
         qwen2,
         {},
         {"blk.0.attn_q.bias"},
         [](GgufWriter &w) { w.add_tensor("blk.0.attn_q.bias", TensorType::F32, {32}, floats(32, 0.0f)); },
         H2O_ERR_MODEL_FORMAT,
         "tensor 'blk.0.attn_q.bias' has shape [32], expected [64]"},
        {"a per-head norm of the embedding's width",
         qwen3,
         {},
         {"blk.0.attn_k_norm.weight"},
         [](GgufWriter &w) { w.add_tensor("blk.0.attn_k_norm.weight", TensorType::F32, {64}, floats(64, 1.0f)); },
         H2O_ERR_MODEL_FORMAT,
         "tensor 'blk.0.attn_k_norm.weight' has shape [64], expected [32]"},
        {"heads wider than the embedding without key_length",
         qwen3,
         {"qwen3.attention.key_length", "qwen3.attention.value_length", "qwen3.rope.dimension_count"},
         {},
         nothing,
         H2O_ERR_MODEL_FORMAT,
         "tensor 'blk.0.attn_q.weight' has shape [64 x 128], expected [64 x 64]"},
        {"values longer than keys",
         qwen3,
         {"qwen3.attention.value_length"},
         {},
         [](GgufWriter &w) { w.add_u32("qwen3.attention.value_length", 64); },
         H2O_ERR_UNSUPPORTED,
         "qwen3.attention.value_length 64 differs"},
        {"a tensor of another architecture",
         llama,
         {},
         {},
         [](GgufWriter &w) { w.add_tensor("blk.0.attn_q_norm.weight", TensorType::F32, {16}, floats(16, 1.0f)); },
         H2O_ERR_UNSUPPORTED,
         "tensor 'blk.0.attn_q_norm.weight' is not part of the 'llama' architecture"},
        {"frequency factors in a Qwen file",
         qwen2,
         {},
         {},
         [](GgufWriter &w) { w.add_tensor("rope_freqs.weight", TensorType::F32, {8}, floats(8, 1.0f)); },
         H2O_ERR_UNSUPPORTED,
         "tensor 'rope_freqs.weight' is not part of the 'qwen2' architecture"},
        {"frequency factors of the wrong count",
         llama,
         {},
         {"rope_freqs.weight"},
         [](GgufWriter &w) { w.add_tensor("rope_freqs.weight", TensorType::F32, {16}, floats(16, 1.0f)); },
         H2O_ERR_MODEL_FORMAT,
         "tensor 'rope_freqs.weight' has shape [16], expected [8]"},
        {"a zero frequency factor",
         llama,
         {},
         {"rope_freqs.weight"},
         [](GgufWriter &w) { w.add_tensor("rope_freqs.weight", TensorType::F32, {8}, floats(8, 0.0f)); },
         H2O_ERR_MODEL_FORMAT,
         "frequency factors must be positive"},
        {"a bias stored as F16",
         qwen2,
         {},
         {"blk.0.attn_v.bias"},
         [](GgufWriter &w) { w.add_tensor("blk.0.attn_v.bias", TensorType::F16, {32}, std::vector<uint8_t>(64, 0)); },
         H2O_ERR_UNSUPPORTED,
         "tensor 'blk.0.attn_v.bias' has type F16, vectors (norms, biases, factors) must be F32"},
        {"YaRN scaling",
         qwen2,
         {},
         {},
         [](GgufWriter &w) { w.add_string("qwen2.rope.scaling.type", "yarn"); },
         H2O_ERR_UNSUPPORTED,
         "qwen2.rope.scaling.type 'yarn' is not supported"},
        {"a mixture of experts",
         llama,
         {},
         {},
         [](GgufWriter &w) { w.add_u32("llama.expert_count", 8); },
         H2O_ERR_UNSUPPORTED,
         "llama.expert_count is 8"},
        {"a vocabulary size other than the embedding's",
         qwen3,
         {},
         {},
         [](GgufWriter &w) { w.add_u32("qwen3.vocab_size", 1000); },
         H2O_ERR_MODEL_FORMAT,
         "qwen3.vocab_size 1000 differs from the 320 rows of 'token_embd.weight'"},
        {"Qwen keys missing", qwen2, {"qwen2.embedding_length"}, {}, nothing, H2O_ERR_MODEL_FORMAT, "qwen2.embedding_length"},
    };
    for (const Case &c : cases) {
        CAPTURE(c.name);
        const std::string path = edited_copy(c.source, std::string("arch-refused-") + std::to_string(&c - cases.data()) + ".gguf",
                                             c.drop_keys, c.drop_tensors, c.add);
        h2o_model *model = nullptr;
        CHECK(h2o_model_load(path.c_str(), nullptr, &model) == c.code);
        const std::string message = h2o_last_error();
        CHECK_MESSAGE(message.find(c.message) != std::string::npos, message);
        CHECK(model == nullptr);
    }
    // The edits alone, without the faults, load (the copies are faithful).
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(edited_copy(qwen2, "arch-refused-none.gguf", {}, {}, nothing).c_str(), nullptr, &model) == H2O_OK);
    h2o_model_free(model);
    // A Phi-3 file may name its LongRoPE factors' scaling "longrope": the same model.
    const std::string named =
        edited_copy(phi3, "arch-longrope-named.gguf", {}, {}, [](GgufWriter &w) { w.add_string("phi3.rope.scaling.type", "longrope"); });
    const std::vector<int32_t> tokens = some_tokens(9, 320);
    CHECK(session_logits(named, tokens) == session_logits(phi3, tokens));
}

// ---- the fingerprint ------------------------------------------------------------------------------

TEST_CASE("architectures: the fingerprint tells apart models that differ only in their rotation, and a Llama of before keeps its own") {
    const std::string qwen2 = small_model("qwen2");
    const std::string other_base = edited_copy(qwen2, "arch-fingerprint-base.gguf", {"qwen2.rope.freq_base"}, {},
                                               [](GgufWriter &w) { w.add_f32("qwen2.rope.freq_base", 10000.0f); });
    const std::string linear =
        edited_copy(qwen2, "arch-fingerprint-linear.gguf", {}, {}, [](GgufWriter &w) { w.add_f32("qwen2.rope.scaling.factor", 2.0f); });
    std::map<std::string, uint64_t> prints;
    for (const std::string &path : {qwen2, other_base, linear}) {
        std::unique_ptr<Model> model;
        REQUIRE(Model::load(path, "", &model).ok());
        prints[path] = model->fingerprint();
    }
    CHECK(prints[qwen2] != prints[other_base]);
    CHECK(prints[qwen2] != prints[linear]);

    // A snapshot of one is refused by the other.
    h2o_test::ApiSession s;
    REQUIRE(s.open(qwen2, cpu_session(H2O_KV_H2O, 1)));
    generate(s.session, "Once", 4);
    const std::vector<uint8_t> snapshot = save(s.session);
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(other_base.c_str(), nullptr, &model) == H2O_OK);
    h2o_session *loaded = nullptr;
    CHECK(h2o_session_load_from_buffer(model, snapshot.data(), snapshot.size(), nullptr, &loaded) == H2O_ERR_STATE_FORMAT);
    CHECK(std::string(h2o_last_error()).find("saved with another model") != std::string::npos);
    h2o_model_free(model);

    // A Llama file as earlier versions ran it: the hash of its tensor table and vocabulary alone
    // (FNV-1a, a separator after each field), so their snapshots still load.
    H2O_SHARED_FILE_OR_SKIP(stories, "models/stories260K.gguf");
    std::unique_ptr<Model> llama;
    REQUIRE(Model::load(stories, "", &llama).ok());
    std::unique_ptr<GgufFile> file;
    REQUIRE(GgufFile::open(stories, &file).ok());
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](const void *data, size_t size) {
        for (size_t i = 0; i < size; ++i) h = (h ^ static_cast<const unsigned char *>(data)[i]) * 0x100000001b3ull;
        h = (h ^ 0xFF) * 0x100000001b3ull;
    };
    for (const GgufTensor &t : file->tensors()) {
        mix(t.name.data(), t.name.size());
        const auto type = static_cast<uint32_t>(t.type);
        mix(&type, sizeof type);
        mix(t.ne, sizeof(t.ne[0]) * t.n_dims);
    }
    for (int32_t id = 0; id < llama->tokenizer().n_vocab(); ++id) {
        const int32_t type = llama->tokenizer().type(id);
        mix(llama->tokenizer().piece(id).data(), llama->tokenizer().piece(id).size());
        mix(&type, sizeof type);
    }
    CHECK(llama->fingerprint() == h);
}

}  // namespace
