#include "llama_graph.h"

namespace h2o {

Status LlamaGraph::create(const Model &model, const RotarySpec &rope, Backend &backend, int max_batch, int position_sets,
                          std::unique_ptr<LlamaGraph> *out) {
    std::unique_ptr<LlamaGraph> graph(new LlamaGraph(model, rope, backend, max_batch, position_sets));
    H2O_TRY(graph->adopt_weights());
    H2O_TRY(graph->alloc_activations());
    *out = std::move(graph);
    return Status::Ok();
}

Status LlamaGraph::adopt_weights() {
    auto adopt = [&](const WeightView &w, Tensor *t) {
        if (!w.present()) return Status::Ok();  // an optional tensor the model lacks: rows stay 0
        H2O_TRY(backend_.adopt_weight(w.type, w.cols, w.rows, w.data, t));
        if (backend_.weight_is_copy(*t)) model_.release_weight_pages(w);  // one copy in memory, not two
        return Status::Ok();
    };
    const ModelWeights &w = model_.weights();
    H2O_TRY(adopt(w.token_embd, &token_embd_));
    H2O_TRY(adopt(w.output_norm, &output_norm_));
    if (w.output.data == w.token_embd.data) {
        output_ = token_embd_;
    } else {
        H2O_TRY(adopt(w.output, &output_));
    }
    layers_.resize(w.layers.size());
    for (size_t l = 0; l < w.layers.size(); ++l) {
        const LayerWeights &src = w.layers[l];
        LayerTensors &dst = layers_[l];
        H2O_TRY(adopt(src.attn_norm, &dst.attn_norm));
        H2O_TRY(adopt(src.wq, &dst.wq));
        H2O_TRY(adopt(src.wk, &dst.wk));
        H2O_TRY(adopt(src.wv, &dst.wv));
        H2O_TRY(adopt(src.wo, &dst.wo));
        H2O_TRY(adopt(src.ffn_norm, &dst.ffn_norm));
        H2O_TRY(adopt(src.w_gate, &dst.w_gate));
        H2O_TRY(adopt(src.w_up, &dst.w_up));
        H2O_TRY(adopt(src.w_down, &dst.w_down));
        H2O_TRY(adopt(src.bq, &dst.bq));
        H2O_TRY(adopt(src.bk, &dst.bk));
        H2O_TRY(adopt(src.bv, &dst.bv));
        H2O_TRY(adopt(src.bo, &dst.bo));
        H2O_TRY(adopt(src.q_norm, &dst.q_norm));
        H2O_TRY(adopt(src.k_norm, &dst.k_norm));
        H2O_TRY(adopt(src.post_attn_norm, &dst.post_attn_norm));
        H2O_TRY(adopt(src.post_ffn_norm, &dst.post_ffn_norm));
    }
    return Status::Ok();
}

std::vector<LlamaGraph::ActivationSpec> LlamaGraph::activation_specs(const ModelShape &s, int max_batch, int position_sets) {
    const int64_t q_dim = s.q_dim(), kv_dim = s.kv_dim();
    const int64_t n = max_batch;
    return {
        {&LlamaGraph::ids_, TensorType::I32, 1, n},          {&LlamaGraph::positions_, TensorType::I32, 1, n * position_sets},
        {&LlamaGraph::x_, TensorType::F32, s.n_embd, n},     {&LlamaGraph::xn_, TensorType::F32, s.n_embd, n},
        {&LlamaGraph::q_, TensorType::F32, q_dim, n},        {&LlamaGraph::k_, TensorType::F32, kv_dim, n},
        {&LlamaGraph::v_, TensorType::F32, kv_dim, n},       {&LlamaGraph::attn_, TensorType::F32, q_dim, n},
        {&LlamaGraph::proj_, TensorType::F32, s.n_embd, n},  {&LlamaGraph::gate_, TensorType::F32, s.n_ff, n},
        {&LlamaGraph::up_, TensorType::F32, s.n_ff, n},      {&LlamaGraph::logits_, TensorType::F32, s.n_vocab, 1},
        {&LlamaGraph::greedy_token_, TensorType::I32, 1, 1},
    };
}

size_t LlamaGraph::activation_bytes(const ModelShape &shape, int max_batch, int position_sets) {
    size_t total = 0;
    for (const ActivationSpec &a : activation_specs(shape, max_batch, position_sets))
        total += row_bytes(a.type, a.cols) * static_cast<size_t>(a.rows);
    return total;
}

Status LlamaGraph::alloc_activations() {
    for (const ActivationSpec &a : activation_specs(shape_, max_batch_, position_sets_))
        H2O_TRY(backend_.alloc(a.type, a.cols, a.rows, &(this->*a.member)));
    return Status::Ok();
}

Status LlamaGraph::evaluate(const int32_t *tokens, const int32_t *positions, const KvConfig &kv, int n, int64_t first_index, uint8_t tag) {
    const ModelShape &s = shape_;
    Backend &be = backend_;
    const bool per_layer = kv.positions_per_layer(), per_kv_head = kv.positions_per_kv_head();
    if (kv.position_sets() > position_sets_) return make_error(H2O_ERR_INTERNAL, "graph: more position sets than it was created for");
    const int64_t layer_positions = static_cast<int64_t>(n) * (per_kv_head ? s.n_head_kv : 1);
    H2O_TRY(be.upload(ids_, tokens, sizeof(int32_t) * n));
    H2O_TRY(be.upload(positions_, positions, sizeof(int32_t) * n * kv.position_sets()));
    AttentionBatch batch{n, first_index, positions_.slice_rows(0, layer_positions), tag, per_kv_head};

    H2O_TRY(be.get_rows(x_, token_embd_, ids_, n));
    if (s.embedding_scale != 1.0f) H2O_TRY(be.scale(x_, s.embedding_scale, n));
    for (int l = 0; l < s.n_layer; ++l) {
        const LayerTensors &w = layers_[l];
        // A local layer rotates by its own base, and its tokens are never pinned nor in a span:
        // it keeps its window whatever the retention (KvConfig::layer_window).
        const bool local = s.is_local(l);
        const ModelShape &layer_shape = local ? local_shape_ : s;
        batch.tag = local ? 0 : tag;
        H2O_TRY(be.rms_norm(xn_, x_, w.attn_norm, n, s.rms_eps));
        const Tensor qkv[] = {q_, k_, v_}, qkv_weights[] = {w.wq, w.wk, w.wv};
        H2O_TRY(be.matmuls(qkv, qkv_weights, 3, xn_, n));
        H2O_TRY(add_bias(q_, w.bq, n));
        H2O_TRY(add_bias(k_, w.bk, n));
        H2O_TRY(add_bias(v_, w.bv, n));
        if (w.q_norm.rows != 0) {
            // Each head of q and k normalised on its own (Qwen3): the rows seen as one per head.
            H2O_TRY(be.rms_norm(q_.with_cols(s.head_dim), q_.with_cols(s.head_dim), w.q_norm, n * s.n_head, s.rms_eps));
            H2O_TRY(be.rms_norm(k_.with_cols(s.head_dim), k_.with_cols(s.head_dim), w.k_norm, n * s.n_head_kv, s.rms_eps));
        }
        if (per_layer) batch.positions = positions_.slice_rows(l * layer_positions, layer_positions);
        H2O_TRY(be.rope(q_, k_, batch.positions, n, layer_shape, per_kv_head));
        H2O_TRY(be.attention(attn_, q_, k_, v_, l, batch, layer_shape));
        H2O_TRY(be.matmul(proj_, w.wo, attn_, n));
        H2O_TRY(add_bias(proj_, w.bo, n));
        if (s.post_norms) H2O_TRY(be.rms_norm(proj_, proj_, w.post_attn_norm, n, s.rms_eps));
        H2O_TRY(be.add(x_, proj_, n));

        H2O_TRY(be.rms_norm(xn_, x_, w.ffn_norm, n, s.rms_eps));
        const Tensor gate_up[] = {gate_, up_}, gate_up_weights[] = {w.w_gate, w.w_up};
        H2O_TRY(be.matmuls(gate_up, gate_up_weights, 2, xn_, n));
        H2O_TRY(s.gelu ? be.geglu(gate_, up_, n) : be.swiglu(gate_, up_, n));
        H2O_TRY(be.matmul(proj_, w.w_down, gate_, n));
        if (s.post_norms) H2O_TRY(be.rms_norm(proj_, proj_, w.post_ffn_norm, n, s.rms_eps));
        H2O_TRY(be.add(x_, proj_, n));
    }
    // Only the last token's logits are needed: generation samples from them, and evaluation
    // feeds one token at a time.
    const Tensor last = x_.slice_rows(n - 1, 1);
    const Tensor last_norm = xn_.slice_rows(0, 1);
    H2O_TRY(be.rms_norm(last_norm, last, output_norm_, 1, s.rms_eps));
    H2O_TRY(be.matmul(logits_, output_, last_norm, 1));
    return s.output_softcap != 0.0f ? be.softcap(logits_, s.output_softcap, 1) : Status::Ok();
}

Status LlamaGraph::add_bias(const Tensor &out, const Tensor &bias, int n) {
    return bias.rows == 0 ? Status::Ok() : backend_.add_bias(out, bias, n);
}

Status LlamaGraph::download_logits(float *host_logits) { return backend_.download(logits_, host_logits, logits_.bytes()); }

Status LlamaGraph::greedy_token(int32_t *token) {
    H2O_TRY(backend_.argmax(greedy_token_, logits_, 1));
    return backend_.download(greedy_token_, token, sizeof(int32_t));
}

}  // namespace h2o
