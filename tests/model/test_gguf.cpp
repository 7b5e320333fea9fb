// GGUF reader and writer: the real model, writer round trips, typed getters, and malformed files
// built by corrupting a valid serialized buffer (each must fail with a precise code and message).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "test_util.h"

using namespace h2o;

namespace {

using Bytes = std::vector<uint8_t>;

// Little-endian byte builder for hand-made files.
struct ByteBuilder {
    Bytes bytes;
    uint64_t n_kv = 0;

    template <class T>
    ByteBuilder &put(T value) {
        uint8_t raw[sizeof(T)];
        std::memcpy(raw, &value, sizeof(T));
        bytes.insert(bytes.end(), raw, raw + sizeof(T));
        return *this;
    }
    ByteBuilder &u32(uint32_t v) { return put(v); }
    ByteBuilder &u64(uint64_t v) { return put(v); }
    ByteBuilder &type(GgufType t) { return put(static_cast<uint32_t>(t)); }
    ByteBuilder &str(std::string_view s) {
        u64(s.size());
        bytes.insert(bytes.end(), s.begin(), s.end());
        return *this;
    }
    // Starts a metadata entry: key name and value type; the caller appends the value.
    ByteBuilder &key(std::string_view name, GgufType t) {
        ++n_kv;
        return str(name).type(t);
    }
    // A whole file: header, then these metadata entries, no tensors.
    Bytes file(uint32_t version = 3) const {
        ByteBuilder out;
        out.bytes = {'G', 'G', 'U', 'F'};
        out.u32(version).u64(0).u64(n_kv);
        out.bytes.insert(out.bytes.end(), bytes.begin(), bytes.end());
        return out.bytes;
    }
};

// Parses a copy in an allocation of exactly bytes.size(), so that ASan catches any read past the
// end (a std::vector's spare capacity would hide it).
Status parse_exact(const Bytes &bytes, std::unique_ptr<GgufFile> *out, std::unique_ptr<uint8_t[]> *storage) {
    storage->reset(new uint8_t[bytes.size() + 1]);  // +1: new[0] is fine but keep data() non-null
    if (!bytes.empty()) std::memcpy(storage->get(), bytes.data(), bytes.size());
    return GgufFile::parse(storage->get(), bytes.size(), out);
}

void expect_error(const Bytes &bytes, h2o_status code, const std::string &substring) {
    std::unique_ptr<uint8_t[]> storage;
    std::unique_ptr<GgufFile> file;
    Status status = parse_exact(bytes, &file, &storage);
    INFO("message: " << status.message);
    INFO("expected substring: " << substring);
    CHECK(status.code == code);
    CHECK(status.message.find(substring) != std::string::npos);
    CHECK(file == nullptr);
}

size_t find_bytes(const Bytes &bytes, std::string_view needle) {
    auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
    REQUIRE(it != bytes.end());
    return static_cast<size_t>(it - bytes.begin());
}

template <class T>
void patch(Bytes *bytes, size_t offset, T value) {
    REQUIRE(offset + sizeof(T) <= bytes->size());
    std::memcpy(bytes->data() + offset, &value, sizeof(T));
}

Bytes truncated(const Bytes &bytes, size_t size) { return Bytes(bytes.begin(), bytes.begin() + size); }

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 37 + seed);
    return out;
}

// The file the malformed-file tests corrupt. Layout facts they rely on: a key is its u64 length,
// its bytes, a u32 type, then the value; a tensor info is its u64 name length, name, u32 n_dims,
// u64 dims, u32 type, u64 offset. "a.weight" (F32 8x2, 64 bytes) is at data offset 0 and
// "b.weight" (Q8_0 32x2, 68 bytes) at 64, ending exactly at the end of the file.
Bytes base_file(uint32_t alignment = 32) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    if (alignment != 32) w.set_alignment(alignment);
    w.add_string("general.name", "tiny");
    w.add_f32_array("test.array", {1.0f, 2.0f, 3.0f});
    w.add_u32("dup.a", 1);
    w.add_u32("dup.b", 2);
    w.add_tensor("a.weight", TensorType::F32, {8, 2}, pattern(64, 1));
    w.add_tensor("b.weight", TensorType::Q8_0, {32, 2}, pattern(68, 2));
    REQUIRE(w.status().ok());
    return w.serialize();
}

// Offsets of fields of the base file.
struct BaseLayout {
    size_t name_key;   // first byte of the key "general.name"
    size_t array_key;  // first byte of the key "test.array"
    size_t b_info;     // first byte of the tensor name "b.weight" in its info
    size_t b_n_dims() const { return b_info + 8; }
    size_t b_dim(int d) const { return b_info + 12 + 8 * d; }
    size_t b_type() const { return b_info + 28; }
    size_t b_offset() const { return b_info + 32; }
};

BaseLayout layout_of(const Bytes &bytes) {
    return {find_bytes(bytes, "general.name"), find_bytes(bytes, "test.array"), find_bytes(bytes, "b.weight")};
}

// A file with a value of every type, hand-built so that add_copy can be tested on all of them.
Bytes every_type_file() {
    ByteBuilder b;
    b.key("t.u8", GgufType::UINT8).put<uint8_t>(200);
    b.key("t.i8", GgufType::INT8).put<int8_t>(-100);
    b.key("t.u16", GgufType::UINT16).put<uint16_t>(60000);
    b.key("t.i16", GgufType::INT16).put<int16_t>(-30000);
    b.key("t.u32", GgufType::UINT32).put<uint32_t>(4000000000u);
    b.key("t.i32", GgufType::INT32).put<int32_t>(-2000000000);
    b.key("t.f32", GgufType::FLOAT32).put<float>(1.5f);
    b.key("t.bool", GgufType::BOOL).put<uint8_t>(1);
    b.key("t.string", GgufType::STRING).str("h\xc3\xa9llo");
    b.key("t.u64", GgufType::UINT64).put<uint64_t>((1ull << 63) + 5);
    b.key("t.i64", GgufType::INT64).put<int64_t>(-(1ll << 62));
    b.key("t.f64", GgufType::FLOAT64).put<double>(3.25);
    b.key("t.f64_huge", GgufType::FLOAT64).put<double>(1e300);
    b.key("t.arr.u8", GgufType::ARRAY).type(GgufType::UINT8).u64(3).put<uint8_t>(1).put<uint8_t>(2).put<uint8_t>(3);
    b.key("t.arr.i16", GgufType::ARRAY).type(GgufType::INT16).u64(2).put<int16_t>(-5).put<int16_t>(7);
    b.key("t.arr.f64", GgufType::ARRAY).type(GgufType::FLOAT64).u64(2).put<double>(0.5).put<double>(-8.0);
    b.key("t.arr.bool", GgufType::ARRAY).type(GgufType::BOOL).u64(3).put<uint8_t>(1).put<uint8_t>(0).put<uint8_t>(1);
    b.key("t.arr.str", GgufType::ARRAY).type(GgufType::STRING).u64(3).str("a").str("").str("ccc");
    b.key("t.arr.u32", GgufType::ARRAY).type(GgufType::UINT32).u64(2).u32(5).u32(4294967295u);
    b.key("t.arr.i32_empty", GgufType::ARRAY).type(GgufType::INT32).u64(0);
    return b.file();
}

