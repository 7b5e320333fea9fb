// Random-weight Llama models of any shape, written as GGUF, so benchmarks and tests never depend
// on downloads. The vocabulary is synthetic too (byte tokens plus made-up pieces).
#pragma once

#include <cstdint>
#include <string>

#include "status.h"
#include "tensor_types.h"

namespace h2o {

struct SyntheticModelSpec {
    int n_embd = 768;
    int n_layer = 12;
    int n_head = 12;
    int n_head_kv = 12;
    int n_ff = 2048;
    int n_vocab = 32000;
    int n_ctx = 2048;
    TensorType type = TensorType::Q4_0;  // matrices; norms stay F32
    bool tied_output = false;
    uint64_t seed = 1;
};

Status write_synthetic_model(const SyntheticModelSpec &spec, const std::string &path);

}  // namespace h2o
