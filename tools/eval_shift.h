// h2o-eval's `shift`: llama.cpp's context shift, the strategy most runtimes use when a context
// fills, as a baseline for the eviction policies. A cache of `budget` slots takes tokens until it
// cannot take the next ones; then BOS is kept (llama.cpp's --keep 0 keeps BOS), the older half of
// the rest is discarded at once and the newer half moves back to the front, its keys rotated to
// their new positions (h2o_experimental_session_discard). The cache holds between half and all of
// its slots, where a window holds all of them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "eval_policies.h"
#include "h2o/h2o.h"

namespace h2o_tools {

// A session for `shift` over `budget` slots: a window with rolling positions, which
// decode_shifting keeps from ever evicting by itself. Call after the tool's other settings.
void make_shift_params(h2o_session_params *p, uint32_t budget);

// h2o_session_decode for a session of make_shift_params: the tokens go in pieces that fit the
// cache, with a shift before each piece that would not.
h2o_status decode_shifting(h2o_session *session, const int32_t *tokens, size_t n);

// h2o_session_decode, or decode_shifting for `shift`.
h2o_status decode_as(uint32_t policy, h2o_session *session, const int32_t *tokens, size_t n);

}  // namespace h2o_tools
