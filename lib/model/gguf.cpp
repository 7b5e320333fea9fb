// GGUF reader and writer. Format reference: ggml's docs/gguf.md. Layout of a file:
//   magic "GGUF", u32 version, u64 tensor count, u64 metadata key count,
//   metadata: { string key, u32 value type, value }*,
//   tensor infos: { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }*,
//   padding to the alignment, then the data section (offsets are relative to its start).
// A string is a u64 byte length followed by the bytes (no terminator). All little-endian.
#include "gguf.h"

#include "file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

namespace h2o {

// Scalars are copied straight from the file, which is little-endian.
static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
// Keys and tensor names are short identifiers; a bound keeps a hostile length from turning into
// a huge string_view or hash.
constexpr uint64_t kMaxNameLength = 65535;
// The smallest possible encodings, used to reject counts that cannot fit in the file before any
// vector is sized by them. Key: length + 1 byte + type + 1-byte value. Tensor info: length +
// 1 byte + n_dims + one dimension + type + offset.
constexpr uint64_t kMinKeyValueBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;
constexpr uint32_t kLastValueType = static_cast<uint32_t>(GgufType::FLOAT64);

// Bytes of one element of a fixed-size type, or 0 for STRING and ARRAY.
size_t fixed_size(GgufType type) {
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
        case GgufType::UINT64:
        case GgufType::INT64:
        case GgufType::FLOAT64:
            return 8;
        case GgufType::STRING:
        case GgufType::ARRAY:
            return 0;
    }
    return 0;
}

bool is_integer(GgufType type) {
    switch (type) {
        case GgufType::UINT8:
        case GgufType::INT8:
        case GgufType::UINT16:
        case GgufType::INT16:
        case GgufType::UINT32:
        case GgufType::INT32:
        case GgufType::UINT64:
        case GgufType::INT64:
            return true;
        default:
            return false;
    }
}

// ggml's names for the tensor types this runtime does not run, so that an "unsupported type"
// error tells the user what the file holds (and that re-quantizing would help).
const char *ggml_type_name(uint32_t id) {
    static const char *const names[] = {
        "F32",  "F16",   "Q4_0",    "Q4_1",   nullptr,   nullptr, "Q5_0",   "Q5_1",  "Q8_0",  "Q8_1",   "Q2_K",  "Q3_K",  "Q4_K", "Q5_K",
        "Q6_K", "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",    "I16",   "I32",  "I64",
        "F64",  "IQ1_M", "BF16",    nullptr,  nullptr,   nullptr, "TQ1_0",  "TQ2_0", nullptr, nullptr,  nullptr, "MXFP4",
    };
    return id < std::size(names) ? names[id] : nullptr;
}

bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// x rounded up to a multiple of alignment (a power of two); false on overflow.
bool align_up(uint64_t x, uint64_t alignment, uint64_t *out) {
    uint64_t padded = 0;
    if (__builtin_add_overflow(x, alignment - 1, &padded)) return false;
    *out = padded & ~(alignment - 1);
    return true;
}

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string range_text(uint64_t begin, uint64_t end) { return "[" + std::to_string(begin) + ".." + std::to_string(end) + ")"; }

std::string os_error(const std::string &what, const std::string &path, int error_number) {
    return what + " '" + path + "': " + std::strerror(error_number);
}

}  // namespace

const char *gguf_type_name(GgufType type) {
    switch (type) {
        case GgufType::UINT8:
            return "UINT8";
        case GgufType::INT8:
            return "INT8";
        case GgufType::UINT16:
            return "UINT16";
        case GgufType::INT16:
            return "INT16";
        case GgufType::UINT32:
            return "UINT32";
        case GgufType::INT32:
            return "INT32";
        case GgufType::FLOAT32:
            return "FLOAT32";
        case GgufType::BOOL:
            return "BOOL";
        case GgufType::STRING:
            return "STRING";
        case GgufType::ARRAY:
            return "ARRAY";
        case GgufType::UINT64:
            return "UINT64";
        case GgufType::INT64:
            return "INT64";
        case GgufType::FLOAT64:
            return "FLOAT64";
    }
    return "unknown";
}

// ---- reading ------------------------------------------------------------------------------------

// Reads the file front to back. Every read checks the remaining bytes first, and every error is
// prefixed with what is being read (the context), e.g. "metadata key 'general.name': ...".
class GgufCursor {
public:
    GgufCursor(const uint8_t *data, size_t size) : data_(data), size_(size) {}

    size_t offset() const { return pos_; }
    size_t remaining() const { return size_ - pos_; }
    void set_context(std::string context) { context_ = std::move(context); }

    Status fail(h2o_status code, const std::string &message) const {
        return make_error(code, context_.empty() ? message : context_ + ": " + message);
    }

    Status bytes(uint64_t n, const char *what, const uint8_t **out) {
        if (n > remaining()) {
            return make_error(H2O_ERR_MODEL_FORMAT, "truncated at offset " + std::to_string(pos_) + " while reading " + context_ + ": " +
                                                        what + " (needs " + std::to_string(n) + " bytes, " + std::to_string(remaining()) +
                                                        " remain)");
        }
        *out = data_ + pos_;
        pos_ += static_cast<size_t>(n);
        return Status::Ok();
    }

