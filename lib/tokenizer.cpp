#include "tokenizer.h"

#include "utf8.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace h2o {
namespace {

// U+2581 LOWER ONE EIGHTH BLOCK: sentencepiece's stand-in for a space inside pieces.
constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";
// How sentencepiece's decoder prints the unknown token by default (U+2047 between spaces).
constexpr std::string_view kUnknownSurface = " \xE2\x81\x87 ";

// --- A minimal protobuf wire-format writer ------------------------------------------------------
// Debian ships sentencepiece without its generated sentencepiece_model.pb.h, so the ModelProto is
// written by hand. Field numbers come from sentencepiece_model.proto.

class ProtoWriter {
public:
    void add_varint(uint32_t field, uint64_t value) {
        put_tag(field, 0);
        put_varint(value);
    }
    // int32 fields encode negative values as 10-byte two's-complement varints.
    void add_int32(uint32_t field, int32_t value) {
        add_varint(field, static_cast<uint64_t>(static_cast<int64_t>(value)));
    }
    void add_bool(uint32_t field, bool value) { add_varint(field, value ? 1 : 0); }
    void add_float(uint32_t field, float value) {
        put_tag(field, 5);
        uint32_t bits;
        std::memcpy(&bits, &value, sizeof bits);
        for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
    }
    void add_bytes(uint32_t field, std::string_view bytes) {
        put_tag(field, 2);
        put_varint(bytes.size());
        out_.append(bytes);
    }
    void add_message(uint32_t field, const ProtoWriter &message) { add_bytes(field, message.out_); }

    std::string take() { return std::move(out_); }

private:
    void put_tag(uint32_t field, uint32_t wire_type) { put_varint((uint64_t{field} << 3) | wire_type); }
    void put_varint(uint64_t value) {
        while (value >= 0x80) {
            out_.push_back(static_cast<char>((value & 0x7F) | 0x80));
            value >>= 7;
        }
        out_.push_back(static_cast<char>(value));
    }

    std::string out_;
};

// --- ... and a minimal reader, for the few ModelProto fields a .model file contributes ----------

class ProtoReader {
public:
    explicit ProtoReader(std::string_view data) : data_(data) {}

    bool done() const { return pos_ >= data_.size(); }
    const std::string &error() const { return error_; }

    // Reads the next field's tag; false at the end or on malformed input (error() says which).
    bool next(uint32_t *field, uint32_t *wire_type) {
        if (done() || !error_.empty()) return false;
        uint64_t tag;
        if (!read_varint(&tag)) return false;
        *field = static_cast<uint32_t>(tag >> 3);
        *wire_type = static_cast<uint32_t>(tag & 7);
        if (*field == 0) return fail("field number 0");
        return true;
    }
    bool read_varint(uint64_t *value) {
        *value = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (done()) return fail("truncated varint");
            const auto byte = static_cast<uint8_t>(data_[pos_++]);
            *value |= uint64_t{byte & 0x7Fu} << shift;
            if (byte < 0x80) return true;
        }
        return fail("varint longer than 10 bytes");
    }
    bool read_bytes(std::string_view *bytes) {
        uint64_t size;
        if (!read_varint(&size)) return false;
        if (size > data_.size() - pos_) return fail("length-delimited field runs past the end");
        *bytes = data_.substr(pos_, static_cast<size_t>(size));
        pos_ += static_cast<size_t>(size);
        return true;
    }
    bool read_float(float *value) {
        if (data_.size() - pos_ < 4) return fail("truncated fixed32");
        uint32_t bits = 0;
        for (int i = 0; i < 4; ++i) bits |= uint32_t{static_cast<uint8_t>(data_[pos_ + i])} << (8 * i);
        pos_ += 4;
        std::memcpy(value, &bits, sizeof bits);
        return true;
    }
    bool skip(uint32_t wire_type) {
        uint64_t ignored;
        std::string_view ignored_bytes;
        switch (wire_type) {
        case 0: return read_varint(&ignored);
        case 1: return skip_bytes(8);
        case 2: return read_bytes(&ignored_bytes);
        case 5: return skip_bytes(4);
        default: return fail("unsupported wire type " + std::to_string(wire_type));
        }
    }
    bool fail(std::string message) {
        if (error_.empty()) error_ = std::move(message) + " at byte " + std::to_string(pos_);
        return false;
    }

private:
    bool skip_bytes(size_t n) {
        if (data_.size() - pos_ < n) return fail("truncated fixed-size field");
        pos_ += n;
        return true;
    }

