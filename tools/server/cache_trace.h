// A request trace for h2o-cache-replay (tools/server/cache_replay.cpp): one JSON object a line,
// as scripts/make-cache-traces.py writes them.
#pragma once

#include <cstdint>
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

}  // namespace h2o_server
