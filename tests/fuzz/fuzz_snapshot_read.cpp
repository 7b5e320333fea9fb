// Fuzz target: the session-snapshot reader (h2o_session_load_from_buffer), on a fixed real model
// (stories260K, loaded once).
//
// Byte 0 chooses how the rest is used:
//   even: the rest is a snapshot file as it is, so the header checks, the length checks and the
//         zstd frame are fuzzed;
//   odd:  the rest is a session state (the payload inside a snapshot): the target compresses it
//         and puts the header of a real session of the default small settings in front, with
//         the sizes and the header hash made right, so that the state's own checks (counts,
//         indices, the KV cache's free lists) are fuzzed past the checksums.
// A snapshot that loads must be usable: the target generates a few tokens and saves it again.
#include <zstd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "session_snapshot.h"

namespace {

// The snapshot layout of lib/session/session_snapshot.h: the header ends with the payload's size,
// the compressed size and the hash of the bytes before it.
const size_t kHeaderSize = h2o::snapshot_header_size(), kPayloadSizeAt = kHeaderSize - 24, kCompressedSizeAt = kHeaderSize - 16,
             kHashAt = kHeaderSize - 8;

// The header of a snapshot of a fresh session with the seed corpus's default settings.
const std::vector<uint8_t> &header_template() {
    static const std::vector<uint8_t> header = [] {
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.n_threads = 1;
        sp.kv_budget = 32;
        sp.n_ctx = 256;
        sp.position_rolling = 1;
        h2o_session *s = nullptr;
        h2o_fuzz::check(h2o_session_create(h2o_fuzz::the_model(), &sp, &s) == H2O_OK, "create the template session");
        size_t bound = 0, size = 0;
        h2o_fuzz::check(h2o_session_state_size(s, &bound) == H2O_OK, "state size");
        std::vector<uint8_t> bytes(bound);
        h2o_fuzz::check(h2o_session_save_to_buffer(s, bytes.data(), bytes.size(), &size) == H2O_OK, "save");
        h2o_session_free(s);
        bytes.resize(kHeaderSize);
        return bytes;
    }();
    return header;
}

std::vector<uint8_t> wrap_state(const uint8_t *state, size_t size) {
    std::vector<uint8_t> out = header_template();
    out.resize(kHeaderSize + ZSTD_compressBound(size));
    const size_t compressed = ZSTD_compress(out.data() + kHeaderSize, out.size() - kHeaderSize, state, size, 1);
    h2o_fuzz::check(!ZSTD_isError(compressed), "zstd compression");
    out.resize(kHeaderSize + compressed);
    const uint64_t payload = size, frame = compressed;
    std::memcpy(out.data() + kPayloadSizeAt, &payload, 8);
    std::memcpy(out.data() + kCompressedSizeAt, &frame, 8);
    uint64_t h = 0xcbf29ce484222325ull;  // the header hash (FNV-1a of the bytes before it)
    for (size_t i = 0; i < kHashAt; ++i) h = (h ^ out[i]) * 0x100000001b3ull;
    std::memcpy(out.data() + kHashAt, &h, 8);
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    std::vector<uint8_t> snapshot = (data[0] & 1) ? wrap_state(data + 1, size - 1) : std::vector<uint8_t>(data + 1, data + size);
    h2o_session *session = nullptr;
    const h2o_status st = h2o_session_load_from_buffer(h2o_fuzz::the_model(), snapshot.data(), snapshot.size(), nullptr, &session);
    if (!h2o_fuzz::ok_or_explained(st, h2o_last_error())) {
        h2o_fuzz::check(session == nullptr, "a failed load returned a session");
        h2o_fuzz::check(
            st == H2O_ERR_STATE_FORMAT || st == H2O_ERR_UNSUPPORTED || st == H2O_ERR_INVALID_ARGUMENT || st == H2O_ERR_OUT_OF_MEMORY,
            "an unexpected status from the snapshot reader");
        return 0;
    }
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 3;
    h2o_fuzz::check_expected_status(h2o_generate(session, "", 0, &gen, nullptr, nullptr), "generate after a load");
    size_t bound = 0, written = 0;
    h2o_fuzz::check(h2o_session_state_size(session, &bound) == H2O_OK, "state size after a load");
    std::vector<uint8_t> again(bound);
    h2o_fuzz::check(h2o_session_save_to_buffer(session, again.data(), again.size(), &written) == H2O_OK, "save after a load");
    h2o_session_free(session);
    return 0;
}
