// Fuzz target: the tokenizer.json reader of the tools (tools/hf_tokenizer.cpp) and the library's
// byte-level BPE on what it reads.
//
// Input layout: byte 0 chooses the vocabulary size asked for (0: the tokenizer's own); the rest is
// up to four texts separated by NUL bytes: tokenizer.json, tokenizer_config.json, config.json and
// a chat template. A reading that fails must say why with an expected status; a vocabulary that
// is read is given to the library, and one that loads tokenizes a few texts and gives them back.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "hf_tokenizer.h"
#include "tokenizer.h"

namespace {

std::vector<std::string_view> split_nul(std::string_view input, size_t max_parts) {
    std::vector<std::string_view> parts;
    while (parts.size() + 1 < max_parts) {
        const size_t nul = input.find('\0');
        if (nul == std::string_view::npos) break;
        parts.push_back(input.substr(0, nul));
        input.remove_prefix(nul + 1);
    }
    parts.push_back(input);
    parts.resize(max_parts);
    return parts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    h2o_set_log_callback(nullptr, nullptr, H2O_LOG_NONE);
    const int32_t n_vocab = data[0] < 200 ? 0 : (data[0] - 199) * 64;
    const std::vector<std::string_view> parts = split_nul(std::string_view(reinterpret_cast<const char *>(data + 1), size - 1), 4);

    h2o::HfVocabulary vocab;
    const h2o::Status read = h2o::parse_hf_tokenizer(parts[0], parts[1], parts[2], parts[3], n_vocab, &vocab);
    h2o_fuzz::check_expected_status(read.code, "parse_hf_tokenizer");
    if (!h2o_fuzz::ok_or_explained(read.code, read.message.c_str())) return 0;
    h2o_fuzz::check(vocab.tokens.size() == vocab.types.size(), "parse_hf_tokenizer: tokens and types differ in length");
    h2o_fuzz::check(n_vocab == 0 || vocab.tokens.size() == static_cast<size_t>(n_vocab), "parse_hf_tokenizer: not the size asked for");

    // Ids up to 2^19 are accepted, and the holes below them become padding tokens: building the
    // library's tokenizer for a half a million tokens takes seconds under the sanitizers and finds
    // nothing a small one does not, so such vocabularies are only read.
    if (vocab.tokens.size() > (1u << 16)) return 0;
    std::unique_ptr<h2o::Tokenizer> tok;
    const h2o::Status loaded = h2o::Tokenizer::from_vocab(h2o::to_vocab_spec(vocab), &tok);
    h2o_fuzz::check_expected_status(loaded.code, "Tokenizer::from_vocab");
    if (!h2o_fuzz::ok_or_explained(loaded.code, loaded.message.c_str())) return 0;
    for (std::string_view text :
         {std::string_view("Hello world, it's 2024!\n"), std::string_view("<|im_end|> \xC3\xA9t\xC3\xA9 \xF0\x9F\x98\x80")}) {
        std::vector<int32_t> ids;
        const h2o::Status st = tok->encode(text, false, &ids);
        // A read vocabulary may lack some byte's token (then no unknown token stands in).
        h2o_fuzz::check(st.ok() || st.code == H2O_ERR_TOKENIZER, "encode of valid text");
        if (!st.ok()) continue;
        for (int32_t id : ids) h2o_fuzz::check(id >= 0 && id < tok->n_vocab(), "encode: an id outside the vocabulary");
        if (std::find(ids.begin(), ids.end(), tok->unk()) != ids.end()) continue;  // a byte without a token
        std::string back;
        h2o_fuzz::check(tok->decode(ids.data(), ids.size(), &back).ok(), "decode");
        h2o_fuzz::check(back == text, "decode(encode(text)) is not the text");
    }
    return 0;
}
