// The OpenAI chat-completions protocol as h2o-server speaks it: a request body checked field by
// field into a ChatRequest, and the JSON shapes of replies, stream chunks and errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace h2o_server {

// An error as the protocol reports it: the HTTP status and the body's "error" object.
struct ApiError {
    int http_status = 500;
    std::string type;     // "invalid_request_error", "not_found_error", "server_error", ...
    std::string message;  // says what is wrong and, where it helps, what is allowed
    std::string param;    // the request field at fault ("" when none)
    std::string code;     // a short machine-readable reason ("" when none)
};
// The response body of an error: {"error": {"message", "type", "param", "code"}}.
std::string error_body(const ApiError &error);
ApiError bad_request(const std::string &message, const std::string &param = "");

struct Message {
    Message() = default;
    Message(std::string role_, std::string content_, std::string tool_calls_ = "", std::string tool_call_id_ = "")
        : role(std::move(role_)),
          content(std::move(content_)),
          tool_calls(std::move(tool_calls_)),
          tool_call_id(std::move(tool_call_id_)) {}
    std::string role;  // "system", "user", "assistant" or "tool" ("developer" is read as "system")
    std::string content;
    std::string tool_calls;    // an assistant's calls: a JSON array in one canonical layout; "" none
    std::string tool_call_id;  // a tool result's call
    // What the conversation's digest hashes for the content: the calls and the call id count.
    std::string digest_content() const;
};

// What a request asks for, every field checked.
struct ChatRequest {
    std::string model;
    std::vector<Message> messages;  // at least one; the last is the user's
    uint32_t max_tokens = 0;        // 0: the server's default
    std::optional<float> temperature, top_p;
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;  // at most 4, none empty
    bool stream = false;
    bool include_usage = false;   // stream_options.include_usage
    std::string conversation_id;  // the extension; "" when not given
    // response_format: the JSON schema the reply must satisfy ("" for text; json_object: any
    // object), as text for h2o_generate_params.json_schema.
    std::string json_schema;
    // logit_bias: token id -> bias (-100 bans the token: -infinity).
    std::vector<std::pair<int32_t, float>> logit_bias;
    // tools: the JSON array as given ("" for none), tool_choice ("auto", "none", "required" or a
    // function's name) and parallel_tool_calls.
    std::string tools;
    std::string tool_choice;
    bool parallel_tool_calls = true;
};

// Messages in the protocol's shape (role, content; an assistant's tool_calls with a null
// content; a tool result's tool_call_id), as a JSON array: a conversation's transcript.
std::string transcript_json(const std::vector<Message> &messages);

// Limits a request must keep (the server's settings).
struct RequestLimits {
    uint32_t max_tokens = 4096;    // the most a request may ask for
    size_t max_messages = 100000;  // messages in one request
    uint32_t max_json_depth = 32;  // nesting of objects and arrays
};

// Parses and checks a request body. Bad JSON, a field of the wrong type or out of range, an
// unsupported feature (n > 1, functions, an unknown role, content parts that are not text,
// response_format with tools) give a 400 naming the field; nothing else is done with the request. (A schema
// the library cannot enforce, or a token outside the vocabulary, is refused when the turn starts.)
std::optional<ApiError> parse_chat_request(const std::string &body, const RequestLimits &limits, ChatRequest *out);

// Whether body nests objects and arrays deeper than max_depth (checked before parsing, so that
// hostile nesting costs neither stack nor memory).
bool nests_deeper_than(const std::string &body, uint32_t max_depth);

// A conversation id of the extension: 1 to 64 characters of [A-Za-z0-9_-] (it names a file).
bool valid_conversation_id(const std::string &id);

// Token counts of one completion (OpenAI's "usage").
struct Usage {
    uint64_t prompt_tokens = 0;      // the whole conversation the reply follows
    uint64_t cached_tokens = 0;      // of those, the ones not processed again for this request
    uint64_t completion_tokens = 0;  // the reply's
    // An h2o extension: of the conversation's tokens, those its session no longer holds (its
    // cache filled and evicted them; the pinned system message is never among them).
    uint64_t evicted_tokens = 0;
};
nlohmann::json usage_json(const Usage &usage);

// What every reply object of one completion shares.
struct CompletionHeader {
    std::string id;       // "chatcmpl-..."
    int64_t created = 0;  // Unix seconds
    std::string model;
    std::string conversation_id;  // the extension: where the conversation lives now
};
// The non-streaming reply (object "chat.completion"). finish_reason: "stop", "length" or
// "tool_calls" (then tool_calls holds them and the content is null).
nlohmann::json completion_json(const CompletionHeader &header, const std::string &text, const std::string &finish_reason,
                               const Usage &usage, const nlohmann::json &tool_calls = nlohmann::json::array());
// One streamed chunk (object "chat.completion.chunk"): delta is {"role"}, {"content"} or {};
// finish_reason null until the last; usage only on the extra chunk of include_usage.
nlohmann::json chunk_json(const CompletionHeader &header, const nlohmann::json &delta, const char *finish_reason,
                          const Usage *usage = nullptr);
// JSON text; bytes that are not UTF-8 (in a message quoting bad input) become U+FFFD.
std::string dump(const nlohmann::json &value);
// One server-sent event carrying json ("data: ...\n\n").
std::string sse_event(const nlohmann::json &json);

}  // namespace h2o_server