    // memcpy, not a cast: the file gives no alignment guarantee for scalars.
    template <class T>
    Status scalar(const char *what, T *out) {
        const uint8_t *p = nullptr;
        H2O_TRY(bytes(sizeof(T), what, &p));
        std::memcpy(out, p, sizeof(T));
        return Status::Ok();
    }

    Status string(const char *what, uint64_t max_length, std::string_view *out) {
        uint64_t length = 0;
        H2O_TRY(scalar(what, &length));
        if (length > max_length) {
            return fail(H2O_ERR_MODEL_FORMAT, std::string(what) + " is " + std::to_string(length) + " bytes long, more than the limit of " +
                                                  std::to_string(max_length));
        }
        const uint8_t *p = nullptr;
        H2O_TRY(bytes(length, what, &p));
        *out = std::string_view(reinterpret_cast<const char *>(p), static_cast<size_t>(length));
        return Status::Ok();
    }

private:
    const uint8_t *data_;
    size_t size_;
    size_t pos_ = 0;
    std::string context_;
};

namespace {

// Integers widen into both i64 and u64 where the value fits each.
template <class T>
Status read_integer(GgufCursor &in, GgufValue *out) {
    T v{};
    H2O_TRY(in.scalar("value", &v));
    if constexpr (std::is_signed_v<T>) {
        out->i64 = v;
        if (v >= 0) out->u64 = static_cast<uint64_t>(v);
    } else {
        out->u64 = v;
        if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) out->i64 = static_cast<int64_t>(v);
    }
    return Status::Ok();
}

template <class T>
Status read_float(GgufCursor &in, GgufValue *out) {
    T v{};
    H2O_TRY(in.scalar("value", &v));
    out->f64 = v;
    return Status::Ok();
}

Status read_bool(GgufCursor &in, GgufValue *out) {
    uint8_t v = 0;
    H2O_TRY(in.scalar("value", &v));
    if (v > 1) return in.fail(H2O_ERR_MODEL_FORMAT, "BOOL value is " + std::to_string(v) + ", expected 0 or 1");
    out->u64 = v;
    out->i64 = v;
    return Status::Ok();
}

Status read_value_type(GgufCursor &in, const char *what, GgufType *out) {
    uint32_t id = 0;
    H2O_TRY(in.scalar(what, &id));
    if (id > kLastValueType) return in.fail(H2O_ERR_MODEL_FORMAT, "unknown value type id " + std::to_string(id));
    *out = static_cast<GgufType>(id);
    return Status::Ok();
}

Status read_array(GgufCursor &in, GgufValue *out) {
    H2O_TRY(read_value_type(in, "array element type", &out->array_type));
    if (out->array_type == GgufType::ARRAY) return in.fail(H2O_ERR_UNSUPPORTED, "arrays of arrays are not supported");
    H2O_TRY(in.scalar("array length", &out->array_size));
    const uint64_t count = out->array_size;
    // Each string takes at least its 8-byte length, so this also bounds the reserve below.
    const size_t element_min_bytes = out->array_type == GgufType::STRING ? 8 : fixed_size(out->array_type);
    if (count > in.remaining() / element_min_bytes) {
        return in.fail(H2O_ERR_MODEL_FORMAT, "array of " + std::to_string(count) + " " + gguf_type_name(out->array_type) +
                                                 " elements at offset " + std::to_string(in.offset()) + " cannot fit in the " +
                                                 std::to_string(in.remaining()) + " bytes that remain");
    }
    if (out->array_type == GgufType::STRING) {
        out->array_strings.reserve(static_cast<size_t>(count));
        for (uint64_t i = 0; i < count; ++i) {
            std::string_view s;
            H2O_TRY(in.string("array string", std::numeric_limits<uint64_t>::max(), &s));
            out->array_strings.push_back(s);
        }
        return Status::Ok();
    }
    H2O_TRY(in.bytes(count * element_min_bytes, "array elements", &out->array_data));
    if (out->array_type == GgufType::BOOL) {
        for (uint64_t i = 0; i < count; ++i) {
            if (out->array_data[i] > 1) {
                return in.fail(H2O_ERR_MODEL_FORMAT, "BOOL array element " + std::to_string(i) + " is " +
                                                         std::to_string(out->array_data[i]) + ", expected 0 or 1");
            }
        }
    }
    return Status::Ok();
}

