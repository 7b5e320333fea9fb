// Grammars (lib/grammar): the GBNF parser and its errors, the matcher over vocabularies of bytes
// and of real tokens, UTF-8 split between tokens, and JSON schemas turned into grammars.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar.h"
#include "grammar_matcher.h"
#include "json_schema.h"
#include "json_value.h"

using namespace h2o;

namespace {

std::shared_ptr<const Grammar> grammar_of(const std::string &text) {
    auto g = std::make_shared<Grammar>();
    const Status st = parse_grammar(text, g.get());
    REQUIRE_MESSAGE(st.ok(), st.message);
    return g;
}

std::string grammar_error(const std::string &text) {
    Grammar g;
    const Status st = parse_grammar(text, &g);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code == H2O_ERR_INVALID_ARGUMENT);
    return st.message;
}

// Token b is the byte b (0..255), then the end-of-generation token (256), then `extra` texts.
std::shared_ptr<const TokenSurfaces> byte_vocab(const std::vector<std::string> &extra = {}) {
    std::vector<std::string> texts;
    std::vector<uint8_t> kinds;
    for (int b = 0; b < 256; ++b) {
        texts.emplace_back(1, static_cast<char>(b));
        kinds.push_back(TokenSurfaces::kText);
    }
    texts.emplace_back();
    kinds.push_back(TokenSurfaces::kEndOfGeneration);
    for (const std::string &t : extra) {
        texts.push_back(t);
        kinds.push_back(TokenSurfaces::kText);
    }
    return TokenSurfaces::from_texts(std::move(texts), std::move(kinds));
}
constexpr int32_t kEog = 256;

// Whether the grammar takes `text` whole, byte by byte, and may end after it; on the way, the mask
// of the whole vocabulary must agree with allows() token by token.
bool matches(const std::shared_ptr<const Grammar> &g, const std::string &text, bool check_mask = true) {
    const auto vocab = byte_vocab();
    GrammarMatcher m(g, vocab);
    std::vector<uint8_t> mask;
    for (char c : text) {
        if (check_mask) {
            REQUIRE(m.mask(&mask));
            for (int32_t t = 0; t <= kEog; ++t) REQUIRE(static_cast<bool>(mask[static_cast<size_t>(t)]) == m.allows(t));
        }
        const auto token = static_cast<int32_t>(static_cast<uint8_t>(c));
        if (!m.allows(token)) return false;
        REQUIRE(m.accept(token).ok());
    }
    return m.allows(kEog);
}

// A random text of the grammar: alternatives chosen at random, the empty ones preferred as the
// derivation deepens, code points at random within their sets (printable ones where it can).
bool derive(const Grammar &g, uint32_t element, int depth, std::mt19937 &rng, std::string *out) {
    for (uint32_t e = element; g.elements[e].kind != GrammarElement::kEnd; ++e) {
        const GrammarElement &el = g.elements[e];
        if (el.kind == GrammarElement::kRule) {
            const std::vector<uint32_t> &alts = g.rules[el.index];
            if (depth > 40) {
                bool done = false;
                for (uint32_t a : alts) {
                    if (g.elements[a].kind == GrammarElement::kEnd) done = true;
                }
                if (done) continue;
                if (depth > 60) return false;
            }
            if (!derive(g, alts[std::uniform_int_distribution<size_t>(0, alts.size() - 1)(rng)], depth + 1, rng, out)) return false;
            continue;
        }
        const Charset &set = g.charsets[el.index];
        uint32_t cp = 0;
        for (int tries = 0; tries < 1000; ++tries) {
            cp = std::uniform_int_distribution<uint32_t>(0x20, tries < 500 ? 0x7E : 0x3000)(rng);
            if (!set.negated && !set.ranges.empty() && tries % 2 == 0) {
                const size_t r = std::uniform_int_distribution<size_t>(0, set.ranges.size() / 2 - 1)(rng);
                cp = std::uniform_int_distribution<uint32_t>(set.ranges[2 * r], set.ranges[2 * r + 1])(rng);
            }
            if (set.contains(cp) && (cp < 0xD800 || cp > 0xDFFF)) break;
        }
        if (!set.contains(cp)) return false;
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
    return true;
}

// A JSON grammar written for these tests in llama.cpp's notation and layout (multi-line rules,
// groups, classes with escapes, bounded repetition).
const char *const kJsonGrammar = R"(# JSON values
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
)";

}  // namespace

