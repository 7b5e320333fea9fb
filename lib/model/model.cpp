#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <unordered_set>

#include "log.h"
#include "quant.h"

namespace h2o {

namespace {

// Upper bounds that no real Llama comes near; they keep products of dimensions far from overflow
// and reject files whose metadata would make us allocate absurd activation buffers.
constexpr uint32_t kMaxEmbedding = 1u << 16;
constexpr uint32_t kMaxLayers = 1024;
constexpr uint32_t kMaxHeads = 1024;
constexpr uint32_t kMaxHeadDim = 1024;
constexpr uint32_t kMaxVocab = 1u << 20;
constexpr uint32_t kMaxFeedForward = 1u << 18;
// Far beyond any released Llama (128K); larger values are corrupt metadata. Sessions do not
// trust even this much: by default they use at most 4096 (api.cpp).
constexpr uint32_t kMaxContextLength = 1u << 24;

Status load_cancelled() { return make_error(H2O_ERR_CANCELLED, "loading was cancelled by the progress callback"); }

Status bad(const std::string &what) { return make_error(H2O_ERR_MODEL_FORMAT, what); }
Status unsupported(const std::string &what) { return make_error(H2O_ERR_UNSUPPORTED, what); }

}  // namespace

Status Model::load(const std::string &path, const std::string &tokenizer_path, std::unique_ptr<Model> *out, const LoadProgress &progress,
                   uint64_t prefix_cache_bytes, CachePolicy prefix_cache_policy) {
    std::unique_ptr<Model> model(new Model());
    model->prefix_cache_ = std::make_unique<PrefixCache>(prefix_cache_bytes, prefix_cache_policy);
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
                                               " tokens but the model's embedding has " + std::to_string(model->shape_.n_vocab) + " rows");
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
    // What the graph computes with beyond the tensors: two files with the same tensors but
    // another rotation (which the cached keys carry), head size or epsilon are other models. The
    // plain Llama files that earlier versions ran (no frequency factors or scaling, q as wide as
    // the embedding) keep the fingerprint those versions gave them, so their snapshots load.
    const ModelShape &s = shape_;
    const bool earlier_llama = std::string_view(architecture_->name) == "llama" && s.rope.freq_factors.empty() &&
                               s.rope.freq_scale == 1.0f && s.q_dim() == s.n_embd;
    if (earlier_llama) return h;
    mix(architecture_->name, std::char_traits<char>::length(architecture_->name));
    const int32_t sizes[] = {s.n_head, s.n_head_kv, s.head_dim, s.rope.dims, static_cast<int32_t>(s.rope.pairing)};
    mix(sizes, sizeof(sizes));
    const float reals[] = {s.rope.freq_base, s.rope.freq_scale, s.rms_eps};
    mix(reals, sizeof(reals));
    mix(s.rope.freq_factors.data(), s.rope.freq_factors.size() * sizeof(float));
    if (architecture_->gemma_block) {
        const float gemma[] = {s.attention_scale, s.attention_softcap, s.output_softcap, s.local_rope.freq_base, s.local_rope.freq_scale};
        mix(gemma, sizeof(gemma));
        mix(&s.sliding_window, sizeof(s.sliding_window));
        mix(s.local_layers.data(), s.local_layers.size());
    }
    if (!long_rope_factors_.empty() || s.rope.magnitude != 1.0f) {  // LongRoPE (files before it keep their fingerprint)
        mix(long_rope_factors_.data(), long_rope_factors_.size() * sizeof(float));
        mix(&s.rope.magnitude, sizeof(s.rope.magnitude));
        mix(&long_rope_from_, sizeof(long_rope_from_));
    }
    return h;
}