    std::string_view data_;
    size_t pos_ = 0;
    std::string error_;
};

// sentencepiece_model.proto field numbers.
namespace pb {
constexpr uint32_t kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr uint32_t kPiecePiece = 1, kPieceScore = 2, kPieceType = 3;
constexpr uint32_t kTrainerModelType = 3, kTrainerVocabSize = 4, kTrainerByteFallback = 35,
                   kTrainerUnkId = 40, kTrainerBosId = 41, kTrainerEosId = 42, kTrainerPadId = 43,
                   kTrainerUnkPiece = 45, kTrainerBosPiece = 46, kTrainerEosPiece = 47;
constexpr uint32_t kNormName = 1, kNormAddDummyPrefix = 3, kNormRemoveExtraWhitespaces = 4,
                   kNormEscapeWhitespaces = 5;
constexpr uint64_t kModelTypeUnigram = 1, kModelTypeBpe = 2;
}  // namespace pb

// Reads what llama.cpp's converter keeps from a sentencepiece .model (pieces, scores, types, the
// special ids and add_dummy_prefix) into spec. The rest of the normalizer is ignored on purpose:
// llama.cpp never collapses whitespace nor applies a normalization rule for this tokenizer, and
// a .model must give the same ids as the same vocabulary embedded in a GGUF file.
Status parse_model_proto(std::string_view bytes, VocabSpec *spec, uint64_t *model_type) {
    auto malformed = [](const ProtoReader &r) { return make_error(H2O_ERR_TOKENIZER, "malformed model: " + r.error()); };
    // Defaults from sentencepiece_model.proto.
    *model_type = pb::kModelTypeUnigram;
    spec->unk = 0, spec->bos = 1, spec->eos = 2;
    spec->add_space_prefix = true;

    ProtoReader model(bytes);
    uint32_t field, wire;
    std::string_view message;
    while (model.next(&field, &wire)) {
        if (field != pb::kModelPieces && field != pb::kModelTrainerSpec && field != pb::kModelNormalizerSpec) {
            if (!model.skip(wire)) return malformed(model);
            continue;
        }
        if (wire != 2) return make_error(H2O_ERR_TOKENIZER, "malformed model: field " + std::to_string(field) + " is not a message");
        if (!model.read_bytes(&message)) return malformed(model);
        ProtoReader sub(message);
        if (field == pb::kModelPieces) {
            std::string_view piece;
            float score = 0.0f;
            uint64_t type = TOKEN_NORMAL;
            while (sub.next(&field, &wire)) {
                bool ok;
                if (field == pb::kPiecePiece && wire == 2) ok = sub.read_bytes(&piece);
                else if (field == pb::kPieceScore && wire == 5) ok = sub.read_float(&score);
                else if (field == pb::kPieceType && wire == 0) ok = sub.read_varint(&type);
                else ok = sub.skip(wire);
                if (!ok) return malformed(sub);
            }
            spec->pieces.emplace_back(piece);
            spec->scores.push_back(score);
            spec->types.push_back(type <= TOKEN_BYTE ? static_cast<int32_t>(type) : -1);  // -1: rejected later
        } else {
            const bool trainer = field == pb::kModelTrainerSpec;
            while (sub.next(&field, &wire)) {
                uint64_t value = 0;
                if (wire != 0) {
                    if (!sub.skip(wire)) return malformed(sub);
                    continue;
                }
                if (!sub.read_varint(&value)) return malformed(sub);
                // int32 fields arrive sign-extended to 64 bits; truncation restores them.
                const auto as_int32 = static_cast<int32_t>(static_cast<uint32_t>(value));
                if (trainer && field == pb::kTrainerModelType) *model_type = value;
                else if (trainer && field == pb::kTrainerUnkId) spec->unk = as_int32;
                else if (trainer && field == pb::kTrainerBosId) spec->bos = as_int32;
                else if (trainer && field == pb::kTrainerEosId) spec->eos = as_int32;
                else if (!trainer && field == pb::kNormAddDummyPrefix) spec->add_space_prefix = value != 0;
            }
        }
        if (!sub.error().empty()) return malformed(sub);
    }
    if (!model.error().empty()) return malformed(model);
    return Status::Ok();
}

