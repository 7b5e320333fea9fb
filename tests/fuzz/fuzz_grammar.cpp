// Fuzz target: GBNF grammars and JSON schemas (lib/grammar), both untrusted input, and the
// matcher run over what parses.
//
// Input layout: byte 0 even: the rest is a GBNF grammar; odd: a JSON schema, turned into one.
// A grammar that parses runs on a vocabulary of the 256 bytes, an end token and a few pieces of
// several characters: up to 48 steps, each taking the allowed token the next input byte picks
// (wrapping around the input), checking on the way that the mask and allows() agree.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "grammar.h"
#include "grammar_matcher.h"
#include "json_schema.h"

namespace {

std::shared_ptr<const h2o::TokenSurfaces> vocabulary() {
    static const std::shared_ptr<const h2o::TokenSurfaces> vocab = [] {
        std::vector<std::string> texts;
        std::vector<uint8_t> kinds;
        for (int b = 0; b < 256; ++b) {
            texts.emplace_back(1, static_cast<char>(b));
            kinds.push_back(h2o::TokenSurfaces::kText);
        }
        texts.emplace_back();
        kinds.push_back(h2o::TokenSurfaces::kEndOfGeneration);
        for (const char *piece : {"{\"", "\":", "true", "null", " \"", "\xC3\xA9", "\xE2\x82", "ab", "12", "\n  "}) {
            texts.emplace_back(piece);
            kinds.push_back(h2o::TokenSurfaces::kText);
        }
        return h2o::TokenSurfaces::from_texts(std::move(texts), std::move(kinds));
    }();
    return vocab;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const std::string_view text(reinterpret_cast<const char *>(data + 1), size - 1);
    std::string gbnf;
    if (data[0] % 2 == 1) {
        if (!h2o::json_schema_to_grammar(text, &gbnf).ok()) return 0;
    } else {
        gbnf = std::string(text);
    }
    auto grammar = std::make_shared<h2o::Grammar>();
    if (!h2o::parse_grammar(gbnf, grammar.get()).ok()) return 0;
    h2o::GrammarMatcher matcher(grammar, vocabulary());
    const auto vocab = vocabulary();
    std::vector<uint8_t> mask;
    for (size_t step = 0; step < 48 && matcher.failure().ok(); ++step) {
        if (!matcher.mask(&mask, 4096)) break;
        std::vector<int32_t> allowed;
        for (size_t t = 0; t < mask.size(); ++t) {
            h2o_fuzz::check(static_cast<bool>(mask[t]) == matcher.allows(static_cast<int32_t>(t)), "mask and allows() disagree");
            if (mask[t]) allowed.push_back(static_cast<int32_t>(t));
        }
        if (allowed.empty()) break;
        const int32_t token = allowed[data[step % size] % allowed.size()];
        h2o_fuzz::check(matcher.accept(token).ok() || !matcher.failure().ok(), "an allowed token was refused");
        if (vocab->kind[static_cast<size_t>(token)] == h2o::TokenSurfaces::kEndOfGeneration) {
            h2o_fuzz::check(matcher.must_end(), "after the end token the grammar must end");
            break;
        }
    }
    return 0;
}
