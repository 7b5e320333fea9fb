#include "model.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace h2o {

namespace {

// Upper bounds that no real Llama comes near; they keep products of dimensions far from overflow
// and reject files whose metadata would make us allocate absurd activation buffers.
constexpr uint32_t kMaxEmbedding = 1u << 16;
constexpr uint32_t kMaxLayers = 1024;
constexpr uint32_t kMaxVocab = 1u << 20;
constexpr uint32_t kMaxFeedForward = 1u << 18;
// Far beyond any released Llama (128K); larger values are corrupt metadata. Sessions do not
// trust even this much: by default they use at most 4096 (api.cpp).
constexpr uint32_t kMaxContextLength = 1u << 24;

Status load_cancelled() { return make_error(H2O_ERR_CANCELLED, "loading was cancelled by the progress callback"); }

}  // namespace

Status Model::load(const std::string &path, const std::string &tokenizer_path, std::unique_ptr<Model> *out,
                   const LoadProgress &progress, uint64_t prefix_cache_bytes) {
    std::unique_ptr<Model> model(new Model());
    model->prefix_cache_ = std::make_unique<PrefixCache>(prefix_cache_bytes);
    if (!progress.report(0.0f)) return load_cancelled();
    H2O_TRY(GgufFile::open(path, &model->file_));  // its messages name the file
    Status st = model->read_hyper_parameters();
    if (st.ok()) st = model->bind_weights();
    if (st.ok()) st = model->prefetch_weights(progress);
    if (st.ok()) {
        st = tokenizer_path.empty() ? Tokenizer::from_gguf(*model->file_, &model->tokenizer_)
                                    : Tokenizer::from_model_file(tokenizer_path, &model->tokenizer_);
    }
    if (st.ok() && model->tokenizer_->n_vocab() != model->shape_.n_vocab) {
        st = make_error(H2O_ERR_TOKENIZER, "tokenizer has " + std::to_string(model->tokenizer_->n_vocab()) +
                                               " tokens but the model's embedding has " + std::to_string(model->shape_.n_vocab) +
                                               " rows");
    }
    if (st.ok()) model->fingerprint_ = model->compute_fingerprint();
    if (st.ok() && !progress.report(1.0f)) st = load_cancelled();
    if (!st.ok()) return make_error(st.code, path + ": " + st.message);
    *out = std::move(model);
    return Status::Ok();
}

uint64_t Model::compute_fingerprint() const {
    // FNV-1a over the fields, each followed by a separator byte so that concatenations differ.
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](const void *data, size_t size) {
        const auto *p = static_cast<const unsigned char *>(data);
        for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
        h = (h ^ 0xFF) * 0x100000001b3ull;
    };
    for (const GgufTensor &t : file_->tensors()) {
        mix(t.name.data(), t.name.size());
        const auto type = static_cast<uint32_t>(t.type);
        mix(&type, sizeof(type));
        mix(t.ne, sizeof(t.ne[0]) * t.n_dims);
    }
    for (int32_t id = 0; id < tokenizer_->n_vocab(); ++id) {
        const std::string &piece = tokenizer_->piece(id);
        const int32_t type = tokenizer_->type(id);
        mix(piece.data(), piece.size());
        mix(&type, sizeof(type));
    }
    return h;
}

Status Model::prefetch_weights(const LoadProgress &progress) const {
    std::vector<const WeightView *> views = {&weights_.token_embd, &weights_.output_norm};
    if (weights_.output.data != weights_.token_embd.data) views.push_back(&weights_.output);
    for (const LayerWeights &l : weights_.layers) {
        for (const WeightView *w : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) views.push_back(w);
    }
    constexpr size_t kPage = 4096;
    uint64_t done = 0;
    unsigned char sum = 0;
    for (const WeightView *w : views) {
        const auto *bytes = static_cast<const unsigned char *>(w->data);
        const size_t n = row_bytes(w->type, w->cols) * static_cast<size_t>(w->rows);
        for (size_t i = 0; i < n; i += kPage) sum ^= bytes[i];
        done += n;
        // The weights are 1% to 95% of the load; the tokenizer comes after.
        if (!progress.report(0.01f + 0.94f * static_cast<float>(static_cast<double>(done) / static_cast<double>(weight_bytes_)))) {
            return load_cancelled();
        }
    }
    // Keeps the reads from being optimised away.
    volatile unsigned char keep = sum;
    (void)keep;
    return Status::Ok();
}

