#include "tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "bpe.h"
#include "pretokenizer.h"
#include "sentencepiece_model.h"
#include "utf8.h"

namespace h2o {
namespace {

// U+2581 LOWER ONE EIGHTH BLOCK: sentencepiece's stand-in for a space inside pieces.
constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";
// How sentencepiece's decoder prints the unknown token by default (U+2047 between spaces).
constexpr std::string_view kUnknownSurface = " \xE2\x81\x87 ";

std::string replace_space_symbol(std::string_view piece) {
    std::string out;
    out.reserve(piece.size());
    for (size_t i = 0; i < piece.size();) {
        if (piece.substr(i, kSpaceSymbol.size()) == kSpaceSymbol) {
            out.push_back(' ');
            i += kSpaceSymbol.size();
        } else {
            out.push_back(piece[i++]);
        }
    }
    return out;
}

// "<0xNN>" -> NN, or -1.
int parse_byte_piece(std::string_view piece) {
    if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
    int value = 0;
    for (char c : piece.substr(3, 2)) {
        int digit;
        if (c >= '0' && c <= '9')
            digit = c - '0';
        else if (c >= 'A' && c <= 'F')
            digit = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f')
            digit = c - 'a' + 10;
        else
            return -1;
        value = value * 16 + digit;
    }
    return value;
}

// The texts of the tokens that end a turn, which llama.cpp adds to the end-of-generation set
// whatever the GGUF keys say: the chat formats' turn ends (<|eot_id|>, <|im_end|>, <|end|>,
// <end_of_turn>, ...), the ends of text, and the end of a tool call's message. Qwen's
// fill-in-the-middle padding, repository and file separators are among them too: llama.cpp stops
// there as well, since a model emitting them has left the answer.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "</s>",  "<|eot_id|>", "<|eom_id|>", "<|im_end|>",  "<|end|>",      "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>",
    "<EOT>", "<|return|>", "<|call|>",   "<|fim_pad|>", "<|fim_repo|>", "<|repo_name|>", "<|file_sep|>",
};

bool is_end_of_generation_text(std::string_view piece) {
    return std::find(std::begin(kEndOfGenerationTexts), std::end(kEndOfGenerationTexts), piece) != std::end(kEndOfGenerationTexts);
}

Status validate_spec(const VocabSpec &spec) {
    auto bad = [](std::string message) { return make_error(H2O_ERR_MODEL_FORMAT, "vocabulary: " + std::move(message)); };
    const bool sentencepiece = spec.model == TokenizerModel::kSentencePiece;
    const size_t n = spec.pieces.size();
    if (n == 0) return bad("no tokens");
    if (n > static_cast<size_t>(INT32_MAX)) return bad("too many tokens (" + std::to_string(n) + ")");
    // Byte-level BPE does not use scores; when a file has them they must still fit.
    if (spec.scores.size() != n && (sentencepiece || !spec.scores.empty()))
        return bad(std::to_string(n) + " tokens but " + std::to_string(spec.scores.size()) + " scores");
    if (spec.types.size() != n) return bad(std::to_string(n) + " tokens but " + std::to_string(spec.types.size()) + " token types");
    if (!spec.strip.empty() && spec.strip.size() != n)
        return bad(std::to_string(n) + " tokens but " + std::to_string(spec.strip.size()) + " strip attributes");
    if (sentencepiece && !spec.merges.empty()) return bad("merges are given for a sentencepiece vocabulary");
    const int64_t n_vocab = static_cast<int64_t>(n);
    auto check_id = [&](const char *name, int32_t id, bool required) -> Status {
        if (id == -1 && !required) return Status::Ok();
        if (id < 0 || id >= n_vocab)
            return bad(std::string(name) + " token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(n) +
                       " tokens");
        return Status::Ok();
    };
    H2O_TRY(check_id("BOS", spec.bos, false));
    H2O_TRY(check_id("EOS", spec.eos, false));
    H2O_TRY(check_id("unknown", spec.unk, sentencepiece));
    H2O_TRY(check_id("end-of-turn", spec.eot, false));
    H2O_TRY(check_id("end-of-message", spec.eom, false));
    if (spec.add_bos.value_or(false) && spec.bos < 0) return bad("add_bos_token is true but there is no BOS token");
    if (spec.add_eos.value_or(false) && spec.eos < 0) return bad("add_eos_token is true but there is no EOS token");

    for (size_t i = 0; i < n; ++i) {
        const int32_t type = spec.types[i];
        if (type < TOKEN_NORMAL || type > TOKEN_BYTE)
            return bad("token " + std::to_string(i) + " has type " + std::to_string(type) + " (valid types are 1..6)");
        if (type == TOKEN_BYTE && parse_byte_piece(spec.pieces[i]) < 0)
            return bad("token " + std::to_string(i) + " has the byte type but is not of the form <0xNN>");
    }
    // Sentencepiece turns characters outside the vocabulary into unk, so it must be a token
    // that stands for nothing: an unknown or a control one (Phi-3's <unk> is a control token).
    if (sentencepiece) {
        const int32_t type = spec.types[static_cast<size_t>(spec.unk)];
        if (type != TOKEN_UNKNOWN && type != TOKEN_CONTROL)
            return bad("unknown token id " + std::to_string(spec.unk) + " has type " + std::to_string(type) +
                       " (an unknown or control token is required)");
    }
    return Status::Ok();
}

// GGUF stores "no such token" as UINT32_MAX (seen as -1 when read as int32).
Status read_token_id(const GgufFile &file, const char *key, int32_t fallback, int32_t *out) {
    uint32_t value = 0;
    H2O_TRY(file.get_u32_or(key, static_cast<uint32_t>(fallback), &value));
    if (value == UINT32_MAX) {
        *out = -1;
    } else if (value > static_cast<uint32_t>(INT32_MAX)) {
        return make_error(H2O_ERR_MODEL_FORMAT,
                          std::string("metadata '") + key + "' = " + std::to_string(value) + " is not a valid token id");
    } else {
        *out = static_cast<int32_t>(value);
    }
    return Status::Ok();
}

Status read_optional_bool(const GgufFile &file, const char *key, std::optional<bool> *out) {
    if (!file.find(key)) return Status::Ok();
    bool value = false;
    H2O_TRY(file.get_bool_or(key, false, &value));
    *out = value;
    return Status::Ok();
}

// llama.cpp's per-model token attributes (its vocabulary loader sets them by general.name, since
// GGUF files do not carry them): Phi-3's special tokens take the whitespace after them, so that
// "<|user|>\nHi" reads as "<|user|>" + "Hi", as Hugging Face's tokenizer does.
bool strips_like_phi3(std::string_view model_name) {
    std::string name(model_name);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

Status invalid_utf8(std::string_view text) {
    size_t bad = 0;
    if (is_valid_utf8(text, &bad)) return Status::Ok();
    return make_error(H2O_ERR_INVALID_TEXT, "text is not valid UTF-8 at byte offset " + std::to_string(bad));
}

}  // namespace

// ------------------------------------------------------------------------------------------------

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Status Tokenizer::from_vocab(const VocabSpec &spec, std::unique_ptr<Tokenizer> *out) {
    H2O_TRY(validate_spec(spec));
    const bool sentencepiece = spec.model == TokenizerModel::kSentencePiece;
    std::unique_ptr<Tokenizer> tok(new Tokenizer());
    tok->model_ = spec.model;

    tok->entries_.resize(spec.pieces.size());
    for (size_t i = 0; i < spec.pieces.size(); ++i) {
        Entry &e = tok->entries_[i];
        e.type = static_cast<TokenType>(spec.types[i]);
        e.piece = spec.pieces[i];
        // A turn end the file does not type as a control token is one (llama.cpp reads Phi-3's
        // user-defined </s> so), unless it is a normal token: Qwen's vocabulary has </s> as an
        // ordinary word that merges build, and it must stay one (it still ends generation).
        if (is_end_of_generation_text(e.piece) && e.type != TOKEN_NORMAL) e.type = TOKEN_CONTROL;
        if (!spec.strip.empty()) e.strip = spec.strip[i] & (kStripLeft | kStripRight);
        switch (e.type) {
            case TOKEN_CONTROL:
                break;  // renders as nothing
            case TOKEN_UNKNOWN:
                if (sentencepiece) e.surface = kUnknownSurface;
                break;
            case TOKEN_BYTE:
                e.surface.assign(1, static_cast<char>(parse_byte_piece(e.piece)));
                break;
            case TOKEN_UNUSED:
                if (sentencepiece) e.surface = replace_space_symbol(e.piece);
                break;
            case TOKEN_USER_DEFINED:
                e.surface = sentencepiece ? replace_space_symbol(e.piece) : e.piece;
                break;
            case TOKEN_NORMAL:
                e.surface = sentencepiece ? replace_space_symbol(e.piece) : byte_level_decode(e.piece);
                break;
        }
    }
    tok->bos_ = spec.bos;
    tok->eos_ = spec.eos;
    tok->unk_ = spec.unk;
    tok->add_space_prefix_ = sentencepiece && spec.add_space_prefix;
    tok->add_eos_ = spec.add_eos.value_or(false);
    const bool phi3_strips = strips_like_phi3(spec.model_name);
    for (int32_t id = 0; id < static_cast<int32_t>(spec.pieces.size()); ++id) {
        Entry &e = tok->entries_[static_cast<size_t>(id)];
        const bool special = e.type == TOKEN_CONTROL || e.type == TOKEN_USER_DEFINED || e.type == TOKEN_UNKNOWN;
        if (phi3_strips && (special || e.piece == "</s>")) {
            const bool keeps = e.piece == "<unk>" || e.piece == "<s>" || e.piece == "<|endoftext|>";
            e.strip = keeps ? e.strip & ~kStripRight : e.strip | kStripRight;
        }
        // A piece that is not UTF-8 could match only inside a character of the (valid) text and
        // cut it in two; such a token is never parsed from text (found by fuzzing).
        if (special && !e.piece.empty() && is_valid_utf8(e.piece)) tok->special_by_length_.push_back(id);
        if (id == spec.eos || id == spec.eot || id == spec.eom || is_end_of_generation_text(e.piece)) tok->end_of_generation_.push_back(id);
    }
    std::stable_sort(tok->special_by_length_.begin(), tok->special_by_length_.end(), [&](int32_t a, int32_t b) {
        return tok->entries_[static_cast<size_t>(a)].piece.size() > tok->entries_[static_cast<size_t>(b)].piece.size();
    });

    if (!sentencepiece) {
        H2O_TRY(tok->build_bpe(spec));
        // Without tokenizer.ggml.add_bos_token, llama.cpp's default for the pre-tokenizer.
        tok->add_bos_ = spec.add_bos.value_or(tok->bpe_->pretokenizer().adds_bos_by_default()) && spec.bos >= 0;
        *out = std::move(tok);
        return Status::Ok();
    }
    tok->add_bos_ = spec.add_bos.value_or(true) && spec.bos >= 0;  // llama.cpp's default for sentencepiece
    bool byte_fallback = false;
    for (int32_t type : spec.types) byte_fallback |= type == TOKEN_BYTE;
    tok->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
    // Sentencepiece takes the types the tokenizer uses: a turn end the file types user-defined is a
    // control token (above), which it must not match inside text either.
    std::vector<int32_t> types(tok->entries_.size());
    for (size_t i = 0; i < types.size(); ++i) types[i] = tok->entries_[i].type;
    const auto st = tok->sp_->LoadFromSerializedProto(serialize_sentencepiece_model(spec, types, byte_fallback));
    if (!st.ok()) return make_error(H2O_ERR_TOKENIZER, std::string("sentencepiece rejected the vocabulary: ") + st.ToString());
    if (tok->sp_->GetPieceSize() != static_cast<int>(spec.pieces.size()))
        return make_error(H2O_ERR_INTERNAL, "sentencepiece loaded a different number of tokens than given");
    *out = std::move(tok);
    return Status::Ok();
}

Status Tokenizer::build_bpe(const VocabSpec &spec) {
    std::unique_ptr<Pretokenizer> pre;
    H2O_TRY(Pretokenizer::create(spec.pre, &pre));
    // The merges see the types as this tokenizer uses them (turn ends count as control tokens).
    std::vector<int32_t> types(entries_.size());
    for (size_t i = 0; i < entries_.size(); ++i) types[i] = entries_[i].type;
    return BytePairEncoder::create(spec.pieces, types, spec.merges, std::move(pre), spec.unk, &bpe_);
}

Status Tokenizer::from_gguf(const GgufFile &file, std::unique_ptr<Tokenizer> *out) {
    std::string_view model;
    H2O_TRY(file.get_string("tokenizer.ggml.model", &model));
    VocabSpec spec;
    if (model == "llama") {
        spec.model = TokenizerModel::kSentencePiece;
    } else if (model == "gpt2") {
        spec.model = TokenizerModel::kByteLevelBpe;
    } else {
        return make_error(H2O_ERR_UNSUPPORTED, "tokenizer.ggml.model '" + std::string(model) +
                                                   "' is not supported (only 'llama', sentencepiece BPE, and 'gpt2', "
                                                   "byte-level BPE)");
    }
    const bool sentencepiece = spec.model == TokenizerModel::kSentencePiece;

    std::vector<std::string_view> strings;
    H2O_TRY(file.get_string_array("tokenizer.ggml.tokens", &strings));
    spec.pieces.assign(strings.begin(), strings.end());
    if (sentencepiece) {
        H2O_TRY(file.get_f32_array("tokenizer.ggml.scores", &spec.scores));
        H2O_TRY(file.get_i32_array("tokenizer.ggml.token_type", &spec.types));
    } else {
        // As llama.cpp: without token types every token is a normal one; scores are not used.
        if (file.find("tokenizer.ggml.token_type")) {
            H2O_TRY(file.get_i32_array("tokenizer.ggml.token_type", &spec.types));
        } else {
            spec.types.assign(spec.pieces.size(), TOKEN_NORMAL);
        }
        H2O_TRY(file.get_string_array("tokenizer.ggml.merges", &strings));
        spec.merges.assign(strings.begin(), strings.end());
        if (file.find("tokenizer.ggml.pre")) {
            std::string_view pre;
            H2O_TRY(file.get_string("tokenizer.ggml.pre", &pre));
            spec.pre = pre;
        }
    }
    // Sentencepiece's defaults are llama.cpp's; byte-level BPE has none (see the header).
    H2O_TRY(read_token_id(file, "tokenizer.ggml.bos_token_id", sentencepiece ? 1 : -1, &spec.bos));
    H2O_TRY(read_token_id(file, "tokenizer.ggml.eos_token_id", sentencepiece ? 2 : -1, &spec.eos));
    H2O_TRY(read_token_id(file, "tokenizer.ggml.unknown_token_id", sentencepiece ? 0 : -1, &spec.unk));
    H2O_TRY(read_token_id(file, "tokenizer.ggml.eot_token_id", -1, &spec.eot));
    H2O_TRY(read_token_id(file, "tokenizer.ggml.eom_token_id", -1, &spec.eom));
    H2O_TRY(read_optional_bool(file, "tokenizer.ggml.add_bos_token", &spec.add_bos));
    H2O_TRY(read_optional_bool(file, "tokenizer.ggml.add_eos_token", &spec.add_eos));
    if (sentencepiece) H2O_TRY(file.get_bool_or("tokenizer.ggml.add_space_prefix", true, &spec.add_space_prefix));
    if (file.find("general.name")) {
        std::string_view name;
        H2O_TRY(file.get_string("general.name", &name));
        spec.model_name = name;
    }
    return from_vocab(spec, out);
}

Status Tokenizer::from_model_file(const std::string &path, std::unique_ptr<Tokenizer> *out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error(H2O_ERR_IO, "cannot open tokenizer model '" + path + "': " + std::strerror(errno));
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return make_error(H2O_ERR_IO, "cannot read tokenizer model '" + path + "'");

    VocabSpec spec;
    uint64_t model_type = 0;
    Status st = parse_sentencepiece_model(bytes, &spec, &model_type);
    if (st.ok() && model_type != kSentencepieceModelTypeBpe)
        st = make_error(H2O_ERR_UNSUPPORTED,
                        "model type " + std::to_string(model_type) + " is not supported (only BPE, the Llama tokenizer)");
    if (st.ok()) st = from_vocab(spec, out);
    if (!st.ok()) st.message = "tokenizer model '" + path + "': " + st.message;
    return st;
}

bool Tokenizer::is_control(int32_t id) const {
    return id >= 0 && id < n_vocab() && entries_[static_cast<size_t>(id)].type == TOKEN_CONTROL;
}

TokenType Tokenizer::type(int32_t id) const { return id >= 0 && id < n_vocab() ? entries_[static_cast<size_t>(id)].type : TOKEN_UNUSED; }

const std::string &Tokenizer::piece(int32_t id) const {
    static const std::string kNone;
    return id >= 0 && id < n_vocab() ? entries_[static_cast<size_t>(id)].piece : kNone;
}

std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text, bool with_control) const {
    std::vector<Fragment> fragments = {{-1, text}}, next;
    for (int32_t id : special_by_length_) {
        const Entry &e = entries_[static_cast<size_t>(id)];
        if (!with_control && e.type != TOKEN_USER_DEFINED) continue;
        next.clear();
        bool found = false;
        for (const Fragment &f : fragments) {
            if (f.token >= 0) {
                next.push_back(f);
                continue;
            }
            size_t start = 0;
            for (size_t at; (at = f.text.find(e.piece, start)) != std::string_view::npos;) {
                size_t left_end = at;
                if (e.strip & kStripLeft)
                    while (left_end > start && is_ascii_space(f.text[left_end - 1])) --left_end;
                if (left_end > start) next.push_back({-1, f.text.substr(start, left_end - start)});
                next.push_back({id, {}});
                found = true;
                start = at + e.piece.size();
                if (e.strip & kStripRight)
                    while (start < f.text.size() && is_ascii_space(f.text[start])) ++start;
            }
            if (start < f.text.size()) next.push_back({-1, f.text.substr(start)});
        }
        if (found) std::swap(fragments, next);
    }
    return fragments;
}