size_t element_size(GgufType type) {
    switch (type) {
        case GgufType::UINT8:
        case GgufType::INT8:
        case GgufType::BOOL:
            return 1;
        case GgufType::UINT16:
        case GgufType::INT16:
            return 2;
        case GgufType::UINT32:
        case GgufType::INT32:
        case GgufType::FLOAT32:
            return 4;
        default:
            return 8;
    }
}

// Checks that two values are equal field by field (arrays element by element).
void check_same_value(const GgufValue &a, const GgufValue &b) {
    CHECK(a.type == b.type);
    CHECK(a.i64 == b.i64);
    CHECK(a.u64 == b.u64);
    CHECK((a.f64 == b.f64 || (std::isnan(a.f64) && std::isnan(b.f64))));
    CHECK(a.str == b.str);
    if (a.type != GgufType::ARRAY) return;
    CHECK(a.array_type == b.array_type);
    REQUIRE(a.array_size == b.array_size);
    CHECK(a.array_strings == b.array_strings);
    if (a.array_type != GgufType::STRING && a.array_size > 0) {
        CHECK(std::memcmp(a.array_data, b.array_data, a.array_size * element_size(a.array_type)) == 0);
    }
}

// Builds a writer holding every value type (direct adders and add_copy from `source`) and the
// four tensor types of the round-trip test.
GgufWriter every_type_writer(const GgufFile &source) {
    GgufWriter w;
    w.add_u32("w.u32", 7);
    w.add_i32("w.i32", -7);
    w.add_f32("w.f32", 0.25f);
    w.add_bool("w.bool", false);
    w.add_string("w.string", "text");
    w.add_string_array("w.strings", {"x", "yy", ""});
    w.add_f32_array("w.floats", {1.0f, -2.5f, 3.0f});
    w.add_i32_array("w.ints", {-1, 0, 2147483647});
    for (const GgufKeyValue &kv : source.metadata()) w.add_copy(kv);
    w.add_tensor("f32", TensorType::F32, {4, 3}, pattern(4 * 3 * 4, 10));
    w.add_tensor("f16", TensorType::F16, {8, 2}, pattern(8 * 2 * 2, 20));
    w.add_tensor("q4_0", TensorType::Q4_0, {64, 2}, pattern(2 * 2 * 18, 30));
    w.add_tensor("q8_0", TensorType::Q8_0, {32, 1, 2}, pattern(2 * 34, 40));
    return w;
}

// Checks a parsed round-trip file against its source and the writer's inputs.
void check_every_type_file(const GgufFile &file, const GgufFile &source, uint32_t alignment) {
    CHECK(file.version() == 3);
    CHECK(file.alignment() == alignment);

    // Keys in insertion order: the eight direct ones, the copies, then general.alignment if
    // set_alignment() was called after them.
    const std::vector<std::string_view> direct = {"w.u32", "w.i32", "w.f32", "w.bool", "w.string", "w.strings", "w.floats", "w.ints"};
    const size_t extra = alignment != 32 ? 1 : 0;
    REQUIRE(file.metadata().size() == direct.size() + extra + source.metadata().size());
    for (size_t i = 0; i < direct.size(); ++i) CHECK(file.metadata()[i].key == direct[i]);
    for (size_t i = 0; i < source.metadata().size(); ++i) {
        const GgufKeyValue &copy = file.metadata()[direct.size() + i];
        INFO("key " << source.metadata()[i].key);
        CHECK(copy.key == source.metadata()[i].key);
        check_same_value(copy.value, source.metadata()[i].value);
    }

    uint32_t u32 = 0;
    CHECK(file.get_u32("w.u32", &u32).ok());
    CHECK(u32 == 7);
    CHECK(file.find("w.i32")->i64 == -7);
    float f32 = 0;
    CHECK(file.get_f32("w.f32", &f32).ok());
    CHECK(f32 == 0.25f);
    bool flag = true;
    CHECK(file.get_bool_or("w.bool", true, &flag).ok());
    CHECK(flag == false);
    std::string_view text;
    CHECK(file.get_string("w.string", &text).ok());
    CHECK(text == "text");
    std::vector<std::string_view> strings;
    CHECK(file.get_string_array("w.strings", &strings).ok());
    CHECK(strings == std::vector<std::string_view>{"x", "yy", ""});
    std::vector<float> floats;
    CHECK(file.get_f32_array("w.floats", &floats).ok());
    CHECK(floats == std::vector<float>{1.0f, -2.5f, 3.0f});
    std::vector<int32_t> ints;
    CHECK(file.get_i32_array("w.ints", &ints).ok());
    CHECK(ints == std::vector<int32_t>{-1, 0, 2147483647});

    // Tensors in insertion order, aligned, with their bytes intact and zero padding between.
    struct Expected {
        const char *name;
        TensorType type;
        std::vector<int64_t> ne;
        std::vector<uint8_t> data;
    };
    const std::vector<Expected> expected = {
        {"f32", TensorType::F32, {4, 3, 1, 1}, pattern(48, 10)},
        {"f16", TensorType::F16, {8, 2, 1, 1}, pattern(32, 20)},
        {"q4_0", TensorType::Q4_0, {64, 2, 1, 1}, pattern(72, 30)},
        {"q8_0", TensorType::Q8_0, {32, 1, 2, 1}, pattern(68, 40)},
    };
    REQUIRE(file.tensors().size() == expected.size());
    const uint8_t *previous_end = nullptr;
    for (size_t i = 0; i < expected.size(); ++i) {
        const GgufTensor &t = file.tensors()[i];
        INFO("tensor " << expected[i].name);
        CHECK(t.name == expected[i].name);
        CHECK(t.type == expected[i].type);
        CHECK(t.n_dims == (expected[i].name == std::string("q8_0") ? 3u : 2u));
        for (int d = 0; d < 4; ++d) CHECK(t.ne[d] == expected[i].ne[d]);
        CHECK(t.n_bytes == expected[i].data.size());
        CHECK(t.offset % alignment == 0);
        CHECK(static_cast<size_t>(t.data - file.file_data()) % alignment == 0);
        CHECK(std::memcmp(t.data, expected[i].data.data(), t.n_bytes) == 0);
        CHECK(file.find_tensor(expected[i].name) == &t);
        if (previous_end != nullptr) {
            for (const uint8_t *p = previous_end; p < t.data; ++p) CHECK(*p == 0);
        }
        previous_end = t.data + t.n_bytes;
    }
    CHECK(previous_end == file.file_data() + file.file_size());  // no padding after the last tensor
}

}  // namespace