TEST_CASE("grammar: the constructs of GBNF, each by hand") {
    CHECK(matches(grammar_of(R"(root ::= "ab" "c")"), "abc"));
    CHECK_FALSE(matches(grammar_of(R"(root ::= "ab" "c")"), "ab"));
    CHECK_FALSE(matches(grammar_of(R"(root ::= "ab" "c")"), "abcd"));
    const auto alt = grammar_of(R"(root ::= "yes" | "no" | ("may" "be"))");
    for (const char *s : {"yes", "no", "maybe"}) CHECK(matches(alt, s));
    CHECK_FALSE(matches(alt, "may"));
    const auto cls = grammar_of(R"(root ::= [a-c0-9_] [^a-z]  [\x41-\x43\-])");
    CHECK(matches(cls, "1Q-"));
    CHECK(matches(cls, "_ B"));
    CHECK_FALSE(matches(cls, "dQ-"));
    CHECK_FALSE(matches(cls, "1qA"));
    const auto star = grammar_of("root ::= \"x\"* \"y\"+ \"z\"?\n");
    for (const char *s : {"y", "xxyy", "yz", "xyyyz"}) CHECK(matches(star, s));
    for (const char *s : {"", "x", "z", "yzz"}) CHECK_FALSE(matches(star, s));
    const auto counted = grammar_of(R"(root ::= [0-9]{2} "-" [a-z]{1,3} "-" "!"{2,})");
    for (const char *s : {"12-a-!!", "12-abc-!!!!"}) CHECK(matches(counted, s));
    for (const char *s : {"1-a-!!", "12--!!", "12-abcd-!!", "12-a-!"}) CHECK_FALSE(matches(counted, s));
    const auto any = grammar_of("root ::= \"<\" . \">\"  # any one character\n");
    CHECK(matches(any, "<\xC3\xA9>"));
    CHECK(matches(any, "<>>"));
    CHECK_FALSE(matches(any, "<ab>"));
    // Rules refer to each other, recursively (on the right), across lines.
    const auto nested = grammar_of("root ::= list\nlist ::= \"(\" (item (\",\" item)*)? \")\"\nitem ::= [a-z] | list\n");
    for (const char *s : {"()", "(a)", "(a,(b,()),c)"}) CHECK(matches(nested, s));
    for (const char *s : {"(", "(a,)", "(a))"}) CHECK_FALSE(matches(nested, s));
    // Escapes in literals, and code points beyond ASCII.
    const auto escapes = grammar_of(R"(root ::= "\"\\\n\t\x41\u00e9\U0001F600")");
    CHECK(matches(escapes, "\"\\\n\tA\xC3\xA9\xF0\x9F\x98\x80"));
    // The empty alternative and an empty literal.
    CHECK(matches(grammar_of(R"(root ::= "a" | )"), ""));
    CHECK(matches(grammar_of(R"(root ::= "" "a")"), "a"));
}