Status Tokenizer::encode_text(std::string_view text, std::vector<int32_t> *out) const {
    if (bpe_) return bpe_->encode(text, out);
    std::vector<int> ids;
    const auto st = sp_->Encode(text, &ids);
    if (!st.ok()) return make_error(H2O_ERR_TOKENIZER, "sentencepiece failed to encode: " + st.ToString());
    out->insert(out->end(), ids.begin(), ids.end());
    return Status::Ok();
}

Status Tokenizer::encode(std::string_view text, bool add_bos, std::vector<int32_t> *out) const {
    H2O_TRY(invalid_utf8(text));
    if (add_bos && bos_ < 0) return make_error(H2O_ERR_INVALID_ARGUMENT, "the vocabulary has no BOS token");
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(bos_);
    // User-defined tokens are found in the raw text before the pre-tokenizer or sentencepiece's
    // normalizer sees it, as llama.cpp does: a converted Gemma file holds its runs of spaces as
    // user-defined tokens spelled with spaces ("  "), which no escaped text could match.
    for (const Fragment &f : split_special(text, /*with_control=*/false)) {
        if (f.token >= 0)
            ids.push_back(f.token);
        else
            H2O_TRY(encode_text(f.text, &ids));
    }
    *out = std::move(ids);
    return Status::Ok();
}

