#include "cache_trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "history_digest.h"

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

std::string trace_line(const TraceRequest &r) {
    const nlohmann::json j = {{"t", r.t},
                              {"conversation", r.conversation},
                              {"named", r.named},
                              {"system", r.system},
                              {"system_tokens", r.system_tokens},
                              {"history_tokens", r.history_tokens},
                              {"new_tokens", r.new_tokens},
                              {"reply_tokens", r.reply_tokens}};
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string trace_name(std::string_view text) { return to_hex(sha256(text)).substr(0, 16); }

bool TraceRecorder::open(const std::string &path, std::unique_ptr<TraceRecorder> *out, std::string *error) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        *error = "cannot open " + path + " to append the request trace: " + std::strerror(errno);
        return false;
    }
    out->reset(new TraceRecorder(fd));
    return true;
}

TraceRecorder::~TraceRecorder() { ::close(fd_); }

void TraceRecorder::record(TraceRequest request) {
    std::lock_guard<std::mutex> lock(mutex_);
    request.t = std::max(request.t, last_t_);
    last_t_ = request.t;
    const std::string line = trace_line(request) + "\n";
    const ssize_t written = ::write(fd_, line.data(), line.size());
    if (written != static_cast<ssize_t>(line.size()) && !said_failed_) {
        said_failed_ = true;
        std::fprintf(stderr, "h2o-server: the request trace is not written: %s\n", written < 0 ? std::strerror(errno) : "a short write");
    }
}

}  // namespace h2o_server