Status Model::prefetch_weights(const LoadProgress &progress) const {
    std::vector<const WeightView *> views = {&weights_.token_embd, &weights_.output_norm};
    if (weights_.output.data != weights_.token_embd.data) views.push_back(&weights_.output);
    for (const LayerWeights &l : weights_.layers) {
        for (const WeightView *w : l.all()) {
            if (w->present()) views.push_back(w);
        }
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
    architecture_ = find_architecture(arch);
    if (!architecture_) {
        return unsupported("model architecture '" + std::string(arch) + "' is not supported (general.architecture; this runtime runs " +
                           supported_architectures() + ")");
    }
    std::string_view name;
    if (file_->get_string("general.name", &name).ok()) name_ = std::string(name);
    std::string_view chat_template;
    if (file_->get_string("tokenizer.chat_template", &chat_template).ok()) chat_template_ = std::string(chat_template);

    uint32_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_ctx = 0, experts = 0;
    H2O_TRY(file_->get_u32(key("embedding_length"), &n_embd));
    H2O_TRY(file_->get_u32(key("block_count"), &n_layer));
    H2O_TRY(file_->get_u32(key("attention.head_count"), &n_head));
    H2O_TRY(file_->get_u32_or(key("attention.head_count_kv"), n_head, &n_head_kv));
    H2O_TRY(file_->get_u32(key("feed_forward_length"), &n_ff));
    H2O_TRY(file_->get_u32(key("context_length"), &n_ctx));
    H2O_TRY(file_->get_u32_or(key("expert_count"), 0, &experts));
    float eps = 0;
    H2O_TRY(file_->get_f32_or(key("attention.layer_norm_rms_epsilon"), 1e-5f, &eps));

    auto range = [](const std::string &k, uint32_t v) { return k + " " + std::to_string(v) + " is out of range"; };
    if (n_embd == 0 || n_embd > kMaxEmbedding) return bad(range(key("embedding_length"), n_embd));
    if (n_layer == 0 || n_layer > kMaxLayers) return bad(range(key("block_count"), n_layer));
    if (n_head == 0 || n_head > kMaxHeads) return bad(range(key("attention.head_count"), n_head));
    if (n_head_kv == 0 || n_head % n_head_kv != 0)
        return bad(key("attention.head_count_kv") + " " + std::to_string(n_head_kv) + " does not divide head_count " +
                   std::to_string(n_head));
    if (n_ff == 0 || n_ff > kMaxFeedForward) return bad(range(key("feed_forward_length"), n_ff));
    if (n_ctx == 0 || n_ctx > kMaxContextLength) {
        return bad(key("context_length") + " " + std::to_string(n_ctx) + " is out of range (1 to " + std::to_string(kMaxContextLength) +
                   ")");
    }
    if (experts != 0)
        return unsupported(key("expert_count") + " is " + std::to_string(experts) + ": mixtures of experts are not supported");
    if (!(eps > 0.0f) || !std::isfinite(eps)) return bad(key("attention.layer_norm_rms_epsilon") + " must be a positive number");

    // The head size: attention.key_length when given (Qwen3: q is wider than the embedding),
    // else the embedding split between the heads. Values must be as long as keys.
    uint32_t head_dim = 0, value_dim = 0;
    if (file_->find(key("attention.key_length"))) {
        H2O_TRY(file_->get_u32(key("attention.key_length"), &head_dim));
        if (head_dim == 0 || head_dim > kMaxHeadDim) return bad(range(key("attention.key_length"), head_dim));
    } else {
        if (n_embd % n_head != 0)
            return bad(key("attention.head_count") + " " + std::to_string(n_head) + " does not divide embedding_length " +
                       std::to_string(n_embd) + " (and " + key("attention.key_length") + " does not give the head size)");
        head_dim = n_embd / n_head;
    }
    H2O_TRY(file_->get_u32_or(key("attention.value_length"), head_dim, &value_dim));
    if (value_dim != head_dim) {
        return unsupported(key("attention.value_length") + " " + std::to_string(value_dim) + " differs from the key length " +
                           std::to_string(head_dim) + ": heads whose values and keys differ in size are not supported");
    }
    if (static_cast<uint64_t>(n_head) * head_dim > 4ull * kMaxEmbedding)
        return bad("the attention width (" + key("attention.head_count") + " x head size) is out of range");
    H2O_TRY(read_rotary(head_dim));

    const GgufTensor *embd = file_->find_tensor("token_embd.weight");
    if (!embd) return bad("missing tensor 'token_embd.weight'");
    if (embd->n_dims != 2 || embd->ne[1] <= 0 || embd->ne[1] > kMaxVocab)
        return bad("tensor 'token_embd.weight' must be 2-D with at most " + std::to_string(kMaxVocab) + " rows");
    uint32_t vocab_size = 0;
    H2O_TRY(file_->get_u32_or(key("vocab_size"), static_cast<uint32_t>(embd->ne[1]), &vocab_size));
    if (vocab_size != embd->ne[1]) {
        return bad(key("vocab_size") + " " + std::to_string(vocab_size) + " differs from the " + std::to_string(embd->ne[1]) +
                   " rows of 'token_embd.weight'");
    }

    shape_.n_embd = static_cast<int>(n_embd);
    shape_.n_layer = static_cast<int>(n_layer);
    shape_.n_head = static_cast<int>(n_head);
    shape_.n_head_kv = static_cast<int>(n_head_kv);
    shape_.head_dim = static_cast<int>(head_dim);
    shape_.n_ff = static_cast<int>(n_ff);
    shape_.n_vocab = static_cast<int>(embd->ne[1]);
    shape_.rms_eps = eps;
    n_ctx_train_ = n_ctx;
    return architecture_->gemma_block ? read_gemma_block() : Status::Ok();
}

Status Model::read_gemma_block() {
    const ArchitectureSpec &a = *architecture_;
    ModelShape &s = shape_;
    s.embedding_scale = std::sqrt(static_cast<float>(s.n_embd));
    s.gelu = true;
    s.post_norms = true;
    auto read_cap = [&](const char *option, float *cap) -> Status {
        H2O_TRY(file_->get_f32_or(key(option), 0.0f, cap));
        if (!(*cap >= 0.0f) || !std::isfinite(*cap)) return bad(key(option) + " must be a positive number (or 0: none)");
        return Status::Ok();
    };
    H2O_TRY(read_cap("final_logit_softcapping", &s.output_softcap));
    if (a.attention_softcap) H2O_TRY(read_cap("attn_logit_softcapping", &s.attention_softcap));
    // As the reference implementation scales the queries: by the head size, but for the 27B
    // models by n_embd / n_head (their query_pre_attn_scalar, which the files do not carry).
    const float query_scalar = static_cast<uint32_t>(s.n_layer) == a.wide_query_scale_layers ? static_cast<float>(s.n_embd / s.n_head)
                                                                                             : static_cast<float>(s.head_dim);
    s.attention_scale = 1.0f / std::sqrt(query_scalar);

    uint32_t window = 0, pattern = 0;
    H2O_TRY(file_->get_u32_or(key("attention.sliding_window"), a.default_window, &window));
    if (window == 0) return Status::Ok();  // every layer global
    if (window > kMaxContextLength) return bad(key("attention.sliding_window") + " " + std::to_string(window) + " is out of range");
    H2O_TRY(file_->get_u32_or(key("attention.sliding_window_pattern"), a.window_pattern, &pattern));
    if (pattern == 0 || pattern > kMaxLayers)
        return bad(key("attention.sliding_window_pattern") + " " + std::to_string(pattern) + " is out of range");
    s.sliding_window = static_cast<int>(window);
    s.local_layers.assign(static_cast<size_t>(s.n_layer), 0);
    // In each group of `pattern` layers the last is global, the others local.
    for (int l = 0; l < s.n_layer; ++l) s.local_layers[static_cast<size_t>(l)] = static_cast<uint32_t>(l) % pattern < pattern - 1 ? 1 : 0;
    s.local_rope = s.rope;
    if (a.local_rope_base != 0.0f) {  // a rotation of their own, unscaled (Gemma 3); else the global one (Gemma 2)
        s.local_rope.freq_base = a.local_rope_base;
        s.local_rope.freq_scale = 1.0f;
    }
    H2O_TRY(file_->get_f32_or(key("rope.freq_base_swa"), s.local_rope.freq_base, &s.local_rope.freq_base));
    if (!(s.local_rope.freq_base > 0.0f) || !std::isfinite(s.local_rope.freq_base))
        return bad(key("rope.freq_base_swa") + " must be a positive number");
    return Status::Ok();
}

Status Model::read_rotary(uint32_t head_dim) {
    RotarySpec &rope = shape_.rope;
    uint32_t dims = 0;
    H2O_TRY(file_->get_u32_or(key("rope.dimension_count"), head_dim, &dims));
    if (dims == 0 || dims > head_dim || dims % 2 != 0)
        return bad(key("rope.dimension_count") + " " + std::to_string(dims) + " must be even and at most the head size " +
                   std::to_string(head_dim));
    H2O_TRY(file_->get_f32_or(key("rope.freq_base"), 10000.0f, &rope.freq_base));
    if (!(rope.freq_base > 0.0f) || !std::isfinite(rope.freq_base)) return bad(key("rope.freq_base") + " must be a positive number");
    rope.dims = static_cast<int>(dims);
    rope.pairing = architecture_->rope_pairing;

    // Position scaling: none, or linear (every angle divided by the factor), which is also what
    // a factor without a type means. YaRN, LongRoPE and the rest change more than the angle.
    std::string_view scaling = "linear";
    if (file_->find(key("rope.scaling.type"))) H2O_TRY(file_->get_string(key("rope.scaling.type"), &scaling));
    // "longrope" names the factor tensors of an architecture that has them (bind_rope_freqs); a
    // factor beside it scales the angles as a linear one does, as llama.cpp reads such a file.
    const bool long_rope = scaling == "longrope" && architecture_->long_rope != TensorPresence::Absent;
    if (scaling != "none" && scaling != "linear" && !long_rope) {
        return unsupported(key("rope.scaling.type") + " '" + std::string(scaling) + "' is not supported (only 'none' and 'linear'" +
                           (architecture_->long_rope != TensorPresence::Absent ? ", and 'longrope'" : "") + ")");
    }
    const std::string factor_key = file_->find(key("rope.scaling.factor")) ? key("rope.scaling.factor") : key("rope.scale_linear");
    float factor = 0.0f;
    H2O_TRY(file_->get_f32_or(factor_key, 0.0f, &factor));
    if (!std::isfinite(factor) || factor < 0.0f) return bad(factor_key + " must be a positive number");
    if ((scaling == "linear" || long_rope) && factor != 0.0f) rope.freq_scale = 1.0f / factor;
    H2O_TRY(file_->get_f32_or(key("rope.scaling.attn_factor"), 1.0f, &rope.magnitude));
    if (!(rope.magnitude > 0.0f) || !std::isfinite(rope.magnitude))
        return bad(key("rope.scaling.attn_factor") + " must be a positive number");
    // LongRoPE's factors are tensors (bind_rope_freqs); the context that chooses between them is here.
    if (architecture_->long_rope != TensorPresence::Absent) {
        H2O_TRY(file_->get_u32_or(key("rope.scaling.original_context_length"), 0, &long_rope_from_));
    }
    return Status::Ok();
}

Status Model::bind(const std::string &name, int64_t cols, int64_t rows, WeightView *out) {
    const GgufTensor *t = file_->find_tensor(name);
    if (!t) return bad("missing tensor '" + name + "'");
    const bool is_vector = rows == 1;
    const bool shape_ok = is_vector ? (t->n_dims == 1 && t->ne[0] == cols) : (t->n_dims == 2 && t->ne[0] == cols && t->ne[1] == rows);
    if (!shape_ok) {
        std::string got;
        for (uint32_t d = 0; d < t->n_dims; ++d) got += (d ? " x " : "") + std::to_string(t->ne[d]);
        return bad("tensor '" + name + "' has shape [" + got + "], expected [" + std::to_string(cols) +
                   (is_vector ? "" : " x " + std::to_string(rows)) + "]");
    }
    WeightView view{name, t->type, cols, rows, t->data};
    if (t->type == TensorType::Q5_0 && !is_vector) H2O_TRY(widen_to_q8_0(*t, &view));
    if (!is_weight_type(view.type) || (is_vector && view.type != TensorType::F32)) {
        return unsupported("tensor '" + name + "' has type " + type_name(view.type) +
                           (is_vector ? ", vectors (norms, biases, factors) must be F32" : ", which this runtime does not run"));
    }
    *out = view;
    n_params_ += static_cast<uint64_t>(t->n_elements());
    weight_bytes_ += row_bytes(view.type, cols) * static_cast<uint64_t>(rows);
    if (std::find(weight_types_.begin(), weight_types_.end(), view.type) == weight_types_.end()) weight_types_.push_back(view.type);
    bound_names_.push_back(name);
    return Status::Ok();
}

Status Model::widen_to_q8_0(const GgufTensor &t, WeightView *view) {
    const int64_t blocks = t.n_elements() / kQK;
    std::unique_ptr<BlockQ8_0[]> widened(new (std::nothrow) BlockQ8_0[static_cast<size_t>(blocks)]);
    if (!widened) return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot allocate the Q8_0 copy of Q5_0 tensor '" + view->name + "'");
    widen_q5_0_to_q8_0(t.data, widened.get(), blocks);
    file_->release_pages(t.data, t.n_bytes);  // the file's bytes are not read again
    view->type = TensorType::Q8_0;
    view->data = widened.get();
    widened_weights_.push_back(std::move(widened));
    widened_file_bytes_ += t.n_bytes;
    return Status::Ok();
}

WeightView Model::rows_of(const WeightView &matrix, int64_t first_row, int64_t rows) {
    WeightView part = matrix;
    part.rows = rows;
    part.data = static_cast<const uint8_t *>(matrix.data) + row_bytes(matrix.type, matrix.cols) * static_cast<size_t>(first_row);
    return part;
}

Status Model::bind_as(TensorPresence presence, const std::string &name, int64_t cols, int64_t rows, WeightView *out) {
    if (presence == TensorPresence::Absent || (presence == TensorPresence::Optional && !file_->find_tensor(name))) return Status::Ok();
    return bind(name, cols, rows, out);
}

Status Model::bind_weights() {
    const int64_t d = shape_.n_embd;
    H2O_TRY(bind("token_embd.weight", d, shape_.n_vocab, &weights_.token_embd));
    H2O_TRY(bind("output_norm.weight", d, 1, &weights_.output_norm));
    H2O_TRY(bind_as(TensorPresence::Optional, "output.weight", d, shape_.n_vocab, &weights_.output));
    if (!weights_.output.present()) weights_.output = weights_.token_embd;  // tied embeddings
    H2O_TRY(bind_rope_freqs());
    weights_.layers.resize(shape_.n_layer);
    for (int l = 0; l < shape_.n_layer; ++l) H2O_TRY(bind_layer(l));
    if (!widened_weights_.empty()) {
        char text[200];
        std::snprintf(text, sizeof text,
                      "%zu Q5_0 tensors run as Q8_0, the same values (no backend has Q5_0 kernels): %.1f MiB instead of %.1f",
                      widened_weights_.size(), static_cast<double>(widened_file_bytes_ / sizeof(BlockQ5_0) * sizeof(BlockQ8_0)) / (1 << 20),
                      static_cast<double>(widened_file_bytes_) / (1 << 20));
        log(H2O_LOG_INFO, text);
    }
    return check_every_tensor_bound();
}

Status Model::bind_layer(int layer) {
    const ArchitectureSpec &a = *architecture_;
    const int64_t d = shape_.n_embd, ff = shape_.n_ff, hd = shape_.head_dim, qd = shape_.q_dim(), kv = shape_.kv_dim();
    const std::string p = "blk." + std::to_string(layer) + ".";
    LayerWeights &w = weights_.layers[static_cast<size_t>(layer)];
    H2O_TRY(bind(p + "attn_norm.weight", d, 1, &w.attn_norm));
    if (a.fused_qkv != TensorPresence::Absent && file_->find_tensor(p + "attn_qkv.weight")) {
        WeightView qkv;
        H2O_TRY(bind(p + "attn_qkv.weight", d, qd + 2 * kv, &qkv));
        w.wq = rows_of(qkv, 0, qd);
        w.wk = rows_of(qkv, qd, kv);
        w.wv = rows_of(qkv, qd + kv, kv);
    } else {
        H2O_TRY(bind(p + "attn_q.weight", d, qd, &w.wq));
        H2O_TRY(bind(p + "attn_k.weight", d, kv, &w.wk));
        H2O_TRY(bind(p + "attn_v.weight", d, kv, &w.wv));
    }
    H2O_TRY(bind(p + "attn_output.weight", qd, d, &w.wo));
    H2O_TRY(bind_as(a.qkv_bias, p + "attn_q.bias", qd, 1, &w.bq));
    H2O_TRY(bind_as(a.qkv_bias, p + "attn_k.bias", kv, 1, &w.bk));
    H2O_TRY(bind_as(a.qkv_bias, p + "attn_v.bias", kv, 1, &w.bv));
    H2O_TRY(bind_as(a.output_bias, p + "attn_output.bias", d, 1, &w.bo));
    H2O_TRY(bind_as(a.qk_norm, p + "attn_q_norm.weight", hd, 1, &w.q_norm));
    H2O_TRY(bind_as(a.qk_norm, p + "attn_k_norm.weight", hd, 1, &w.k_norm));
    if (w.q_norm.present() != w.k_norm.present()) return bad("layer " + std::to_string(layer) + " normalises only one of q and k");
    H2O_TRY(bind(p + "ffn_norm.weight", d, 1, &w.ffn_norm));
    if (a.fused_gate_up) {
        WeightView gate_up;
        H2O_TRY(bind(p + "ffn_up.weight", d, 2 * ff, &gate_up));
        w.w_gate = rows_of(gate_up, 0, ff);
        w.w_up = rows_of(gate_up, ff, ff);
    } else {
        H2O_TRY(bind(p + "ffn_gate.weight", d, ff, &w.w_gate));
        H2O_TRY(bind(p + "ffn_up.weight", d, ff, &w.w_up));
    }
    H2O_TRY(bind(p + "ffn_down.weight", ff, d, &w.w_down));
    if (shape_.post_norms) {
        H2O_TRY(bind(p + "post_attention_norm.weight", d, 1, &w.post_attn_norm));
        H2O_TRY(bind(p + "post_ffw_norm.weight", d, 1, &w.post_ffn_norm));
    }
    return Status::Ok();
}

Status Model::bind_rope_freqs() {
    H2O_TRY(bind_frequency_factors(architecture_->rope_freqs, "rope_freqs.weight", &shape_.rope.freq_factors));
    // LongRoPE: the short factors are the model's own rotation (ModelShape::rope), the long ones
    // replace them in sessions of a longer context (rotary_for_context).
    H2O_TRY(bind_frequency_factors(architecture_->long_rope, "rope_factors_short.weight", &shape_.rope.freq_factors));
    H2O_TRY(bind_frequency_factors(architecture_->long_rope, "rope_factors_long.weight", &long_rope_factors_));
    if (shape_.rope.freq_factors.empty() != long_rope_factors_.empty() && architecture_->long_rope != TensorPresence::Absent) {
        return bad("the file has only one of 'rope_factors_long.weight' and 'rope_factors_short.weight'");
    }
    if (!long_rope_factors_.empty() && long_rope_from_ == 0) {
        return bad(key("rope.scaling.original_context_length") + " is missing: LongRoPE needs it to choose its factors");
    }
    return Status::Ok();
}

Status Model::bind_frequency_factors(TensorPresence presence, const std::string &name, std::vector<float> *out) {
    WeightView factors;
    H2O_TRY(bind_as(presence, name, shape_.rope.pairs(), 1, &factors));
    if (!factors.present()) return Status::Ok();
    out->resize(static_cast<size_t>(shape_.rope.pairs()));
    std::memcpy(out->data(), factors.data, out->size() * sizeof(float));
    for (float f : *out) {
        if (!(f > 0.0f) || !std::isfinite(f))
            return bad("tensor '" + name + "' holds " + std::to_string(f) + ": frequency factors must be positive numbers");
    }
    return Status::Ok();
}

RotarySpec Model::rotary_for_context(int64_t n_ctx) const {
    RotarySpec rope = shape_.rope;
    if (!long_rope_factors_.empty() && n_ctx > static_cast<int64_t>(long_rope_from_)) rope.freq_factors = long_rope_factors_;
    return rope;
}

Status Model::check_every_tensor_bound() const {
    const std::unordered_set<std::string_view> bound(bound_names_.begin(), bound_names_.end());
    for (const GgufTensor &t : file_->tensors()) {
        if (!bound.count(t.name)) {
            return unsupported("tensor '" + std::string(t.name) + "' is not part of the '" + std::string(architecture_->name) +
                               "' architecture as this runtime runs it (computing without it would give other results)");
        }
    }
    return Status::Ok();
}

}  // namespace h2o