Status read_value(GgufCursor &in, GgufType type, GgufValue *out) {
    out->type = type;
    switch (type) {
        case GgufType::UINT8:
            return read_integer<uint8_t>(in, out);
        case GgufType::INT8:
            return read_integer<int8_t>(in, out);
        case GgufType::UINT16:
            return read_integer<uint16_t>(in, out);
        case GgufType::INT16:
            return read_integer<int16_t>(in, out);
        case GgufType::UINT32:
            return read_integer<uint32_t>(in, out);
        case GgufType::INT32:
            return read_integer<int32_t>(in, out);
        case GgufType::UINT64:
            return read_integer<uint64_t>(in, out);
        case GgufType::INT64:
            return read_integer<int64_t>(in, out);
        case GgufType::FLOAT32:
            return read_float<float>(in, out);
        case GgufType::FLOAT64:
            return read_float<double>(in, out);
        case GgufType::BOOL:
            return read_bool(in, out);
        case GgufType::STRING:
            return in.string("string value", std::numeric_limits<uint64_t>::max(), &out->str);
        case GgufType::ARRAY:
            return read_array(in, out);
    }
    return in.fail(H2O_ERR_INTERNAL, "unhandled value type");  // read_value_type admits only the above
}

}  // namespace

GgufFile::~GgufFile() {
    if (mapping_ != nullptr) munmap(mapping_, size_);
}

void GgufFile::release_pages(const void *data, size_t bytes) const {
    const auto begin = reinterpret_cast<uintptr_t>(data), map = reinterpret_cast<uintptr_t>(mapping_);
    if (mapping_ == nullptr || begin < map || bytes > size_ || begin - map > size_ - bytes) return;
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
    // Advice only: if the OS declines, the pages simply stay resident.
    if (last > first) madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED);
}

Status GgufFile::open(const std::string &path, std::unique_ptr<GgufFile> *out) {
    // O_NONBLOCK so that opening a FIFO by mistake fails the regular-file check below instead of
    // blocking until a writer appears. It has no effect on regular files.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return make_error(H2O_ERR_IO, os_error("cannot open", path, errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int error_number = errno;
        ::close(fd);
        return make_error(H2O_ERR_IO, os_error("cannot stat", path, error_number));
    }
    if (S_ISDIR(st.st_mode)) {
        ::close(fd);
        return make_error(H2O_ERR_IO, "cannot open '" + path + "': is a directory");
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        return make_error(H2O_ERR_IO, "cannot open '" + path + "': not a regular file");
    }
    if (static_cast<uint64_t>(st.st_size) > std::numeric_limits<size_t>::max()) {
        ::close(fd);
        return make_error(H2O_ERR_IO, "cannot map '" + path + "': file too large for the address space");
    }
    std::unique_ptr<GgufFile> file(new GgufFile());
    file->size_ = static_cast<size_t>(st.st_size);
    if (file->size_ > 0) {  // mmap rejects length 0; an empty file fails parsing below
        void *mapping = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (mapping == MAP_FAILED) {
            const int error_number = errno;
            ::close(fd);
            return make_error(H2O_ERR_IO, os_error("cannot map", path, error_number));
        }
        file->mapping_ = mapping;
        file->data_ = static_cast<const uint8_t *>(mapping);
    }
    ::close(fd);  // the mapping keeps the file's contents reachable
    Status status = file->parse_all();
    if (!status.ok()) return make_error(status.code, path + ": " + status.message);
    *out = std::move(file);
    return Status::Ok();
}

Status GgufFile::parse(const uint8_t *data, size_t size, std::unique_ptr<GgufFile> *out) {
    std::unique_ptr<GgufFile> file(new GgufFile());
    file->data_ = data;
    file->size_ = size;
    H2O_TRY(file->parse_all());
    *out = std::move(file);
    return Status::Ok();
}

Status GgufFile::parse_all() {
    if (size_ == 0) return make_error(H2O_ERR_MODEL_FORMAT, "empty file (0 bytes): not a GGUF file");
    GgufCursor in(data_, size_);
    uint64_t n_tensors = 0, n_kv = 0;
    H2O_TRY(parse_header(in, &n_tensors, &n_kv));
    H2O_TRY(parse_metadata(in, n_kv));
    H2O_TRY(parse_alignment());
    H2O_TRY(parse_tensor_infos(in, n_tensors));
    return place_tensor_data(in.offset());
}

Status GgufFile::parse_header(GgufCursor &in, uint64_t *n_tensors, uint64_t *n_kv) {
    in.set_context("the header");
    const uint8_t *magic = nullptr;
    H2O_TRY(in.bytes(4, "magic", &magic));
    if (std::memcmp(magic, kMagic, 4) != 0) {
        char text[64];
        std::snprintf(text, sizeof(text), "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
        return make_error(H2O_ERR_MODEL_FORMAT, std::string("not a GGUF file: bad magic (first bytes ") + text + ", expected 'GGUF')");
    }
    H2O_TRY(in.scalar("version", &version_));
    if (version_ == 1) {
        return make_error(H2O_ERR_UNSUPPORTED,
                          "GGUF version 1 is not supported (only versions 2 and 3); "
                          "convert the model again with a current llama.cpp");
    }
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) {
        return make_error(H2O_ERR_UNSUPPORTED, "big-endian GGUF files are not supported");
    }
    if (version_ != 2 && version_ != 3) {
        return make_error(H2O_ERR_UNSUPPORTED, "GGUF version " + std::to_string(version_) + " is not supported (only versions 2 and 3)");
    }
    H2O_TRY(in.scalar("tensor count", n_tensors));
    H2O_TRY(in.scalar("metadata key count", n_kv));
    const uint64_t remaining = in.remaining();
    if (*n_kv > remaining / kMinKeyValueBytes) {
        return make_error(H2O_ERR_MODEL_FORMAT, "metadata key count " + std::to_string(*n_kv) + " cannot fit in the " +
                                                    std::to_string(remaining) + " bytes after the header");
    }
    if (*n_tensors > remaining / kMinTensorInfoBytes) {
        return make_error(H2O_ERR_MODEL_FORMAT, "tensor count " + std::to_string(*n_tensors) + " cannot fit in the " +
                                                    std::to_string(remaining) + " bytes after the header");
    }
    return Status::Ok();
}

