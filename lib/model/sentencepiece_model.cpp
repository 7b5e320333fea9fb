#include "sentencepiece_model.h"

#include <cstring>

namespace h2o {
namespace {

// --- A minimal protobuf wire-format writer ------------------------------------------------------

class ProtoWriter {
public:
    void add_varint(uint32_t field, uint64_t value) {
        put_tag(field, 0);
        put_varint(value);
    }
    // int32 fields encode negative values as 10-byte two's-complement varints.
    void add_int32(uint32_t field, int32_t value) { add_varint(field, static_cast<uint64_t>(static_cast<int64_t>(value))); }
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
            case 0:
                return read_varint(&ignored);
            case 1:
                return skip_bytes(8);
            case 2:
                return read_bytes(&ignored_bytes);
            case 5:
                return skip_bytes(4);
            default:
                return fail("unsupported wire type " + std::to_string(wire_type));
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
constexpr uint32_t kTrainerModelType = 3, kTrainerVocabSize = 4, kTrainerByteFallback = 35, kTrainerUnkId = 40, kTrainerBosId = 41,
                   kTrainerEosId = 42, kTrainerPadId = 43, kTrainerUnkPiece = 45, kTrainerBosPiece = 46, kTrainerEosPiece = 47;
constexpr uint32_t kNormName = 1, kNormAddDummyPrefix = 3, kNormRemoveExtraWhitespaces = 4, kNormEscapeWhitespaces = 5;
constexpr uint64_t kModelTypeUnigram = 1, kModelTypeBpe = kSentencepieceModelTypeBpe;
}  // namespace pb

}  // namespace

Status parse_sentencepiece_model(std::string_view bytes, VocabSpec *spec, uint64_t *model_type) {
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
                if (field == pb::kPiecePiece && wire == 2)
                    ok = sub.read_bytes(&piece);
                else if (field == pb::kPieceScore && wire == 5)
                    ok = sub.read_float(&score);
                else if (field == pb::kPieceType && wire == 0)
                    ok = sub.read_varint(&type);
                else
                    ok = sub.skip(wire);
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
                if (trainer && field == pb::kTrainerModelType)
                    *model_type = value;
                else if (trainer && field == pb::kTrainerUnkId)
                    spec->unk = as_int32;
                else if (trainer && field == pb::kTrainerBosId)
                    spec->bos = as_int32;
                else if (trainer && field == pb::kTrainerEosId)
                    spec->eos = as_int32;
                else if (!trainer && field == pb::kNormAddDummyPrefix)
                    spec->add_space_prefix = value != 0;
            }
        }
        if (!sub.error().empty()) return malformed(sub);
    }
    if (!model.error().empty()) return malformed(model);
    return Status::Ok();
}

std::string serialize_sentencepiece_model(const VocabSpec &spec, const std::vector<int32_t> &types, bool byte_fallback) {
    ProtoWriter model;
    for (size_t i = 0; i < spec.pieces.size(); ++i) {
        ProtoWriter piece;
        piece.add_bytes(pb::kPiecePiece, spec.pieces[i]);
        piece.add_float(pb::kPieceScore, spec.scores[i]);
        // Sentencepiece wants exactly one unknown piece: unk, whatever type the file gives it
        // (Phi-3's <unk> is a control token, and its padding tokens have the unknown type). A
        // user-defined piece is an ordinary one to it: the tokenizer finds user-defined tokens in
        // the raw text itself, and in the text between them llama.cpp merges into any piece by its
        // score, which sentencepiece does for normal pieces only.
        int32_t type = types[i];
        if (static_cast<int32_t>(i) == spec.unk)
            type = TOKEN_UNKNOWN;
        else if (type == TOKEN_UNKNOWN)
            type = TOKEN_UNUSED;
        else if (type == TOKEN_USER_DEFINED)
            type = TOKEN_NORMAL;
        piece.add_varint(pb::kPieceType, static_cast<uint64_t>(type));
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

}  // namespace h2o
