// The small Gemma 3 the session tests run: two local layers (8-token window) to every global one.
#pragma once

#include <string>

#include "doctest/doctest.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace h2o_test {

// Writes it to a temporary file `name` and returns the path: six layers (2 and 5 global), four
// query heads of 32 dimensions over n_head_kv kv heads, F32, a 320-token synthetic vocabulary.
inline std::string write_small_gemma3(const char *name, int n_head_kv = 1) {
    h2o::SyntheticModelSpec s;
    s.architecture = "gemma3";
    s.type = h2o::TensorType::F32;
    s.n_embd = 64;
    s.n_layer = 6;
    s.n_head = 4;
    s.n_head_kv = n_head_kv;
    s.head_dim = 32;
    s.n_ff = 128;
    s.n_vocab = 320;
    s.tied_output = true;
    s.embedding_scale = 0.125f;
    s.sliding_window = 8;
    s.sliding_window_pattern = 3;
    const std::string path = temp_path(name);
    REQUIRE(h2o::write_synthetic_model(s, path).ok());
    return path;
}

}  // namespace h2o_test
