// Small helpers shared by the command-line programs.
#pragma once

#include <cstdint>
#include <string>

namespace h2o_tools {

// Peak resident set size of this process in bytes.
uint64_t peak_rss_bytes();
// Current resident set size in bytes (from /proc/self/statm).
uint64_t current_rss_bytes();
double now_seconds();
// Escapes text for a JSON string literal (without the quotes).
std::string json_escape(const std::string &text);
// The model to use: the given path, else $H2O_MODEL, else "".
std::string resolve_model_path(const std::string &given);

}  // namespace h2o_tools
