#include "session_snapshot.h"

#include <zstd.h>

#include <cstring>
#include <string>

#include "byte_io.h"

namespace h2o {

namespace {

constexpr char kMagic[8] = {'H', '2', 'O', 'S', 'T', 'A', 'T', 'E'};
// Magic, version, size, the model's fingerprint, the payload's two sizes and the hash.
constexpr size_t kHeaderFixedBytes = 8 + 4 + 4 + 8 + 8 + 8 + 8;
// Level 1: the KV rows are mostly incompressible numbers, so higher levels buy a few percent of
// size for several times the time (measured: see the README's session-state figures).
constexpr int kCompressionLevel = 1;

uint64_t fnv1a(const uint8_t *data, size_t size) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
    return h;
}

Status bad(const std::string &what) { return make_error(H2O_ERR_STATE_FORMAT, "not a valid session snapshot: " + what); }

}  // namespace

size_t snapshot_header_size(uint32_t version) { return kHeaderFixedBytes + cache_settings_bytes(version); }

size_t snapshot_size_bound(size_t state_size) { return snapshot_header_size() + ZSTD_compressBound(state_size); }

Status encode_snapshot(const Session &session, const std::vector<uint8_t> &state, std::vector<uint8_t> *out) {
    const SessionSettings &s = session.settings();
    const size_t header_size = snapshot_header_size();
    out->clear();
    ByteWriter w(out);
    w.put_raw(kMagic, sizeof(kMagic));
    w.put<uint32_t>(kSnapshotFormatVersion);
    w.put<uint32_t>(static_cast<uint32_t>(header_size));
    w.put<uint64_t>(session.model().fingerprint());
    write_cache_settings(s, &w);
    w.put<uint64_t>(state.size());
    const size_t bound = ZSTD_compressBound(state.size());
    w.put<uint64_t>(0);  // compressed size, filled in below
    w.put<uint64_t>(0);  // header hash, filled in below
    out->resize(header_size + bound);

    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    if (!cctx) return make_error(H2O_ERR_OUT_OF_MEMORY, "cannot create a zstd compression context");
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, kCompressionLevel);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    const size_t compressed = ZSTD_compress2(cctx, out->data() + header_size, bound, state.data(), state.size());
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(compressed))
        return make_error(H2O_ERR_INTERNAL, std::string("zstd compression failed: ") + ZSTD_getErrorName(compressed));
    out->resize(header_size + compressed);
    const uint64_t compressed_size = compressed;
    // The header ends with the compressed size and the hash of the bytes before the hash.
    const size_t hash_at = header_size - 8;
    std::memcpy(out->data() + hash_at - 8, &compressed_size, sizeof(compressed_size));
    const uint64_t hash = fnv1a(out->data(), hash_at);
    std::memcpy(out->data() + hash_at, &hash, sizeof(hash));
    return Status::Ok();
}

Status read_snapshot_header(const uint8_t *data, size_t size, uint64_t model_fingerprint, SnapshotHeader *header) {
    if (size < 16) return bad(std::to_string(size) + " bytes is shorter than a header");
    if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) return bad("it does not begin with \"H2OSTATE\"");
    uint32_t version = 0, header_size = 0;
    std::memcpy(&version, data + 8, sizeof(version));
    std::memcpy(&header_size, data + 12, sizeof(header_size));
    if (version < 1 || version > kSnapshotFormatVersion) {
        return make_error(H2O_ERR_UNSUPPORTED, "session snapshot format version " + std::to_string(version) +
                                                   " is not supported (this library reads versions 1 to " +
                                                   std::to_string(kSnapshotFormatVersion) + ")");
    }
    const size_t expected_size = snapshot_header_size(version);
    if (header_size != expected_size)
        return bad("header size " + std::to_string(header_size) + " (version " + std::to_string(version) + ": " +
                   std::to_string(expected_size) + ")");
    if (size < header_size) {
        return bad(std::to_string(size) + " bytes is shorter than the " + std::to_string(header_size) + "-byte header");
    }
    ByteReader r(data + 16, header_size - 16);
    uint64_t fingerprint = 0, payload_size = 0, compressed_size = 0, hash = 0;
    H2O_TRY(r.get("model fingerprint", &fingerprint));
    H2O_TRY(read_cache_settings(&r, version, &header->settings));
    H2O_TRY(r.get("payload size", &payload_size));
    H2O_TRY(r.get("compressed size", &compressed_size));
    H2O_TRY(r.get("header hash", &hash));
    if (hash != fnv1a(data, header_size - 8)) return bad("the header is corrupted (its hash does not match)");
    if (fingerprint != model_fingerprint) {
        return bad("it was saved with another model (fingerprint " + std::to_string(fingerprint) + ", this model's is " +
                   std::to_string(model_fingerprint) + ")");
    }
    if (compressed_size != size - header_size) {
        return bad("the header announces " + std::to_string(compressed_size) + " bytes of payload but " +
                   std::to_string(size - header_size) + " follow (truncated or extended)");
    }
    header->version = version;
    header->header_size = header_size;
    header->fingerprint = fingerprint;
    header->payload_size = payload_size;
    header->compressed_size = compressed_size;
    return Status::Ok();
}

Status read_snapshot_payload(const uint8_t *data, const SnapshotHeader &header, uint64_t payload_limit, std::vector<uint8_t> *state) {
    if (header.payload_size > payload_limit) {
        return bad("the payload is said to be " + std::to_string(header.payload_size) +
                   " bytes; a session with these settings saves at most " + std::to_string(payload_limit));
    }
    const uint8_t *frame = data + header.header_size;
    const unsigned long long content = ZSTD_getFrameContentSize(frame, header.compressed_size);
    if (content == ZSTD_CONTENTSIZE_ERROR) return bad("the payload is not a zstd frame");
    if (content != header.payload_size) return bad("the payload's frame does not hold the announced number of bytes");
    state->resize(header.payload_size);
    const size_t got = ZSTD_decompress(state->data(), state->size(), frame, header.compressed_size);
    if (ZSTD_isError(got)) return bad(std::string("the payload is corrupted (zstd: ") + ZSTD_getErrorName(got) + ")");
    if (got != header.payload_size) return bad("the payload decompressed to " + std::to_string(got) + " bytes");
    return Status::Ok();
}

}  // namespace h2o
