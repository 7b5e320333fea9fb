#include "eval_oracle.h"

#include <limits>

#include "h2o/h2o_experimental.h"

namespace h2o_tools {

void make_oracle_params(h2o_session_params *p, uint32_t budget) { make_caller_evicted_window(p, budget); }

Oracle::Oracle(h2o_model *model, const h2o_session_params &recording) : model_(model), params_(recording) {
    // A cache of n_ctx slots, which a sequence never fills: what a full cache computes (a default
    // session's, endless but not yet evicting, since a cache that cannot evict gathers nothing),
    // with TOVA's statistics holding each query's weights.
    params_.kv_policy = H2O_KV_TOVA;
    params_.kv_budget = params_.n_ctx;
    params_.kv_overflow = H2O_KV_OVERFLOW_EVICT;
    h2o_session_params_set_experimental(&params_, H2O_EXP_KV_LAYER_SLOPE, 0.0);
    h2o_session_params_set_experimental(&params_, H2O_EXP_KV_HEAD_SHARE, 0.0);
    h2o_session_params_set_experimental(&params_, H2O_EXP_KV_PROMPT_PROXY, 0.0);
    h2o_model_info info;
    info.struct_size = sizeof info;
    h2o_model_get_info(model, &info);
    cells_ = size_t{info.n_layer} * info.n_head_kv;
}

Oracle::~Oracle() { h2o_session_free(recorder_); }

h2o_status Oracle::fail(h2o_status st, const h2o_session *session) {
    error_ = std::string("oracle: ") + (session ? h2o_session_last_error(session) : h2o_last_error()) + " (" + h2o_status_string(st) + ")";
    return st;
}

h2o_status Oracle::record(const std::vector<int32_t> &sequence) {
    h2o_status st = recorder_ ? h2o_session_reset(recorder_) : h2o_session_create(model_, &params_, &recorder_);
    if (st != H2O_OK) return fail(st, recorder_);
    slots_ = cells_ * params_.n_ctx;
    index_.resize(slots_);
    attention_.resize(slots_);
    n_ = sequence.size();
    future_.assign(cells_ * n_ * n_, 0.0f);
    // Row q: the weights query q gives the tokens it sees (the last token predicts nothing).
    for (size_t q = 0; q + 1 < n_; ++q) {
        if ((st = h2o_session_decode(recorder_, &sequence[q], 1)) != H2O_OK) return fail(st, recorder_);
        st = h2o_experimental_session_kv_attention(recorder_, index_.data(), attention_.data(), slots_);
        if (st != H2O_OK) return fail(st, recorder_);
        for (size_t c = 0; c < cells_; ++c) {
            float *row = &future_[(c * n_ + q) * n_];
            for (size_t s = c * params_.n_ctx; s < (c + 1) * params_.n_ctx; ++s) {
                if (index_[s] >= 0) row[index_[s]] = attention_[s];
            }
        }
    }
    // Suffix sums over the queries: row t becomes the attention from queries t and on.
    for (size_t c = 0; c < cells_; ++c) {
        for (size_t t = n_ - 1; t-- > 0;) {
            float *row = &future_[(c * n_ + t) * n_];
            const float *next = row + n_;
            for (size_t i = 0; i < n_; ++i) row[i] += next[i];
        }
    }
    return H2O_OK;
}

h2o_status Oracle::make_room(h2o_session *session, size_t t) {
    h2o_kv_usage usage;
    usage.struct_size = sizeof usage;
    h2o_status st = h2o_session_get_kv_usage(session, &usage);
    if (st != H2O_OK) return fail(st, session);
    if (usage.n_held < uint64_t{usage.capacity}) return H2O_OK;
    const size_t slots = cells_ * usage.capacity;
    index_.resize(slots);
    if ((st = h2o_experimental_session_kv_attention(session, index_.data(), nullptr, slots)) != H2O_OK) return fail(st, session);
    std::vector<int64_t> victims(cells_);
    for (size_t c = 0; c < cells_; ++c) {
        const float *row = &future_[(c * n_ + t) * n_];
        float least = std::numeric_limits<float>::infinity();
        int64_t victim = -1;
        for (size_t s = c * usage.capacity; s < (c + 1) * usage.capacity; ++s) {
            const int64_t i = index_[s];
            // Ties go to the oldest token, as the policies' do.
            if (i >= 0 && (row[i] < least || (row[i] == least && i < victim))) {
                least = row[i];
                victim = i;
            }
        }
        victims[c] = victim;
    }
    if ((st = h2o_experimental_session_evict(session, victims.data(), cells_)) != H2O_OK) return fail(st, session);
    return H2O_OK;
}

}  // namespace h2o_tools
