#include "json_schema.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "grammar.h"
#include "json_value.h"

namespace h2o {

namespace {

// The rules every schema's grammar may use. Numbers and whitespace runs are bounded, so that a
// reply cannot spend its tokens on one number or on blanks; a number's exponent has at most two
// digits, so that every number fits a double (1e999 is JSON, but most readers make it infinite).
constexpr const char *kCommonRules = R"(ws ::= [ \t\n]{0,4}
json-char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\""
json-integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-number ::= json-integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws (json-string ws ":" ws json-value ws ("," ws json-string ws ":" ws json-value ws)*)? "}"
json-array ::= "[" ws (json-value ws ("," ws json-value ws)*)? "]"
)";

// A GBNF literal of the bytes of text.
std::string literal(const std::string &text) {
    static const char hex[] = "0123456789ABCDEF";
    std::string out = "\"";
    for (char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out.push_back('\\');
            out.push_back(c);
        } else if (u < 0x20) {
            out += "\\x";
            out.push_back(hex[u >> 4]);
            out.push_back(hex[u & 15]);
        } else {
            out.push_back(c);
        }
    }
    return out + "\"";
}

class Converter {
public:
    Converter(const JsonValue &root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {}

    // The expression of the schema's texts into *top, its rules' lines appended to *rules.
    Status convert(std::string *top, std::string *rules) {
        H2O_TRY(visit(root_, "#", 0, top));
        for (const auto &[name, body] : rules_) *rules += name + " ::= " + body + "\n";
        if (rules->size() > kMaxGrammarBytes)
            return make_error(H2O_ERR_INVALID_ARGUMENT,
                              "json schema: its grammar would be larger than " + std::to_string(kMaxGrammarBytes) + " bytes");
        return Status::Ok();
    }

private:
    static Status bad(const std::string &where, const std::string &why) {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "json schema: " + why + " (at " + where + ")");
    }

