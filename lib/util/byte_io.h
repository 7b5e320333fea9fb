// Little-endian serialisation of session state: a writer that appends to a byte vector and a
// reader that checks every length against what is left before it reads, naming the field that
// does not fit, so that a truncated or hostile snapshot is an error and never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "status.h"

namespace h2o {

class ByteWriter {
public:
    explicit ByteWriter(std::vector<uint8_t> *out) : out_(out) {}
    template <typename T>
    void put(T value) {
        static_assert(std::is_arithmetic_v<T>, "scalars only");
        put_raw(&value, sizeof(T));  // the supported platforms are little-endian
    }
    // A whole array, preceded by its element count, so the reader can check it.
    template <typename T>
    void put_array(const std::vector<T> &values) {
        put<uint64_t>(values.size());
        put_raw(values.data(), values.size() * sizeof(T));
    }
    void put_raw(const void *data, size_t size) {
        const size_t at = out_->size();
        out_->resize(at + size);
        if (size) std::memcpy(out_->data() + at, data, size);
    }

private:
    std::vector<uint8_t> *out_;
};

class ByteReader {
public:
    ByteReader(const uint8_t *data, size_t size) : data_(data), size_(size) {}
    template <typename T>
    Status get(const char *field, T *value) {
        static_assert(std::is_arithmetic_v<T>, "scalars only");
        return get_raw(field, value, sizeof(T));
    }
    // An array written by put_array whose element count must be exactly `expected`.
    template <typename T>
    Status get_array(const char *field, size_t expected, std::vector<T> *values) {
        uint64_t count = 0;
        H2O_TRY(get(field, &count));
        if (count != expected) {
            return make_error(H2O_ERR_STATE_FORMAT,
                              std::string(field) + " has " + std::to_string(count) + " entries, expected " + std::to_string(expected));
        }
        values->resize(expected);
        return get_raw(field, values->data(), expected * sizeof(T));
    }
    Status get_raw(const char *field, void *out, size_t size) {
        if (size > size_ - offset_) {
            return make_error(H2O_ERR_STATE_FORMAT, std::string("truncated state: ") + field + " needs " + std::to_string(size) +
                                                        " bytes at offset " + std::to_string(offset_) + ", " +
                                                        std::to_string(size_ - offset_) + " are left");
        }
        if (size) std::memcpy(out, data_ + offset_, size);
        offset_ += size;
        return Status::Ok();
    }
    size_t remaining() const { return size_ - offset_; }

private:
    const uint8_t *data_;
    size_t size_;
    size_t offset_ = 0;
};

}  // namespace h2o