Status Model::read_hyper_parameters() {
    std::string_view arch;
    H2O_TRY(file_->get_string("general.architecture", &arch));
    if (arch != "llama") {
        return make_error(H2O_ERR_UNSUPPORTED,
                          "model architecture '" + std::string(arch) + "' is not supported (only 'llama')");
    }
    std::string_view name;
    if (file_->get_string("general.name", &name).ok()) name_ = std::string(name);
    std::string_view chat_template;
    if (file_->get_string("tokenizer.chat_template", &chat_template).ok()) chat_template_ = std::string(chat_template);

    uint32_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_ctx = 0, rope_dims = 0;
    H2O_TRY(file_->get_u32("llama.embedding_length", &n_embd));
    H2O_TRY(file_->get_u32("llama.block_count", &n_layer));
    H2O_TRY(file_->get_u32("llama.attention.head_count", &n_head));
    H2O_TRY(file_->get_u32_or("llama.attention.head_count_kv", n_head, &n_head_kv));
    H2O_TRY(file_->get_u32("llama.feed_forward_length", &n_ff));
    H2O_TRY(file_->get_u32("llama.context_length", &n_ctx));
    float eps = 0, freq_base = 0;
    H2O_TRY(file_->get_f32_or("llama.attention.layer_norm_rms_epsilon", 1e-5f, &eps));
    H2O_TRY(file_->get_f32_or("llama.rope.freq_base", 10000.0f, &freq_base));

    auto bad = [](const std::string &what) { return make_error(H2O_ERR_MODEL_FORMAT, what); };
    if (n_embd == 0 || n_embd > kMaxEmbedding) return bad("llama.embedding_length " + std::to_string(n_embd) + " is out of range");
    if (n_layer == 0 || n_layer > kMaxLayers) return bad("llama.block_count " + std::to_string(n_layer) + " is out of range");
    if (n_head == 0 || n_embd % n_head != 0)
        return bad("llama.attention.head_count " + std::to_string(n_head) + " does not divide embedding_length " + std::to_string(n_embd));
    if (n_head_kv == 0 || n_head % n_head_kv != 0)
        return bad("llama.attention.head_count_kv " + std::to_string(n_head_kv) + " does not divide head_count " + std::to_string(n_head));
    if (n_ff == 0 || n_ff > kMaxFeedForward) return bad("llama.feed_forward_length " + std::to_string(n_ff) + " is out of range");
    if (n_ctx == 0 || n_ctx > kMaxContextLength) {
        return bad("llama.context_length " + std::to_string(n_ctx) + " is out of range (1 to " + std::to_string(kMaxContextLength) + ")");
    }
    if (!(eps > 0.0f) || !std::isfinite(eps)) return bad("llama.attention.layer_norm_rms_epsilon must be a positive number");
    if (!(freq_base > 0.0f) || !std::isfinite(freq_base)) return bad("llama.rope.freq_base must be a positive number");
    const uint32_t head_dim = n_embd / n_head;
    H2O_TRY(file_->get_u32_or("llama.rope.dimension_count", head_dim, &rope_dims));
    if (rope_dims == 0 || rope_dims > head_dim || rope_dims % 2 != 0)
        return bad("llama.rope.dimension_count " + std::to_string(rope_dims) + " must be even and at most the head size " + std::to_string(head_dim));

    const GgufTensor *embd = file_->find_tensor("token_embd.weight");
    if (!embd) return bad("missing tensor 'token_embd.weight'");
    if (embd->n_dims != 2 || embd->ne[1] <= 0 || embd->ne[1] > kMaxVocab)
        return bad("tensor 'token_embd.weight' must be 2-D with at most " + std::to_string(kMaxVocab) + " rows");

    shape_.n_embd = static_cast<int>(n_embd);
    shape_.n_layer = static_cast<int>(n_layer);
    shape_.n_head = static_cast<int>(n_head);
    shape_.n_head_kv = static_cast<int>(n_head_kv);
    shape_.head_dim = static_cast<int>(head_dim);
    shape_.n_ff = static_cast<int>(n_ff);
    shape_.n_vocab = static_cast<int>(embd->ne[1]);
    shape_.rope_dims = static_cast<int>(rope_dims);
    shape_.rope_freq_base = freq_base;
    shape_.rms_eps = eps;
    n_ctx_train_ = n_ctx;
    return Status::Ok();
}