    // A rule for `body`, named after `hint` (its pointer's last part); returns the name.
    std::string add_rule(const std::string &hint, const std::string &body) {
        std::string base = prefix_ + "s";
        for (char c : hint) base.push_back((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ? c : '-');
        if (base.size() > 40) base.resize(40);
        std::string name = base + "-" + std::to_string(rules_.size());
        rules_.emplace_back(name, body);
        return name;
    }

    // The expression for the schema at `where` (a JSON pointer), into *out.
    Status visit(const JsonValue &s, const std::string &where, int depth, std::string *out) {
        if (depth > kMaxJsonDepth) return bad(where, "schemas nest deeper than " + std::to_string(kMaxJsonDepth));
        if (s.is(JsonValue::kBool)) {
            if (!s.boolean) return bad(where, "the schema false accepts nothing");
            *out = "json-value";
            return Status::Ok();
        }
        if (!s.is(JsonValue::kObject)) return bad(where, "a schema must be an object or a boolean");
        static const std::set<std::string> kRefused = {"pattern",
                                                       "minimum",
                                                       "maximum",
                                                       "exclusiveMinimum",
                                                       "exclusiveMaximum",
                                                       "multipleOf",
                                                       "allOf",
                                                       "not",
                                                       "if",
                                                       "then",
                                                       "else",
                                                       "uniqueItems",
                                                       "prefixItems",
                                                       "contains",
                                                       "minProperties",
                                                       "maxProperties",
                                                       "patternProperties",
                                                       "dependentRequired",
                                                       "dependentSchemas",
                                                       "propertyNames",
                                                       "unevaluatedProperties",
                                                       "unevaluatedItems"};
        for (const auto &[key, value] : s.members) {
            if (kRefused.count(key)) return bad(where + "/" + key, "'" + key + "' is not supported");
        }
        if (const JsonValue *ref = s.find("$ref")) return reference(*ref, where, depth, out);
        if (const JsonValue *c = s.find("const")) {
            *out = literal(json_text(*c));
            return Status::Ok();
        }
        if (const JsonValue *e = s.find("enum")) {
            if (!e->is(JsonValue::kArray) || e->items.empty()) return bad(where + "/enum", "enum must be a non-empty array");
            std::string alternatives;
            for (const JsonValue &v : e->items) alternatives += (alternatives.empty() ? "" : " | ") + literal(json_text(v));
            *out = "(" + alternatives + ")";
            return Status::Ok();
        }
        for (const char *key : {"anyOf", "oneOf"}) {
            if (const JsonValue *any = s.find(key)) {
                if (!any->is(JsonValue::kArray) || any->items.empty())
                    return bad(where + "/" + key, std::string(key) + " must be a non-empty array");
                std::string alternatives;
                for (size_t i = 0; i < any->items.size(); ++i) {
                    std::string one;
                    H2O_TRY(visit(any->items[i], where + "/" + key + "/" + std::to_string(i), depth + 1, &one));
                    alternatives += (alternatives.empty() ? "" : " | ") + one;
                }
                *out = "(" + alternatives + ")";
                return Status::Ok();
            }
        }
        const JsonValue *type = s.find("type");
        if (!type) {
            // No type: what the other keywords describe, else any value.
            if (s.find("properties")) return typed(s, "object", where, depth, out);
            if (s.find("items")) return typed(s, "array", where, depth, out);
            *out = "json-value";
            return Status::Ok();
        }
        if (type->is(JsonValue::kString)) return typed(s, type->text, where, depth, out);
        if (!type->is(JsonValue::kArray) || type->items.empty())
            return bad(where + "/type", "type must be a name or a non-empty array of names");
        std::string alternatives;
        for (const JsonValue &t : type->items) {
            if (!t.is(JsonValue::kString)) return bad(where + "/type", "type must be a name or a non-empty array of names");
            std::string one;
            H2O_TRY(typed(s, t.text, where, depth, &one));
            alternatives += (alternatives.empty() ? "" : " | ") + one;
        }
        *out = "(" + alternatives + ")";
        return Status::Ok();
    }

    Status reference(const JsonValue &ref, const std::string &where, int depth, std::string *out) {
        if (!ref.is(JsonValue::kString)) return bad(where + "/$ref", "$ref must be a string");
        const std::string &path = ref.text;
        if (const auto it = refs_.find(path); it != refs_.end()) {
            *out = it->second;  // defined, or being defined: recursion goes through its rule
            return Status::Ok();
        }
        std::string name;
        const JsonValue *target = nullptr;
        for (const char *prefix : {"#/$defs/", "#/definitions/"}) {
            const std::string p = prefix;
            if (path.compare(0, p.size(), p) != 0) continue;
            const JsonValue *defs = root_.find(p.substr(2, p.size() - 3));
            name = path.substr(p.size());
            target = defs ? defs->find(name) : nullptr;
        }
        if (path == "#") target = &root_;
        if (!target) return bad(where + "/$ref", "'" + path + "' is not a definition of this schema (#/$defs/NAME or #/definitions/NAME)");
        // The rule's name first, so that a recursive reference finds it; its body once visited.
        const std::string rule = add_rule(name.empty() ? "root" : name, "");
        const size_t index = rules_.size() - 1;
        refs_[path] = rule;
        std::string body;
        H2O_TRY(visit(*target, path, depth + 1, &body));
        rules_[index].second = body;
        *out = rule;
        return Status::Ok();
    }

    static Status count(const JsonValue &s, const char *key, const std::string &where, uint32_t fallback, uint32_t *out) {
        const JsonValue *v = s.find(key);
        if (!v) {
            *out = fallback;
            return Status::Ok();
        }
        if (!v->is(JsonValue::kNumber) || v->number < 0 || v->number != static_cast<double>(static_cast<uint64_t>(v->number)) ||
            v->number > kMaxRepetition)
            return bad(where + "/" + key, std::string(key) + " must be a whole number from 0 to " + std::to_string(kMaxRepetition));
        *out = static_cast<uint32_t>(v->number);
        return Status::Ok();
    }

    // "ITEM{min,max}" as GBNF (max UINT32_MAX: no bound).
    static std::string repeat(const std::string &item, uint32_t min, uint32_t max) {
        if (min == 0 && max == UINT32_MAX) return item + "*";
        return item + "{" + std::to_string(min) + "," + (max == UINT32_MAX ? "" : std::to_string(max)) + "}";
    }

    Status typed(const JsonValue &s, const std::string &type, const std::string &where, int depth, std::string *out) {
        if (type == "string") return string_type(s, where, out);
        if (type == "integer")
            *out = "json-integer";
        else if (type == "number")
            *out = "json-number";
        else if (type == "boolean")
            *out = "json-boolean";
        else if (type == "null")
            *out = "json-null";
        else if (type == "array")
            return array_type(s, where, depth, out);
        else if (type == "object")
            return object_type(s, where, depth, out);
        else
            return bad(where + "/type", "unknown type '" + type + "'");
        return Status::Ok();
    }

    Status string_type(const JsonValue &s, const std::string &where, std::string *out) {
        uint32_t min = 0, max = UINT32_MAX;
        H2O_TRY(count(s, "minLength", where, 0, &min));
        H2O_TRY(count(s, "maxLength", where, UINT32_MAX, &max));
        if (max < min) return bad(where, "maxLength is below minLength");
        if (const JsonValue *format = s.find("format")) {
            // Every text these take is a valid value of its format: months of 28, 30 and 31
            // days (29 February is left out, as it needs a leap year), hours to 23.
            static const std::string kDate =
                R"([0-9]{4} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])))";
            static const std::string kTime = R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})?)";
            static const std::string kOffset = R"(("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))";
            static const std::map<std::string, std::string> kFormats = {
                {"date", kDate},
                {"time", kTime + " " + kOffset},
                {"date-time", kDate + " \"T\" " + kTime + " " + kOffset},
                {"uuid", R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})"},
            };
            if (!format->is(JsonValue::kString)) return bad(where + "/format", "format must be a string");
            const auto it = kFormats.find(format->text);
            if (it == kFormats.end()) return bad(where + "/format", "the format '" + format->text + "' is not supported");
            if (s.find("minLength") || s.find("maxLength")) return bad(where, "a format with minLength or maxLength is not supported");
            *out = "(\"\\\"\" " + it->second + " \"\\\"\")";
            return Status::Ok();
        }
        *out = min == 0 && max == UINT32_MAX ? "json-string" : "(\"\\\"\" " + repeat("json-char", min, max) + " \"\\\"\")";
        return Status::Ok();
    }

    Status array_type(const JsonValue &s, const std::string &where, int depth, std::string *out) {
        std::string item = "json-value";
        if (const JsonValue *items = s.find("items")) H2O_TRY(visit(*items, where + "/items", depth + 1, &item));
        uint32_t min = 0, max = UINT32_MAX;
        H2O_TRY(count(s, "minItems", where, 0, &min));
        H2O_TRY(count(s, "maxItems", where, UINT32_MAX, &max));
        if (max < min) return bad(where, "maxItems is below minItems");
        const std::string element = add_rule(where.substr(where.rfind('/') + 1) + "-item", item + " ws");
        if (max == 0) {
            *out = "(\"[\" ws \"]\")";
        } else {
            const std::string more = repeat("(\",\" ws " + element + ")", min > 0 ? min - 1 : 0, max == UINT32_MAX ? UINT32_MAX : max - 1);
            const std::string list = element + " " + more;
            *out = "(\"[\" ws " + (min == 0 ? "(" + list + ")?" : list) + " \"]\")";
        }
        return Status::Ok();
    }

    Status object_type(const JsonValue &s, const std::string &where, int depth, std::string *out) {
        std::vector<std::string> required_names;
        if (const JsonValue *req = s.find("required")) {
            if (!req->is(JsonValue::kArray)) return bad(where + "/required", "required must be an array of names");
            for (const JsonValue &r : req->items) {
                if (!r.is(JsonValue::kString)) return bad(where + "/required", "required must be an array of names");
                required_names.push_back(r.text);
            }
        }
        const JsonValue *props = s.find("properties");
        if (props && !props->is(JsonValue::kObject)) return bad(where + "/properties", "properties must be an object");
        std::vector<std::string> required, optional;  // "key: value" pieces, in order
        for (const std::string &name : required_names) {
            if (!props || !props->find(name))
                return bad(where + "/required", "the required property '" + name + "' has no schema in properties");
        }
        for (const auto &[name, schema] : props ? props->members : std::vector<JsonMember>{}) {
            std::string value;
            H2O_TRY(visit(schema, where + "/properties/" + name, depth + 1, &value));
            JsonValue key;
            key.kind = JsonValue::kString;
            key.text = name;
            const std::string pair = add_rule(name + "-kv", literal(json_text(key)) + " ws \":\" ws " + value + " ws");
            (std::find(required_names.begin(), required_names.end(), name) != required_names.end() ? required : optional).push_back(pair);
        }
        // More members after the named ones, when additionalProperties allows them.
        std::string extra;
        if (const JsonValue *additional = s.find("additionalProperties")) {
            if (!additional->is(JsonValue::kBool) || additional->boolean) {
                std::string value = "json-value";
                if (!additional->is(JsonValue::kBool)) H2O_TRY(visit(*additional, where + "/additionalProperties", depth + 1, &value));
                extra = add_rule("extra-kv", "json-string ws \":\" ws " + value + " ws");
            }
        }
        if (!extra.empty()) optional.push_back(add_rule("extra-kvs", extra + " (\",\" ws " + extra + ")*"));
        // Optional pieces: each may be left out; commas go between the ones present.
        // tail(i): what may follow something already written; head(i): the first present one.
        std::vector<std::string> tail(optional.size() + 1), head(optional.size() + 1);
        for (size_t i = optional.size(); i-- > 0;) {
            tail[i] = add_rule("tail", "(\",\" ws " + optional[i] + ")?" + (tail[i + 1].empty() ? "" : " " + tail[i + 1]));
            head[i] = add_rule(
                "head", optional[i] + (tail[i + 1].empty() ? "" : " " + tail[i + 1]) + (head[i + 1].empty() ? "" : " | " + head[i + 1]));
        }
        std::string body;
        for (size_t i = 0; i < required.size(); ++i) body += (i ? " \",\" ws " : "") + required[i];
        if (!optional.empty()) body += required.empty() ? "(" + head[0] + ")?" : " " + tail[0];
        *out = "(\"{\" ws " + body + " \"}\")";
        return Status::Ok();
    }

    const JsonValue &root_;
    const std::string prefix_;  // of every rule's name: schemas side by side in one grammar
    std::vector<std::pair<std::string, std::string>> rules_;
    std::map<std::string, std::string> refs_;
};

}  // namespace

const char *json_common_rules() { return kCommonRules; }

Status json_schema_rules(const JsonValue &schema, const std::string &prefix, std::string *expression, std::string *rules) {
    return Converter(schema, prefix).convert(expression, rules);
}

Status json_schema_to_grammar(std::string_view schema, std::string *grammar) {
    JsonValue root;
    H2O_TRY(parse_json(schema, "json schema", &root));
    std::string top, rules;
    H2O_TRY(json_schema_rules(root, "", &top, &rules));
    std::string text = "root ::= " + top + "\n" + kCommonRules + rules;
    // The grammar made is checked as a user's would be (limits included).
    Grammar parsed;
    if (Status st = parse_grammar(text, &parsed); !st.ok()) return make_error(H2O_ERR_INVALID_ARGUMENT, "json schema: " + st.message);
    *grammar = std::move(text);
    return Status::Ok();
}

}  // namespace h2o