// The ModelProto that makes sentencepiece segment exactly as llama.cpp's llama (SPM) tokenizer:
// BPE merges by piece score, byte fallback for characters outside the vocabulary, identity
// normalization, spaces escaped to U+2581, a dummy prefix space, and whitespace kept as is.
std::string serialize_model(const VocabSpec &spec, bool byte_fallback) {
    ProtoWriter model;
    for (size_t i = 0; i < spec.pieces.size(); ++i) {
        ProtoWriter piece;
        piece.add_bytes(pb::kPiecePiece, spec.pieces[i]);
        piece.add_float(pb::kPieceScore, spec.scores[i]);
        piece.add_varint(pb::kPieceType, static_cast<uint64_t>(spec.types[i]));
        model.add_message(pb::kModelPieces, piece);
    }

    ProtoWriter trainer;
    trainer.add_varint(pb::kTrainerModelType, pb::kModelTypeBpe);
    trainer.add_int32(pb::kTrainerVocabSize, static_cast<int32_t>(spec.pieces.size()));
    trainer.add_bool(pb::kTrainerByteFallback, byte_fallback);
    // sentencepiece looks its special tokens up by string (unk_piece, ...), so those are given;
    // the ids only document the vocabulary (-1: none). The tokenizer keeps its own ids.
    trainer.add_int32(pb::kTrainerUnkId, spec.unk);
    trainer.add_int32(pb::kTrainerBosId, spec.bos);
    trainer.add_int32(pb::kTrainerEosId, spec.eos);
    trainer.add_int32(pb::kTrainerPadId, -1);
    trainer.add_bytes(pb::kTrainerUnkPiece, spec.pieces[static_cast<size_t>(spec.unk)]);
    if (spec.bos >= 0) trainer.add_bytes(pb::kTrainerBosPiece, spec.pieces[static_cast<size_t>(spec.bos)]);
    if (spec.eos >= 0) trainer.add_bytes(pb::kTrainerEosPiece, spec.pieces[static_cast<size_t>(spec.eos)]);
    model.add_message(pb::kModelTrainerSpec, trainer);

    // No precompiled_charsmap: the identity normalizer. remove_extra_whitespaces must be false,
    // since llama keeps runs of spaces ("  Hello" is "▁▁" + "▁Hello", not "▁Hello").
    ProtoWriter normalizer;
    normalizer.add_bytes(pb::kNormName, "identity");
    normalizer.add_bool(pb::kNormAddDummyPrefix, spec.add_space_prefix);
    normalizer.add_bool(pb::kNormRemoveExtraWhitespaces, false);
    normalizer.add_bool(pb::kNormEscapeWhitespaces, true);
    model.add_message(pb::kModelNormalizerSpec, normalizer);
    return model.take();
}

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
        if (c >= '0' && c <= '9') digit = c - '0';
        else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
        else return -1;
        value = value * 16 + digit;
    }
    return value;
}

