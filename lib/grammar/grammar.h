// Grammars that constrain generation, in GBNF, the notation llama.cpp reads (so users' grammars
// work as written):
//
//   root   ::= "{" ws pair ("," ws pair)* "}"   # rules: a name, "::=", alternatives
//   pair   ::= string ":" ws value
//   string ::= "\"" [^"\\]* "\""                 # literals, character classes, negated classes
//   ws     ::= [ \t\n]{0,20}                     # quantifiers * + ? {m} {m,} {m,n}; "." any character
//
// Literals and classes take the escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH; a class
// may hold ranges (a-z); "#" comments to the end of the line; a rule continues on the next line
// inside parentheses or after "|" or "::=". Generation starts at the rule "root". A grammar is
// untrusted input: every error names the byte offset and the reason, and the sizes are bounded
// (kMaxGrammarBytes of text, kMaxElements compiled elements, repetition counts up to
// kMaxRepetition, nesting up to kMaxNesting); left-recursive rules, which no left-to-right
// matcher can run, are refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "status.h"

namespace h2o {

constexpr size_t kMaxGrammarBytes = 1u << 20;
constexpr size_t kMaxElements = 1u << 20;
constexpr uint32_t kMaxRepetition = 10000;
constexpr int kMaxNesting = 64;

// One step of an alternative: a code point from a set, a reference to a rule, or the end.
struct GrammarElement {
    enum Kind : uint8_t {
        kEnd,
        kChars,
        kRule
    } kind = kEnd;
    uint32_t index = 0;  // kChars: into Grammar::charsets; kRule: a rule
};

// Code points [first, last] pairs, sorted and disjoint; negated: every code point but those.
struct Charset {
    std::vector<uint32_t> ranges;  // first0, last0, first1, last1, ...
    bool negated = false;
    bool contains(uint32_t cp) const;
    // Whether some code point of [lo, hi] is in the set (a character whose first bytes are known).
    bool intersects(uint32_t lo, uint32_t hi) const;
};

struct Grammar {
    // rules[r] holds its alternatives, each a run of elements ending in kEnd, in `elements`.
    std::vector<std::vector<uint32_t>> rules;  // the first element of each alternative
    std::vector<GrammarElement> elements;
    std::vector<Charset> charsets;
    std::vector<std::string> rule_names;  // rules the text named (generated ones: "name_1", ...)
    uint32_t root = 0;
    std::string source;  // the text parsed: the control tokens it spells may be generated (TokenSurfaces)
};

// Parses and checks a GBNF grammar. Errors: H2O_ERR_INVALID_ARGUMENT with "grammar: ..." and the
// byte offset (syntax, an unknown or missing root rule, a rule used but not defined, left
// recursion, a limit passed).
Status parse_grammar(std::string_view text, Grammar *out);

}  // namespace h2o
