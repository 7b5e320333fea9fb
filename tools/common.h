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
// The ids of text (no BOS; flags: H2O_TOKENIZE_*), sized by a first call. On failure *ids is
// empty and the status says why (h2o_last_error() has the message).
h2o_status tokenize(const h2o_model *model, const std::string &text, uint32_t flags, std::vector<int32_t> *ids);
// The text of ids; "" when h2o_detokenize fails.
std::string detokenize(const h2o_model *model, const std::vector<int32_t> &ids);
// -log p(token) under the softmax of logits (in double precision); *argmax gets the most likely id.
double negative_log_prob(const std::vector<float> &logits, int32_t token, int32_t *argmax);
// Escapes text for a JSON string literal (without the quotes).
std::string json_escape(const std::string &text);
// Names of eviction policies (h2o_kv_policy), KV types (h2o_kv_type) and backends
// (h2o_backend_kind), as the library defines them. parse_* return false for an unknown name;
// *_names() list the known ones, "a, b, c", for messages.
bool parse_policy(const std::string &name, uint32_t *out);
const char *policy_name(uint32_t policy);
std::string kv_policy_names();
bool parse_kv_type(const std::string &name, uint32_t *out);
const char *kv_type_name(uint32_t type);
std::string kv_type_names();
bool parse_backend(const std::string &name, uint32_t *out);
std::string backend_names();

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

}  // namespace h2o_tools