// ---- the real model ---------------------------------------------------------------------------

TEST_CASE("gguf: parses the real stories260K model") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<GgufFile> file;
    Status status = GgufFile::open(path, &file);
    INFO(status.message);
    REQUIRE(status.ok());
    CHECK(file->version() == 3);
    CHECK(file->tensors().size() == 48);
    CHECK(file->metadata().size() == 19);
    CHECK(file->alignment() == 32);

    uint32_t n_embd = 0;
    CHECK(file->get_u32("llama.embedding_length", &n_embd).ok());
    CHECK(n_embd == 64);
    std::string_view arch;
    CHECK(file->get_string("general.architecture", &arch).ok());
    CHECK(arch == "llama");
    std::vector<std::string_view> tokens;
    CHECK(file->get_string_array("tokenizer.ggml.tokens", &tokens).ok());
    CHECK(tokens.size() == 512);
    std::vector<float> scores;
    CHECK(file->get_f32_array("tokenizer.ggml.scores", &scores).ok());
    CHECK(scores.size() == 512);

    const GgufTensor *k = file->find_tensor("blk.0.attn_k.weight");
    REQUIRE(k != nullptr);
    CHECK(k->n_dims == 2);
    CHECK(k->ne[0] == 64);
    CHECK(k->ne[1] == 32);
    CHECK(k->type == TensorType::F32);
    CHECK(k->n_bytes == 64 * 32 * 4);
    CHECK(file->find_tensor("no.such.tensor") == nullptr);

    // Every tensor lies inside the file.
    for (const GgufTensor &t : file->tensors()) {
        CHECK(t.data >= file->file_data());
        CHECK(t.data + t.n_bytes <= file->file_data() + file->file_size());
    }
}

TEST_CASE("gguf: add_copy of every key of the real model reproduces its metadata") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<GgufFile> source;
    REQUIRE(GgufFile::open(path, &source).ok());
    GgufWriter w;
    for (const GgufKeyValue &kv : source->metadata()) w.add_copy(kv);
    for (const GgufTensor &t : source->tensors()) {
        w.add_tensor(std::string(t.name), t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                     std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }
    REQUIRE(w.status().ok());
    const Bytes bytes = w.serialize();
    std::unique_ptr<GgufFile> copy;
    REQUIRE(GgufFile::parse(bytes.data(), bytes.size(), &copy).ok());
    REQUIRE(copy->metadata().size() == source->metadata().size());
    for (size_t i = 0; i < source->metadata().size(); ++i) {
        INFO("key " << source->metadata()[i].key);
        CHECK(copy->metadata()[i].key == source->metadata()[i].key);
        check_same_value(copy->metadata()[i].value, source->metadata()[i].value);
    }
    REQUIRE(copy->tensors().size() == source->tensors().size());
    for (size_t i = 0; i < source->tensors().size(); ++i) {
        const GgufTensor &a = source->tensors()[i];
        const GgufTensor &b = copy->tensors()[i];
        CHECK(a.name == b.name);
        CHECK(a.n_bytes == b.n_bytes);
        CHECK(std::memcmp(a.data, b.data, a.n_bytes) == 0);
    }
}

// ---- writer round trips -----------------------------------------------------------------------

TEST_CASE("gguf: writer round trip with every value type and tensor type") {
    const Bytes source_bytes = every_type_file();
    std::unique_ptr<GgufFile> source;
    Status status = GgufFile::parse(source_bytes.data(), source_bytes.size(), &source);
    INFO(status.message);
    REQUIRE(status.ok());
    REQUIRE(source->metadata().size() == 20);

    GgufWriter w = every_type_writer(*source);
    REQUIRE(w.status().ok());
    const Bytes bytes = w.serialize();
    std::unique_ptr<GgufFile> file;
    status = GgufFile::parse(bytes.data(), bytes.size(), &file);
    INFO(status.message);
    REQUIRE(status.ok());
    CHECK(file->metadata().size() == 28);
    CHECK(file->find("general.alignment") == nullptr);  // default alignment is not written
    check_every_type_file(*file, *source, 32);
    // The header is padded to the alignment with zeros before the first tensor.
    const GgufTensor &first = file->tensors()[0];
    CHECK(first.offset == 0);
    CHECK(static_cast<size_t>(first.data - file->file_data()) % 32 == 0);
}

