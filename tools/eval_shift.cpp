#include "eval_shift.h"

#include <algorithm>

#include "h2o/h2o_experimental.h"

namespace h2o_tools {

namespace {
// Stream tokens a shift keeps in front: BOS.
constexpr uint64_t kKeep = 1;
}  // namespace

void make_shift_params(h2o_session_params *p, uint32_t budget) {
    make_caller_evicted_window(p, budget);
    p->position_rolling = 1;
    p->kv_overflow = H2O_KV_OVERFLOW_EVICT;
}

h2o_status decode_shifting(h2o_session *session, const int32_t *tokens, size_t n) {
    h2o_kv_usage usage;
    usage.struct_size = sizeof usage;
    for (size_t done = 0; done < n;) {
        h2o_status st = h2o_session_get_kv_usage(session, &usage);
        if (st != H2O_OK) return st;
        if (usage.n_held >= uint64_t{usage.capacity}) {
            // llama.cpp: n_discard = n_left / 2, n_left = n_past - n_keep; pinned tokens stay.
            const uint64_t left = usage.n_held - std::min(usage.n_held, kKeep + usage.n_pinned);
            st = h2o_experimental_session_discard(session, kKeep, left / 2);
            if (st != H2O_OK) return st;
            if ((st = h2o_session_get_kv_usage(session, &usage)) != H2O_OK) return st;
        }
        // What fits without the session evicting by itself (at least one token: a cache of
        // pinned tokens only leaves it that).
        const uint64_t capacity = usage.capacity;
        const size_t room = static_cast<size_t>(std::max<uint64_t>(1, capacity - std::min(capacity, usage.n_held)));
        const size_t piece = std::min(n - done, room);
        if ((st = h2o_session_decode(session, tokens + done, piece)) != H2O_OK) return st;
        done += piece;
    }
    return H2O_OK;
}

h2o_status decode_as(uint32_t policy, h2o_session *session, const int32_t *tokens, size_t n) {
    return policy == kShiftPolicy ? decode_shifting(session, tokens, n) : h2o_session_decode(session, tokens, n);
}

}  // namespace h2o_tools
