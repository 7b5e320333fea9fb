#include "pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "log.h"

namespace h2o {
namespace {

// Whitespace as the tokenizers mean it: the Unicode White_Space property (what Python's and Rust's
// \s match, and what llama.cpp tests). PCRE2's \s with Unicode properties also matches U+180E,
// which is not White_Space any more, so the patterns spell the class out: WS is its content, for
// use inside brackets.
#define WS "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
// The English contractions, case-insensitive but only for ASCII letters ('S, 'Re), written out
// because (?i:...) would also fold non-ASCII letters such as U+017F or U+212A into s and k.
#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
constexpr const char *kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])|[" WS "]+";

// Llama 3 (tokenizer.json): (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
constexpr const char *kLlama3 = CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS
                                             "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";

// Qwen 2, 2.5 and 3: as Llama 3, with digits one at a time.
constexpr const char *kQwen2 = CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS
                                            "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";

// GPT-4o / o200k (Phi-4-mini). tokenizer.json's pattern tells upper- from lower-case letters by
// Unicode category ([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ ...). llama.cpp
// evaluates an adaptation in which only ASCII letters have a case: an "upper" letter is any
// letter but a-z, a "lower" one any letter but A-Z, and combining marks (\p{M}) are not letters.
// This is that adaptation ([^\P{L}a-z]: a letter other than a-z), so that the ids are llama.cpp's;
// they differ from the Hugging Face tokenizer's only where non-ASCII text changes case inside a
// word or carries combining marks.
constexpr const char *kGpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]*[^\\P{L}A-Z]+" CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]+[^\\P{L}A-Z]*" CONTRACTIONS
    "?|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";

struct Definition {
    std::vector<std::string_view> names;  // tokenizer.ggml.pre values (llama.cpp's aliases)
    bool ignore_merges;
    bool adds_bos_by_default;  // without tokenizer.ggml.add_bos_token (llama.cpp's default)
    std::vector<const char *> patterns;
};