TEST_CASE("gguf: writer with a non-default alignment writes general.alignment") {
    const Bytes source_bytes = every_type_file();
    std::unique_ptr<GgufFile> source;
    REQUIRE(GgufFile::parse(source_bytes.data(), source_bytes.size(), &source).ok());
    GgufWriter w = every_type_writer(*source);
    w.set_alignment(256);
    REQUIRE(w.status().ok());
    const Bytes bytes = w.serialize();
    std::unique_ptr<GgufFile> file;
    Status status = GgufFile::parse(bytes.data(), bytes.size(), &file);
    INFO(status.message);
    REQUIRE(status.ok());
    const GgufValue *alignment = file->find("general.alignment");
    REQUIRE(alignment != nullptr);
    CHECK(alignment->type == GgufType::UINT32);
    CHECK(alignment->u64 == 256);
    CHECK(file->metadata().back().key == "general.alignment");  // where set_alignment was called
    check_every_type_file(*file, *source, 256);
}

TEST_CASE("gguf: write() to disk and open() the result") {
    const Bytes source_bytes = every_type_file();
    std::unique_ptr<GgufFile> source;
    REQUIRE(GgufFile::parse(source_bytes.data(), source_bytes.size(), &source).ok());
    const GgufWriter w = every_type_writer(*source);
    const std::string path = h2o_test::temp_path("gguf_roundtrip.gguf");
    std::filesystem::remove(path);
    Status status = w.write(path);
    INFO(status.message);
    REQUIRE(status.ok());

    std::unique_ptr<GgufFile> file;
    status = GgufFile::open(path, &file);
    INFO(status.message);
    REQUIRE(status.ok());
    check_every_type_file(*file, *source, 32);
    // Same bytes as serialize(), and no temporary file left behind.
    const Bytes expected = w.serialize();
    REQUIRE(file->file_size() == expected.size());
    CHECK(std::memcmp(file->file_data(), expected.data(), expected.size()) == 0);
    for (const auto &entry : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
        CHECK(entry.path().filename().string().find("gguf_roundtrip.gguf.tmp.") == std::string::npos);
    }
    file.reset();
    std::filesystem::remove(path);
}

TEST_CASE("gguf: write() removes temporary files that killed writers left beside the target") {
    GgufWriter w;
    w.add_u32("k", 1);
    const std::string path = h2o_test::temp_path("stale_temp.gguf");
    // A writer killed mid-write leaves PATH.tmp.PID; PID 4194305 is above Linux's pid_max, so no
    // process has it. A live process's file (this one's parent) and other names are kept.
    const std::string stale = path + ".tmp.4194305";
    const std::string live = path + ".tmp." + std::to_string(getppid());
    const std::string unrelated = path + ".tmp.notes";
    for (const std::string &f : {stale, live, unrelated}) std::ofstream(f) << "partial";
    REQUIRE(w.write(path).ok());
    CHECK_FALSE(std::filesystem::exists(stale));
    CHECK(std::filesystem::exists(live));
    CHECK(std::filesystem::exists(unrelated));
    for (const std::string &f : {path, live, unrelated}) std::filesystem::remove(f);
}

