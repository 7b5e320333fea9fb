// What a decoded token reads, and how fast this machine reads memory: h2o-bench's bandwidth share
// of each decode figure (bytes read per token x tokens per second / the probe's bytes per second).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace h2o_tools {

// Bytes per second that `threads` threads read from a buffer of `bytes` bytes (far larger than the
// caches), each its own contiguous part: the best of `passes` passes.
double probe_read_bandwidth(int threads, size_t bytes = size_t{1} << 30, int passes = 5);
// The same in a child process, so that its buffer leaves this process's peak RSS alone; 0 when
// the child cannot run. Call it before starting threads.
double probe_read_bandwidth_apart(int threads);

// Bytes of weights one decoded token reads in the GGUF file at `path`: every tensor, except that
// of the token embedding table it reads one row, unless the output projection is that table
// (tied). 0 when the file cannot be read, with the reason in *error.
uint64_t decode_weight_bytes(const std::string &path, std::string *error);

// Bytes of KV rows a decoded token reads per cached token: the key and value rows of every
// (layer, kv head), in the h2o_kv_type `kv_type`.
uint64_t kv_bytes_per_cached_token(uint32_t kv_type, uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim);

}  // namespace h2o_tools
