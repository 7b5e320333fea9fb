// Re-encodes the weights of a GGUF model in another type (the engine of h2o-quantize).
//
// Which type each tensor gets:
//   - Tensors of one dimension (norm weights) are copied unchanged.
//   - F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K: every other tensor gets that type (what llama.cpp's
//     quantizer calls --pure). general.file_type becomes llama.cpp's LLAMA_FTYPE for it; for the
//     single K types that is the "_S" mix of the same base type (Q4_K_S = 14, Q5_K_S = 16), the
//     closest value llama.cpp has (its own Q4_K_S also raises a few tensors to Q5_K).
//   - Q4_K_M (file_type 15), llama.cpp's recipe for Llama: Q4_K, except Q6_K for output.weight,
//     for attn_v.weight and ffn_down.weight of the layers where llama.cpp's use_more_bits() holds
//     (the first and last eighth of the layers and every third in between), and for
//     token_embd.weight when the model has no output.weight (tied embeddings: it is the output
//     projection too). A separate token_embd.weight stays at Q4_K, as llama.cpp does.
// A tensor whose row length (ne[0]) is not a multiple of the chosen type's block falls back to
// the nearest type that fits: Q4_K -> Q4_0 (the same 4.5 bits per weight); Q5_K and Q6_K ->
// Q8_0 (no 5- or 6-bit type with 32-element blocks exists here; llama.cpp also sends Q6_K to
// Q8_0); and to F16 if the row is not a multiple of 32 either. A tensor already in the chosen
// type is copied bit for bit, never requantized.
//
// Metadata is copied unchanged and in order except general.file_type (set, or added at the end
// when missing); tensor order and the file's alignment are kept. Input tensors of any type this
// runtime reads are dequantized first, so a quantized model can be converted again (at the cost
// of a second rounding).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "status.h"
#include "tensor_types.h"

namespace h2o {

enum class QuantPreset {
    F16,
    Q8_0,
    Q4_0,
    Q4_K,
    Q5_K,
    Q6_K,
    Q4_K_M
};

// "F16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M" (exact, upper case); false otherwise.
bool parse_quant_preset(std::string_view name, QuantPreset *out);
const char *quant_preset_name(QuantPreset preset);
// The names parse_quant_preset accepts, comma-separated, for messages.
const char *quant_preset_names();
// llama.cpp's general.file_type (LLAMA_FTYPE_*) for a preset: F16 1, Q4_0 2, Q8_0 7, Q4_K 14,
// Q4_K_M 15, Q5_K 16, Q6_K 18.
uint32_t llama_file_type(QuantPreset preset);

struct TensorQuantReport {
    std::string name;
    std::vector<int64_t> shape;  // ne[0] first (the row length)
    TensorType type_in = TensorType::F32;
    TensorType wanted = TensorType::F32;    // what the preset asked for
    TensorType type_out = TensorType::F32;  // what was written (differs from wanted on fallback)
    bool copied = false;                    // bytes copied unchanged (1-D, or already that type)
    // RMS of (written - input) over RMS of the input, both as dequantized floats; 0 when copied.
    double rel_rms_error = 0.0;
    uint64_t bytes_in = 0, bytes_out = 0;

    bool fell_back() const { return type_out != wanted; }
};

struct QuantizeReport {
    std::vector<TensorQuantReport> tensors;
    uint64_t tensor_bytes_in = 0, tensor_bytes_out = 0;
    uint64_t file_bytes_in = 0, file_bytes_out = 0;
    uint32_t file_type = 0;  // the general.file_type written
};

struct QuantizeOptions {
    QuantPreset preset = QuantPreset::Q4_K_M;
    int n_threads = 0;  // 0: one per hardware thread
    // Called after each tensor, in file order (for progress output); may be empty.
    std::function<void(const TensorQuantReport &)> on_tensor;
};

// The type the preset gives a tensor of this name and shape, before any fallback. n_layer is the
// model's layer count and tied_output whether it lacks output.weight (both matter for Q4_K_M).
TensorType preset_tensor_type(QuantPreset preset, std::string_view name, uint32_t n_dims, int n_layer, bool tied_output,
                              TensorType type_in);
// The type actually written for a row length: `wanted`, or its fallback (see above).
TensorType fallback_type(TensorType wanted, int64_t row_length);

// Reads in_path, writes out_path (through a temporary file and a rename, so a failure never leaves
// a partial file there). Errors: H2O_ERR_INVALID_ARGUMENT (the same path for input and output),
// the GGUF reader's errors for the input (H2O_ERR_IO, H2O_ERR_MODEL_FORMAT, H2O_ERR_UNSUPPORTED),
// H2O_ERR_UNSUPPORTED for a tensor type that cannot be converted, H2O_ERR_IO when writing (a
// missing or read-only output folder is found before any tensor is converted).
Status quantize_model(const std::string &in_path, const std::string &out_path, const QuantizeOptions &options, QuantizeReport *report);

}  // namespace h2o