TEST_CASE("gguf: write() failures return H2O_ERR_IO with the OS error and leave no file") {
    GgufWriter w;
    w.add_u32("k", 1);
    const std::string path = h2o_test::temp_path("no_such_dir/out.gguf");
    Status status = w.write(path);
    CHECK(status.code == H2O_ERR_IO);
    CHECK(status.message.find("cannot create") != std::string::npos);
    CHECK(status.message.find("No such file or directory") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(path));

    // Renaming onto a non-empty directory fails after the data was written: the temp file goes.
    const std::string dir = h2o_test::temp_path("gguf_target_is_dir");
    std::filesystem::create_directories(dir + "/child");
    status = w.write(dir);
    CHECK(status.code == H2O_ERR_IO);
    CHECK(status.message.find("cannot rename") != std::string::npos);
    for (const auto &entry : std::filesystem::directory_iterator(std::filesystem::path(dir).parent_path())) {
        CHECK(entry.path().filename().string().find("gguf_target_is_dir.tmp.") == std::string::npos);
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("gguf: writer rejects invalid input instead of writing a corrupt file") {
    struct Case {
        const char *what;
        void (*build)(GgufWriter &);
        const char *message;
    };
    const Case cases[] = {
        {"data size",
         [](GgufWriter &w) {
             w.add_tensor("t", TensorType::F32, {4, 2}, Bytes(31));
         },
         "tensor 't': data has 31 bytes, its shape needs 32"},
        {"block size", [](GgufWriter &w) { w.add_tensor("t", TensorType::Q4_0, {16}, Bytes(9)); },
         "not a multiple of the Q4_0 block size 32"},
        {"no dims", [](GgufWriter &w) { w.add_tensor("t", TensorType::F32, {}, Bytes()); }, "1 to 4 dimensions"},
        {"zero dim",
         [](GgufWriter &w) {
             w.add_tensor("t", TensorType::F32, {4, 0}, Bytes());
         },
         "dimensions must be positive"},
        {"duplicate tensor",
         [](GgufWriter &w) {
             w.add_tensor("t", TensorType::F32, {1}, Bytes(4));
             w.add_tensor("t", TensorType::F32, {1}, Bytes(4));
         },
         "duplicate tensor name 't'"},
        {"duplicate key",
         [](GgufWriter &w) {
             w.add_u32("k", 1);
             w.add_string("k", "x");
         },
         "duplicate metadata key 'k'"},
        {"empty key", [](GgufWriter &w) { w.add_u32("", 1); }, "name must be 1 to 65535 bytes"},
        {"alignment", [](GgufWriter &w) { w.set_alignment(48); }, "nonzero power of two, got 48"},
        {"alignment type", [](GgufWriter &w) { w.add_i32("general.alignment", 64); }, "must be UINT32"},
    };
    for (const Case &c : cases) {
        INFO(c.what);
        GgufWriter w;
        c.build(w);
        CHECK(w.status().code == H2O_ERR_INVALID_ARGUMENT);
        CHECK(w.status().message.find(c.message) != std::string::npos);
        const std::string path = h2o_test::temp_path("gguf_invalid.gguf");
        Status status = w.write(path);
        CHECK(status.code == H2O_ERR_INVALID_ARGUMENT);
        CHECK_FALSE(std::filesystem::exists(path));
    }
}

TEST_CASE("gguf: general.alignment keeps the place where it was first set") {
    GgufWriter w;
    w.add_u32("first", 1);
    w.add_u32("general.alignment", 64);  // the same as set_alignment(64)
    w.add_u32("second", 2);
    w.set_alignment(128);
    w.add_tensor("t", TensorType::F32, {3}, pattern(12, 0));
    REQUIRE(w.status().ok());
    const Bytes bytes = w.serialize();
    std::unique_ptr<GgufFile> file;
    REQUIRE(GgufFile::parse(bytes.data(), bytes.size(), &file).ok());
    CHECK(file->alignment() == 128);
    REQUIRE(file->metadata().size() == 3);
    CHECK(file->metadata()[1].key == "general.alignment");
    CHECK(file->metadata()[1].value.u64 == 128);
    CHECK(static_cast<size_t>(file->tensors()[0].data - file->file_data()) % 128 == 0);
}

TEST_CASE("gguf: version 2 files are read") {
    ByteBuilder b;
    b.key("general.architecture", GgufType::STRING).str("llama");
    const Bytes bytes = b.file(2);
    std::unique_ptr<GgufFile> file;
    REQUIRE(GgufFile::parse(bytes.data(), bytes.size(), &file).ok());
    CHECK(file->version() == 2);
    CHECK(file->metadata().size() == 1);
    CHECK(file->tensors().empty());
}

// ---- typed getters ----------------------------------------------------------------------------

TEST_CASE("gguf: typed getters convert in range and name key and types on error") {
    const Bytes bytes = every_type_file();
    std::unique_ptr<GgufFile> file;
    REQUIRE(GgufFile::parse(bytes.data(), bytes.size(), &file).ok());
    auto check_error = [](const Status &status, const std::string &substring) {
        INFO("message: " << status.message);
        CHECK(status.code == H2O_ERR_MODEL_FORMAT);
        CHECK(status.message.find(substring) != std::string::npos);
    };

    uint32_t u32 = 12345;
    check_error(file->get_u32("nope", &u32), "missing metadata key 'nope'");
    CHECK(u32 == 12345);  // untouched on failure
    check_error(file->get_u32("t.string", &u32), "metadata key 't.string': expected an integer, got STRING");
    check_error(file->get_u32("t.i32", &u32), "value -2000000000 (INT32) is out of range for uint32");
    check_error(file->get_u32("t.i8", &u32), "value -100 (INT8) is out of range");
    check_error(file->get_u32("t.u64", &u32), "(UINT64) is out of range for uint32");
    check_error(file->get_u32("t.f32", &u32), "expected an integer, got FLOAT32");
    CHECK(file->get_u32("t.u8", &u32).ok());
    CHECK(u32 == 200);
    CHECK(file->get_u32("t.u32", &u32).ok());
    CHECK(u32 == 4000000000u);
    CHECK(file->get_u32_or("nope", 77, &u32).ok());
    CHECK(u32 == 77);
    check_error(file->get_u32_or("t.string", 77, &u32), "expected an integer, got STRING");

    float f32 = 0;
    CHECK(file->get_f32("t.f64", &f32).ok());
    CHECK(f32 == 3.25f);
    check_error(file->get_f32("t.u32", &f32), "metadata key 't.u32': expected FLOAT32 or FLOAT64, got UINT32");
    check_error(file->get_f32("t.f64_huge", &f32), "is out of range for float32");
    check_error(file->get_f32("nope", &f32), "missing metadata key 'nope'");
    CHECK(file->get_f32_or("nope", 0.5f, &f32).ok());
    CHECK(f32 == 0.5f);

    std::string_view text;
    CHECK(file->get_string("t.string", &text).ok());
    CHECK(text == "h\xc3\xa9llo");
    check_error(file->get_string("t.u8", &text), "expected STRING, got UINT8");

    bool flag = false;
    CHECK(file->get_bool_or("t.bool", false, &flag).ok());
    CHECK(flag);
    CHECK(file->get_bool_or("nope", true, &flag).ok());
    CHECK(flag);
    check_error(file->get_bool_or("t.u8", false, &flag), "expected BOOL, got UINT8");

    std::vector<std::string_view> strings;
    CHECK(file->get_string_array("t.arr.str", &strings).ok());
    CHECK(strings == std::vector<std::string_view>{"a", "", "ccc"});
    check_error(file->get_string_array("t.arr.f64", &strings), "expected ARRAY of STRING, got ARRAY of FLOAT64");
    check_error(file->get_string_array("t.string", &strings), "expected ARRAY of STRING, got STRING");

    std::vector<float> floats;
    CHECK(file->get_f32_array("t.arr.f64", &floats).ok());
    CHECK(floats == std::vector<float>{0.5f, -8.0f});
    check_error(file->get_f32_array("t.arr.u8", &floats), "got ARRAY of UINT8");

    std::vector<int32_t> ints = {9};
    CHECK(file->get_i32_array("t.arr.i32_empty", &ints).ok());
    CHECK(ints.empty());
    check_error(file->get_i32_array("t.arr.u32", &ints), "element 1 value 4294967295 (UINT32) is out of range for int32");
    check_error(file->get_i32_array("t.arr.i16", &ints), "expected ARRAY of INT32 or UINT32, got ARRAY of INT16");
    check_error(file->get_i32_array("nope", &ints), "missing metadata key 'nope'");

    // Scalars widen as documented.
    CHECK(file->find("t.u64")->u64 == (1ull << 63) + 5);
    CHECK(file->find("t.i64")->i64 == -(1ll << 62));
    CHECK(file->find("t.i16")->i64 == -30000);
    CHECK(file->find("t.u16")->u64 == 60000);
    CHECK(file->find("t.bool")->u64 == 1);
}

// ---- malformed files --------------------------------------------------------------------------

TEST_CASE("gguf: the base file of the malformed-file tests is valid") {
    const Bytes bytes = base_file();
    std::unique_ptr<GgufFile> file;
    REQUIRE(GgufFile::parse(bytes.data(), bytes.size(), &file).ok());
    const BaseLayout at = layout_of(bytes);
    const GgufTensor *b = file->find_tensor("b.weight");
    REQUIRE(b != nullptr);
    CHECK(b->offset == 64);
    CHECK(b->data + b->n_bytes == bytes.data() + bytes.size());
    uint64_t dim0 = 0;
    std::memcpy(&dim0, bytes.data() + at.b_dim(0), 8);
    CHECK(dim0 == 32);
}

TEST_CASE("gguf: empty file, bad magic, unsupported versions") {
    expect_error({}, H2O_ERR_MODEL_FORMAT, "empty file");
    Bytes bytes = base_file();
    bytes[0] = 'X';
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "not a GGUF file: bad magic (first bytes 58 47 55 46");

    bytes = base_file();
    patch<uint32_t>(&bytes, 4, 1);
    expect_error(bytes, H2O_ERR_UNSUPPORTED, "GGUF version 1 is not supported");
    patch<uint32_t>(&bytes, 4, 99);
    expect_error(bytes, H2O_ERR_UNSUPPORTED, "GGUF version 99 is not supported (only versions 2 and 3)");
    patch<uint32_t>(&bytes, 4, 0);
    expect_error(bytes, H2O_ERR_UNSUPPORTED, "GGUF version 0 is not supported");
    patch<uint32_t>(&bytes, 4, 0x03000000);
    expect_error(bytes, H2O_ERR_UNSUPPORTED, "big-endian GGUF files are not supported");
}

TEST_CASE("gguf: truncated header") {
    const Bytes bytes = base_file();
    expect_error(truncated(bytes, 2), H2O_ERR_MODEL_FORMAT,
                 "truncated at offset 0 while reading the header: magic (needs 4 bytes, 2 remain)");
    expect_error(truncated(bytes, 6), H2O_ERR_MODEL_FORMAT, "truncated at offset 4 while reading the header: version");
    expect_error(truncated(bytes, 10), H2O_ERR_MODEL_FORMAT, "truncated at offset 8 while reading the header: tensor count");
    expect_error(truncated(bytes, 20), H2O_ERR_MODEL_FORMAT, "truncated at offset 16 while reading the header: metadata key count");
}

TEST_CASE("gguf: truncated in the middle of a key, a value, a tensor info, tensor data") {
    const Bytes bytes = base_file();
    const BaseLayout at = layout_of(bytes);
    // The last key, "dup.b" (5 bytes, metadata key #4, a UINT32): cut inside its name, its type,
    // its value. (Earlier cuts are caught by the key count check: see the next test case.)
    const size_t dup_b = find_bytes(bytes, "dup.b");
    expect_error(truncated(bytes, dup_b + 3), H2O_ERR_MODEL_FORMAT,
                 "truncated at offset " + std::to_string(dup_b) + " while reading metadata key #4: key name (needs 5 bytes, 3 remain)");
    expect_error(
        truncated(bytes, dup_b + 7), H2O_ERR_MODEL_FORMAT,
        "truncated at offset " + std::to_string(dup_b + 5) + " while reading metadata key 'dup.b': value type (needs 4 bytes, 2 remain)");
    expect_error(
        truncated(bytes, dup_b + 10), H2O_ERR_MODEL_FORMAT,
        "truncated at offset " + std::to_string(dup_b + 9) + " while reading metadata key 'dup.b': value (needs 4 bytes, 1 remain)");
    // Inside the string value "tiny" of "general.name".
    expect_error(truncated(bytes, at.name_key + 26), H2O_ERR_MODEL_FORMAT,
                 "truncated at offset " + std::to_string(at.name_key + 24) +
                     " while reading metadata key 'general.name': string value (needs 4 bytes, 2 remain)");
    // Inside the float array of "test.array" (10 bytes: type at +10, element type +14, count +18).
    expect_error(truncated(bytes, at.array_key + 26 + 5), H2O_ERR_MODEL_FORMAT,
                 "metadata key 'test.array': array of 3 FLOAT32 elements at offset " + std::to_string(at.array_key + 26) +
                     " cannot fit in the 5 bytes that remain");
    // Cut so early that the declared number of keys cannot fit (each takes at least 14 bytes).
    expect_error(truncated(bytes, at.name_key + 3), H2O_ERR_MODEL_FORMAT,
                 "metadata key count 5 cannot fit in the " + std::to_string(at.name_key + 3 - 24) + " bytes after the header");
    // Inside the first dimension of b.weight's info, then inside its type.
    expect_error(
        truncated(bytes, at.b_dim(0) + 4), H2O_ERR_MODEL_FORMAT,
        "truncated at offset " + std::to_string(at.b_dim(0)) + " while reading tensor 'b.weight': dimension (needs 8 bytes, 4 remain)");
    expect_error(truncated(bytes, at.b_type() + 1), H2O_ERR_MODEL_FORMAT,
                 "truncated at offset " + std::to_string(at.b_type()) + " while reading tensor 'b.weight': tensor type");
    // Inside the tensor info name.
    expect_error(truncated(bytes, at.b_info + 2), H2O_ERR_MODEL_FORMAT,
                 "truncated at offset " + std::to_string(at.b_info) + " while reading tensor info #1: tensor name");
    // Inside b.weight's data (its last byte is the last byte of the file).
    const size_t b_begin = bytes.size() - 68;
    expect_error(truncated(bytes, bytes.size() - 1), H2O_ERR_MODEL_FORMAT,
                 "tensor 'b.weight': data [" + std::to_string(b_begin) + ".." + std::to_string(bytes.size()) +
                     ") extends past end of file (size " + std::to_string(bytes.size() - 1) + ")");
}

TEST_CASE("gguf: every truncation of a valid file is rejected, never read past the end") {
    const Bytes bytes = base_file();
    for (size_t size = 0; size < bytes.size(); ++size) {
        std::unique_ptr<uint8_t[]> storage;
        std::unique_ptr<GgufFile> file;
        Status status = parse_exact(truncated(bytes, size), &file, &storage);
        INFO("size " << size << ": " << status.message);
        CHECK(status.code == H2O_ERR_MODEL_FORMAT);
        const bool precise = status.message.find("truncated at offset") != std::string::npos ||
                             status.message.find("extends past end of file") != std::string::npos ||
                             status.message.find("cannot fit") != std::string::npos ||
                             status.message.find("empty file") != std::string::npos;
        CHECK(precise);
    }
}

TEST_CASE("gguf: corrupting any single header byte never crashes") {
    // Under ASan/UBSan this checks that no corruption leads to an out-of-bounds read, an overflow
    // or a huge allocation; the status itself may be anything.
    const Bytes bytes = base_file();
    const size_t header_size = bytes.size() - 64 - 68;
    for (size_t i = 0; i < header_size; ++i) {
        for (uint8_t value : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x7f}, static_cast<uint8_t>(bytes[i] ^ 0x01)}) {
            Bytes corrupt = bytes;
            corrupt[i] = value;
            std::unique_ptr<uint8_t[]> storage;
            std::unique_ptr<GgufFile> file;
            Status status = parse_exact(corrupt, &file, &storage);
            CHECK((status.ok() || !status.message.empty()));
        }
    }
}

