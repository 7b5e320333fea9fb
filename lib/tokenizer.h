// Llama (sentencepiece BPE) tokenizer. The segmentation itself is done by the sentencepiece
// library; this class feeds it a vocabulary (from a GGUF file, a .model file or a VocabSpec),
// validates input text and renders tokens back to bytes.
//
// Immutable after construction: encode/decode/append_piece are const and safe to call from many
// threads at once (sentencepiece's Encode/Decode are const and keep no shared mutable state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.h"
#include "status.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace h2o {

// GGUF token types (tokenizer.ggml.token_type). They have the same numbering as sentencepiece's
// ModelProto.SentencePiece.Type.
enum TokenType : int32_t {
    TOKEN_NORMAL = 1,
    TOKEN_UNKNOWN = 2,
    TOKEN_CONTROL = 3,
    TOKEN_USER_DEFINED = 4,
    TOKEN_UNUSED = 5,
    TOKEN_BYTE = 6,
};

// A vocabulary as GGUF stores it: pieces, scores and types have one entry per token. Exactly one
// token has the unknown type and unk names it; bos/eos are -1 when absent. Byte tokens, if any,
// must cover all 256 values (byte fallback).
struct VocabSpec {
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<int32_t> types;  // TokenType values
    int32_t bos = -1, eos = -1, unk = -1;
    // End-of-turn and end-of-message tokens (tokenizer.ggml.eot_token_id, eom_token_id), -1: none.
    int32_t eot = -1, eom = -1;
    bool add_space_prefix = true;  // sentencepiece's add_dummy_prefix
};

class Tokenizer {
public:
    ~Tokenizer();
    Tokenizer(const Tokenizer &) = delete;
    Tokenizer &operator=(const Tokenizer &) = delete;

    // Builds the sentencepiece model llama.cpp's tokenizer corresponds to: BPE over the pieces'
    // scores, byte fallback when the vocabulary has byte tokens, identity normalization, spaces
    // escaped to U+2581, runs of whitespace kept. Errors: H2O_ERR_MODEL_FORMAT (inconsistent
    // spec: lengths, ids or types), H2O_ERR_TOKENIZER (sentencepiece rejects it, e.g. a piece
    // appears twice or byte tokens are incomplete).
    static Status from_vocab(const VocabSpec &spec, std::unique_ptr<Tokenizer> *out);
    // Reads tokenizer.ggml.* from a GGUF file: model must be "llama" (else H2O_ERR_UNSUPPORTED
    // naming it); tokens, scores and token_type are required; bos/eos/unknown_token_id default to
    // llama.cpp's 1/2/0 and UINT32_MAX means "none"; add_space_prefix defaults to true.
    static Status from_gguf(const GgufFile &file, std::unique_ptr<Tokenizer> *out);
    // A sentencepiece .model file (BPE), read the way llama.cpp converts one to GGUF: pieces,
    // scores, types, special ids and add_dummy_prefix. Its other normalizer settings are ignored
    // (llama.cpp neither collapses whitespace nor normalizes), so the ids equal those of the same
    // vocabulary embedded in a GGUF file. Errors: H2O_ERR_IO, H2O_ERR_TOKENIZER (malformed or
    // rejected), H2O_ERR_UNSUPPORTED (not BPE), H2O_ERR_MODEL_FORMAT (inconsistent vocabulary).
    static Status from_model_file(const std::string &path, std::unique_ptr<Tokenizer> *out);

    int32_t n_vocab() const { return static_cast<int32_t>(entries_.size()); }
    int32_t bos() const { return bos_; }
    int32_t eos() const { return eos_; }
    int32_t unk() const { return unk_; }
    bool is_control(int32_t id) const;
    // The token's type and raw vocabulary string; out of range: TOKEN_UNUSED and "".
    TokenType type(int32_t id) const;
    const std::string &piece(int32_t id) const;

    // Text must be valid UTF-8 (else H2O_ERR_INVALID_TEXT with the byte offset). A leading space
    // is added when the vocabulary asks for it, as sentencepiece and llama.cpp do. Empty text
    // gives no tokens (just BOS when add_bos). add_bos without a BOS token: H2O_ERR_INVALID_ARGUMENT.
    Status encode(std::string_view text, bool add_bos, std::vector<int32_t> *out) const;
    // As encode, but the text of a control or user-defined token ("<s>", "</s>", "<|im_end|>")
    // becomes that token instead of being spelled out; the text between them is encoded as
    // above, each piece with its own leading space, as llama.cpp does. A BOS at the very start
    // is not doubled by add_bos.
    Status encode_special(std::string_view text, bool add_bos, std::vector<int32_t> *out) const;

    // Whether generation ends at this token: EOS, the end-of-turn and end-of-message tokens the
    // vocabulary names, and control tokens that chat formats use to end a turn.
    bool is_end_of_generation(int32_t id) const;

    // Appends the bytes token id contributes to a text stream: U+2581 becomes ' ', a byte token
    // <0xNN> that raw byte (possibly part of a multi-byte character), control tokens nothing, the
    // unknown token sentencepiece's unknown surface (" \xE2\x81\x87 "), other pieces verbatim.
    // after_bos: no text-producing token precedes this one since BOS (or the start), so a piece
    // starting with U+2581 drops that dummy-prefix space, as sentencepiece's decoder does (byte
    // and unknown tokens keep theirs; without add_space_prefix nothing is dropped). Appending a
    // sequence with after_bos true until its first non-control token equals decode() whenever
    // the bytes form valid UTF-8. Ids out of range append nothing.
    void append_piece(int32_t id, bool after_bos, std::string *out) const;

    // Decodes a whole sequence as sentencepiece does: the dummy-prefix space of the first piece
    // is removed, control tokens vanish, byte tokens are joined into characters (bytes that do
    // not form valid UTF-8 become U+FFFD each). Ids out of range: H2O_ERR_INVALID_ARGUMENT, and
    // *out is left unchanged.
    Status decode(const int32_t *ids, size_t n, std::string *out) const;

private:
    struct Entry {
        TokenType type = TOKEN_NORMAL;
        std::string piece;    // as in the vocabulary
        std::string surface;  // what append_piece emits (before the after_bos rule)
    };

    Tokenizer();

    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
    std::vector<Entry> entries_;
    std::vector<int32_t> special_by_length_;  // control and user-defined tokens, longest piece first
    std::vector<int32_t> end_of_generation_;  // sorted
    int32_t bos_ = -1, eos_ = -1, unk_ = -1;
    bool add_space_prefix_ = true;
};


}  // namespace h2o