Status GgufFile::parse_metadata(GgufCursor &in, uint64_t n_kv) {
    kv_.reserve(static_cast<size_t>(n_kv));  // bounded by the file size in parse_header
    for (uint64_t i = 0; i < n_kv; ++i) {
        in.set_context("metadata key #" + std::to_string(i));
        GgufKeyValue kv;
        H2O_TRY(in.string("key name", kMaxNameLength, &kv.key));
        if (kv.key.empty()) return in.fail(H2O_ERR_MODEL_FORMAT, "empty key name");
        in.set_context("metadata key " + quoted(kv.key));
        if (kv_index_.count(kv.key) != 0) return in.fail(H2O_ERR_MODEL_FORMAT, "duplicate key");
        GgufType type;
        H2O_TRY(read_value_type(in, "value type", &type));
        H2O_TRY(read_value(in, type, &kv.value));
        kv_index_.emplace(kv.key, kv_.size());
        kv_.push_back(std::move(kv));
    }
    return Status::Ok();
}

Status GgufFile::parse_alignment() {
    const GgufValue *value = find("general.alignment");
    if (value == nullptr) return Status::Ok();
    const std::string prefix = "metadata key 'general.alignment': ";
    if (value->type != GgufType::UINT32) {
        return make_error(H2O_ERR_MODEL_FORMAT, prefix + "expected type UINT32, got " + gguf_type_name(value->type));
    }
    if (!is_power_of_two(value->u64)) {
        return make_error(H2O_ERR_MODEL_FORMAT, prefix + "must be a nonzero power of two, got " + std::to_string(value->u64));
    }
    alignment_ = static_cast<uint32_t>(value->u64);
    return Status::Ok();
}

Status GgufFile::parse_tensor_infos(GgufCursor &in, uint64_t n_tensors) {
    tensors_.reserve(static_cast<size_t>(n_tensors));  // bounded by the file size in parse_header
    for (uint64_t i = 0; i < n_tensors; ++i) {
        in.set_context("tensor info #" + std::to_string(i));
        GgufTensor t;
        H2O_TRY(in.string("tensor name", kMaxNameLength, &t.name));
        if (t.name.empty()) return in.fail(H2O_ERR_MODEL_FORMAT, "empty tensor name");
        in.set_context("tensor " + quoted(t.name));
        if (tensor_index_.count(t.name) != 0) return in.fail(H2O_ERR_MODEL_FORMAT, "duplicate tensor name");

        H2O_TRY(in.scalar("n_dims", &t.n_dims));
        if (t.n_dims < 1 || t.n_dims > kMaxDims) {
            return in.fail(H2O_ERR_MODEL_FORMAT, "n_dims is " + std::to_string(t.n_dims) + ", expected 1 to 4");
        }
        int64_t n_elements = 1;
        for (uint32_t d = 0; d < t.n_dims; ++d) {
            uint64_t dim = 0;
            H2O_TRY(in.scalar("dimension", &dim));
            if (dim == 0) return in.fail(H2O_ERR_MODEL_FORMAT, "dimension " + std::to_string(d) + " is 0");
            if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                return in.fail(H2O_ERR_MODEL_FORMAT, "dimension " + std::to_string(d) + " is " + std::to_string(dim) + ", too large");
            }
            t.ne[d] = static_cast<int64_t>(dim);
            if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements)) {
                return in.fail(H2O_ERR_MODEL_FORMAT, "the element count (product of the dimensions) overflows int64");
            }
        }

        uint32_t type_id = 0;
        H2O_TRY(in.scalar("tensor type", &type_id));
        const TensorTypeTraits *traits = tensor_type_traits(type_id);
        if (traits == nullptr) {
            const char *ggml_name = ggml_type_name(type_id);
            return in.fail(H2O_ERR_UNSUPPORTED, "tensor type id " + std::to_string(type_id) +
                                                    (ggml_name ? std::string(" (") + ggml_name + ")" : "") + " is not supported");
        }
        t.type = static_cast<TensorType>(type_id);
        if (t.ne[0] % traits->block_elements != 0) {
            return in.fail(H2O_ERR_MODEL_FORMAT, "row length ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                                                     traits->name + " block size " + std::to_string(traits->block_elements));
        }
        const uint64_t blocks_per_row = static_cast<uint64_t>(t.ne[0]) / traits->block_elements;
        uint64_t bytes_per_row = 0;
        if (__builtin_mul_overflow(blocks_per_row, traits->block_bytes, &bytes_per_row) ||
            __builtin_mul_overflow(bytes_per_row, static_cast<uint64_t>(t.n_rows()), &t.n_bytes)) {
            return in.fail(H2O_ERR_MODEL_FORMAT, "data size overflows 64 bits");
        }

        H2O_TRY(in.scalar("data offset", &t.offset));
        if (t.offset % alignment_ != 0) {
            return in.fail(H2O_ERR_MODEL_FORMAT,
                           "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(alignment_));
        }
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(t);
    }
    return Status::Ok();
}

