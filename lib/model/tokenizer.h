// The tokenizer of a model's vocabulary, one class for both families GGUF files carry:
//   - "llama": sentencepiece BPE over scored pieces, with byte fallback (Llama 1/2, Mistral,
//     Phi-3). The segmentation is done by the sentencepiece library.
//   - "gpt2": byte-level BPE with ranked merges and a pre-tokenizer chosen by tokenizer.ggml.pre
//     (GPT-2, Llama 3, Qwen 2/2.5/3, SmolLM2, Phi-4-mini); see bpe.h and pretokenizer.h.
// This class holds what both share: the vocabulary, special-token parsing, the end-of-generation
// set, validation of input text and rendering of tokens back to bytes.
//
// Immutable after construction: encode/decode/append_piece are const and safe to call from many
// threads at once (sentencepiece's Encode/Decode are const and keep no shared mutable state, and
// the byte-level encoder keeps its scratch space per call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.h"
#include "status.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace h2o {

class BytePairEncoder;

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

// tokenizer.ggml.model: "llama" and "gpt2".
enum class TokenizerModel {
    kSentencePiece,
    kByteLevelBpe
};

// A vocabulary as GGUF stores it: pieces and types have one entry per token; bos/eos/unk are -1
// when absent.
//   - Sentencepiece: one score per token; unk is required and names an unknown or control token
//     (the only one sentencepiece treats as unknown; other tokens of the unknown type are never
//     produced). Byte tokens, if any, must cover all 256 values (byte fallback).
//   - Byte-level BPE: scores are not used (may be empty); merges are required; pre names the
//     pre-tokenizer ("" when the key is absent); unk, when given, stands for a byte the
//     vocabulary has no token for.
struct VocabSpec {
    TokenizerModel model = TokenizerModel::kSentencePiece;
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<int32_t> types;       // TokenType values
    std::vector<std::string> merges;  // byte-level BPE: "left right", by rank
    std::string pre;                  // byte-level BPE: tokenizer.ggml.pre
    int32_t bos = -1, eos = -1, unk = -1;
    // End-of-turn and end-of-message tokens (tokenizer.ggml.eot_token_id, eom_token_id), -1: none.
    int32_t eot = -1, eom = -1;
    bool add_space_prefix = true;  // sentencepiece's add_dummy_prefix (byte-level BPE has none)
    // tokenizer.ggml.add_bos_token / add_eos_token; absent: llama.cpp's defaults (sentencepiece
    // adds BOS, byte-level BPE does not; neither adds EOS).
    std::optional<bool> add_bos, add_eos;
    // Whitespace a special token swallows where it is found in text: TokenStrip bits per token
    // (Hugging Face's lstrip / rstrip of added tokens), or empty for none. GGUF files do not carry
    // them; llama.cpp sets them by the model's name, and so does the tokenizer (model_name).
    std::vector<uint8_t> strip;
    // general.name: llama.cpp gives the special tokens of a model named Phi-3 ("phi-3", "phi3", any
    // case) a right strip (all but <unk>, <s> and <|endoftext|>; </s> too), over `strip`.
    std::string model_name;
};

enum TokenStrip : uint8_t {
    kStripLeft = 1,   // the ASCII whitespace before the token
    kStripRight = 2,  // the ASCII whitespace after it
};

class Tokenizer {
public:
    ~Tokenizer();
    Tokenizer(const Tokenizer &) = delete;
    Tokenizer &operator=(const Tokenizer &) = delete;

    // Sentencepiece: builds the sentencepiece model llama.cpp's tokenizer corresponds to: BPE
    // over the pieces' scores, byte fallback when the vocabulary has byte tokens, identity
    // normalization, spaces escaped to U+2581, runs of whitespace kept. Byte-level BPE: the merge
    // table and the pre-tokenizer (bpe.h). Errors: H2O_ERR_MODEL_FORMAT (inconsistent spec:
    // lengths, ids, types, merges), H2O_ERR_UNSUPPORTED (an unknown pre-tokenizer),
    // H2O_ERR_TOKENIZER (sentencepiece rejects it, e.g. a piece appears twice or byte tokens are
    // incomplete).
    static Status from_vocab(const VocabSpec &spec, std::unique_ptr<Tokenizer> *out);
    // Reads tokenizer.ggml.* from a GGUF file: model "llama" or "gpt2" (else H2O_ERR_UNSUPPORTED
    // naming it). "llama": tokens, scores and token_type are required; bos/eos/unknown_token_id
    // default to llama.cpp's 1/2/0; add_space_prefix defaults to true. "gpt2": tokens and merges
    // are required, token_type defaults to normal, pre to llama.cpp's "default" (with a warning);
    // special ids default to none (llama.cpp's 11 for BOS and EOS is GPT-2's ',' and no model's
    // intent). UINT32_MAX means "none" for every id.
    static Status from_gguf(const GgufFile &file, std::unique_ptr<Tokenizer> *out);
    // A sentencepiece .model file (BPE), read the way llama.cpp converts one to GGUF: pieces,
    // scores, types, special ids and add_dummy_prefix. Its other normalizer settings are ignored
    // (llama.cpp neither collapses whitespace nor normalizes), so the ids equal those of the same
    // vocabulary embedded in a GGUF file. Errors: H2O_ERR_IO, H2O_ERR_TOKENIZER (malformed or
    // rejected), H2O_ERR_UNSUPPORTED (not BPE), H2O_ERR_MODEL_FORMAT (inconsistent vocabulary).
    static Status from_model_file(const std::string &path, std::unique_ptr<Tokenizer> *out);