TEST_CASE("gguf: string length past end of file") {
    Bytes bytes = base_file();
    const BaseLayout at = layout_of(bytes);
    patch<uint64_t>(&bytes, at.name_key + 16, 1000000);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT,
                 "truncated at offset " + std::to_string(at.name_key + 24) +
                     " while reading metadata key 'general.name': string value (needs 1000000 bytes");
    // A key length past the end of file, and one beyond the name limit.
    bytes = base_file();
    patch<uint64_t>(&bytes, at.name_key - 8, ~0ull);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key #1: key name is 18446744073709551615 bytes long, more than the limit of 65535");
    bytes = base_file();
    patch<uint64_t>(&bytes, at.name_key - 8, 60000);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "while reading metadata key #1: key name (needs 60000 bytes");
    // A tensor name over the limit.
    bytes = base_file();
    patch<uint64_t>(&bytes, at.b_info - 8, 70000);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor info #1: tensor name is 70000 bytes long, more than the limit of 65535");
}

TEST_CASE("gguf: huge key, tensor and array counts are rejected before allocating") {
    Bytes bytes = base_file();
    patch<uint64_t>(&bytes, 16, 1ull << 60);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key count 1152921504606846976 cannot fit in the");
    bytes = base_file();
    patch<uint64_t>(&bytes, 8, ~0ull);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor count 18446744073709551615 cannot fit in the");
    bytes = base_file();
    const BaseLayout at = layout_of(bytes);
    patch<uint64_t>(&bytes, at.array_key + 18, 1ull << 62);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key 'test.array': array of 4611686018427387904 FLOAT32 elements at offset");
    // An array of strings: each needs at least its 8-byte length.
    ByteBuilder b;
    b.key("strings", GgufType::ARRAY).type(GgufType::STRING).u64(1000).str("only one");
    expect_error(b.file(), H2O_ERR_MODEL_FORMAT,
                 "metadata key 'strings': array of 1000 STRING elements at offset 55 cannot fit in the 16 bytes");
}

