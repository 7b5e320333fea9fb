// Whole-file reads and writes with clear errors. Writes never leave a partial file at the path:
// the bytes go to a temporary file beside it, which is synced and then renamed over the path. A
// process killed mid-write leaves only its temporary file, named PATH.tmp.PID, and the next write
// to PATH removes such files whose process no longer exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "status.h"

namespace h2o {

// Receives the file's bytes in order; returns false when writing failed.
using ByteSink = std::function<bool(const uint8_t *data, size_t size)>;

// Calls produce(sink) to write the content; produce returns false to abandon the write (then
// the error says the content could not be produced, and the path is untouched).
Status write_file_atomically(const std::string &path, const std::function<bool(const ByteSink &)> &produce);

// Reads the first min(max_bytes, file size) bytes of a regular file into *out; *file_size
// receives the whole file's size. Errors: H2O_ERR_IO naming the path and the OS error.
Status read_file(const std::string &path, uint64_t max_bytes, std::vector<uint8_t> *out, uint64_t *file_size);

}  // namespace h2o
