// A request trace for h2o-cache-replay (tools/server/cache_replay.cpp): one JSON object a line,
// as scripts/make-cache-traces.py and h2o-server --record-trace write them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace h2o_server {

struct TraceRequest {
    double t = 0;              // seconds from the trace's start
    std::string conversation;  // which conversation the request continues or starts
    bool named = false;        // the client names it (conversation_id)
    std::string system;        // its system prompt's id ("" none)
    // Tokens: the system prompt; the conversation's before this request (system prompt aside);
    // the new message; the reply.
    uint64_t system_tokens = 0, history_tokens = 0, new_tokens = 0, reply_tokens = 0;
};

// Reads one line: {"t", "conversation"} and the optional fields above. false with *error saying
// what is wrong (any bytes are safe to give).
bool parse_trace_request(std::string_view line, TraceRequest *out, std::string *error);
// The line of one request, without its newline: what parse_trace_request reads back.
std::string trace_line(const TraceRequest &request);

// How a trace names a conversation or a system prompt without its text: 16 hexadecimal digits of
// its SHA-256.
std::string trace_name(std::string_view text);

// Appends a server's requests to a trace (h2o-server --record-trace), so that its caches can be
// replayed on what its users did. A line is written whole by one write() to a file opened for
// appending: lines of concurrent requests never interleave, and those of earlier runs stay.
class TraceRecorder {
public:
    // false with *error naming the file when it cannot be opened for appending.
    static bool open(const std::string &path, std::unique_ptr<TraceRecorder> *out, std::string *error);
    ~TraceRecorder();
    TraceRecorder(const TraceRecorder &) = delete;
    TraceRecorder &operator=(const TraceRecorder &) = delete;
    // Appends the request; t (seconds since the Unix epoch) is raised to the last one written if
    // the clock stepped back, because a trace is in time order. A failed write is said on stderr
    // once, and the server goes on.
    void record(TraceRequest request);

private:
    explicit TraceRecorder(int fd) : fd_(fd) {}
    const int fd_;
    std::mutex mutex_;
    double last_t_ = 0;         // mutex_
    bool said_failed_ = false;  // mutex_
};

}  // namespace h2o_server