TEST_CASE("gguf: unknown value types, arrays of arrays, bad bools, empty key") {
    Bytes bytes = base_file();
    const BaseLayout at = layout_of(bytes);
    patch<uint32_t>(&bytes, at.name_key + 12, 13);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key 'general.name': unknown value type id 13");
    bytes = base_file();
    patch<uint32_t>(&bytes, at.array_key + 14, 0xdeadbeef);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key 'test.array': unknown value type id 3735928559");
    bytes = base_file();
    patch<uint32_t>(&bytes, at.array_key + 14, static_cast<uint32_t>(GgufType::ARRAY));
    expect_error(bytes, H2O_ERR_UNSUPPORTED, "metadata key 'test.array': arrays of arrays are not supported");

    ByteBuilder bad_bool;
    bad_bool.key("flag", GgufType::BOOL).put<uint8_t>(2);
    expect_error(bad_bool.file(), H2O_ERR_MODEL_FORMAT, "metadata key 'flag': BOOL value is 2, expected 0 or 1");
    ByteBuilder bad_bool_array;
    bad_bool_array.key("flags", GgufType::ARRAY).type(GgufType::BOOL).u64(2).put<uint8_t>(0).put<uint8_t>(9);
    expect_error(bad_bool_array.file(), H2O_ERR_MODEL_FORMAT, "metadata key 'flags': BOOL array element 1 is 9");
    ByteBuilder empty_key;
    empty_key.key("", GgufType::STRING).str("value");
    expect_error(empty_key.file(), H2O_ERR_MODEL_FORMAT, "metadata key #0: empty key name");
}

TEST_CASE("gguf: bad general.alignment") {
    Bytes bytes = base_file(64);
    const size_t key = find_bytes(bytes, "general.alignment");
    const size_t value = key + 17 + 4;
    patch<uint32_t>(&bytes, value, 0);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key 'general.alignment': must be a nonzero power of two, got 0");
    patch<uint32_t>(&bytes, value, 3);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key 'general.alignment': must be a nonzero power of two, got 3");
    patch<uint32_t>(&bytes, value, 64);
    patch<uint32_t>(&bytes, key + 17, static_cast<uint32_t>(GgufType::INT32));
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key 'general.alignment': expected type UINT32, got INT32");
}

TEST_CASE("gguf: duplicate keys and tensor names") {
    Bytes bytes = base_file();
    bytes[find_bytes(bytes, "dup.b") + 4] = 'a';
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "metadata key 'dup.a': duplicate key");
    bytes = base_file();
    bytes[layout_of(bytes).b_info] = 'a';
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'a.weight': duplicate tensor name");
}

