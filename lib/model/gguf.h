// GGUF reader (v2 and v3, little-endian), memory-mapped. Every count, length, offset, shape and
// type is validated against the file size before use, so a truncated or hostile file yields a
// Status naming the problem instead of a crash or an allocation sized by an unchecked field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "status.h"
#include "tensor_types.h"

namespace h2o {

enum class GgufType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};

const char *gguf_type_name(GgufType type);

class GgufCursor;  // bounds-checked reader over the file bytes (gguf.cpp)

// One metadata value. Scalars are decoded; strings and arrays point into the mapped file.
struct GgufValue {
    GgufType type = GgufType::UINT8;
    // Scalars (integers widen into i64/u64 as fits; floats into f64; bool into u64 0/1).
    int64_t i64 = 0;
    uint64_t u64 = 0;
    double f64 = 0.0;
    std::string_view str;                         // STRING
    GgufType array_type = GgufType::UINT8;        // ARRAY: element type (arrays of arrays are rejected)
    uint64_t array_size = 0;                      // ARRAY: element count
    const uint8_t *array_data = nullptr;          // ARRAY of fixed-size elements: first element
    std::vector<std::string_view> array_strings;  // ARRAY of STRING: the elements
};

struct GgufKeyValue {
    std::string_view key;
    GgufValue value;
};

struct GgufTensor {
    std::string_view name;
    TensorType type = TensorType::F32;
    uint32_t n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the row length (contiguous), as in ggml
    uint64_t offset = 0;           // from the start of the data section
    uint64_t n_bytes = 0;
    const uint8_t *data = nullptr;  // inside the mapping, aligned to the file's alignment

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
public:
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile &operator=(const GgufFile &) = delete;

    // Maps and parses a file. Errors: H2O_ERR_IO (cannot open, not a regular file, cannot map),
    // H2O_ERR_MODEL_FORMAT (malformed; the message names key/tensor/offset), H2O_ERR_UNSUPPORTED
    // (unknown tensor type id, GGUF version other than 2 and 3, big-endian file, array of
    // arrays). Messages begin with the path.
    static Status open(const std::string &path, std::unique_ptr<GgufFile> *out);
    // Parses a buffer the caller keeps alive (used by tests and fuzzing). Same errors.
    static Status parse(const uint8_t *data, size_t size, std::unique_ptr<GgufFile> *out);

    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    size_t file_size() const { return size_; }
    const uint8_t *file_data() const { return data_; }
    // Lets the OS drop the pages wholly inside [data, data + bytes) of the mapped file: nobody will
    // read them soon, and if anyone does they come back from the file (the mapping is read-only).
    // Does nothing for a parsed buffer, or for bytes outside the mapping.
    void release_pages(const void *data, size_t bytes) const;

    const std::vector<GgufKeyValue> &metadata() const { return kv_; }
    const std::vector<GgufTensor> &tensors() const { return tensors_; }

    const GgufValue *find(std::string_view key) const;
    const GgufTensor *find_tensor(std::string_view name) const;

    // Typed getters. Missing key: H2O_ERR_MODEL_FORMAT "missing metadata key 'k'" unless a
    // default is given through the *_or variants. Wrong type or out of range:
    // H2O_ERR_MODEL_FORMAT naming the key, the expected and the actual type.
    Status get_u32(std::string_view key, uint32_t *out) const;  // any integer type in range
    Status get_u32_or(std::string_view key, uint32_t fallback, uint32_t *out) const;
    Status get_f32(std::string_view key, float *out) const;  // FLOAT32 or FLOAT64
    Status get_f32_or(std::string_view key, float fallback, float *out) const;
    Status get_string(std::string_view key, std::string_view *out) const;
    Status get_bool_or(std::string_view key, bool fallback, bool *out) const;
    Status get_string_array(std::string_view key, std::vector<std::string_view> *out) const;
    Status get_f32_array(std::string_view key, std::vector<float> *out) const;    // FLOAT32 or FLOAT64
    Status get_i32_array(std::string_view key, std::vector<int32_t> *out) const;  // INT32 or UINT32 in range

private:
    GgufFile() = default;
    // The parse steps, in file order. Each validates what it reads against size_.
    Status parse_all();
    Status parse_header(GgufCursor &in, uint64_t *n_tensors, uint64_t *n_kv);
    Status parse_metadata(GgufCursor &in, uint64_t n_kv);
    Status parse_alignment();
    Status parse_tensor_infos(GgufCursor &in, uint64_t n_tensors);
    Status place_tensor_data(uint64_t header_end);

    const uint8_t *data_ = nullptr;
    size_t size_ = 0;
    void *mapping_ = nullptr;  // non-null when this object owns an mmap of size_ bytes
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    std::vector<GgufKeyValue> kv_;
    std::vector<GgufTensor> tensors_;
    std::unordered_map<std::string_view, size_t> kv_index_;      // key -> index in kv_
    std::unordered_map<std::string_view, size_t> tensor_index_;  // name -> index in tensors_
};

// Writes GGUF v3 files (synthetic models, the quantizer). Values are copied on add.
// The writer never produces a file the reader would reject: an invalid add (duplicate key or
// tensor name, bad shape, data size that does not match the shape, bad alignment) is recorded,
// and write() then fails with H2O_ERR_INVALID_ARGUMENT naming the first such problem.
class GgufWriter {
public:
    // Must be a nonzero power of two (default 32). A non-default alignment is written as the
    // UINT32 key general.alignment; adding that key with add_u32/add_copy is the same as calling
    // this.
    void set_alignment(uint32_t alignment);
    void add_u32(std::string key, uint32_t value);
    void add_i32(std::string key, int32_t value);
    void add_f32(std::string key, float value);
    void add_bool(std::string key, bool value);
    void add_string(std::string key, std::string value);
    void add_string_array(std::string key, std::vector<std::string> values);
    void add_f32_array(std::string key, std::vector<float> values);
    void add_i32_array(std::string key, std::vector<int32_t> values);
    // Copies an existing key/value (any type) from a parsed file.
    void add_copy(const GgufKeyValue &kv);
    // ne[0] is the row length; data holds row_bytes(type, ne[0]) * rows bytes.
    void add_tensor(std::string name, TensorType type, std::vector<int64_t> ne, std::vector<uint8_t> data);

    // The first invalid add, or Ok.
    const Status &status() const { return error_; }

    // Writes to a temporary file beside path and renames it into place, so an interrupted write
    // never leaves a half-written file at path. Errors: H2O_ERR_INVALID_ARGUMENT (see status()),
    // H2O_ERR_IO with the OS error text (the temporary file is removed).
    Status write(const std::string &path) const;
    // Serializes into memory (tests build malformed variants from this). Calling it while
    // status() is an error is a programming bug and aborts.
    std::vector<uint8_t> serialize() const;

private:
    struct Entry {
        std::string key;
        std::vector<uint8_t> value;  // encoded as in the file: type id, then the payload
    };
    struct TensorEntry {
        std::string name;
        TensorType type;
        std::vector<int64_t> ne;
        std::vector<uint8_t> data;
    };
    void add_entry(std::string key, std::vector<uint8_t> value);
    void record_error(std::string message);
    // Produces the file's bytes in order through sink(const uint8_t *, size_t) -> bool, stopping
    // at the first false. One code path for serialize() and write().
    template <class Sink>
    bool emit(Sink &sink) const;

    uint32_t alignment_ = 32;
    std::vector<Entry> entries_;
    std::vector<TensorEntry> tensors_;
    Status error_;
};

}  // namespace h2o