Status GgufFile::place_tensor_data(uint64_t header_end) {
    uint64_t data_start = 0;
    if (!align_up(header_end, alignment_, &data_start)) {
        return make_error(H2O_ERR_MODEL_FORMAT, "data section start overflows 64 bits");
    }
    for (GgufTensor &t : tensors_) {
        uint64_t begin = 0, end = 0;
        if (__builtin_add_overflow(data_start, t.offset, &begin) || __builtin_add_overflow(begin, t.n_bytes, &end)) {
            return make_error(H2O_ERR_MODEL_FORMAT,
                              "tensor " + quoted(t.name) + ": data offset " + std::to_string(t.offset) + " overflows 64 bits");
        }
        if (end > size_) {
            return make_error(H2O_ERR_MODEL_FORMAT, "tensor " + quoted(t.name) + ": data " + range_text(begin, end) +
                                                        " extends past end of file (size " + std::to_string(size_) + ")");
        }
        t.data = data_ + begin;
    }
    // Overlapping tensors would alias each other's weights: a sign of a corrupt or crafted file.
    std::vector<const GgufTensor *> by_offset;
    by_offset.reserve(tensors_.size());
    for (const GgufTensor &t : tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensor *a, const GgufTensor *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const GgufTensor &prev = *by_offset[i - 1];
        const GgufTensor &next = *by_offset[i];
        if (next.offset < prev.offset + prev.n_bytes) {  // no overflow: both ends were checked above
            return make_error(H2O_ERR_MODEL_FORMAT, "tensors " + quoted(prev.name) + " (data " +
                                                        range_text(data_start + prev.offset, data_start + prev.offset + prev.n_bytes) +
                                                        ") and " + quoted(next.name) + " (data " +
                                                        range_text(data_start + next.offset, data_start + next.offset + next.n_bytes) +
                                                        ") overlap");
        }
    }
    return Status::Ok();
}

const GgufValue *GgufFile::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const GgufTensor *GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// ---- typed getters ------------------------------------------------------------------------------

namespace {

Status missing_key(std::string_view key) { return make_error(H2O_ERR_MODEL_FORMAT, "missing metadata key " + quoted(key)); }

std::string describe_type(const GgufValue &value) {
    if (value.type != GgufType::ARRAY) return gguf_type_name(value.type);
    return std::string("ARRAY of ") + gguf_type_name(value.array_type);
}

Status wrong_type(std::string_view key, const char *expected, const GgufValue &actual) {
    return make_error(H2O_ERR_MODEL_FORMAT, "metadata key " + quoted(key) + ": expected " + expected + ", got " + describe_type(actual));
}

// Unaligned element i of a fixed-size array.
template <class T>
T array_element(const GgufValue &value, uint64_t i) {
    T v;
    std::memcpy(&v, value.array_data + i * sizeof(T), sizeof(T));
    return v;
}

}  // namespace

Status GgufFile::get_u32(std::string_view key, uint32_t *out) const {
    const GgufValue *value = find(key);
    if (value == nullptr) return missing_key(key);
    if (!is_integer(value->type)) return wrong_type(key, "an integer", *value);
    constexpr uint32_t max = std::numeric_limits<uint32_t>::max();
    const bool is_signed =
        value->type == GgufType::INT8 || value->type == GgufType::INT16 || value->type == GgufType::INT32 || value->type == GgufType::INT64;
    const bool in_range = is_signed ? value->i64 >= 0 && value->i64 <= max : value->u64 <= max;
    if (!in_range) {
        const std::string text = is_signed ? std::to_string(value->i64) : std::to_string(value->u64);
        return make_error(H2O_ERR_MODEL_FORMAT, "metadata key " + quoted(key) + ": value " + text + " (" + gguf_type_name(value->type) +
                                                    ") is out of range for uint32");
    }
    *out = static_cast<uint32_t>(is_signed ? static_cast<uint64_t>(value->i64) : value->u64);
    return Status::Ok();
}

Status GgufFile::get_u32_or(std::string_view key, uint32_t fallback, uint32_t *out) const {
    if (find(key) == nullptr) {
        *out = fallback;
        return Status::Ok();
    }
    return get_u32(key, out);
}