Status Tokenizer::encode_special(std::string_view text, bool add_bos, std::vector<int32_t> *out) const {
    H2O_TRY(invalid_utf8(text));
    if (add_bos && bos_ < 0) return make_error(H2O_ERR_INVALID_ARGUMENT, "the vocabulary has no BOS token");
    std::vector<int32_t> ids;
    for (const Fragment &f : split_special(text, /*with_control=*/true)) {
        if (f.token >= 0)
            ids.push_back(f.token);
        else
            H2O_TRY(encode_text(f.text, &ids));
    }
    if (add_bos && (ids.empty() || ids.front() != bos_)) ids.insert(ids.begin(), bos_);
    *out = std::move(ids);
    return Status::Ok();
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
    return std::binary_search(end_of_generation_.begin(), end_of_generation_.end(), id);
}

void Tokenizer::append_piece(int32_t id, bool after_bos, std::string *out) const {
    if (id < 0 || id >= n_vocab()) return;
    const Entry &e = entries_[static_cast<size_t>(id)];
    std::string_view surface = e.surface;
    // As sentencepiece's decoder: only a U+2581 the piece itself starts with can be the dummy
    // prefix; a byte token 0x20 or the unknown token keep their spaces.
    const bool from_piece = e.type == TOKEN_NORMAL || e.type == TOKEN_USER_DEFINED || e.type == TOKEN_UNUSED;
    if (after_bos && add_space_prefix_ && from_piece && e.piece.starts_with(kSpaceSymbol)) surface.remove_prefix(1);
    out->append(surface);
}

Status Tokenizer::decode(const int32_t *ids, size_t n, std::string *out) const {
    for (size_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= n_vocab())
            return make_error(H2O_ERR_INVALID_ARGUMENT, "token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                                            " is outside the vocabulary of " + std::to_string(n_vocab()) + " tokens");
    }
    std::string text;
    if (bpe_) {
        std::string bytes;
        for (size_t i = 0; i < n; ++i) bytes += entries_[static_cast<size_t>(ids[i])].surface;
        take_complete_utf8(&bytes, &text, /*flush=*/true);
    } else {
        const std::vector<int> checked(ids, ids + n);
        const auto st = sp_->Decode(checked, &text);
        if (!st.ok()) return make_error(H2O_ERR_TOKENIZER, "sentencepiece failed to decode: " + st.ToString());
    }
    *out = std::move(text);
    return Status::Ok();
}

}  // namespace h2o
