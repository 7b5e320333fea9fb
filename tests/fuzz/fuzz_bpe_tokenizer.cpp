// Fuzz target: byte-level BPE, its pre-tokenizers and its vocabulary metadata.
//
// Byte 0 chooses the mode.
//   Even: text. Byte 1 picks a pre-tokenizer, used with GPT-2's real vocabulary and merges
//   ($H2O_SHARED_DIR/vocab/ggml-vocab-gpt-2.gguf, or a small built-in vocabulary without the
//   shared folder); the rest is text. encode must refuse invalid UTF-8 and nothing else, the
//   words must cover the text, and decode and streaming must give the text back byte for byte.
//   Odd: metadata. The rest describes a vocabulary after the 256 byte characters: a first line
//   "pre=NAME" (else gpt-2), then token lines ("#text" a control token, "@text" a user-defined
//   one, else normal) up to an empty line, then merge lines; after a NUL, a text. A vocabulary
//   that loads must tokenize the text and give it back.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bpe.h"
#include "fuzz_common.h"
#include "gguf.h"
#include "pretokenizer.h"
#include "tokenizer.h"
#include "utf8.h"

namespace {

using h2o::Status;

void check_status(const Status &st, const char *call) {
    h2o_fuzz::check_expected_status(st.code, call);
    if (!st.ok() && st.message.empty()) h2o_fuzz::fail("an error without a message", call);
}

// GPT-2's vocabulary and merges (or the built-in stand-in), read once.
const h2o::VocabSpec &base_vocabulary() {
    static const h2o::VocabSpec spec = [] {
        h2o::VocabSpec s;
        s.model = h2o::TokenizerModel::kByteLevelBpe;
        const char *env = std::getenv("H2O_SHARED_DIR");
        const std::string path = std::string(env && *env ? env : H2O_DEFAULT_SHARED_DIR) + "/vocab/ggml-vocab-gpt-2.gguf";
        std::unique_ptr<h2o::GgufFile> file;
        if (std::filesystem::exists(path) && h2o::GgufFile::open(path, &file).ok()) {
            std::vector<std::string_view> strings;
            if (!file->get_string_array("tokenizer.ggml.tokens", &strings).ok()) h2o_fuzz::fail("GPT-2 vocabulary", "tokens");
            s.pieces.assign(strings.begin(), strings.end());
            if (!file->get_i32_array("tokenizer.ggml.token_type", &s.types).ok()) h2o_fuzz::fail("GPT-2 vocabulary", "types");
            if (!file->get_string_array("tokenizer.ggml.merges", &strings).ok()) h2o_fuzz::fail("GPT-2 vocabulary", "merges");
            s.merges.assign(strings.begin(), strings.end());
            return s;
        }
        for (int b = 0; b < 256; ++b) s.pieces.emplace_back(h2o::byte_level_char(static_cast<uint8_t>(b)));
        for (const char *t : {"th", "the", "\xC4\xA0t", "\xC4\xA0th", "\xC4\xA0the", "in", "ing", "<|endoftext|>"})
            s.pieces.emplace_back(t);
        s.types.assign(s.pieces.size(), h2o::TOKEN_NORMAL);
        s.types.back() = h2o::TOKEN_CONTROL;
        s.merges = {"t h", "th e", "\xC4\xA0 t", "\xC4\xA0t h", "\xC4\xA0th e", "i n", "in g"};
        return s;
    }();
    return spec;
}

// Encodes, checks the ids, and checks that decode and streaming give valid text back exactly.
void check_round_trip(const h2o::Tokenizer &tok, std::string_view text) {
    std::vector<int32_t> ids;
    const Status st = tok.encode(text, false, &ids);
    check_status(st, "encode");
    size_t bad = 0;
    const bool valid = h2o::is_valid_utf8(text, &bad);
    if (!valid) {
        h2o_fuzz::check(st.code == H2O_ERR_INVALID_TEXT, "encode accepted invalid UTF-8");
        return;
    }
    h2o_fuzz::check(st.ok(), "encode refused valid UTF-8");
    for (int32_t id : ids) h2o_fuzz::check(id >= 0 && id < tok.n_vocab(), "encode: an id outside the vocabulary");
    std::string decoded, streamed;
    h2o_fuzz::check(tok.decode(ids.data(), ids.size(), &decoded).ok(), "decode of encoded ids");
    h2o_fuzz::check(decoded == text, "decode(encode(text)) is not the text");
    for (int32_t id : ids) tok.append_piece(id, false, &streamed);
    h2o_fuzz::check(streamed == text, "the streamed pieces are not the text");

    std::vector<int32_t> special;
    check_status(tok.encode_special(text, false, &special), "encode_special");
    for (int32_t id : special) h2o_fuzz::check(id >= 0 && id < tok.n_vocab(), "encode_special: an id outside the vocabulary");
    h2o_fuzz::check(tok.decode(special.data(), special.size(), &decoded).ok(), "decode of encode_special's ids");
    h2o_fuzz::check(h2o::is_valid_utf8(decoded), "decode gave invalid UTF-8");
}

void fuzz_text(uint8_t pre_byte, std::string_view text) {
    static const std::vector<std::string> names = h2o::Pretokenizer::known_names();
    static std::vector<std::unique_ptr<h2o::Tokenizer>> tokenizers(names.size());
    const size_t which = pre_byte % names.size();
    if (!tokenizers[which]) {
        h2o::VocabSpec spec = base_vocabulary();
        spec.pre = names[which];
        const Status st = h2o::Tokenizer::from_vocab(spec, &tokenizers[which]);
        if (!st.ok()) h2o_fuzz::fail("the base vocabulary does not load", st.message.c_str());
    }
    check_round_trip(*tokenizers[which], text);

    if (!h2o::is_valid_utf8(text)) return;
    std::unique_ptr<h2o::Pretokenizer> pre;
    if (!h2o::Pretokenizer::create(names[which], &pre).ok()) h2o_fuzz::fail("pre-tokenizer", names[which].c_str());
    std::vector<std::string_view> words;
    check_status(pre->split(text, &words), "split");
    std::string joined;
    for (std::string_view w : words) {
        h2o_fuzz::check(!w.empty(), "split: an empty word");
        h2o_fuzz::check(h2o::is_valid_utf8(w), "split: a word cut inside a character");
        joined += w;
    }
    h2o_fuzz::check(joined == text, "split: the words are not the text");
}

void fuzz_metadata(std::string_view input) {
    const size_t nul = input.find('\0');
    const std::string_view description = input.substr(0, nul);
    const std::string_view text = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);

