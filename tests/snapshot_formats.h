// Older snapshot formats, made from a current snapshot, for the compatibility tests and the fuzz
// seeds: what a library before the rebalancing interval (format 8), before sinks under every policy (format 7), before budgets across layers (format 6), before budgets per kv head (format 5), before one-shot prompt eviction (format 4), before the layer slope (format
// 3), before retention spans (format 2) or before the horizon (format 1) wrote.
#pragma once

#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace h2o_test {

// The snapshot's header without the zero word at `at`, relabelled `version` and rehashed; empty if
// the word is not zero.
inline std::vector<uint8_t> without_header_word(const std::vector<uint8_t> &snapshot, size_t at, uint32_t version) {
    const size_t header_size = snapshot.size() > 12 ? snapshot[12] : 0;
    if (snapshot.size() < header_size || header_size < at + 12 ||
        std::any_of(snapshot.begin() + at, snapshot.begin() + at + 4, [](uint8_t b) { return b != 0; })) {
        return {};
    }
    std::vector<uint8_t> out(snapshot.begin(), snapshot.begin() + at);
    out.insert(out.end(), snapshot.begin() + at + 4, snapshot.end());
    out[8] = static_cast<uint8_t>(version);
    out[12] = static_cast<uint8_t>(header_size - 4);
    uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a of the header before its hash
    for (size_t i = 0; i + 8 < header_size - 4; ++i) hash = (hash ^ out[i]) * 0x100000001b3ull;
    std::memcpy(out.data() + header_size - 12, &hash, sizeof(hash));
    return out;
}

// The snapshot (lib/session/session_snapshot.h, format 9, of a session without a rebalancing
// interval for formats 1 to 8, without sinks under every policy for 1 to 7, without budgets per
// head for formats 1 to 5, and for formats 1 to 4 without one-shot prompt eviction) as format
// `version` (1 to 8) writes it: for format 8 without the word at 92..95; for format 7 also without the word at 88..91; for
// format 6 the same bytes with a zero word at 84..87 (no share across layers); for format 5 a 104-byte header without the head share and reserved words at bytes 80..87; for
// formats 2 to 4 a 96-byte header without the prompt eviction words at bytes 72..79 either; for formats 1 and 2, without the span table of the payload (its count of 0 after
// the three stream counters; the session must hold no span); for format 1, also without the
// horizon and slope words at bytes 64..71 (88 bytes); formats 1 to 3 have no layer slope. Empty
// if the snapshot is not such a one.
inline std::vector<uint8_t> snapshot_as_version(const std::vector<uint8_t> &current, uint32_t version) {
    constexpr size_t kHeaderSize = 112, kSizesAt = 88, kSpanCountAt = 3 * sizeof(int64_t);
    // Format 9 (120 bytes) adds the rebalancing interval's word at bytes 92..95, format 8 (116)
    // the word of sinks under every policy at 88..91: each older format is the same without its
    // word, when it is zero.
    if (current.size() < 120 || current[8] != 9 || current[12] != 120) return {};
    const std::vector<uint8_t> v8 = without_header_word(current, 92, 8);
    if (version == 8 || v8.empty()) return v8;
    std::vector<uint8_t> snapshot = without_header_word(v8, 88, 7);
    if (snapshot.empty()) return {};
    auto zeros = [&](size_t from, size_t to) {
        return std::all_of(snapshot.begin() + from, snapshot.begin() + to, [](uint8_t b) { return b == 0; });
    };
    auto rehash = [](std::vector<uint8_t> *bytes, size_t header_size) {
        uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a of the header before its hash
        for (size_t i = 0; i + 8 < header_size; ++i) hash = (hash ^ (*bytes)[i]) * 0x100000001b3ull;
        std::memcpy(bytes->data() + header_size - 8, &hash, sizeof(hash));
    };
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
