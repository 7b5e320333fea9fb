// Older snapshot formats, made from a current snapshot, for the compatibility tests and the fuzz
// seeds: what a library before retention spans (format 2) or before the horizon (format 1) wrote.
#pragma once

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace h2o_test {

// The snapshot (lib/session_snapshot.h, format 3, of a session without retention spans) as format
// `version` (1 or 2) writes it: without the span table of the payload (its count of 0 after the
// three stream counters) and, for format 1, without the horizon and reserved words at bytes 64..71
// of the header. Empty if the snapshot is not such a one.
inline std::vector<uint8_t> snapshot_as_version(const std::vector<uint8_t> &snapshot, uint32_t version) {
    constexpr size_t kHeaderSize = 96, kSpanCountAt = 3 * sizeof(int64_t);
    if (snapshot.size() < kHeaderSize || (version != 1 && version != 2)) return {};
    uint64_t payload_size = 0;
    std::memcpy(&payload_size, snapshot.data() + 72, sizeof(payload_size));
    std::vector<uint8_t> payload(payload_size);
    if (ZSTD_decompress(payload.data(), payload.size(), snapshot.data() + kHeaderSize, snapshot.size() - kHeaderSize) != payload_size ||
        payload_size < kSpanCountAt + 4 ||
        !std::all_of(payload.begin() + kSpanCountAt, payload.begin() + kSpanCountAt + 4, [](uint8_t b) { return b == 0; })) {
        return {};
    }
    payload.erase(payload.begin() + kSpanCountAt, payload.begin() + kSpanCountAt + 4);
    std::vector<uint8_t> frame(ZSTD_compressBound(payload.size()));
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    const size_t compressed = ZSTD_compress2(cctx, frame.data(), frame.size(), payload.data(), payload.size());
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(compressed)) return {};
    std::vector<uint8_t> out(snapshot.begin(), snapshot.begin() + kHeaderSize);
    const uint64_t sizes[2] = {payload.size(), compressed};
    std::memcpy(out.data() + 72, sizes, sizeof(sizes));
    size_t header_size = kHeaderSize;
    if (version == 1) {
        if (!std::all_of(out.begin() + 64, out.begin() + 72, [](uint8_t b) { return b == 0; })) return {};  // a horizon
        out.erase(out.begin() + 64, out.begin() + 72);
        header_size = 88;
    }
    const uint32_t fields[2] = {version, static_cast<uint32_t>(header_size)};
    std::memcpy(out.data() + 8, fields, sizeof(fields));
    uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a of the header before its hash
    for (size_t i = 0; i + 8 < header_size; ++i) hash = (hash ^ out[i]) * 0x100000001b3ull;
    std::memcpy(out.data() + header_size - 8, &hash, sizeof(hash));
    out.insert(out.end(), frame.begin(), frame.begin() + compressed);
    return out;
}

}  // namespace h2o_test
