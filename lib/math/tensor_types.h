// Element types of weight tensors, numbered as in the GGUF format (ggml type ids), with their
// block geometry. One home for "how many bytes does a row of N elements take".
#pragma once

#include <cstddef>
#include <cstdint>

namespace h2o {

enum class TensorType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q5_0 = 6,  // read from files only: the model widens it to Q8_0 (Model::bind)
    Q8_0 = 8,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    I32 = 26,  // token ids and positions in backend memory; never a weight
};

struct TensorTypeTraits {
    const char *name;
    uint32_t block_elements;  // elements per block (1 for plain floats)
    uint32_t block_bytes;     // bytes per block
};

// Geometry of a type this runtime knows, or nullptr for any other ggml type id.
inline const TensorTypeTraits *tensor_type_traits(uint32_t ggml_type) {
    static const TensorTypeTraits f32{"F32", 1, 4}, f16{"F16", 1, 2}, q4_0{"Q4_0", 32, 18}, q5_0{"Q5_0", 32, 22}, q8_0{"Q8_0", 32, 34},
        q4_k{"Q4_K", 256, 144}, q5_k{"Q5_K", 256, 176}, q6_k{"Q6_K", 256, 210}, i32{"I32", 1, 4};
    switch (ggml_type) {
        case 0:
            return &f32;
        case 1:
            return &f16;
        case 2:
            return &q4_0;
        case 6:
            return &q5_0;
        case 8:
            return &q8_0;
        case 12:
            return &q4_k;
        case 13:
            return &q5_k;
        case 14:
            return &q6_k;
        case 26:
            return &i32;
        default:
            return nullptr;
    }
}

inline const TensorTypeTraits &traits(TensorType type) { return *tensor_type_traits(static_cast<uint32_t>(type)); }

inline const char *type_name(TensorType type) { return traits(type).name; }

// The types a model's weights may have: those the CPU backend, the reference, runs. Other
// backends run a subset (each backend's supports() says which).
constexpr TensorType kWeightTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::Q4_0, TensorType::Q8_0,
                                       TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

constexpr bool is_weight_type(TensorType type) {
    for (TensorType t : kWeightTypes) {
        if (t == type) return true;
    }
    return false;
}

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(TensorType type, int64_t n) {
    const TensorTypeTraits &t = traits(type);
    return static_cast<size_t>(n / t.block_elements) * t.block_bytes;
}

}  // namespace h2o
