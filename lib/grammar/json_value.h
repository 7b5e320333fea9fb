// A JSON document parsed into plain values: what a JSON schema arrives as. Untrusted input: the
// text is at most kMaxJsonBytes, nests at most kMaxJsonDepth deep, and every error names its byte
// offset. Object members keep their order (a schema's properties are generated in it).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "status.h"

namespace h2o {

constexpr size_t kMaxJsonBytes = 1u << 20;
constexpr int kMaxJsonDepth = 64;

struct JsonMember;

struct JsonValue {
    enum Kind {
        kNull,
        kBool,
        kNumber,
        kString,
        kArray,
        kObject
    } kind = kNull;
    bool boolean = false;
    double number = 0.0;
    std::string text;  // a string's value, or a number as written
    std::vector<JsonValue> items;
    std::vector<JsonMember> members;  // (a pair would need JsonValue complete here)

    // The member `key` of an object, or null.
    const JsonValue *find(std::string_view key) const;
    bool is(Kind k) const { return kind == k; }
};

// One member of an object: its key and value.
struct JsonMember {
    std::string first;
    JsonValue second;
};

// Errors: H2O_ERR_INVALID_ARGUMENT, "what: ..." with the byte offset.
Status parse_json(std::string_view text, const char *what, JsonValue *out);

// The value as JSON text (strings escaped; numbers as written).
std::string json_text(const JsonValue &value);

}  // namespace h2o
