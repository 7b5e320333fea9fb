// The policies h2o-eval compares: the library's (h2o_kv_policy) and two of its own, which are
// not policies of the library: `shift`, llama.cpp's context shift (eval_shift.h), and `oracle`,
// eviction that knows the future (eval_oracle.h).
#pragma once

#include <cstdint>
#include <string>

#include "h2o/h2o.h"

namespace h2o_tools {

// Their ids, outside the library's.
constexpr uint32_t kShiftPolicy = 0x10000u;
constexpr uint32_t kOraclePolicy = 0x10001u;

// A policy's name, h2o-eval's own included; and back (false for an unknown name).
const char *eval_policy_name(uint32_t policy);
bool parse_eval_policy(const std::string &name, uint32_t *out);
// Every name, for help texts.
std::string eval_policy_names();

// The session both run on: a window of `budget` slots, the same in every (layer, kv head), which
// they evict from themselves (h2o_experimental_session_discard and _evict need equal cells).
void make_caller_evicted_window(h2o_session_params *p, uint32_t budget);

}  // namespace h2o_tools