Status GgufFile::get_f32(std::string_view key, float *out) const {
    const GgufValue *value = find(key);
    if (value == nullptr) return missing_key(key);
    if (value->type != GgufType::FLOAT32 && value->type != GgufType::FLOAT64) {
        return wrong_type(key, "FLOAT32 or FLOAT64", *value);
    }
    // Converting a finite double beyond float's range is undefined behaviour.
    if (std::isfinite(value->f64) && std::fabs(value->f64) > std::numeric_limits<float>::max()) {
        return make_error(H2O_ERR_MODEL_FORMAT,
                          "metadata key " + quoted(key) + ": value " + std::to_string(value->f64) + " is out of range for float32");
    }
    *out = static_cast<float>(value->f64);
    return Status::Ok();
}

Status GgufFile::get_f32_or(std::string_view key, float fallback, float *out) const {
    if (find(key) == nullptr) {
        *out = fallback;
        return Status::Ok();
    }
    return get_f32(key, out);
}

Status GgufFile::get_string(std::string_view key, std::string_view *out) const {
    const GgufValue *value = find(key);
    if (value == nullptr) return missing_key(key);
    if (value->type != GgufType::STRING) return wrong_type(key, "STRING", *value);
    *out = value->str;
    return Status::Ok();
}

Status GgufFile::get_bool_or(std::string_view key, bool fallback, bool *out) const {
    const GgufValue *value = find(key);
    if (value == nullptr) {
        *out = fallback;
        return Status::Ok();
    }
    if (value->type != GgufType::BOOL) return wrong_type(key, "BOOL", *value);
    *out = value->u64 != 0;
    return Status::Ok();
}

Status GgufFile::get_string_array(std::string_view key, std::vector<std::string_view> *out) const {
    const GgufValue *value = find(key);
    if (value == nullptr) return missing_key(key);
    if (value->type != GgufType::ARRAY || value->array_type != GgufType::STRING) {
        return wrong_type(key, "ARRAY of STRING", *value);
    }
    *out = value->array_strings;
    return Status::Ok();
}

Status GgufFile::get_f32_array(std::string_view key, std::vector<float> *out) const {
    const GgufValue *value = find(key);
    if (value == nullptr) return missing_key(key);
    const bool is_float_array =
        value->type == GgufType::ARRAY && (value->array_type == GgufType::FLOAT32 || value->array_type == GgufType::FLOAT64);
    if (!is_float_array) return wrong_type(key, "ARRAY of FLOAT32 or FLOAT64", *value);
    std::vector<float> result(static_cast<size_t>(value->array_size));
    for (uint64_t i = 0; i < value->array_size; ++i) {
        if (value->array_type == GgufType::FLOAT32) {
            result[i] = array_element<float>(*value, i);
            continue;
        }
        const double v = array_element<double>(*value, i);
        if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max()) {
            return make_error(H2O_ERR_MODEL_FORMAT, "metadata key " + quoted(key) + ": element " + std::to_string(i) + " value " +
                                                        std::to_string(v) + " is out of range for float32");
        }
        result[i] = static_cast<float>(v);
    }
    *out = std::move(result);
    return Status::Ok();
}

Status GgufFile::get_i32_array(std::string_view key, std::vector<int32_t> *out) const {
    const GgufValue *value = find(key);
    if (value == nullptr) return missing_key(key);
    const bool is_int32_array =
        value->type == GgufType::ARRAY && (value->array_type == GgufType::INT32 || value->array_type == GgufType::UINT32);
    if (!is_int32_array) return wrong_type(key, "ARRAY of INT32 or UINT32", *value);
    std::vector<int32_t> result(static_cast<size_t>(value->array_size));
    for (uint64_t i = 0; i < value->array_size; ++i) {
        if (value->array_type == GgufType::INT32) {
            result[i] = array_element<int32_t>(*value, i);
            continue;
        }
        const uint32_t v = array_element<uint32_t>(*value, i);
        if (v > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
            return make_error(H2O_ERR_MODEL_FORMAT, "metadata key " + quoted(key) + ": element " + std::to_string(i) + " value " +
                                                        std::to_string(v) + " (UINT32) is out of range for int32");
        }
        result[i] = static_cast<int32_t>(v);
    }
    *out = std::move(result);
    return Status::Ok();
}

// ---- writing ------------------------------------------------------------------------------------

namespace {

template <class T>
void put(std::vector<uint8_t> *out, T value) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out->insert(out->end(), bytes, bytes + sizeof(T));
}

void put_type(std::vector<uint8_t> *out, GgufType type) { put(out, static_cast<uint32_t>(type)); }

void put_string(std::vector<uint8_t> *out, std::string_view s) {
    put(out, static_cast<uint64_t>(s.size()));
    out->insert(out->end(), s.begin(), s.end());
}

template <class T>
std::vector<uint8_t> encode_scalar(GgufType type, T value) {
    std::vector<uint8_t> out;
    put_type(&out, type);
    put(&out, value);
    return out;
}

