// h2o-eval's `oracle`: an offline eviction reference that knows the future, to say how far the
// policies are from the best eviction there is. Per chunk, a first pass with a full cache records
// for every (layer, kv head) the attention each token receives from each later query; the second
// pass, under the same budget as the policies, evicts before each token, from each (layer, kv
// head), the held token that will receive the least attention from the queries still to come
// (their sum in the full-cache pass: Belady's rule for attention). Its record is a chunk's
// square per (layer, kv head), so it runs in chunk mode, token by token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "eval_policies.h"
#include "h2o/h2o.h"

namespace h2o_tools {

// The second pass's session: a window of `budget` slots (which the oracle keeps from evicting by
// itself), the same slots in every (layer, kv head). Call after the tool's other settings.
void make_oracle_params(h2o_session_params *p, uint32_t budget);

class Oracle {
public:
    // `recording`: the first pass's settings (n_ctx, threads, KV type), from which the oracle
    // makes a full cache that gathers attention.
    Oracle(h2o_model *model, const h2o_session_params &recording);
    ~Oracle();
    Oracle(const Oracle &) = delete;
    Oracle &operator=(const Oracle &) = delete;

    // The first pass over a sequence (BOS first). On failure, error() says why.
    h2o_status record(const std::vector<int32_t> &sequence);
    // Before `session` decodes token t of the recorded sequence: when its cache is full, evicts
    // from each (layer, kv head) the held token with the least attention from queries t and on.
    h2o_status make_room(h2o_session *session, size_t t);
    const std::string &error() const { return error_; }

private:
    h2o_status fail(h2o_status st, const h2o_session *session);

    h2o_model *model_;
    h2o_session_params params_;
    h2o_session *recorder_ = nullptr;
    size_t cells_ = 0, slots_ = 0, n_ = 0;
    // future_[(cell * n_ + t) * n_ + i]: the attention token i receives from queries t.. n_ - 1.
    std::vector<float> future_;
    std::vector<int64_t> index_;
    std::vector<float> attention_;
    std::string error_;
};

}  // namespace h2o_tools
