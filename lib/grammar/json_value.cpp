#include "json_value.h"

#include <cstdlib>

#include "utf8.h"

namespace h2o {

const JsonValue *JsonValue::find(std::string_view key) const {
    for (const auto &[name, value] : members) {
        if (name == key) return &value;
    }
    return nullptr;
}

namespace {

class JsonParser {
public:
    JsonParser(std::string_view text, const char *what) : text_(text), what_(what) {}

    Status document(JsonValue *out) {
        H2O_TRY(value(out, 0));
        skip_space();
        if (pos_ != text_.size()) return error("unexpected text after the value");
        return Status::Ok();
    }

private:
    Status error(const std::string &why) const {
        return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what_) + ": " + why + " (at byte " + std::to_string(pos_) + ")");
    }
    void skip_space() {
        while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) ++pos_;
    }
    bool take(std::string_view word) {
        if (text_.substr(pos_, word.size()) != word) return false;
        pos_ += word.size();
        return true;
    }

    Status value(JsonValue *out, int depth) {
        if (depth > kMaxJsonDepth) return error("nested deeper than " + std::to_string(kMaxJsonDepth));
        skip_space();
        if (pos_ >= text_.size()) return error("a value is missing");
        const char c = text_[pos_];
        if (c == '{') return object(out, depth);
        if (c == '[') return array(out, depth);
        if (c == '"') {
            out->kind = JsonValue::kString;
            return string(&out->text);
        }
        if (take("true")) {
            out->kind = JsonValue::kBool;
            out->boolean = true;
        } else if (take("false")) {
            out->kind = JsonValue::kBool;
        } else if (take("null")) {
            out->kind = JsonValue::kNull;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            return number(out);
        } else {
            return error(std::string("unexpected character '") + c + "'");
        }
        return Status::Ok();
    }

    Status object(JsonValue *out, int depth) {
        out->kind = JsonValue::kObject;
        ++pos_;
        skip_space();
        if (take("}")) return Status::Ok();
        for (;;) {
            skip_space();
            if (pos_ >= text_.size() || text_[pos_] != '"') return error("expected a member name");
            std::string key;
            H2O_TRY(string(&key));
            skip_space();
            if (!take(":")) return error("expected ':'");
            JsonValue member;
            H2O_TRY(value(&member, depth + 1));
            out->members.push_back(JsonMember{std::move(key), std::move(member)});
            skip_space();
            if (take("}")) return Status::Ok();
            if (!take(",")) return error("expected ',' or '}'");
        }
    }

    Status array(JsonValue *out, int depth) {
        out->kind = JsonValue::kArray;
        ++pos_;
        skip_space();
        if (take("]")) return Status::Ok();
        for (;;) {
            out->items.emplace_back();
            H2O_TRY(value(&out->items.back(), depth + 1));
            skip_space();
            if (take("]")) return Status::Ok();
            if (!take(",")) return error("expected ',' or ']'");
        }
    }

    Status number(JsonValue *out) {
        const size_t start = pos_;
        auto digits = [&]() {
            const size_t from = pos_;
            while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
            return pos_ > from;
        };
        take("-");
        if (take("0")) {
        } else if (!digits()) {
            return error("a number without digits");
        }
        if (take(".") && !digits()) return error("a number without digits after '.'");
        if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
            ++pos_;
            if (!take("+")) take("-");
            if (!digits()) return error("a number without an exponent");
        }
        out->kind = JsonValue::kNumber;
        out->text = std::string(text_.substr(start, pos_ - start));
        out->number = std::strtod(out->text.c_str(), nullptr);
        return Status::Ok();
    }

    Status hex4(uint32_t *out) {
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i, ++pos_) {
            if (pos_ >= text_.size()) return error("a \\u escape ends early");
            const char c = text_[pos_];
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return error("a \\u escape with a character that is not hexadecimal");
            v = v * 16 + static_cast<uint32_t>(d);
        }
        *out = v;
        return Status::Ok();
    }

    static void append_utf8(uint32_t cp, std::string *out) {
        if (cp < 0x80) {
            out->push_back(static_cast<char>(cp));
        } else if (cp < 0x800) {
            out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
            out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
            out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else {
            out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
            out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
    }

    Status string(std::string *out) {
        ++pos_;  // '"'
        for (;;) {
            if (pos_ >= text_.size()) return error("unterminated string");
            const char c = text_[pos_];
            if (c == '"') {
                ++pos_;
                return Status::Ok();
            }
            if (static_cast<unsigned char>(c) < 0x20) return error("a control character inside a string");
            if (c != '\\') {
                uint32_t cp = 0;
                size_t length = 0;
                if (!decode_utf8(text_.substr(pos_), &cp, &length)) return error("text that is not UTF-8");
                out->append(text_.substr(pos_, length));
                pos_ += length;
                continue;
            }
            if (++pos_ >= text_.size()) return error("unterminated escape");
            const char e = text_[pos_++];
            switch (e) {
                case '"':
                case '\\':
                case '/':
                    out->push_back(e);
                    break;
                case 'b':
                    out->push_back('\b');
                    break;
                case 'f':
                    out->push_back('\f');
                    break;
                case 'n':
                    out->push_back('\n');
                    break;
                case 'r':
                    out->push_back('\r');
                    break;
                case 't':
                    out->push_back('\t');
                    break;
                case 'u': {
                    uint32_t cp = 0;
                    H2O_TRY(hex4(&cp));
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        uint32_t low = 0;
                        if (!take("\\u")) return error("a high surrogate without its low half");
                        H2O_TRY(hex4(&low));
                        if (low < 0xDC00 || low > 0xDFFF) return error("a high surrogate without its low half");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        return error("a low surrogate alone");
                    }
                    append_utf8(cp, out);
                    break;
                }
                default:
                    return error(std::string("unknown escape '\\") + e + "'");
            }
        }
    }

    std::string_view text_;
    const char *what_;
    size_t pos_ = 0;
};

