// Session snapshots: the bytes h2o_session_save writes and h2o_session_load reads.
//
// Layout (little-endian):
//   header, 120 bytes, uncompressed:
//     0  magic "H2OSTATE"          8  u32 format version (9)     12 u32 header size (120)
//     16 u64 model fingerprint (Model::fingerprint: tensor table and vocabulary)
//     24 the settings that shape the cache, one word each in kCacheSettings' order (kv_settings.h):
//        u32 n_ctx, kv_budget, policy, recent, sinks, kv_type, position_rolling, n_batch; u64 seed;
//        u32 kv horizon (0: none); f32 kv_layer_slope; u32 kv_prompt_proxy;
//        f32 kv_prompt_random_share; f32 kv_head_share; u32 kv_share_across_layers;
//        u32 kv_sinks_every_policy; u32 kv_rebalance_interval
//     96 u64 payload size (uncompressed)   104 u64 compressed size (the bytes after the header)
//     112 u64 FNV-1a hash of bytes 0..111
//   payload: one zstd frame with a content checksum, holding Session::save_state's bytes.
// Older versions are read too; their headers hold fewer settings words (each row of
// kCacheSettings says from which version it has one), so the last three fields come earlier:
// version 1 (library 0.2) has no horizon and no slope (88 bytes); versions 2 to 4 have both, the
// slope word reserved (zero) in 2 and 3 (96 bytes); version 5 adds the prompt eviction settings
// (104 bytes); versions 6 and 7 the head share and a word that 7 gives to sharing across layers
// (112 bytes); version 8 sinks under every policy (116 bytes). A setting a version does not hold reads as 0. Versions 1 and 2 have no retention
// span table in the payload (Session::save_state); they are read as sessions without spans.
// Every field is checked before it is used: a truncated, corrupted, foreign or hostile snapshot
// is H2O_ERR_STATE_FORMAT with a message naming the problem, never a crash or a huge allocation.
#pragma once

#include <cstdint>
#include <vector>

#include "session.h"

namespace h2o {

// The header's size in a format version: the settings words that version holds (kv_settings.h)
// and the fixed fields. Older versions' headers are shorter.
size_t snapshot_header_size(uint32_t version = kSnapshotFormatVersion);

struct SnapshotHeader {
    uint32_t version = 0;
    uint32_t header_size = 0;  // the payload follows it
    uint64_t fingerprint = 0;
    SessionSettings settings;  // only the cache-shaping fields are stored
    uint64_t payload_size = 0;
    uint64_t compressed_size = 0;
};

// Compresses a state (Session::save_state) into a snapshot for `session`'s settings and model.
Status encode_snapshot(const Session &session, const std::vector<uint8_t> &state, std::vector<uint8_t> *out);
// An upper bound of encode_snapshot's size for a state of state_size bytes.
size_t snapshot_size_bound(size_t state_size);

// Checks the header and the snapshot's length and model. On success *header holds its fields.
Status read_snapshot_header(const uint8_t *data, size_t size, uint64_t model_fingerprint, SnapshotHeader *header);
// Decompresses and verifies the payload of a snapshot whose header was read; payload_limit bounds
// the declared payload size (the most a session with those settings can save).
Status read_snapshot_payload(const uint8_t *data, const SnapshotHeader &header, uint64_t payload_limit, std::vector<uint8_t> *state);

}  // namespace h2o