Status validate_spec(const VocabSpec &spec) {
    auto bad = [](std::string message) { return make_error(H2O_ERR_MODEL_FORMAT, "vocabulary: " + std::move(message)); };
    const size_t n = spec.pieces.size();
    if (n == 0) return bad("no tokens");
    if (n > static_cast<size_t>(INT32_MAX)) return bad("too many tokens (" + std::to_string(n) + ")");
    if (spec.scores.size() != n)
        return bad(std::to_string(n) + " tokens but " + std::to_string(spec.scores.size()) + " scores");
    if (spec.types.size() != n)
        return bad(std::to_string(n) + " tokens but " + std::to_string(spec.types.size()) + " token types");
    const int64_t n_vocab = static_cast<int64_t>(n);
    auto check_id = [&](const char *name, int32_t id, bool required) -> Status {
        if (id == -1 && !required) return Status::Ok();
        if (id < 0 || id >= n_vocab)
            return bad(std::string(name) + " token id " + std::to_string(id) + " is outside the vocabulary of " +
                       std::to_string(n) + " tokens");
        return Status::Ok();
    };
    H2O_TRY(check_id("BOS", spec.bos, false));
    H2O_TRY(check_id("EOS", spec.eos, false));
    H2O_TRY(check_id("unknown", spec.unk, true));

    int32_t n_unknown = 0;
    for (size_t i = 0; i < n; ++i) {
        const int32_t type = spec.types[i];
        if (type < TOKEN_NORMAL || type > TOKEN_BYTE)
            return bad("token " + std::to_string(i) + " has type " + std::to_string(type) + " (valid types are 1..6)");
        if (type == TOKEN_UNKNOWN) ++n_unknown;
        if (type == TOKEN_BYTE && parse_byte_piece(spec.pieces[i]) < 0)
            return bad("token " + std::to_string(i) + " has the byte type but is not of the form <0xNN>");
    }
    // sentencepiece needs exactly one unknown piece, and unk must name it.
    if (n_unknown != 1) return bad(std::to_string(n_unknown) + " tokens have the unknown type (exactly 1 is required)");
    if (spec.types[static_cast<size_t>(spec.unk)] != TOKEN_UNKNOWN)
        return bad("unknown token id " + std::to_string(spec.unk) + " does not have the unknown type");
    return Status::Ok();
}

// GGUF stores "no such token" as UINT32_MAX (seen as -1 when read as int32).
Status read_token_id(const GgufFile &file, const char *key, int32_t fallback, int32_t *out) {
    uint32_t value = 0;
    H2O_TRY(file.get_u32_or(key, static_cast<uint32_t>(fallback), &value));
    if (value == UINT32_MAX) {
        *out = -1;
    } else if (value > static_cast<uint32_t>(INT32_MAX)) {
        return make_error(H2O_ERR_MODEL_FORMAT, std::string("metadata '") + key + "' = " + std::to_string(value) +
                                                    " is not a valid token id");
    } else {
        *out = static_cast<int32_t>(value);
    }
    return Status::Ok();
}

}  // namespace

