#include "cache_trace.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace h2o_server {

bool parse_trace_request(std::string_view line, TraceRequest *out, std::string *error) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) {
        *error = "not a JSON object";
        return false;
    }
    if (!j.contains("t") || !j["t"].is_number() || !std::isfinite(j["t"].get<double>()) || j["t"].get<double>() < 0) {
        *error = "\"t\" must be a number of seconds, 0 or more";
        return false;
    }
    if (!j.contains("conversation") || !j["conversation"].is_string()) {
        *error = "\"conversation\" must be a string";
        return false;
    }
    TraceRequest r;
    r.t = j["t"].get<double>();
    r.conversation = j["conversation"].get<std::string>();
    if (j.contains("named")) {
        if (!j["named"].is_boolean()) {
            *error = "\"named\" must be true or false";
            return false;
        }
        r.named = j["named"].get<bool>();
    }
    if (j.contains("system")) {
        if (!j["system"].is_string()) {
            *error = "\"system\" must be a string";
            return false;
        }
        r.system = j["system"].get<std::string>();
    }
    // Counts up to 2^32: a trace's requests are not longer than any model's context.
    for (auto [key, field] : {std::pair{"system_tokens", &r.system_tokens}, std::pair{"history_tokens", &r.history_tokens},
                              std::pair{"new_tokens", &r.new_tokens}, std::pair{"reply_tokens", &r.reply_tokens}}) {
        if (!j.contains(key)) continue;
        if (!j[key].is_number_unsigned() || j[key].get<uint64_t>() > UINT32_MAX) {
            *error = std::string("\"") + key + "\" must be a whole number from 0 to 2^32 - 1";
            return false;
        }
        *field = j[key].get<uint64_t>();
    }
    *out = r;
    return true;
}

}  // namespace h2o_server
