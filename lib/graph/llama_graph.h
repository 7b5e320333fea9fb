// The forward pass of every architecture the runtime runs (architecture.h): the Llama block, with
// the projections' biases, the per-head norms of q and k and the rotary description where the
// model has them, and Gemma's variations of it (ModelShape). Written once against the Backend
// interface.
#pragma once

#include <memory>
#include <vector>

#include "backend.h"
#include "model.h"

namespace h2o {

class LlamaGraph {
public:
    // Adopts the model's weights into `backend` and allocates activations for batches of up to
    // max_batch tokens, with position_sets sets of positions each (KvConfig::position_sets). The
    // rotation is `rope` (the session's: Model::rotary_for_context). All memory is allocated here,
    // none during evaluate().
    static Status create(const Model &model, const RotarySpec &rope, Backend &backend, int max_batch, int position_sets,
                         std::unique_ptr<LlamaGraph> *out);

    // Runs n (1..max_batch) tokens whose stream indices start at first_index, with rotary
    // positions `positions`, retention tag `tag` in the KV cache (kv_make_tag: pinned tokens are
    // never evicted). positions holds n entries, or as kv says (KvConfig::positions_per_layer,
    // positions_per_kv_head; kv_batch_positions) n per layer, layer after layer, and within a
    // layer n per kv head (rolling ranks differ between cells that hold different numbers of
    // tokens). Afterwards download_logits copies the last token's logits to the host.
    Status evaluate(const int32_t *tokens, const int32_t *positions, const KvConfig &kv, int n, int64_t first_index, uint8_t tag);
    Status download_logits(float *host_logits);
    // The index of the largest of the last token's logits (ties: the smallest), computed where
    // the logits are: greedy sampling reads back 4 bytes instead of the logits.
    Status greedy_token(int32_t *token);

    int max_batch() const { return max_batch_; }
    // Bytes of the activations create() allocates for batches of max_batch tokens.
    static size_t activation_bytes(const ModelShape &shape, int max_batch, int position_sets);

private:
    struct ActivationSpec {
        Tensor LlamaGraph::*member;
        TensorType type;
        int64_t cols, rows;
    };
    static std::vector<ActivationSpec> activation_specs(const ModelShape &shape, int max_batch, int position_sets);

    struct LayerTensors {
        Tensor attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
        // Absent (rows 0) unless the model has them (LayerWeights).
        Tensor bq, bk, bv, bo, q_norm, k_norm, post_attn_norm, post_ffn_norm;
    };
    // out += bias, when the model has the bias.
    Status add_bias(const Tensor &out, const Tensor &bias, int n);

    LlamaGraph(const Model &model, const RotarySpec &rope, Backend &backend, int max_batch, int position_sets)
        : model_(model), shape_(model.shape()), backend_(backend), max_batch_(max_batch), position_sets_(position_sets) {
        shape_.rope = rope;
        local_shape_ = shape_;
        local_shape_.rope = shape_.local_rope;
    }
    Status adopt_weights();
    Status alloc_activations();

    const Model &model_;
    ModelShape shape_;        // the model's, with the session's rotation
    ModelShape local_shape_;  // shape_ with the local layers' rotation (ModelShape::local_rope)
    Backend &backend_;
    int max_batch_;
    int position_sets_;

    Tensor token_embd_, output_norm_, output_;
    std::vector<LayerTensors> layers_;

    // Activations, max_batch rows each.
    Tensor ids_;               // I32
    Tensor positions_;         // I32, max_batch per position set
    Tensor x_, xn_;            // residual stream and its normalised copy [n_embd]
    Tensor q_, k_, v_, attn_;  // [q_dim], [kv_dim], [kv_dim], [q_dim] (ModelShape)
    Tensor proj_;              // [n_embd]: output of attn_output / ffn_down before the residual add
    Tensor gate_, up_;         // [n_ff]
    Tensor logits_;            // [n_vocab], one row
    Tensor greedy_token_;      // I32, one: the argmax of logits_
};

}  // namespace h2o