Status Model::bind(const std::string &name, int64_t cols, int64_t rows, WeightView *out) {
    const GgufTensor *t = file_->find_tensor(name);
    if (!t) return make_error(H2O_ERR_MODEL_FORMAT, "missing tensor '" + name + "'");
    const bool is_vector = rows == 1;
    const bool shape_ok = is_vector ? (t->n_dims == 1 && t->ne[0] == cols)
                                    : (t->n_dims == 2 && t->ne[0] == cols && t->ne[1] == rows);
    if (!shape_ok) {
        std::string got;
        for (uint32_t d = 0; d < t->n_dims; ++d) got += (d ? " x " : "") + std::to_string(t->ne[d]);
        return make_error(H2O_ERR_MODEL_FORMAT, "tensor '" + name + "' has shape [" + got + "], expected [" +
                                                    std::to_string(cols) + (is_vector ? "" : " x " + std::to_string(rows)) + "]");
    }
    if (!is_weight_type(t->type) || (is_vector && t->type != TensorType::F32)) {
        return make_error(H2O_ERR_UNSUPPORTED, "tensor '" + name + "' has type " + type_name(t->type) +
                                                   (is_vector ? ", norm weights must be F32" : ", which this runtime does not run"));
    }
    *out = WeightView{name, t->type, cols, rows, t->data};
    n_params_ += static_cast<uint64_t>(t->n_elements());
    weight_bytes_ += t->n_bytes;
    if (std::find(weight_types_.begin(), weight_types_.end(), t->type) == weight_types_.end()) weight_types_.push_back(t->type);
    return Status::Ok();
}

Status Model::bind_weights() {
    const int64_t d = shape_.n_embd, ff = shape_.n_ff, hd = shape_.head_dim;
    const int64_t kv = hd * shape_.n_head_kv;
    H2O_TRY(bind("token_embd.weight", d, shape_.n_vocab, &weights_.token_embd));
    H2O_TRY(bind("output_norm.weight", d, 1, &weights_.output_norm));
    if (file_->find_tensor("output.weight")) {
        H2O_TRY(bind("output.weight", d, shape_.n_vocab, &weights_.output));
    } else {
        weights_.output = weights_.token_embd;  // tied embeddings
    }
    weights_.layers.resize(shape_.n_layer);
    for (int l = 0; l < shape_.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        LayerWeights &w = weights_.layers[l];
        H2O_TRY(bind(p + "attn_norm.weight", d, 1, &w.attn_norm));
        H2O_TRY(bind(p + "attn_q.weight", d, d, &w.wq));
        H2O_TRY(bind(p + "attn_k.weight", d, kv, &w.wk));
        H2O_TRY(bind(p + "attn_v.weight", d, kv, &w.wv));
        H2O_TRY(bind(p + "attn_output.weight", d, d, &w.wo));
        H2O_TRY(bind(p + "ffn_norm.weight", d, 1, &w.ffn_norm));
        H2O_TRY(bind(p + "ffn_gate.weight", d, ff, &w.w_gate));
        H2O_TRY(bind(p + "ffn_up.weight", d, ff, &w.w_up));
        H2O_TRY(bind(p + "ffn_down.weight", ff, d, &w.w_down));
    }
    return Status::Ok();
}

}  // namespace h2o
