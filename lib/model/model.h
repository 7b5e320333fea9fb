// A loaded model of one of the architectures the graph runs (architecture.h): hyper-parameters
// and weight descriptors validated against the GGUF file, plus the tokenizer. Immutable after
// load, so many sessions may share it across threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "architecture.h"
#include "backend.h"
#include "gguf.h"
#include "prefix_cache.h"
#include "quant.h"
#include "tokenizer.h"

namespace h2o {

// A weight tensor as stored in the mapped file; data is null for an optional tensor the file
// does not have (present()).
struct WeightView {
    std::string name;
    TensorType type = TensorType::F32;
    int64_t cols = 0;  // row length
    int64_t rows = 0;
    const void *data = nullptr;

    bool present() const { return data != nullptr; }
};

struct LayerWeights {
    WeightView attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
    // As the architecture has them (ArchitectureSpec), else absent: the projections' biases and
    // the per-head norms of q and k.
    WeightView bq, bk, bv, bo, q_norm, k_norm;
    // Gemma's norms of the attention's and the feed-forward's outputs (ModelShape::post_norms).
    WeightView post_attn_norm, post_ffn_norm;

    // Every tensor of the layer, absent ones included (for walking them all).
    std::vector<const WeightView *> all() const {
        return {&attn_norm, &wq, &wk, &wv, &wo,     &ffn_norm, &w_gate,         &w_up,         &w_down,
                &bq,        &bk, &bv, &bo, &q_norm, &k_norm,   &post_attn_norm, &post_ffn_norm};
    }
};

struct ModelWeights {
    WeightView token_embd, output_norm, output;  // output aliases token_embd when tied
    std::vector<LayerWeights> layers;
};

// A caller's load-progress callback (h2o_progress_callback); none when callback is null.
struct LoadProgress {
    int (*callback)(float fraction, void *user_data) = nullptr;
    void *user_data = nullptr;
    // Reports a fraction; false when the caller asked to stop.
    bool report(float fraction) const { return !callback || callback(fraction, user_data) == 0; }
};

class Model {
public:
    // Loads and validates a GGUF model, then reads every weight page once (reporting
    // progress by bytes). tokenizer_path: optional sentencepiece .model file that replaces the
    // embedded vocabulary (it must have the model's vocabulary size). Every error message names
    // the file.
    // prefix_cache_bytes: capacity of the model's prefix cache (0: none); prefix_cache_policy:
    // which of its entries go first when it is full.
    static Status load(const std::string &path, const std::string &tokenizer_path, std::unique_ptr<Model> *out,
                       const LoadProgress &progress = {}, uint64_t prefix_cache_bytes = 0,
                       CachePolicy prefix_cache_policy = CachePolicy::kReuse);

    const ModelShape &shape() const { return shape_; }
    const ArchitectureSpec &architecture() const { return *architecture_; }
    const ModelWeights &weights() const { return weights_; }
    const Tokenizer &tokenizer() const { return *tokenizer_; }
    uint32_t n_ctx_train() const { return n_ctx_train_; }
    // The rotation a session of n_ctx tokens uses: ModelShape::rope, but with LongRoPE's long
    // factors when the model has them and n_ctx is beyond its original context (as llama.cpp
    // chooses by the context size).
    RotarySpec rotary_for_context(int64_t n_ctx) const;
    uint64_t n_params() const { return n_params_; }
    uint64_t weight_bytes() const { return weight_bytes_; }
    // The distinct types of the weight tensors, in the order first met: what a backend must run.
    const std::vector<TensorType> &weight_types() const { return weight_types_; }
    const std::string &name() const { return name_; }
    // tokenizer.chat_template from the file ("" when absent).
    const std::string &chat_template() const { return chat_template_; }
    // A 64-bit hash of the tensor table (names, types, shapes), the vocabulary (pieces, types)
    // and what the graph computes with beyond them (architecture, heads, rotary description,
    // epsilon): session snapshots carry it so that another model's snapshot is refused.
    uint64_t fingerprint() const { return fingerprint_; }
    // For a backend that copied a weight (Backend::weight_is_copy): the OS may drop the file's pages
    // of it; they are read from the file again if another session needs them.
    void release_weight_pages(const WeightView &w) const {
        file_->release_pages(w.data, row_bytes(w.type, w.cols) * static_cast<size_t>(w.rows));
    }
    // Shared by the model's sessions; internally synchronised, so usable through a const model.
    PrefixCache &prefix_cache() const { return *prefix_cache_; }

private:
    Model() = default;
    Status read_hyper_parameters();
    // The rotary description (ModelShape::rope) from the metadata, but for the frequency factors
    // (a tensor: bind_weights).
    Status read_rotary(uint32_t head_dim);
    // Gemma's block (ArchitectureSpec::gemma_block): the embedding scale, soft-capping, the query
    // scale and the local layers with their window and rotation, into shape_.
    Status read_gemma_block();
    Status bind_weights();
    Status bind_layer(int layer);
    // rope_freqs.weight, or LongRoPE's short factors, into shape_.rope.freq_factors, and LongRoPE's
    // long factors, as the architecture has them.
    Status bind_rope_freqs();
    Status bind_frequency_factors(TensorPresence presence, const std::string &name, std::vector<float> *out);
    // Refuses a file with a tensor the graph would not use (computing without it would be wrong).
    Status check_every_tensor_bound() const;
    // The metadata key of the architecture's option (prefix "qwen2." and so on).
    std::string key(const char *option) const { return std::string(architecture_->name) + "." + option; }
    // Touches every page of the weights, so the first token does not wait for the disk.
    Status prefetch_weights(const LoadProgress &progress) const;
    uint64_t compute_fingerprint() const;
    Status bind(const std::string &name, int64_t cols, int64_t rows, WeightView *out);
    // bind() as `presence` says: an Absent tensor is left unbound (check_every_tensor_bound
    // refuses it if the file has it), an Optional one bound when the file has it.
    Status bind_as(TensorPresence presence, const std::string &name, int64_t cols, int64_t rows, WeightView *out);
    // Rows [first_row, first_row + rows) of a bound matrix, as a matrix of their own (the parts
    // of a fused projection: they are consecutive rows of whole blocks in the file).
    static WeightView rows_of(const WeightView &matrix, int64_t first_row, int64_t rows);
    // Points *view at a Q8_0 copy of Q5_0 tensor t (widen_q5_0_to_q8_0: the same values), which the
    // model keeps.
    Status widen_to_q8_0(const GgufTensor &t, WeightView *view);

    std::unique_ptr<GgufFile> file_;
    std::unique_ptr<Tokenizer> tokenizer_;
    const ArchitectureSpec *architecture_ = nullptr;
    ModelShape shape_;
    ModelWeights weights_;
    uint32_t n_ctx_train_ = 0;
    std::vector<float> long_rope_factors_;  // LongRoPE's factors beyond long_rope_from_ tokens of context
    uint32_t long_rope_from_ = 0;
    uint64_t n_params_ = 0;
    uint64_t weight_bytes_ = 0;
    std::vector<TensorType> weight_types_;
    std::vector<std::unique_ptr<BlockQ8_0[]>> widened_weights_;  // Q5_0 tensors as Q8_0 (widen_to_q8_0)
    uint64_t widened_file_bytes_ = 0;
    std::vector<std::string> bound_names_;  // the file's tensors the graph uses
    std::string name_;
    std::string chat_template_;
    uint64_t fingerprint_ = 0;
    std::unique_ptr<PrefixCache> prefix_cache_;
};

}  // namespace h2o