// ------------------------------------------------------------------------------------------------

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Status Tokenizer::from_vocab(const VocabSpec &spec, std::unique_ptr<Tokenizer> *out) {
    H2O_TRY(validate_spec(spec));
    bool byte_fallback = false;
    for (int32_t type : spec.types) byte_fallback |= type == TOKEN_BYTE;

    std::unique_ptr<Tokenizer> tok(new Tokenizer());
    tok->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const auto st = tok->sp_->LoadFromSerializedProto(serialize_model(spec, byte_fallback));
    if (!st.ok()) return make_error(H2O_ERR_TOKENIZER, std::string("sentencepiece rejected the vocabulary: ") + st.ToString());
    if (tok->sp_->GetPieceSize() != static_cast<int>(spec.pieces.size()))
        return make_error(H2O_ERR_INTERNAL, "sentencepiece loaded a different number of tokens than given");

    tok->entries_.resize(spec.pieces.size());
    for (size_t i = 0; i < spec.pieces.size(); ++i) {
        Entry &e = tok->entries_[i];
        e.type = static_cast<TokenType>(spec.types[i]);
        e.piece = spec.pieces[i];
        switch (e.type) {
        case TOKEN_CONTROL: break;  // renders as nothing
        case TOKEN_UNKNOWN: e.surface = kUnknownSurface; break;
        case TOKEN_BYTE: e.surface.assign(1, static_cast<char>(parse_byte_piece(e.piece))); break;
        default: e.surface = replace_space_symbol(e.piece); break;
        }
    }
    tok->bos_ = spec.bos;
    tok->eos_ = spec.eos;
    tok->unk_ = spec.unk;
    // The ends of a turn in the chat formats of Llama-family models, when the vocabulary has them
    // as control tokens (the GGUF keys name only some of them).
    static const std::string_view kTurnEnds[] = {"</s>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>"};
    for (int32_t id = 0; id < static_cast<int32_t>(spec.pieces.size()); ++id) {
        const Entry &e = tok->entries_[static_cast<size_t>(id)];
        if ((e.type == TOKEN_CONTROL || e.type == TOKEN_USER_DEFINED) && !e.piece.empty()) tok->special_by_length_.push_back(id);
        const bool turn_end = e.type == TOKEN_CONTROL && std::find(std::begin(kTurnEnds), std::end(kTurnEnds), e.piece) != std::end(kTurnEnds);
        if (id == spec.eos || id == spec.eot || id == spec.eom || turn_end) tok->end_of_generation_.push_back(id);
    }
    std::stable_sort(tok->special_by_length_.begin(), tok->special_by_length_.end(), [&](int32_t a, int32_t b) {
        return tok->entries_[static_cast<size_t>(a)].piece.size() > tok->entries_[static_cast<size_t>(b)].piece.size();
    });
    tok->add_space_prefix_ = spec.add_space_prefix;
    *out = std::move(tok);
    return Status::Ok();
}

Status Tokenizer::from_gguf(const GgufFile &file, std::unique_ptr<Tokenizer> *out) {
    std::string_view model;
    H2O_TRY(file.get_string("tokenizer.ggml.model", &model));
    if (model != "llama")
        return make_error(H2O_ERR_UNSUPPORTED, "tokenizer.ggml.model '" + std::string(model) +
                                                   "' is not supported (only 'llama', the sentencepiece BPE tokenizer)");

    VocabSpec spec;
    std::vector<std::string_view> tokens;
    H2O_TRY(file.get_string_array("tokenizer.ggml.tokens", &tokens));
    spec.pieces.assign(tokens.begin(), tokens.end());
    H2O_TRY(file.get_f32_array("tokenizer.ggml.scores", &spec.scores));
    H2O_TRY(file.get_i32_array("tokenizer.ggml.token_type", &spec.types));
    // Defaults are llama.cpp's for this tokenizer.
    H2O_TRY(read_token_id(file, "tokenizer.ggml.bos_token_id", 1, &spec.bos));
    H2O_TRY(read_token_id(file, "tokenizer.ggml.eos_token_id", 2, &spec.eos));
    H2O_TRY(read_token_id(file, "tokenizer.ggml.unknown_token_id", 0, &spec.unk));
    H2O_TRY(read_token_id(file, "tokenizer.ggml.eot_token_id", -1, &spec.eot));
    H2O_TRY(read_token_id(file, "tokenizer.ggml.eom_token_id", -1, &spec.eom));
    for (int32_t id : {spec.eot, spec.eom}) {
        if (id >= static_cast<int32_t>(spec.pieces.size())) {
            return make_error(H2O_ERR_MODEL_FORMAT, "end-of-turn token id " + std::to_string(id) + " is outside the vocabulary");
        }
    }
    H2O_TRY(file.get_bool_or("tokenizer.ggml.add_space_prefix", true, &spec.add_space_prefix));
    return from_vocab(spec, out);
}

Status Tokenizer::from_model_file(const std::string &path, std::unique_ptr<Tokenizer> *out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error(H2O_ERR_IO, "cannot open tokenizer model '" + path + "': " + std::strerror(errno));
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return make_error(H2O_ERR_IO, "cannot read tokenizer model '" + path + "'");

    VocabSpec spec;
    uint64_t model_type = 0;
    Status st = parse_model_proto(bytes, &spec, &model_type);
    if (st.ok() && model_type != pb::kModelTypeBpe)
        st = make_error(H2O_ERR_UNSUPPORTED, "model type " + std::to_string(model_type) +
                                                 " is not supported (only BPE, the Llama tokenizer)");
    if (st.ok()) st = from_vocab(spec, out);
    if (!st.ok()) st.message = "tokenizer model '" + path + "': " + st.message;
    return st;
}

