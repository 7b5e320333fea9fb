// Pre-tokenizers of byte-level BPE vocabularies (GGUF key tokenizer.ggml.pre): the regular
// expressions that cut text into the words that BPE merges within (a merge never crosses a word).
//
// The patterns are those of the models' tokenizer.json, in the form llama.cpp evaluates them, so
// that the words, and therefore the token ids, are the same as llama.cpp's. They run on PCRE2 with
// Unicode properties (\p{L}, \p{N}) and its JIT. Each pattern is compiled once per Pretokenizer;
// PCRE2's compiled code is read-only while matching, so one Pretokenizer serves many threads
// (every split() call has its own match data).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "status.h"

namespace h2o {

class Pretokenizer {
public:
    ~Pretokenizer();
    Pretokenizer(const Pretokenizer &) = delete;
    Pretokenizer &operator=(const Pretokenizer &) = delete;

    // The pre-tokenizer llama.cpp uses for this tokenizer.ggml.pre value. An empty name (the key
    // is absent) is llama.cpp's "default", with a warning in the log, as llama.cpp does. A name
    // this library does not know is H2O_ERR_UNSUPPORTED naming it (see the .cpp for why).
    static Status create(std::string_view name, std::unique_ptr<Pretokenizer> *out);

    // The names create() accepts, for messages and tests.
    static std::vector<std::string> known_names();

    const std::string &name() const { return name_; }
    // Llama 3's rule: a word that is itself a token becomes that token without merging.
    bool ignore_merges() const { return ignore_merges_; }
    // Whether a vocabulary without tokenizer.ggml.add_bos_token starts a text with BOS: llama.cpp's
    // default for this pre-tokenizer (Llama 3's files rely on it).
    bool adds_bos_by_default() const { return adds_bos_by_default_; }

    // Appends the words of text, in order; together they are exactly text. text must be valid
    // UTF-8 (the tokenizer checks it first). Errors: H2O_ERR_TOKENIZER when the regex engine
    // gives up (a resource limit), never a partial result presented as complete.
    Status split(std::string_view text, std::vector<std::string_view> *words) const;

private:
    struct Pattern;
    Pretokenizer();

    std::string name_;
    bool ignore_merges_ = false;
    bool adds_bos_by_default_ = false;
    // Applied in order: each one splits the pieces the previous one left, as llama.cpp does; text
    // between two matches is a piece of its own.
    std::vector<std::unique_ptr<Pattern>> patterns_;
};

}  // namespace h2o