    h2o::VocabSpec spec;
    spec.model = h2o::TokenizerModel::kByteLevelBpe;
    spec.pre = "gpt-2";
    for (int b = 0; b < 256; ++b) spec.pieces.emplace_back(h2o::byte_level_char(static_cast<uint8_t>(b)));
    spec.types.assign(256, h2o::TOKEN_NORMAL);
    bool in_merges = false, first = true;
    for (size_t pos = 0; pos <= description.size();) {
        size_t end = description.find('\n', pos);
        if (end == std::string_view::npos) end = description.size();
        const std::string_view line = description.substr(pos, end - pos);
        pos = end + 1;
        if (first && line.starts_with("pre=")) {
            spec.pre = line.substr(4);
        } else if (in_merges) {
            spec.merges.emplace_back(line);
        } else if (line.empty()) {
            in_merges = true;
        } else if (line[0] == '#' || line[0] == '@') {
            spec.pieces.emplace_back(line.substr(1));
            spec.types.push_back(line[0] == '#' ? h2o::TOKEN_CONTROL : h2o::TOKEN_USER_DEFINED);
        } else {
            spec.pieces.emplace_back(line);
            spec.types.push_back(h2o::TOKEN_NORMAL);
        }
        first = false;
    }
    std::unique_ptr<h2o::Tokenizer> tok;
    const Status st = h2o::Tokenizer::from_vocab(spec, &tok);
    check_status(st, "from_vocab");
    if (!st.ok()) return;
    check_round_trip(*tok, text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    h2o_set_log_callback(nullptr, nullptr, H2O_LOG_NONE);
    const std::string_view rest(reinterpret_cast<const char *>(data + 2), size - 2);
    if (data[0] % 2 == 0) {
        fuzz_text(data[1], rest);
    } else {
        fuzz_metadata(std::string_view(reinterpret_cast<const char *>(data + 1), size - 1));
    }
    return 0;
}