bool Tokenizer::is_control(int32_t id) const {
    return id >= 0 && id < n_vocab() && entries_[static_cast<size_t>(id)].type == TOKEN_CONTROL;
}

TokenType Tokenizer::type(int32_t id) const {
    return id >= 0 && id < n_vocab() ? entries_[static_cast<size_t>(id)].type : TOKEN_UNUSED;
}

const std::string &Tokenizer::piece(int32_t id) const {
    static const std::string kNone;
    return id >= 0 && id < n_vocab() ? entries_[static_cast<size_t>(id)].piece : kNone;
}

Status Tokenizer::encode(std::string_view text, bool add_bos, std::vector<int32_t> *out) const {
    if (size_t bad = 0; !is_valid_utf8(text, &bad))
        return make_error(H2O_ERR_INVALID_TEXT, "text is not valid UTF-8 at byte offset " + std::to_string(bad));
    if (add_bos && bos_ < 0) return make_error(H2O_ERR_INVALID_ARGUMENT, "the vocabulary has no BOS token");

    std::vector<int> ids;
    const auto st = sp_->Encode(text, &ids);
    if (!st.ok()) return make_error(H2O_ERR_TOKENIZER, "sentencepiece failed to encode: " + st.ToString());
    out->clear();
    out->reserve(ids.size() + (add_bos ? 1 : 0));
    if (add_bos) out->push_back(bos_);
    out->insert(out->end(), ids.begin(), ids.end());
    return Status::Ok();
}

Status Tokenizer::encode_special(std::string_view text, bool add_bos, std::vector<int32_t> *out) const {
    if (size_t bad = 0; !is_valid_utf8(text, &bad))
        return make_error(H2O_ERR_INVALID_TEXT, "text is not valid UTF-8 at byte offset " + std::to_string(bad));
    std::vector<int32_t> ids, fragment_ids;
    size_t fragment_start = 0;
    auto flush_text = [&](size_t end) -> Status {
        if (end > fragment_start) {
            H2O_TRY(encode(text.substr(fragment_start, end - fragment_start), false, &fragment_ids));
            ids.insert(ids.end(), fragment_ids.begin(), fragment_ids.end());
        }
        return Status::Ok();
    };
    for (size_t i = 0; i < text.size();) {
        int32_t found = -1;
        for (int32_t id : special_by_length_) {
            if (text.substr(i).starts_with(entries_[static_cast<size_t>(id)].piece)) {
                found = id;
                break;
            }
        }
        if (found < 0) {
            ++i;
            continue;
        }
        H2O_TRY(flush_text(i));
        ids.push_back(found);
        i += entries_[static_cast<size_t>(found)].piece.size();
        fragment_start = i;
    }
    H2O_TRY(flush_text(text.size()));
    if (add_bos && bos_ < 0) return make_error(H2O_ERR_INVALID_ARGUMENT, "the vocabulary has no BOS token");
    out->clear();
    if (add_bos && (ids.empty() || ids.front() != bos_)) out->push_back(bos_);
    out->insert(out->end(), ids.begin(), ids.end());
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
    std::vector<int> checked(n);
    for (size_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= n_vocab())
            return make_error(H2O_ERR_INVALID_ARGUMENT, "token id " + std::to_string(ids[i]) + " at position " +
                                                            std::to_string(i) + " is outside the vocabulary of " +
                                                            std::to_string(n_vocab()) + " tokens");
        checked[i] = ids[i];
    }
    std::string text;
    const auto st = sp_->Decode(checked, &text);
    if (!st.ok()) return make_error(H2O_ERR_TOKENIZER, "sentencepiece failed to decode: " + st.ToString());
    *out = std::move(text);
    return Status::Ok();
}

}  // namespace h2o