TEST_CASE("grammar: malformed or hostile grammars are refused with the byte and the reason") {
    CHECK(grammar_error("foo ::= \"a\"").find("no rule 'root'") != std::string::npos);
    CHECK(grammar_error("root ::= foo").find("rule 'foo' is used but not defined (at byte 9)") != std::string::npos);
    CHECK(grammar_error("root ::= \"a").find("unterminated literal") != std::string::npos);
    CHECK(grammar_error("root ::= [a-").find("unterminated character class") != std::string::npos);
    CHECK(grammar_error("root ::= [z-a]").find("end comes before its start") != std::string::npos);
    CHECK(grammar_error("root ::= \"\\q\"").find("unknown escape '\\q' (at byte 11)") != std::string::npos);
    CHECK(grammar_error("root ::= \"\\xZZ\"").find("hexadecimal") != std::string::npos);
    CHECK(grammar_error("root ::= \"a\" ::=").find("unexpected") != std::string::npos);
    CHECK(grammar_error("root \"a\"").find("expected '::='") != std::string::npos);
    CHECK(grammar_error("root ::= (\"a\"").find("expected ')'") != std::string::npos);
    CHECK(grammar_error("root ::= *").find("'*' follows nothing") != std::string::npos);
    CHECK(grammar_error("root ::= \"a\"**").find("follows nothing") != std::string::npos);
    CHECK(grammar_error("root ::= \"a\"{3,2}").find("maximum is below its minimum") != std::string::npos);
    CHECK(grammar_error("root ::= \"a\"{100000}").find("above 10000") != std::string::npos);
    CHECK(grammar_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice") != std::string::npos);
    CHECK(grammar_error("root ::= \"\xFF\"").find("not UTF-8") != std::string::npos);
    // Left recursion, directly and through a rule that may be empty.
    CHECK(grammar_error("root ::= root \"a\" | \"b\"").find("rule 'root' is left-recursive") != std::string::npos);
    CHECK(grammar_error("root ::= e x\ne ::= \"\" | \"q\"\nx ::= root \"a\" | \"b\"").find("left-recursive") != std::string::npos);
    // Sizes: nesting, and repetitions whose expansion would pass the element bound.
    CHECK(grammar_error("root ::= " + std::string(70, '(') + "\"a\"" + std::string(70, ')')).find("nest deeper") != std::string::npos);
    std::string many = "root ::=";
    for (int i = 0; i < 110; ++i) many += " \"a\"{10000}";
    CHECK(grammar_error(many).find("elements") != std::string::npos);
    CHECK(grammar_error(std::string(kMaxGrammarBytes + 1, ' ')).find("bytes, more than") != std::string::npos);
}

TEST_CASE("grammar: texts derived from a JSON grammar are taken byte by byte, and the mask always agrees with allows()") {
    const auto g = grammar_of(kJsonGrammar);
    std::mt19937 rng(5);
    int derived = 0;
    for (int i = 0; i < 200 && derived < 60; ++i) {
        std::string text;
        if (!derive(*g, g->rules[g->root][0], 0, rng, &text) || text.size() > 400) continue;
        ++derived;
        CAPTURE(text);
        CHECK(matches(g, text, derived <= 15));
    }
    CHECK(derived >= 30);
    for (const char *json : {R"({"a": [1, 2.5e-3, "x\n"], "b": {"c": null}} )", R"({})", "{\"k\": \"\\u00e9t\xC3\xA9\"}"})
        CHECK(matches(g, json));
    for (const char *bad : {R"({"a" 1})", R"({"a": 01x})", R"([1, 2])", R"({"a": "\q"})"}) CHECK_FALSE(matches(g, bad));
}

TEST_CASE("grammar: a character split between tokens is allowed by its first bytes, and tokens of several characters are walked whole") {
    // "é" is C3 A9, "€" is E2 82 AC: the first bytes alone are allowed where the character is.
    const auto g = grammar_of(R"(root ::= [é€] "!")");
    const auto vocab = byte_vocab({"\xC3\xA9!", "\xE2\x82", "\xAC!", "e!", "\xC3\xA9"});
    GrammarMatcher m(g, vocab);
    const int32_t e_bang = 257, euro_head = 258, euro_tail = 259, ascii = 260, e_whole = 261;
    CHECK(m.allows(0xC3));
    CHECK(m.allows(0xE2));
    CHECK_FALSE(m.allows(0xE3));  // begins only characters outside the set
    CHECK_FALSE(m.allows(0xF0));  // four bytes make U+10000 or more, never "é" nor "€"
    GrammarMatcher ascii_only(grammar_of(R"(root ::= "{" [\x80-\x9F]? )"), vocab);
    CHECK_FALSE(ascii_only.allows(0xF0));
    CHECK_FALSE(ascii_only.allows(0xC2));
    GrammarMatcher wide(grammar_of(R"(root ::= [\x80-\U0010FFFF])"), vocab);
    CHECK(wide.allows(0xC2));
    CHECK(wide.allows(0xF4));
    CHECK_FALSE(wide.allows(0xF5));  // no code point begins so
    REQUIRE(wide.accept(0xE0).ok());
    CHECK_FALSE(wide.allows(0x80));  // E0 80 would be an overlong form
    CHECK(wide.allows(0xA0));
    wide.reset();
    REQUIRE(wide.accept(0xED).ok());
    REQUIRE(wide.accept(0xA0).ok());  // the code points ED A0 .. begin are surrogates:
    CHECK_FALSE(wide.allows(0x80));   // no character
    CHECK_FALSE(m.allows(0xA9));      // a continuation byte cannot begin a character
    CHECK(m.allows(e_bang));
    CHECK(m.allows(euro_head));
    CHECK_FALSE(m.allows(ascii));
    CHECK_FALSE(m.allows(kEog));
    std::vector<uint8_t> mask;
    REQUIRE(m.mask(&mask));
    for (int32_t t = 0; t < static_cast<int32_t>(mask.size()); ++t) CHECK(static_cast<bool>(mask[static_cast<size_t>(t)]) == m.allows(t));
    REQUIRE(m.accept(euro_head).ok());
    CHECK_FALSE(m.can_end());
    CHECK(m.allows(euro_tail));
    CHECK(m.allows(0xAC));
    CHECK_FALSE(m.allows(0xA9));  // "â‚©" is not in the set
    CHECK_FALSE(m.allows('!'));
    CHECK(m.accept(0xA9).code == H2O_ERR_INVALID_ARGUMENT);  // refused, the state kept
    REQUIRE(m.accept(euro_tail).ok());
    CHECK(m.must_end());
    CHECK(m.allows(kEog));
    m.reset();
    REQUIRE(m.accept(e_whole).ok());
    CHECK(m.allows('!'));
}

TEST_CASE("grammar: the mask's budget stops a walk that would touch most of the vocabulary") {
    std::vector<std::string> words;
    for (int i = 0; i < 5000; ++i) words.push_back("w" + std::to_string(i * 7919 % 100000));
    const auto vocab = byte_vocab(words);
    GrammarMatcher open(grammar_of(R"(root ::= [a-z0-9]*)"), vocab);
    std::vector<uint8_t> mask;
    CHECK_FALSE(open.mask(&mask, 1000));  // most pieces fit: too many steps
    REQUIRE(open.mask(&mask));
    CHECK(mask[257]);
    GrammarMatcher narrow(grammar_of(R"(root ::= "{" [a-z]*)"), vocab);
    REQUIRE(narrow.mask(&mask, 1000));  // the first byte rules out almost every piece at once
    CHECK(mask['{']);
    CHECK_FALSE(mask[257]);
}

TEST_CASE("grammar: a long repetition of something that may match nothing is stopped with a message, not walked for minutes") {
    // Found by the fuzzer: every copy may be empty, so after each character every later copy is
    // open, and each byte would cost the square of the count.
    const auto vocab = byte_vocab({"ab", "ba", "#"});
    GrammarMatcher m(grammar_of(R"(root ::= ("a" | . "b"* | [#^$/ ]?){295} .)"), vocab);
    std::vector<uint8_t> mask;
    CHECK_FALSE(m.mask(&mask));
    CHECK(m.failure().code == H2O_ERR_INVALID_ARGUMENT);
    CHECK(m.failure().message.find("alternatives open") != std::string::npos);
    CHECK_FALSE(m.accept('a').ok());  // and it stays stopped
    // The same repetition of something that cannot be empty is an ordinary grammar.
    GrammarMatcher plain(grammar_of(R"(root ::= ("a" | "b"){295})"), vocab);
    REQUIRE(plain.mask(&mask));
    CHECK(mask['a']);
    CHECK(plain.failure().ok());
}

TEST_CASE("grammar: masks from the state cache, warm, cold or filled mid-walk, agree with fresh matchers taking each token") {
    // Every position of the repetition is a state of its own: the 9000-letter token alone walks
    // past the cache's bound, so that walk is done again without it.
    std::vector<std::string> words = {std::string(9000, 'a'), "ab", "abc", "b", "bb", "a1", "zz", std::string(300, 'q')};
    const auto vocab = byte_vocab(words);
    const auto g = grammar_of(R"(root ::= [a-z]{0,9999} "!"?)");
    GrammarMatcher m(g, vocab);
    const std::vector<int32_t> steps = {257, 'a', 258, 264, '!'};  // tokens taken one after another
    for (size_t k = 0; k <= steps.size(); ++k) {
        CAPTURE(k);
        // The reference: a matcher that has only ever taken tokens (never masked) takes each
        // token in turn, from a copy of itself after the first k steps.
        GrammarMatcher taken(g, vocab);
        for (size_t i = 0; i < k; ++i) REQUIRE(taken.accept(steps[i]).ok());
        std::vector<uint8_t> accepted;
        for (int32_t t = 0; t < static_cast<int32_t>(vocab->kind.size()); ++t) accepted.push_back(GrammarMatcher(taken).accept(t).ok());
        for (int pass = 0; pass < 2; ++pass) {  // the second pass finds the cache warm
            std::vector<uint8_t> mask;
            REQUIRE(m.mask(&mask));
            REQUIRE(mask.size() == accepted.size());
            for (int32_t t = 0; t < static_cast<int32_t>(mask.size()); ++t) {
                CAPTURE(t);
                CHECK(static_cast<bool>(mask[static_cast<size_t>(t)]) == static_cast<bool>(accepted[static_cast<size_t>(t)]));
                CHECK(m.allows(t) == static_cast<bool>(mask[static_cast<size_t>(t)]));
            }
        }
        if (k < steps.size()) REQUIRE(m.accept(steps[k]).ok());
    }
    CHECK(m.must_end());
}

TEST_CASE("json schema: the subset becomes grammars whose texts are the schema's") {
    auto accepts = [](const std::string &schema, const std::string &text) {
        std::string grammar;
        const Status st = json_schema_to_grammar(schema, &grammar);
        REQUIRE_MESSAGE(st.ok(), st.message);
        return matches(grammar_of(grammar), text, false);
    };
    const std::string person = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
        "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
        "kind": {"const": "person"}, "email": {"type": ["string", "null"]}}, "required": ["name", "age"]})";
    CHECK(accepts(person, R"({"name": "Ann", "age": 30})"));
    CHECK(accepts(person, R"({ "name" : "Ann" , "age" : -3 , "tags" : ["a", "b"] , "email" : null })"));
    CHECK(accepts(person, R"({"name": "", "age": 0, "kind": "person", "email": "x@y"})"));
    CHECK_FALSE(accepts(person, R"({"age": 30, "name": "Ann"})"));             // required ones first, in order
    CHECK_FALSE(accepts(person, R"({"name": "Annabel", "age": 30})"));         // maxLength
    CHECK_FALSE(accepts(person, R"({"name": "Ann", "age": 3.5})"));            // integer
    CHECK_FALSE(accepts(person, R"({"name": "Ann", "age": 3, "tags": []})"));  // minItems
    CHECK_FALSE(accepts(person, R"({"name": "Ann", "age": 3, "tags": ["c"]})"));
    CHECK_FALSE(accepts(person, R"({"name": "Ann", "age": 3, "other": 1})"));  // no additional properties
    CHECK(accepts(R"({"type": "object", "additionalProperties": true})", R"({"x": [1, {"y": null}]})"));
    CHECK(accepts(R"({"properties": {"a": {"type": "boolean"}}, "additionalProperties": {"type": "number"}})", R"({"a": true, "z": 2})"));
    CHECK(accepts(R"({"anyOf": [{"type": "number"}, {"type": "string", "format": "date"}]})", R"("2026-12-01")"));
    CHECK(accepts(R"({"type": "string", "format": "uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
    CHECK(accepts(R"({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"})",
                  R"({"next": {"next": {}}})"));
    CHECK(accepts(R"(true)", R"([1, "two", {"three": 3}])"));
    // Refused, by name and place, not ignored.
    auto refused = [](const std::string &schema) {
        std::string grammar;
        const Status st = json_schema_to_grammar(schema, &grammar);
        REQUIRE_FALSE(st.ok());
        return st.message;
    };
    CHECK(refused(R"({"type": "string", "pattern": "^a"})").find("'pattern' is not supported (at #/pattern)") != std::string::npos);
    CHECK(refused(R"({"properties": {"n": {"type": "integer", "minimum": 0}}})").find("#/properties/n/minimum") != std::string::npos);
    CHECK(refused(R"({"type": "frob"})").find("unknown type 'frob'") != std::string::npos);
    CHECK(refused(R"({"required": ["x"], "properties": {}})").find("'x' has no schema") != std::string::npos);
    CHECK(refused(R"({"$ref": "https://example.com/s.json"})").find("is not a definition") != std::string::npos);
    CHECK(refused(R"({"type": "array", "minItems": 3, "maxItems": 2})").find("maxItems is below minItems") != std::string::npos);
    CHECK(refused(R"({"type": "string", "format": "email"})").find("format 'email'") != std::string::npos);
    CHECK(refused(R"(false)").find("accepts nothing") != std::string::npos);
    CHECK(refused(R"({"type": "object",)").find("at byte 18") != std::string::npos);
    CHECK(refused(std::string(100, '[') + std::string(100, ']')).find("nested deeper") != std::string::npos);
}

TEST_CASE("json: values, escapes and errors of the schema reader") {
    JsonValue v;
    REQUIRE(parse_json(R"({"a": [1, -2.5e3, true, null, "x\u00e9\ud83d\ude00\n"], "b": {}})", "test", &v).ok());
    REQUIRE(v.find("a"));
    CHECK(v.find("a")->items.size() == 5);
    CHECK(v.find("a")->items[1].number == -2500.0);
    CHECK(v.find("a")->items[4].text == "x\xC3\xA9\xF0\x9F\x98\x80\n");
    CHECK(json_text(v) == R"({"a":[1,-2.5e3,true,null,"xé😀\n"],"b":{}})");
    for (const char *bad : {"{", "[1,]", "\"\\ud800\"", "01", "{\"a\" 1}", "\"a\x01\"", "tru", "[1] 2"}) {
        CAPTURE(bad);
        const Status st = parse_json(bad, "test", &v);
        CHECK(st.code == H2O_ERR_INVALID_ARGUMENT);
        CHECK(st.message.find("(at byte") != std::string::npos);
    }
}
