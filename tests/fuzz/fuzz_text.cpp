// Fuzz target: the text entry points on a fixed real model (stories260K, loaded once from
// $H2O_SHARED_DIR or the shared folder beside the checkout).
//
// Input layout: byte 0 chooses the session (budget, policy, rolling, KV format, pinning),
// byte 1 the generation (tokens, temperature, BOS); the rest is text. The text goes whole to
// h2o_tokenize and, read as 16-bit ids, to h2o_detokenize (ids past the vocabulary included).
// Its first 256 bytes, up to a NUL, are added to a session with h2o_session_add_text; what
// follows that NUL is the h2o_generate prompt.
#include <cstring>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_common.h"

namespace {

uint32_t n_vocab() {
    h2o_model_info info{};
    info.struct_size = sizeof(info);
    h2o_fuzz::check(h2o_model_get_info(h2o_fuzz::the_model(), &info) == H2O_OK, "h2o_model_get_info");
    return info.n_vocab;
}

// Tokenizes with a too-small buffer first: the size it reports must be the size that fits.
void fuzz_tokenize(const char *text, size_t len, int add_bos, uint32_t vocab) {
    size_t needed = 0;
    const h2o_status st = h2o_tokenize(h2o_fuzz::the_model(), text, len, add_bos, nullptr, 0, &needed);
    if (st == H2O_ERR_INVALID_TEXT) return;
    h2o_fuzz::check(st == H2O_OK || st == H2O_ERR_BUFFER_TOO_SMALL, "h2o_tokenize size query");
    h2o_fuzz::check((st == H2O_OK) == (needed == 0), "h2o_tokenize: BUFFER_TOO_SMALL exactly when ids are needed");
    std::vector<int32_t> ids(needed);
    size_t n = 0;
    h2o_fuzz::check(h2o_tokenize(h2o_fuzz::the_model(), text, len, add_bos, ids.data(), ids.size(), &n) == H2O_OK,
                    "h2o_tokenize with the reported size");
    h2o_fuzz::check(n == needed, "h2o_tokenize: a different count with the reported size");
    for (int32_t id : ids) h2o_fuzz::check(id >= 0 && static_cast<uint32_t>(id) < vocab, "h2o_tokenize: id outside the vocabulary");
}

// Detokenizes ids read from the bytes; the vocabulary is far below 65536, so many are invalid.
void fuzz_detokenize(const uint8_t *bytes, size_t len, uint32_t vocab) {
    std::vector<int32_t> ids(len / 2);
    bool all_valid = true;
    for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<int32_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8)) - (bytes[2 * i + 1] == 0xFF ? 65536 : 0);
        all_valid = all_valid && ids[i] >= 0 && static_cast<uint32_t>(ids[i]) < vocab;
    }
    size_t needed = 0;
    char small[4];
    const h2o_status st = h2o_detokenize(h2o_fuzz::the_model(), ids.data(), ids.size(), small, sizeof(small), &needed);
    if (!all_valid) {
        h2o_fuzz::check(st == H2O_ERR_INVALID_ARGUMENT, "h2o_detokenize accepted an id outside the vocabulary");
        return;
    }
    h2o_fuzz::check(st == (needed < sizeof(small) ? H2O_OK : H2O_ERR_BUFFER_TOO_SMALL), "h2o_detokenize status against its size");
    std::vector<char> text(needed + 1, '\x7f');
    size_t n = 0;
    h2o_fuzz::check(h2o_detokenize(h2o_fuzz::the_model(), ids.data(), ids.size(), text.data(), text.size(), &n) == H2O_OK,
                    "h2o_detokenize with the reported size");
    h2o_fuzz::check(n == needed && text[n] == '\0', "h2o_detokenize: size or terminator");
}

constexpr uint32_t kPolicies[] = {H2O_KV_SCISSORHANDS, H2O_KV_H2O,    H2O_KV_WINDOW,   H2O_KV_SINK_WINDOW, H2O_KV_TOVA,
                                  H2O_KV_ROCO,         H2O_KV_RANDOM, H2O_KV_MEAN_H2O, H2O_KV_FULL};
constexpr uint32_t kBudgets[] = {6, 9, 16, 0};  // 0: a full cache of n_ctx slots

void fuzz_session(uint8_t session_byte, uint8_t generate_byte, const std::string &added, const std::string &prompt) {
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 96;
    sp.n_threads = 1;
    sp.n_batch = 8;
    sp.seed = generate_byte;
    sp.backend = H2O_BACKEND_CPU;
    sp.kv_budget = kBudgets[session_byte & 3];
    sp.position_rolling = (session_byte >> 2) & 1;
    sp.kv_policy = kPolicies[((session_byte >> 3) & 7) + ((session_byte >> 6) == 3 ? 1 : 0)];
    sp.kv_type = static_cast<uint32_t>((session_byte >> 6) + ((generate_byte >> 7) & 1));  // 0..4
    h2o_session *session = nullptr;
    const h2o_status st = h2o_session_create(h2o_fuzz::the_model(), &sp, &session);
    h2o_fuzz::check_expected_status(st, "h2o_session_create");
    if (!h2o_fuzz::ok_or_explained(st, h2o_last_error())) return;

    const uint32_t flags = (generate_byte & 0x40) ? H2O_TEXT_PIN : 0;
    const h2o_status a = h2o_session_add_text(session, added.data(), added.size(), flags);
    h2o_fuzz::check_expected_status(a, "h2o_session_add_text");
    h2o_fuzz::ok_or_explained(a, h2o_session_last_error(session));

    h2o_generate_params gp;

    h2o_generate_params_init(&gp, sizeof gp);
    gp.max_tokens = 1 + (generate_byte & 7);
    gp.temperature = (generate_byte & 8) ? 0.0f : 0.9f;
    gp.stop_at_eos = (generate_byte >> 4) & 1;
    const char *stops[] = {"\n", "the"};
    gp.stop_strings = stops;
    gp.n_stop_strings = (generate_byte >> 5) & 1 ? 2 : 0;
    const h2o_status g = h2o_generate(session, prompt.data(), prompt.size(), &gp, nullptr, nullptr);
    h2o_fuzz::check_expected_status(g, "h2o_generate");
    h2o_fuzz::ok_or_explained(g, h2o_session_last_error(session));
    h2o_session_free(session);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    h2o_set_log_callback(nullptr, nullptr, H2O_LOG_NONE);
    static const uint32_t vocab = n_vocab();
    const char *text = reinterpret_cast<const char *>(data + 2);
    const size_t len = size - 2;
    fuzz_tokenize(text, len, data[1] & 1, vocab);
    fuzz_detokenize(data + 2, len, vocab);

    // Session input is bounded so that one input costs a few hundred forward passes at most.
    const std::string head(text, std::min<size_t>(len, 256));
    const size_t nul = head.find('\0');
    const std::string added = head.substr(0, nul);
    const std::string prompt = nul == std::string::npos ? std::string() : head.substr(nul + 1).c_str();
    fuzz_session(data[0], data[1], added, prompt);
    return 0;
}
