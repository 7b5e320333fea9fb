// Reads a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json and, when present,
// config.json and chat_template.jinja) into what a GGUF conversion of it carries: the
// tokenizer.ggml.* metadata. Byte-level BPE tokenizers (GPT-2, Llama 3, Qwen 2/2.5/3, SmolLM2,
// GPT-4o/Phi-4-mini) and sentencepiece BPE ones written as tokenizer.json (Gemma 2/3: byte
// fallback, spaces replaced by U+2581) are read; others are H2O_ERR_UNSUPPORTED.
//
// A sentencepiece one becomes a "llama" vocabulary as llama.cpp's converter writes it from the
// tokenizer.model file, but for the scores, which tokenizer.json does not carry: each piece
// scores minus the rank of the first merge that makes it (added tokens -1000 as the converter
// writes them, 0 for the rest), so that sentencepiece's merging by score follows
// tokenizer.json's merge order. Byte tokens (<0xXX>) are bytes, the unknown token unknown,
// add_space_prefix is the normalizer's Prepend of U+2581.
//
// The values follow llama.cpp's converter (convert_hf_to_gguf.py and gguf-py's SpecialVocab):
//   - every id below the vocabulary size has a token; a missing one is "[PAD<id>]", unused;
//   - tokens of the model's vocabulary are normal; added tokens are control tokens when marked
//     special or when they look special (<|...|>), user-defined otherwise, with each U+2581 of
//     a user-defined token written as a space (Gemma's "▁▁" is "  ");
//   - merges are "left right" strings in rank order;
//   - bos/eos/unk/pad come from tokenizer_config.json's *_token (looked up among the added
//     tokens), else from the post-processor's template, else from config.json's *_token_id;
//     add_bos/add_eos from tokenizer_config.json's add_*_token, else from that template;
//   - the pre-tokenizer name is the one llama.cpp would detect for the pre-tokenizer found in
//     tokenizer.json (llama3 -> "llama-bpe", qwen2/qwen3 -> "qwen2", gpt4o -> "gpt-4o", a plain
//     byte-level one -> "gpt-2", digits then byte-level -> "smollm"). llama.cpp's converter
//     recognises a tokenizer by hashing the ids it gives a check text; this reader recognises the
//     pre-tokenizer's definition instead (it runs no tokenizer), and refuses one it does not know.
//
// Not part of the library (which has no JSON dependency): the tools and tests link it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.h"
#include "status.h"
#include "tokenizer.h"

namespace h2o {

struct HfVocabulary {
    bool sentencepiece = false;     // a sentencepiece BPE vocabulary ("llama"), else byte-level BPE ("gpt2")
    std::vector<float> scores;      // sentencepiece: per token
    bool add_space_prefix = false;  // sentencepiece: tokenizer.ggml.add_space_prefix
    std::string pre;                // tokenizer.ggml.pre
    std::vector<std::string> tokens;
    std::vector<int32_t> types;       // TokenType values
    std::vector<std::string> merges;  // byte-level BPE
    // The added tokens' lstrip / rstrip (TokenStrip bits per token; empty: none strips). A GGUF
    // file has no key for them (add_hf_vocabulary leaves them out): the library applies
    // llama.cpp's rules by model name to a file, these to a VocabSpec (to_vocab_spec).
    std::vector<uint8_t> strip;
    int32_t bos = -1, eos = -1, unk = -1, pad = -1;
    std::optional<bool> add_bos, add_eos;
    std::string chat_template;  // empty: none
};

// The texts of the files (config_json, model_config_json and chat_template may be empty: the
// file is absent). n_vocab: the model's vocabulary size (config.json's vocab_size, which may
// exceed the tokenizer's); 0 takes the tokenizer's own (highest id + 1).
// Errors: H2O_ERR_MODEL_FORMAT (malformed JSON or contents, naming the field),
// H2O_ERR_UNSUPPORTED (not a byte-level BPE tokenizer, an unknown pre-tokenizer).
Status parse_hf_tokenizer(std::string_view tokenizer_json, std::string_view config_json, std::string_view model_config_json,
                          std::string_view chat_template, int32_t n_vocab, HfVocabulary *out);

// Reads the files from a folder (tokenizer.json required; the others when present).
// Errors: those of parse_hf_tokenizer, H2O_ERR_IO; messages name the file.
Status read_hf_tokenizer(const std::string &dir, int32_t n_vocab, HfVocabulary *out);

// Adds the tokenizer.ggml.* keys (and tokenizer.chat_template) of vocab to a GGUF being written.
void add_hf_vocabulary(const HfVocabulary &vocab, GgufWriter *writer);

// A real vocabulary for a written model (h2o-synth --vocab, tests): a tokenizer.json or its
// folder (read_hf_tokenizer), or a GGUF file, a model or a vocabulary-only one such as llama.cpp's
// ggml-vocab-*.gguf, whose tokenizer.* keys are copied as they are. *n_tokens: its size; *write:
// adds its keys to a GGUF being written (and keeps what it read alive).
// Errors: those of read_hf_tokenizer and GgufFile::open; H2O_ERR_MODEL_FORMAT for a GGUF file
// without tokenizer.ggml.tokens.
Status read_vocabulary(const std::string &path, int32_t *n_tokens, std::function<void(GgufWriter &)> *write);

// The same vocabulary as the library's tokenizer takes it.
VocabSpec to_vocab_spec(const HfVocabulary &vocab);

}  // namespace h2o
