// Sentencepiece's ModelProto (the .model format), read and written by hand: Debian ships
// sentencepiece without its generated sentencepiece_model.pb.h. Field numbers come from
// sentencepiece_model.proto.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "status.h"
#include "tokenizer.h"

namespace h2o {

// TrainerSpec.model_type of a BPE model (the Llama tokenizer); 1 is UNIGRAM.
constexpr uint64_t kSentencepieceModelTypeBpe = 2;

// Reads what llama.cpp's converter keeps from a sentencepiece .model (pieces, scores, types, the
// special ids and add_dummy_prefix) into spec. The rest of the normalizer is ignored on purpose:
// llama.cpp never collapses whitespace nor applies a normalization rule for this tokenizer, and
// a .model must give the same ids as the same vocabulary embedded in a GGUF file.
// Errors: H2O_ERR_TOKENIZER (malformed).
Status parse_sentencepiece_model(std::string_view bytes, VocabSpec *spec, uint64_t *model_type);

// The ModelProto that makes sentencepiece segment exactly as llama.cpp's llama (SPM) tokenizer:
// BPE merges by piece score, byte fallback for characters outside the vocabulary, identity
// normalization, spaces escaped to U+2581, a dummy prefix space, and whitespace kept as is.
// spec.unk is the one unknown piece; other pieces of the unknown type are given as unused (never
// produced), user-defined ones as normal (the tokenizer finds those in the raw text itself). types: the pieces' types as the tokenizer uses them (which may differ from
// spec.types: Tokenizer::from_vocab). spec must have passed the tokenizer's checks.
std::string serialize_sentencepiece_model(const VocabSpec &spec, const std::vector<int32_t> &types, bool byte_fallback);

}  // namespace h2o