    TokenizerModel model() const { return model_; }
    int32_t n_vocab() const { return static_cast<int32_t>(entries_.size()); }
    int32_t bos() const { return bos_; }
    int32_t eos() const { return eos_; }
    int32_t unk() const { return unk_; }
    // Whether a prompt starts with BOS / ends with EOS, as the vocabulary asks (add_bos is false
    // without a BOS token). encode() adds BOS only when told to; a fresh session asks add_bos().
    bool add_bos() const { return add_bos_; }
    bool add_eos() const { return add_eos_; }
    bool is_control(int32_t id) const;
    // The token's type and raw vocabulary string; out of range: TOKEN_UNUSED and "".
    TokenType type(int32_t id) const;
    const std::string &piece(int32_t id) const;

    // Text must be valid UTF-8 (else H2O_ERR_INVALID_TEXT with the byte offset). The text of a
    // user-defined token (Qwen's "<think>", Gemma's runs of spaces and newlines) is that token
    // wherever it appears, as in llama.cpp; control-token text is spelled out. Sentencepiece: a
    // leading space is added to each piece of text between such tokens when the vocabulary asks
    // for it, as llama.cpp does.
    // Empty text gives no tokens (just BOS when add_bos). add_bos without a BOS token:
    // H2O_ERR_INVALID_ARGUMENT.
    Status encode(std::string_view text, bool add_bos, std::vector<int32_t> *out) const;
    // As encode, but the text of a control, user-defined or unknown token ("<s>", "</s>",
    // "<|im_end|>") becomes that token instead of being spelled out. Tokens are found as
    // llama.cpp finds them: the longest token text first, everywhere in the text, then the next
    // longest in what is left; a token that strips (VocabSpec::strip) takes the whitespace beside
    // it. The text between them is encoded as above (sentencepiece: each piece with its own
    // leading space, as llama.cpp does). A BOS at the very start is not doubled by add_bos.
    Status encode_special(std::string_view text, bool add_bos, std::vector<int32_t> *out) const;

    // Whether generation ends at this token, decided as llama.cpp does: EOS, the end-of-turn
    // and end-of-message tokens the vocabulary names, and the tokens chat and fill-in-the-middle
    // formats end a turn with (<|eot_id|>, <|eom_id|>, <|im_end|>, <|endoftext|>, <|end|>, ...),
    // which count as control tokens unless the file has them as normal tokens.
    bool is_end_of_generation(int32_t id) const;

    // Appends the bytes token id contributes to a text stream (possibly part of a multi-byte
    // character; callers hold incomplete characters back, see take_complete_utf8). Sentencepiece:
    // U+2581 becomes ' ', a byte token <0xNN> that raw byte, control tokens nothing, the unknown
    // token sentencepiece's unknown surface (" \xE2\x81\x87 "), other pieces verbatim.
    // Byte-level BPE: a normal token the bytes its characters stand for, a user-defined token its
    // text, control, unknown and unused tokens nothing (as llama.cpp renders them).
    // after_bos: no text-producing token precedes this one since BOS (or the start), so a piece
    // starting with U+2581 drops that dummy-prefix space, as sentencepiece's decoder does (byte
    // and unknown tokens keep theirs; without add_space_prefix nothing is dropped). Appending a
    // sequence with after_bos true until its first non-control token equals decode() whenever
    // the bytes form valid UTF-8. Ids out of range append nothing.
    void append_piece(int32_t id, bool after_bos, std::string *out) const;

    // Decodes a whole sequence. Sentencepiece: as sentencepiece does: the dummy-prefix space of
    // the first piece is removed, control tokens vanish, byte tokens are joined into characters
    // (bytes that do not form valid UTF-8 become U+FFFD each). Byte-level BPE: the pieces of
    // append_piece joined, bytes that do not form valid UTF-8 becoming U+FFFD each; spaces are
    // never "cleaned up" (llama.cpp's clean_spaces), so decode(encode(text)) is text. Ids out of
    // range: H2O_ERR_INVALID_ARGUMENT, and *out is left unchanged.
    Status decode(const int32_t *ids, size_t n, std::string *out) const;

private:
    struct Entry {
        TokenType type = TOKEN_NORMAL;
        uint8_t strip = 0;    // TokenStrip bits
        std::string piece;    // as in the vocabulary
        std::string surface;  // what append_piece emits (before the after_bos rule)
    };

    // A piece of text to encode, or a special token found in it.
    struct Fragment {
        int32_t token;  // -1: text
        std::string_view text;
    };

    Tokenizer();
    Status build_bpe(const VocabSpec &spec);
    // Cuts text at the special tokens (control, user-defined and unknown ones when with_control,
    // else user-defined ones only), in llama.cpp's order.
    std::vector<Fragment> split_special(std::string_view text, bool with_control) const;
    // Appends the ids of plain text (no special token is looked for).
    Status encode_text(std::string_view text, std::vector<int32_t> *out) const;

    TokenizerModel model_ = TokenizerModel::kSentencePiece;
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
    std::unique_ptr<BytePairEncoder> bpe_;
    std::vector<Entry> entries_;
    std::vector<int32_t> special_by_length_;  // control, user-defined and unknown tokens, longest piece first
    std::vector<int32_t> end_of_generation_;  // sorted
    int32_t bos_ = -1, eos_ = -1, unk_ = -1;
    bool add_space_prefix_ = true;
    bool add_bos_ = false, add_eos_ = false;
};

}  // namespace h2o
