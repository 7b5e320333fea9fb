// JSON schemas as grammars (grammar.h): the reply is a JSON text the schema accepts.
//
// The subset read: "type" (one or a list of object, array, string, number, integer, boolean,
// null), "properties" with "required" and "additionalProperties" (false, the default here: only
// the properties named; true or a schema: more members after them), "enum", "const", "anyOf" and
// "oneOf", "items" with "minItems" and "maxItems", "minLength" and "maxLength", the string formats
// "date", "time", "date-time" and "uuid", local "$ref"s ("#/$defs/...", "#/definitions/...",
// recursion included), and the boolean schema true. Required properties come first, in the
// schema's order, then the optional ones in theirs, each of which may be left out. Descriptive
// keywords (title, description, default, examples, ...) are passed over. Keywords that would
// constrain what the grammar cannot (pattern, minimum, maximum, multipleOf, allOf, not,
// if/then/else, uniqueItems, prefixItems, ...) are refused by name rather than ignored, so
// that a reply never breaks its schema unnoticed.
#pragma once

#include <string>
#include <string_view>

#include "status.h"

namespace h2o {

struct JsonValue;

// The GBNF grammar of the schema's JSON texts. Errors: H2O_ERR_INVALID_ARGUMENT, "json schema:
// ..." naming the offending keyword and where it is (a JSON pointer), or the JSON error's offset.
Status json_schema_to_grammar(std::string_view schema, std::string *grammar);

// For grammars that hold several schemas (tool calls): the rules of one schema, each named with
// `prefix` (letters, digits and '-'), appended to *rules, and the expression of its texts into
// *expression. They use the rules of json_common_rules(), which the grammar must hold once.
Status json_schema_rules(const JsonValue &schema, const std::string &prefix, std::string *expression, std::string *rules);
const char *json_common_rules();

}  // namespace h2o
