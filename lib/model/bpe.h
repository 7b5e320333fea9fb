// Byte-level BPE, the tokenizer of GGUF files with tokenizer.ggml.model = "gpt2" (GPT-2, Llama 3,
// Qwen 2/2.5/3, SmolLM2, Phi-4-mini): text is cut into words by a pre-tokenizer, each word's bytes
// start as one token each, and the ranked merges of tokenizer.ggml.merges join neighbours, the
// lowest rank (then the leftmost pair) first, until no listed pair is left.
//
// Normal tokens are written in GPT-2's byte-level alphabet: every byte value has a printable
// character of its own ("Ġ" U+0120 is the space byte, "Ċ" U+010A the newline), so that a token's
// text is readable and its bytes are recovered exactly.
//
// Immutable after create(): encode is const, keeps its scratch space on the caller's stack and
// heap, and is safe to call from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pretokenizer.h"
#include "status.h"

namespace h2o {

// The character (as UTF-8) that stands for a byte in byte-level token texts.
std::string_view byte_level_char(uint8_t byte);

// The bytes a byte-level token text stands for. A character outside the 256 of the alphabet (in
// a token that was not written by a byte-level converter) is kept as its own UTF-8.
std::string byte_level_decode(std::string_view text);

class BytePairEncoder {
public:
    ~BytePairEncoder();
    BytePairEncoder(const BytePairEncoder &) = delete;
    BytePairEncoder &operator=(const BytePairEncoder &) = delete;

    // pieces and types: the vocabulary (types as Tokenizer uses them, after its own checks).
    // merges: "left right" strings, rank = position; the text before the first space (after the
    // first character) is the left token. Every merge must join two normal tokens into a normal
    // token; a duplicate pair keeps its first (lowest) rank, as llama.cpp does. unk (or -1) is
    // the token for a byte the vocabulary has no token for. Errors: H2O_ERR_MODEL_FORMAT naming
    // the merge or token at fault.
    static Status create(const std::vector<std::string> &pieces, const std::vector<int32_t> &types, const std::vector<std::string> &merges,
                         std::unique_ptr<Pretokenizer> pretokenizer, int32_t unk, std::unique_ptr<BytePairEncoder> *out);

    const Pretokenizer &pretokenizer() const { return *pretokenizer_; }
    size_t n_merges() const { return n_merges_; }

    // Appends the ids of text, which holds no special token. text must be valid UTF-8.
    // Errors: H2O_ERR_TOKENIZER (a byte no token stands for and no unknown token; the regex
    // engine's limits).
    Status encode(std::string_view text, std::vector<int32_t> *out) const;

private:
    class MergeTable;
    struct Scratch;
    BytePairEncoder();

    Status encode_word(std::string_view word, Scratch &scratch, std::vector<int32_t> *out) const;

    std::unique_ptr<Pretokenizer> pretokenizer_;
    std::unique_ptr<MergeTable> merges_;
    size_t n_merges_ = 0;
    int32_t byte_token_[256];  // the token of each byte's character, or -1
    int32_t unk_ = -1;
    // For Llama 3's ignore_merges: normal tokens by the bytes they stand for (views of word_bytes_).
    std::string word_bytes_;
    std::unordered_map<std::string_view, int32_t> token_by_bytes_;
};

}  // namespace h2o
