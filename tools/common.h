// Small helpers shared by the command-line programs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "h2o/h2o.h"

namespace h2o_tools {

// Peak resident set size of this process in bytes.
uint64_t peak_rss_bytes();
// Current resident set size in bytes (from /proc/self/statm).
uint64_t current_rss_bytes();
double now_seconds();
// Escapes text for a JSON string literal (without the quotes).
std::string json_escape(const std::string &text);
// Parses an eviction policy name (full, h2o, window, sink_window, scissorhands, tova, roco,
// random, mean_h2o); false if unknown.
bool parse_policy(const std::string &name, h2o_kv_policy *out);
// The name parse_policy accepts for a policy.
const char *policy_name(h2o_kv_policy policy);

// Parses a KV element format: f32, f16, q8, q4; false if unknown.
bool parse_kv_type(const std::string &name, h2o_kv_type *out);
const char *kv_type_name(h2o_kv_type type);

// Parses a backend name: auto, cpu, vulkan, cuda; false if unknown.
bool parse_backend(const std::string &name, h2o_backend_kind *out);

// The model to use: the given path, else $H2O_MODEL, else "".
std::string resolve_model_path(const std::string &given);

// Strict number parsing: the whole text must be the number. parse_uint rejects signs.
bool parse_double(const char *text, double *out);
bool parse_uint(const char *text, uint64_t *out);
// Splits "a,b,c" at sep; empty items are kept (callers reject them).
std::vector<std::string> split(const std::string &text, char sep);
// Reads a whole file; on failure *error says why.
bool read_file(const std::string &path, std::string *out, std::string *error);
// Writes a whole file; on failure *error says why.
bool write_file(const std::string &path, const std::string &text, std::string *error);
// The names parse_policy accepts, "full, h2o, ...", for messages.
std::string kv_policy_names();

}  // namespace h2o_tools