void quote(const std::string &s, std::string *out) {
    static const char hex[] = "0123456789abcdef";
    out->push_back('"');
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out->push_back('\\');
            out->push_back(c);
        } else if (c == '\n') {
            *out += "\\n";
        } else if (c == '\r') {
            *out += "\\r";
        } else if (c == '\t') {
            *out += "\\t";
        } else if (u < 0x20) {
            *out += "\\u00";
            out->push_back(hex[u >> 4]);
            out->push_back(hex[u & 15]);
        } else {
            out->push_back(c);
        }
    }
    out->push_back('"');
}

void write(const JsonValue &v, std::string *out) {
    switch (v.kind) {
        case JsonValue::kNull:
            *out += "null";
            break;
        case JsonValue::kBool:
            *out += v.boolean ? "true" : "false";
            break;
        case JsonValue::kNumber:
            *out += v.text;
            break;
        case JsonValue::kString:
            quote(v.text, out);
            break;
        case JsonValue::kArray:
            out->push_back('[');
            for (size_t i = 0; i < v.items.size(); ++i) {
                if (i) out->push_back(',');
                write(v.items[i], out);
            }
            out->push_back(']');
            break;
        case JsonValue::kObject:
            out->push_back('{');
            for (size_t i = 0; i < v.members.size(); ++i) {
                if (i) out->push_back(',');
                quote(v.members[i].first, out);
                out->push_back(':');
                write(v.members[i].second, out);
            }
            out->push_back('}');
            break;
    }
}

}  // namespace

Status parse_json(std::string_view text, const char *what, JsonValue *out) {
    if (text.size() > kMaxJsonBytes)
        return make_error(H2O_ERR_INVALID_ARGUMENT, std::string(what) + ": " + std::to_string(text.size()) + " bytes, more than the " +
                                                        std::to_string(kMaxJsonBytes) + " allowed");
    JsonValue v;
    H2O_TRY(JsonParser(text, what).document(&v));
    *out = std::move(v);
    return Status::Ok();
}

std::string json_text(const JsonValue &value) {
    std::string out;
    write(value, &out);
    return out;
}

}  // namespace h2o