template <class T>
std::vector<uint8_t> encode_array(GgufType element_type, const std::vector<T> &values) {
    std::vector<uint8_t> out;
    put_type(&out, GgufType::ARRAY);
    put_type(&out, element_type);
    put(&out, static_cast<uint64_t>(values.size()));
    for (const T &v : values) put(&out, v);
    return out;
}

}  // namespace

void GgufWriter::record_error(std::string message) {
    if (error_.ok()) error_ = make_error(H2O_ERR_INVALID_ARGUMENT, "GGUF writer: " + std::move(message));
}

void GgufWriter::add_entry(std::string key, std::vector<uint8_t> value) {
    if (key.empty() || key.size() > kMaxNameLength) {
        return record_error("metadata key " + quoted(key) + ": name must be 1 to 65535 bytes long");
    }
    if (key == "general.alignment") {
        return record_error("metadata key 'general.alignment' must be UINT32; it is written by set_alignment()");
    }
    for (const Entry &e : entries_) {
        if (e.key == key) return record_error("duplicate metadata key " + quoted(key));
    }
    entries_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::set_alignment(uint32_t alignment) {
    if (!is_power_of_two(alignment)) {
        return record_error("alignment must be a nonzero power of two, got " + std::to_string(alignment));
    }
    alignment_ = alignment;
    std::vector<uint8_t> value = encode_scalar(GgufType::UINT32, alignment);
    for (Entry &e : entries_) {
        if (e.key == "general.alignment") {
            e.value = std::move(value);  // keep the key where it was first added
            return;
        }
    }
    if (alignment != kDefaultAlignment) entries_.push_back({"general.alignment", std::move(value)});
}

void GgufWriter::add_u32(std::string key, uint32_t value) {
    if (key == "general.alignment") return set_alignment(value);
    add_entry(std::move(key), encode_scalar(GgufType::UINT32, value));
}

void GgufWriter::add_i32(std::string key, int32_t value) { add_entry(std::move(key), encode_scalar(GgufType::INT32, value)); }

void GgufWriter::add_f32(std::string key, float value) { add_entry(std::move(key), encode_scalar(GgufType::FLOAT32, value)); }

void GgufWriter::add_bool(std::string key, bool value) {
    add_entry(std::move(key), encode_scalar(GgufType::BOOL, static_cast<uint8_t>(value ? 1 : 0)));
}

void GgufWriter::add_string(std::string key, std::string value) {
    std::vector<uint8_t> encoded;
    put_type(&encoded, GgufType::STRING);
    put_string(&encoded, value);
    add_entry(std::move(key), std::move(encoded));
}

void GgufWriter::add_string_array(std::string key, std::vector<std::string> values) {
    std::vector<uint8_t> encoded;
    put_type(&encoded, GgufType::ARRAY);
    put_type(&encoded, GgufType::STRING);
    put(&encoded, static_cast<uint64_t>(values.size()));
    for (const std::string &s : values) put_string(&encoded, s);
    add_entry(std::move(key), std::move(encoded));
}

void GgufWriter::add_f32_array(std::string key, std::vector<float> values) {
    add_entry(std::move(key), encode_array(GgufType::FLOAT32, values));
}

void GgufWriter::add_i32_array(std::string key, std::vector<int32_t> values) {
    add_entry(std::move(key), encode_array(GgufType::INT32, values));
}

void GgufWriter::add_copy(const GgufKeyValue &kv) {
    const GgufValue &value = kv.value;
    if (kv.key == "general.alignment") {
        if (value.type != GgufType::UINT32) {
            return record_error("metadata key 'general.alignment': expected UINT32, got " + std::string(gguf_type_name(value.type)));
        }
        return set_alignment(static_cast<uint32_t>(value.u64));
    }
    std::vector<uint8_t> encoded;
    put_type(&encoded, value.type);
    switch (value.type) {
        case GgufType::UINT8:
            put(&encoded, static_cast<uint8_t>(value.u64));
            break;
        case GgufType::INT8:
            put(&encoded, static_cast<int8_t>(value.i64));
            break;
        case GgufType::UINT16:
            put(&encoded, static_cast<uint16_t>(value.u64));
            break;
        case GgufType::INT16:
            put(&encoded, static_cast<int16_t>(value.i64));
            break;
        case GgufType::UINT32:
            put(&encoded, static_cast<uint32_t>(value.u64));
            break;
        case GgufType::INT32:
            put(&encoded, static_cast<int32_t>(value.i64));
            break;
        case GgufType::UINT64:
            put(&encoded, value.u64);
            break;
        case GgufType::INT64:
            put(&encoded, value.i64);
            break;
        case GgufType::FLOAT32:
            put(&encoded, static_cast<float>(value.f64));
            break;  // exact: it came from a float
        case GgufType::FLOAT64:
            put(&encoded, value.f64);
            break;
        case GgufType::BOOL:
            put(&encoded, static_cast<uint8_t>(value.u64 != 0));
            break;
        case GgufType::STRING:
            put_string(&encoded, value.str);
            break;
        case GgufType::ARRAY: {
            put_type(&encoded, value.array_type);
            put(&encoded, value.array_size);
            if (value.array_type == GgufType::STRING) {
                if (value.array_strings.size() != value.array_size) {
                    return record_error("metadata key " + quoted(kv.key) + ": array_size does not match array_strings");
                }
                for (std::string_view s : value.array_strings) put_string(&encoded, s);
                break;
            }
            const size_t element_size = fixed_size(value.array_type);
            if (element_size == 0 || (value.array_size > 0 && value.array_data == nullptr)) {
                return record_error("metadata key " + quoted(kv.key) + ": cannot copy an ARRAY of " + gguf_type_name(value.array_type));
            }
            encoded.insert(encoded.end(), value.array_data, value.array_data + value.array_size * element_size);
            break;
        }
        default:
            return record_error("metadata key " + quoted(kv.key) + ": unknown value type id " +
                                std::to_string(static_cast<uint32_t>(value.type)));
    }
    add_entry(std::string(kv.key), std::move(encoded));
}

void GgufWriter::add_tensor(std::string name, TensorType type, std::vector<int64_t> ne, std::vector<uint8_t> data) {
    const std::string label = "tensor " + quoted(name);
    if (name.empty() || name.size() > kMaxNameLength) {
        return record_error(label + ": name must be 1 to 65535 bytes long");
    }
    for (const TensorEntry &t : tensors_) {
        if (t.name == name) return record_error("duplicate tensor name " + quoted(name));
    }
    const TensorTypeTraits *traits = tensor_type_traits(static_cast<uint32_t>(type));
    if (traits == nullptr) return record_error(label + ": unknown tensor type");
    if (ne.empty() || ne.size() > kMaxDims) return record_error(label + ": must have 1 to 4 dimensions");
    int64_t n_elements = 1;
    for (int64_t dim : ne) {
        if (dim <= 0) return record_error(label + ": dimensions must be positive");
        if (__builtin_mul_overflow(n_elements, dim, &n_elements)) {
            return record_error(label + ": element count overflows");
        }
    }
    if (ne[0] % traits->block_elements != 0) {
        return record_error(label + ": row length " + std::to_string(ne[0]) + " is not a multiple of the " + traits->name + " block size " +
                            std::to_string(traits->block_elements));
    }
    const uint64_t expected = static_cast<uint64_t>(row_bytes(type, ne[0])) * static_cast<uint64_t>(n_elements / ne[0]);
    if (data.size() != expected) {
        return record_error(label + ": data has " + std::to_string(data.size()) + " bytes, its shape needs " + std::to_string(expected));
    }
    tensors_.push_back({std::move(name), type, std::move(ne), std::move(data)});
}

template <class Sink>
bool GgufWriter::emit(Sink &sink) const {
    static const uint8_t zeros[4096] = {};
    auto pad = [&sink](uint64_t n) {
        while (n > 0) {
            const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, sizeof(zeros)));
            if (!sink(zeros, chunk)) return false;
            n -= chunk;
        }
        return true;
    };

    std::vector<uint8_t> header(kMagic, kMagic + 4);
    put(&header, uint32_t{3});
    put(&header, static_cast<uint64_t>(tensors_.size()));
    put(&header, static_cast<uint64_t>(entries_.size()));
    for (const Entry &e : entries_) {
        put_string(&header, e.key);
        header.insert(header.end(), e.value.begin(), e.value.end());
    }
    // Tensor data follows in insertion order, each at the next multiple of the alignment.
    uint64_t data_size = 0;
    for (const TensorEntry &t : tensors_) {
        put_string(&header, t.name);
        put(&header, static_cast<uint32_t>(t.ne.size()));
        for (int64_t dim : t.ne) put(&header, static_cast<uint64_t>(dim));
        put(&header, static_cast<uint32_t>(t.type));
        uint64_t offset = 0;
        align_up(data_size, alignment_, &offset);
        put(&header, offset);
        data_size = offset + t.data.size();
    }
    if (!sink(header.data(), header.size())) return false;

    // The data section starts at the aligned end of the header, and it is aligned, so aligning
    // each file position lands every tensor at data start + its offset.
    uint64_t position = header.size();
    for (const TensorEntry &t : tensors_) {
        uint64_t aligned = 0;
        align_up(position, alignment_, &aligned);
        if (!pad(aligned - position) || !sink(t.data.data(), t.data.size())) return false;
        position = aligned + t.data.size();
    }
    return true;
}

std::vector<uint8_t> GgufWriter::serialize() const {
    if (!error_.ok()) {
        std::fprintf(stderr, "h2o: GgufWriter::serialize() called on an invalid writer: %s\n", error_.message.c_str());
        std::abort();
    }
    std::vector<uint8_t> out;
    auto append = [&out](const uint8_t *p, size_t n) {
        out.insert(out.end(), p, p + n);
        return true;
    };
    emit(append);
    return out;
}

Status GgufWriter::write(const std::string &path) const {
    if (!error_.ok()) return error_;
    return write_file_atomically(path, [this](const ByteSink &sink) { return emit(sink); });
}

}  // namespace h2o