const std::vector<Definition> &definitions() {
    static const std::vector<Definition> kDefinitions = {
        {{"llama-bpe", "llama3", "llama-v3"}, true, true, {kLlama3}},
        {{"qwen2", "deepseek-r1-qwen"}, false, false, {kQwen2}},
        // SmolLM and SmolLM2: every digit alone, then GPT-2's pattern.
        {{"smollm"}, false, false, {"\\p{N}", kGpt2}},
        {{"gpt-2", "phi-2"}, false, false, {kGpt2}},
        {{"gpt-4o"}, false, false, {kGpt4o}},
        // llama.cpp's "default" (also its choice when the key is absent): runs of punctuation and
        // a few symbols first, then GPT-2's pattern, then numbers in groups of at most three digits.
        {{"default"}, false, false, {"[\\p{P}$+<=>^~|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    };
    return kDefinitions;
}

#undef WS
#undef CONTRACTIONS

}  // namespace

struct Pretokenizer::Pattern {
    pcre2_code *code = nullptr;
    ~Pattern() { pcre2_code_free(code); }
};

Pretokenizer::Pretokenizer() = default;
Pretokenizer::~Pretokenizer() = default;

std::vector<std::string> Pretokenizer::known_names() {
    std::vector<std::string> names;
    for (const Definition &d : definitions()) names.insert(names.end(), d.names.begin(), d.names.end());
    return names;
}

Status Pretokenizer::create(std::string_view name, std::unique_ptr<Pretokenizer> *out) {
    std::string_view effective = name;
    if (name.empty()) {
        // llama.cpp's choice for files converted before the key existed.
        log(H2O_LOG_WARN,
            "tokenizer.ggml.pre is absent: using llama.cpp's 'default' pre-tokenizer; the tokens may "
            "not be the model's own (convert the model again with a current converter)");
        effective = "default";
    }
    const Definition *found = nullptr;
    for (const Definition &d : definitions()) {
        if (std::find(d.names.begin(), d.names.end(), effective) != d.names.end()) found = &d;
    }
    // An unknown name is refused rather than replaced by some other pattern: a wrong split gives
    // other token ids than those the model was trained on, and the model then answers worse with
    // no sign of why. llama.cpp refuses such files too.
    if (!found) {
        std::string known;
        for (const std::string &n : known_names()) known += (known.empty() ? "" : ", ") + n;
        return make_error(H2O_ERR_UNSUPPORTED,
                          "tokenizer.ggml.pre '" + std::string(name) + "' is not a supported pre-tokenizer (supported: " + known + ")");
    }

    std::unique_ptr<Pretokenizer> pre(new Pretokenizer());
    pre->name_ = std::string(effective);
    pre->ignore_merges_ = found->ignore_merges;
    pre->adds_bos_by_default_ = found->adds_bos_by_default;
    for (const char *source : found->patterns) {
        auto pattern = std::make_unique<Pattern>();
        int error = 0;
        PCRE2_SIZE error_offset = 0;
        pattern->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &error,
                                      &error_offset, nullptr);
        if (!pattern->code) {
            PCRE2_UCHAR buffer[256];
            pcre2_get_error_message(error, buffer, sizeof buffer);
            return make_error(H2O_ERR_INTERNAL, "pre-tokenizer '" + pre->name_ + "': pattern does not compile at offset " +
                                                    std::to_string(error_offset) + ": " + reinterpret_cast<const char *>(buffer));
        }
        // The JIT is an optimisation: where PCRE2 was built without it (or the CPU has none),
        // pcre2_match interprets the same pattern with the same results.
        const int jit = pcre2_jit_compile(pattern->code, PCRE2_JIT_COMPLETE);
        if (jit != 0 && jit != PCRE2_ERROR_JIT_BADOPTION) {
            log(H2O_LOG_DEBUG, "pre-tokenizer '" + pre->name_ + "': no JIT (" + std::to_string(jit) + "), interpreting");
        }
        pre->patterns_.push_back(std::move(pattern));
    }
    *out = std::move(pre);
    return Status::Ok();
}

namespace {

// Match data sized for a pattern, freed on every path.
struct MatchData {
    explicit MatchData(const pcre2_code *code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
    ~MatchData() { pcre2_match_data_free(data); }
    MatchData(const MatchData &) = delete;
    MatchData &operator=(const MatchData &) = delete;
    pcre2_match_data *data;
};

}  // namespace

Status Pretokenizer::split(std::string_view text, std::vector<std::string_view> *words) const {
    if (text.empty()) return Status::Ok();
    std::vector<std::string_view> pieces = {text}, next;
    for (const auto &pattern : patterns_) {
        MatchData match(pattern->code);
        if (!match.data) return make_error(H2O_ERR_OUT_OF_MEMORY, "pre-tokenizer: cannot allocate match data");
        next.clear();
        for (std::string_view piece : pieces) {
            const auto *subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
            size_t start = 0;
            while (start < piece.size()) {
                // The text was validated as UTF-8 and every offset here is a character boundary.
                const int rc = pcre2_match(pattern->code, subject, piece.size(), start, PCRE2_NO_UTF_CHECK, match.data, nullptr);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR buffer[256];
                    pcre2_get_error_message(rc, buffer, sizeof buffer);
                    return make_error(H2O_ERR_TOKENIZER, "pre-tokenizer '" + name_ + "' failed on a piece of " +
                                                             std::to_string(piece.size()) +
                                                             " bytes: " + reinterpret_cast<const char *>(buffer));
                }
                const PCRE2_SIZE *ovector = pcre2_get_ovector_pointer(match.data);
                const size_t begin = ovector[0], end = ovector[1];
                // Every alternative of every pattern consumes at least one character.
                if (end <= begin || begin < start || end > piece.size())
                    return make_error(H2O_ERR_INTERNAL, "pre-tokenizer '" + name_ + "': the pattern matched an empty or misplaced span");
                if (begin > start) next.push_back(piece.substr(start, begin - start));
                next.push_back(piece.substr(begin, end - begin));
                start = end;
            }
            if (start < piece.size()) next.push_back(piece.substr(start));
        }
        std::swap(pieces, next);
    }
    words->insert(words->end(), pieces.begin(), pieces.end());
    return Status::Ok();
}

}  // namespace h2o
