// h2o-eval --retention: what a KV cache kept of a passage, measured by reading it again.
//
// Each trial is BOS + a passage of real text + N tokens of other text + the same passage again;
// the score is the mean NLL of the repeated passage. A small model copies text it can still see,
// so the repeat's NLL falls to nearly nothing when the cache kept the first passage and stays at
// the unseen level when it did not. Every configuration runs with the first passage added
// normally, pinned (H2O_TEXT_PIN), and as a retention span of each minimum share asked for
// (h2o_session_add_span_text); two references bound the scores: the full cache (which
// keeps everything, but past the model's trained context its positions are out of range) and
// "unseen", the full cache without the first passage.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "h2o/h2o.h"

namespace h2o_tools {

struct RetentionOptions {
    std::vector<uint32_t> policies, budgets;
    std::vector<uint32_t> lengths;  // N: tokens of other text between the two passages
    uint32_t trials = 8;
    uint32_t passage_tokens = 24;
    std::vector<float> min_shares;  // the passage as a retention span of each of these shares
    uint32_t jobs = 1;
    bool json = false;
    // The session parameters of a (policy, budget) pair: the tool's recent window, sinks,
    // horizon, KV type, threads and rolling; n_ctx is set here.
    std::function<h2o_session_params(uint32_t policy, uint32_t budget)> session_params;
};

// Runs the evaluation on `text` and prints a table or JSON lines; returns the exit code.
int run_retention(h2o_model *model, const std::string &text, const RetentionOptions &options);

}  // namespace h2o_tools