TEST_CASE("gguf: bad tensor shapes") {
    const Bytes good = base_file();
    const BaseLayout at = layout_of(good);
    Bytes bytes = good;
    patch<uint32_t>(&bytes, at.b_n_dims(), 0);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'b.weight': n_dims is 0, expected 1 to 4");
    patch<uint32_t>(&bytes, at.b_n_dims(), 5);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'b.weight': n_dims is 5, expected 1 to 4");

    bytes = good;
    patch<uint64_t>(&bytes, at.b_dim(1), 0);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'b.weight': dimension 1 is 0");

    bytes = good;
    patch<uint64_t>(&bytes, at.b_dim(0), 1ull << 40);
    patch<uint64_t>(&bytes, at.b_dim(1), 1ull << 40);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'b.weight': the element count (product of the dimensions) overflows int64");

    bytes = good;
    patch<uint64_t>(&bytes, at.b_dim(0), ~0ull);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'b.weight': dimension 0 is 18446744073709551615, too large");

    // 2^62 F32 elements fit int64, but their 2^64 bytes do not fit 64 bits. a.weight is F32 and
    // its info has the same layout as b.weight's.
    bytes = good;
    const size_t a_dims = find_bytes(bytes, "a.weight") + 12;
    patch<uint64_t>(&bytes, a_dims, 1ull << 62);
    patch<uint64_t>(&bytes, a_dims + 8, 1);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'a.weight': data size overflows 64 bits");

    bytes = good;
    patch<uint64_t>(&bytes, at.b_dim(0), 33);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'b.weight': row length ne[0] = 33 is not a multiple of the Q8_0 block size 32");
}

TEST_CASE("gguf: unknown tensor type ids are unsupported") {
    Bytes bytes = base_file();
    const BaseLayout at = layout_of(bytes);
    patch<uint32_t>(&bytes, at.b_type(), 7);
    expect_error(bytes, H2O_ERR_UNSUPPORTED, "tensor 'b.weight': tensor type id 7 (Q5_1) is not supported");
    patch<uint32_t>(&bytes, at.b_type(), 1000);
    expect_error(bytes, H2O_ERR_UNSUPPORTED, "tensor 'b.weight': tensor type id 1000 is not supported");
}

TEST_CASE("gguf: misaligned, out-of-file and overlapping tensor data") {
    const Bytes good = base_file();
    const BaseLayout at = layout_of(good);
    Bytes bytes = good;
    patch<uint64_t>(&bytes, at.b_offset(), 65);
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'b.weight': data offset 65 is not a multiple of the alignment 32");

    bytes = good;
    patch<uint64_t>(&bytes, at.b_offset(), 1024);
    const size_t data_start = good.size() - 64 - 68;
    expect_error(bytes, H2O_ERR_MODEL_FORMAT,
                 "tensor 'b.weight': data [" + std::to_string(data_start + 1024) + ".." + std::to_string(data_start + 1024 + 68) +
                     ") extends past end of file (size " + std::to_string(good.size()) + ")");

    bytes = good;
    patch<uint64_t>(&bytes, at.b_offset(), ~0ull & ~31ull);  // aligned, but start + size overflows
    expect_error(bytes, H2O_ERR_MODEL_FORMAT, "tensor 'b.weight': data offset 18446744073709551584 overflows 64 bits");

    bytes = good;
    patch<uint64_t>(&bytes, at.b_offset(), 32);  // a.weight occupies [0, 64) of the data section
    expect_error(bytes, H2O_ERR_MODEL_FORMAT,
                 "tensors 'a.weight' (data [" + std::to_string(data_start) + ".." + std::to_string(data_start + 64) +
                     ")) and 'b.weight' (data [" + std::to_string(data_start + 32) + ".." + std::to_string(data_start + 100) +
                     ")) overlap");
}

TEST_CASE("gguf: empty tensor name") {
    // Hand-built: one tensor whose name is empty.
    ByteBuilder b;
    b.bytes = {'G', 'G', 'U', 'F'};
    b.u32(3).u64(1).u64(0);
    b.str("").u32(1).u64(8).u32(0).u64(0);
    b.bytes.resize(b.bytes.size() + 64);  // room for the data, so that only the name is wrong
    expect_error(b.bytes, H2O_ERR_MODEL_FORMAT, "tensor info #0: empty tensor name");
}

// ---- open() -------------------------------------------------------------------------------------

TEST_CASE("gguf: open() errors name the path") {
    std::unique_ptr<GgufFile> file;
    const std::string dir = h2o_test::temp_path("gguf_a_directory");
    std::filesystem::create_directories(dir);
    Status status = GgufFile::open(dir, &file);
    CHECK(status.code == H2O_ERR_IO);
    CHECK(status.message == "cannot open '" + dir + "': is a directory");

    std::filesystem::remove(dir);

    // A FIFO is refused without blocking until a writer appears.
    const std::string fifo = h2o_test::temp_path("gguf_fifo");
    std::filesystem::remove(fifo);
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    status = GgufFile::open(fifo, &file);
    CHECK(status.code == H2O_ERR_IO);
    CHECK(status.message == "cannot open '" + fifo + "': not a regular file");
    std::filesystem::remove(fifo);

    const std::string missing = h2o_test::temp_path("gguf_does_not_exist.gguf");
    status = GgufFile::open(missing, &file);
    CHECK(status.code == H2O_ERR_IO);
    CHECK(status.message == "cannot open '" + missing + "': No such file or directory");

    // An empty file and a malformed file: the format error is prefixed with the path.
    const std::string empty = h2o_test::temp_path("gguf_empty.gguf");
    {
        std::FILE *f = std::fopen(empty.c_str(), "wb");
        REQUIRE(f);
        std::fclose(f);
    }
    status = GgufFile::open(empty, &file);
    CHECK(status.code == H2O_ERR_MODEL_FORMAT);
    CHECK(status.message == empty + ": empty file (0 bytes): not a GGUF file");

    const std::string bad = h2o_test::temp_path("gguf_bad_version.gguf");
    Bytes bytes = base_file();
    patch<uint32_t>(&bytes, 4, 1);
    {
        std::FILE *f = std::fopen(bad.c_str(), "wb");
        REQUIRE(f);
        std::fwrite(bytes.data(), 1, bytes.size(), f);
        std::fclose(f);
    }
    status = GgufFile::open(bad, &file);
    CHECK(status.code == H2O_ERR_UNSUPPORTED);
    CHECK(status.message.rfind(bad + ": GGUF version 1 is not supported", 0) == 0);
    CHECK(file == nullptr);
    std::filesystem::remove(empty);
    std::filesystem::remove(bad);
}
