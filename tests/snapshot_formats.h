// Older snapshot formats, made from a current snapshot, for the compatibility tests and the fuzz
// seeds: what a library before sinks under every policy (format 7), before budgets across layers (format 6), before budgets per kv head (format 5), before one-shot prompt eviction (format 4), before the layer slope (format
// 3), before retention spans (format 2) or before the horizon (format 1) wrote.
#pragma once

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace h2o_test {

// The snapshot (lib/session/session_snapshot.h, format 8, of a session without sinks under every policy,
// without budgets per head for formats 1 to 5, and for formats 1 to 4 without one-shot prompt
// eviction) as format `version` (1 to 7) writes it: for format 7 without the word at 88..91; for
// format 6 the same bytes with a zero word at 84..87 (no share across layers); for format 5 a 104-byte header without the head share and reserved words at bytes 80..87; for
// formats 2 to 4 a 96-byte header without the prompt eviction words at bytes 72..79 either; for formats 1 and 2, without the span table of the payload (its count of 0 after
// the three stream counters; the session must hold no span); for format 1, also without the
// horizon and slope words at bytes 64..71 (88 bytes); formats 1 to 3 have no layer slope. Empty
// if the snapshot is not such a one.
inline std::vector<uint8_t> snapshot_as_version(const std::vector<uint8_t> &current, uint32_t version) {
    constexpr size_t kHeaderSize = 112, kSizesAt = 88, kSpanCountAt = 3 * sizeof(int64_t);
    // Format 8 (116 bytes) adds the word of sinks under every policy at bytes 88..91: format 7
    // is the same without it, when it is zero.
    constexpr size_t kCurrentHeaderSize = 116;
    if (current.size() < kCurrentHeaderSize || current[8] != 8 || current[88] || current[89] || current[90] || current[91]) return {};
    std::vector<uint8_t> snapshot(current.begin(), current.begin() + 88);
    snapshot.insert(snapshot.end(), current.begin() + 92, current.end());
    snapshot[8] = 7;
    snapshot[12] = static_cast<uint8_t>(kHeaderSize);
    auto zeros = [&](size_t from, size_t to) {
        return std::all_of(snapshot.begin() + from, snapshot.begin() + to, [](uint8_t b) { return b == 0; });
    };
    auto rehash = [](std::vector<uint8_t> *bytes, size_t header_size) {
        uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a of the header before its hash
        for (size_t i = 0; i + 8 < header_size; ++i) hash = (hash ^ (*bytes)[i]) * 0x100000001b3ull;
        std::memcpy(bytes->data() + header_size - 8, &hash, sizeof(hash));
    };
    rehash(&snapshot, kHeaderSize);
    if (version == 7) return snapshot;
    if (version == 6 && snapshot.size() >= kHeaderSize && zeros(84, 88)) {
        std::vector<uint8_t> out = snapshot;
        out[8] = 6;
        rehash(&out, kHeaderSize);
        return out;
    }
    if (snapshot.size() < kHeaderSize || version < 1 || version > 5 || !zeros(80, 88) || (version < 5 && !zeros(72, 80))) return {};
    if ((version < 4 && !zeros(68, 72)) || (version == 1 && !zeros(64, 68))) return {};  // a slope; a horizon
    uint64_t payload_size = 0;
    std::memcpy(&payload_size, snapshot.data() + kSizesAt, sizeof(payload_size));
    std::vector<uint8_t> payload(payload_size);
    if (ZSTD_decompress(payload.data(), payload.size(), snapshot.data() + kHeaderSize, snapshot.size() - kHeaderSize) != payload_size ||
        payload_size < kSpanCountAt + 4) {
        return {};
    }
    if (version <= 2) {
        if (!std::all_of(payload.begin() + kSpanCountAt, payload.begin() + kSpanCountAt + 4, [](uint8_t b) { return b == 0; })) return {};
        payload.erase(payload.begin() + kSpanCountAt, payload.begin() + kSpanCountAt + 4);
    }
    std::vector<uint8_t> frame(ZSTD_compressBound(payload.size()));
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    const size_t compressed = ZSTD_compress2(cctx, frame.data(), frame.size(), payload.data(), payload.size());
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(compressed)) return {};
    std::vector<uint8_t> out(snapshot.begin(), snapshot.begin() + (version == 1 ? 64 : version < 5 ? 72 : 80));
    const uint64_t sizes[3] = {payload.size(), compressed, 0};  // the hash, filled in below
    out.insert(out.end(), reinterpret_cast<const uint8_t *>(sizes), reinterpret_cast<const uint8_t *>(sizes) + sizeof(sizes));
    const size_t header_size = out.size();
    const uint32_t fields[2] = {version, static_cast<uint32_t>(header_size)};
    std::memcpy(out.data() + 8, fields, sizeof(fields));
    rehash(&out, header_size);
    out.insert(out.end(), frame.begin(), frame.begin() + compressed);
    return out;
}

}  // namespace h2o_test
