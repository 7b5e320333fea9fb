#include "chat_request.h"

#include <climits>
#include <cmath>
#include <cstdlib>

namespace h2o_server {

using nlohmann::json;

std::string error_body(const ApiError &error) {
    json e = {{"message", error.message}, {"type", error.type}};
    e["param"] = error.param.empty() ? json(nullptr) : json(error.param);
    e["code"] = error.code.empty() ? json(nullptr) : json(error.code);
    return dump(json{{"error", e}});
}

ApiError bad_request(const std::string &message, const std::string &param) {
    return ApiError{400, "invalid_request_error", message, param, ""};
}

bool nests_deeper_than(const std::string &body, uint32_t max_depth) {
    uint32_t depth = 0;
    bool in_string = false, escaped = false;
    for (char c : body) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth) return true;
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return false;
}

bool valid_conversation_id(const std::string &id) {
    if (id.empty() || id.size() > 64) return false;
    for (char c : id) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

std::string Message::digest_content() const {
    if (tool_calls.empty() && tool_call_id.empty()) return content;
    return content + std::string(1, '\0') + tool_calls + std::string(1, '\0') + tool_call_id;
}

std::string transcript_json(const std::vector<Message> &messages) {
    json out = json::array();
    for (const Message &m : messages) {
        json message{{"role", m.role}, {"content", m.content}};
        if (!m.tool_calls.empty()) {
            message["content"] = nullptr;
            message["tool_calls"] = json::parse(m.tool_calls);
        }
        if (!m.tool_call_id.empty()) message["tool_call_id"] = m.tool_call_id;
        out.push_back(std::move(message));
    }
    return dump(out);
}

namespace {

// An assistant's tool_calls in the layout the server writes them back in: what it returned and
// what a client sends back digest alike.
std::optional<ApiError> read_tool_calls(const json &calls, const std::string &param, std::string *out) {
    if (!calls.is_array()) return bad_request("tool_calls must be an array", param);
    json canonical = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
        const json &c = calls[i];
        const std::string where = param + "[" + std::to_string(i) + "]";
        if (!c.is_object() || !c.contains("id") || !c["id"].is_string() || !c.contains("function") || !c["function"].is_object())
            return bad_request("each tool call needs an id and a function", where);
        const json &f = c["function"];
        if (!f.contains("name") || !f["name"].is_string() || !f.contains("arguments") || !f["arguments"].is_string())
            return bad_request("a tool call's function needs a name and arguments (a string of JSON)", where + ".function");
        canonical.push_back(
            json{{"id", c["id"]}, {"type", "function"}, {"function", {{"name", f["name"]}, {"arguments", f["arguments"]}}}});
    }
    if (!canonical.empty()) *out = canonical.dump();
    return std::nullopt;
}

// A message's content: a string, or an array of text parts (joined), or null (empty).
std::optional<ApiError> read_content(const json &content, const std::string &param, std::string *out) {
    out->clear();
    if (content.is_null()) return std::nullopt;
    if (content.is_string()) {
        *out = content.get<std::string>();
        return std::nullopt;
    }
    if (!content.is_array()) return bad_request("content must be a string or an array of text parts", param);
    for (size_t i = 0; i < content.size(); ++i) {
        const json &part = content[i];
        const std::string where = param + "[" + std::to_string(i) + "]";
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") || !part["text"].is_string())
            return bad_request("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported", where);
        out->append(part["text"].get<std::string>());
    }
    return std::nullopt;
}

std::optional<ApiError> read_messages(const json &messages, const RequestLimits &limits, std::vector<Message> *out) {
    if (!messages.is_array() || messages.empty()) return bad_request("messages must be a non-empty array", "messages");
    if (messages.size() > limits.max_messages) {
        return ApiError{
            413, "invalid_request_error",
            "a request may hold at most " + std::to_string(limits.max_messages) + " messages, not " + std::to_string(messages.size()),
            "messages", "too_many_messages"};
    }
    out->reserve(messages.size());
    for (size_t i = 0; i < messages.size(); ++i) {
        const json &m = messages[i];
        const std::string param = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) return bad_request("each message must be an object", param);
        if (!m.contains("role") || !m["role"].is_string()) return bad_request("a message needs a role (a string)", param + ".role");
        Message message;
        message.role = m["role"].get<std::string>();
        if (message.role == "developer") message.role = "system";
        if (message.role != "system" && message.role != "user" && message.role != "assistant" && message.role != "tool") {
            return bad_request("role '" + message.role + "' is not supported (system, developer, user, assistant, tool are)",
                               param + ".role");
        }
        if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
            if (message.role != "assistant") return bad_request("only an assistant's message has tool calls", param + ".tool_calls");
            if (auto e = read_tool_calls(m["tool_calls"], param + ".tool_calls", &message.tool_calls)) return e;
        }
        if (message.role == "tool") {
            if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string() || m["tool_call_id"].get<std::string>().empty())
                return bad_request("a tool message needs the tool_call_id it answers", param + ".tool_call_id");
            message.tool_call_id = m["tool_call_id"].get<std::string>();
        }
        // An assistant's message that only calls tools may leave its content out.
        if (!m.contains("content") && message.tool_calls.empty()) return bad_request("a message needs content", param + ".content");
        if (m.contains("content")) {
            if (auto e = read_content(m["content"], param + ".content", &message.content)) return e;
        }
        out->push_back(std::move(message));
    }
    if (out->back().role != "user" && out->back().role != "tool")
        return bad_request("the last message must be the user's or a tool's result", "messages");
    return std::nullopt;
}

// A number field in [min, max] (or (min, max] when min_open).
std::optional<ApiError> read_number(const json &request, const char *name, double min, double max, bool min_open,
                                    std::optional<float> *out) {
    if (!request.contains(name) || request[name].is_null()) return std::nullopt;
    const json &v = request[name];
    const double x = v.is_number() ? v.get<double>() : NAN;
    if (!(min_open ? x > min : x >= min) || !(x <= max)) {
        return bad_request(
            std::string(name) + " must be a number in " + (min_open ? "(" : "[") + json(min).dump() + ", " + json(max).dump() + "]", name);
    }
    *out = static_cast<float>(x);
    return std::nullopt;
}

std::optional<ApiError> read_stop(const json &request, std::vector<std::string> *out) {
    if (!request.contains("stop") || request["stop"].is_null()) return std::nullopt;
    const json &stop = request["stop"];
    std::vector<json> items;
    if (stop.is_string())
        items.push_back(stop);
    else if (stop.is_array())
        items.assign(stop.begin(), stop.end());
    else
        return bad_request("stop must be a string or an array of strings", "stop");
    if (items.size() > 4) return bad_request("stop takes at most 4 strings", "stop");
    for (const json &s : items) {
        if (!s.is_string() || s.get<std::string>().empty()) return bad_request("each stop sequence must be a non-empty string", "stop");
        out->push_back(s.get<std::string>());
    }
    return std::nullopt;
}

// Fields a front-end may send whose non-default values this server cannot honour.
std::optional<ApiError> refuse_unsupported(const json &request) {
    if (request.contains("n") && !request["n"].is_null() && request["n"] != 1) return bad_request("only n = 1 is supported", "n");
    if (request.contains("functions") && !request["functions"].is_null() && !request["functions"].empty())
        return bad_request("functions is not supported: give tools", "functions");
    for (const char *name : {"presence_penalty", "frequency_penalty"}) {
        if (request.contains(name) && !request[name].is_null() && request[name] != 0)
            return bad_request(std::string(name) + " is not supported (only 0)", name);
    }
    if (request.contains("logprobs") && request["logprobs"] == true) return bad_request("logprobs is not supported", "logprobs");
    return std::nullopt;
}

// response_format: text, json_object (any JSON object) or json_schema (its "schema").
std::optional<ApiError> read_response_format(const json &request, std::string *schema) {
    if (!request.contains("response_format") || request["response_format"].is_null()) return std::nullopt;
    const json &format = request["response_format"];
    if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
        return bad_request("response_format must be an object with a type", "response_format");
    const std::string type = format["type"].get<std::string>();
    if (type == "text") return std::nullopt;
    if (type == "json_object") {
        *schema = R"({"type": "object", "additionalProperties": true})";
        return std::nullopt;
    }
    if (type != "json_schema") return bad_request("response_format.type must be text, json_object or json_schema", "response_format.type");
    if (!format.contains("json_schema") || !format["json_schema"].is_object() || !format["json_schema"].contains("schema"))
        return bad_request("response_format.json_schema.schema is required", "response_format.json_schema");
    const json &s = format["json_schema"]["schema"];
    if (!s.is_object() && !s.is_boolean())
        return bad_request("response_format.json_schema.schema must be a JSON schema", "response_format.json_schema.schema");
    *schema = s.dump();
    return std::nullopt;
}

// logit_bias: {"token id": bias in [-100, 100]}; -100 bans the token, as OpenAI's does.
std::optional<ApiError> read_logit_bias(const json &request, std::vector<std::pair<int32_t, float>> *out) {
    if (!request.contains("logit_bias") || request["logit_bias"].is_null()) return std::nullopt;
    const json &bias = request["logit_bias"];
    if (!bias.is_object()) return bad_request("logit_bias must be an object of token ids and biases", "logit_bias");
    if (bias.size() > 1024) return bad_request("logit_bias holds at most 1024 tokens", "logit_bias");
    for (const auto &[key, value] : bias.items()) {
        char *end = nullptr;
        const long id = std::strtol(key.c_str(), &end, 10);
        if (key.empty() || *end != '\0' || id < 0 || id > INT32_MAX) return bad_request("logit_bias keys must be token ids", "logit_bias");
        if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100)
            return bad_request("logit_bias values must be numbers from -100 to 100", "logit_bias");
        const double b = value.get<double>();
        out->emplace_back(static_cast<int32_t>(id), b <= -100 ? -INFINITY : static_cast<float>(b));
    }
    return std::nullopt;
}

// tools, tool_choice and parallel_tool_calls. The library checks each tool when the turn starts.
std::optional<ApiError> read_tools(const json &request, ChatRequest *r) {
    const bool has_tools = request.contains("tools") && !request["tools"].is_null() && !request["tools"].empty();
    if (has_tools) {
        if (!request["tools"].is_array()) return bad_request("tools must be an array of functions", "tools");
        r->tools = request["tools"].dump();
        r->tool_choice = "auto";
    }
    if (request.contains("tool_choice") && !request["tool_choice"].is_null()) {
        const json &choice = request["tool_choice"];
        if (choice.is_string() && (choice == "none" || choice == "auto" || choice == "required")) {
            r->tool_choice = choice.get<std::string>();
        } else if (choice.is_object() && choice.value("type", "") == "function" && choice.contains("function") &&
                   choice["function"].is_object() && choice["function"].contains("name") && choice["function"]["name"].is_string()) {
            r->tool_choice = choice["function"]["name"].get<std::string>();
        } else {
            return bad_request("tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                               "tool_choice");
        }
        if (!has_tools && r->tool_choice != "none") return bad_request("tool_choice needs tools", "tool_choice");
    }
    if (request.contains("parallel_tool_calls") && !request["parallel_tool_calls"].is_null()) {
        if (!request["parallel_tool_calls"].is_boolean())
            return bad_request("parallel_tool_calls must be true or false", "parallel_tool_calls");
        r->parallel_tool_calls = request["parallel_tool_calls"].get<bool>();
    }
    if (has_tools && r->tool_choice != "none" && !r->json_schema.empty())
        return bad_request("response_format and tools cannot both shape one reply: give tool_choice none, or no response_format",
                           "response_format");
    return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_chat_request(const std::string &body, const RequestLimits &limits, ChatRequest *out) {
    if (nests_deeper_than(body, limits.max_json_depth))
        return bad_request("the body nests objects or arrays deeper than " + std::to_string(limits.max_json_depth) + " levels");
    json request;
    try {
        request = json::parse(body);
    } catch (const json::exception &e) {
        return bad_request(std::string("the body is not valid JSON: ") + e.what());
    }
    if (!request.is_object()) return bad_request("the body must be a JSON object");
    ChatRequest r;
    if (!request.contains("model") || !request["model"].is_string()) return bad_request("model (a string) is required", "model");
    r.model = request["model"].get<std::string>();
    if (!request.contains("messages")) return bad_request("messages is required", "messages");
    if (auto e = read_messages(request["messages"], limits, &r.messages)) return e;
    if (auto e = refuse_unsupported(request)) return e;
    if (auto e = read_response_format(request, &r.json_schema)) return e;
    if (auto e = read_logit_bias(request, &r.logit_bias)) return e;
    if (auto e = read_tools(request, &r)) return e;
    for (const char *name : {"max_tokens", "max_completion_tokens"}) {
        if (!request.contains(name) || request[name].is_null()) continue;
        const json &v = request[name];
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > limits.max_tokens)
            return bad_request(std::string(name) + " must be a whole number from 1 to " + std::to_string(limits.max_tokens), name);
        r.max_tokens = static_cast<uint32_t>(v.get<int64_t>());
    }
    if (auto e = read_number(request, "temperature", 0.0, 2.0, false, &r.temperature)) return e;
    if (auto e = read_number(request, "top_p", 0.0, 1.0, true, &r.top_p)) return e;
    if (request.contains("seed") && !request["seed"].is_null()) {
        if (!request["seed"].is_number_integer()) return bad_request("seed must be a whole number", "seed");
        r.seed =
            request["seed"].is_number_unsigned() ? request["seed"].get<uint64_t>() : static_cast<uint64_t>(request["seed"].get<int64_t>());
    }
    if (auto e = read_stop(request, &r.stop)) return e;
    if (request.contains("stream") && !request["stream"].is_null()) {
        if (!request["stream"].is_boolean()) return bad_request("stream must be true or false", "stream");
        r.stream = request["stream"].get<bool>();
    }
    if (request.contains("stream_options") && request["stream_options"].is_object()) {
        const json &options = request["stream_options"];
        if (options.contains("include_usage") && !options["include_usage"].is_boolean())
            return bad_request("stream_options.include_usage must be true or false", "stream_options.include_usage");
        r.include_usage = options.value("include_usage", false);
    }
    if (request.contains("conversation_id") && !request["conversation_id"].is_null()) {
        const json &id = request["conversation_id"];
        if (!id.is_string() || !valid_conversation_id(id.get<std::string>()))
            return bad_request("conversation_id must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'", "conversation_id");
        r.conversation_id = id.get<std::string>();
    }
    *out = std::move(r);
    return std::nullopt;
}

json usage_json(const Usage &usage) {
    return json{{"prompt_tokens", usage.prompt_tokens},
                {"completion_tokens", usage.completion_tokens},
                {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
                {"evicted_tokens", usage.evicted_tokens}};
}

json completion_json(const CompletionHeader &header, const std::string &text, const std::string &finish_reason, const Usage &usage,
                     const json &tool_calls) {
    json message = {{"role", "assistant"}, {"content", tool_calls.empty() ? json(text) : json(nullptr)}};
    if (!tool_calls.empty()) message["tool_calls"] = tool_calls;
    json choice = {{"index", 0}, {"message", message}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
    return json{{"id", header.id},
                {"object", "chat.completion"},
                {"created", header.created},
                {"model", header.model},
                {"choices", json::array({choice})},
                {"usage", usage_json(usage)},
                {"conversation_id", header.conversation_id}};
}

json chunk_json(const CompletionHeader &header, const json &delta, const char *finish_reason, const Usage *usage) {
    json chunk = {{"id", header.id},
                  {"object", "chat.completion.chunk"},
                  {"created", header.created},
                  {"model", header.model},
                  {"conversation_id", header.conversation_id}};
    if (usage) {
        chunk["choices"] = json::array();
        chunk["usage"] = usage_json(*usage);
    } else {
        chunk["choices"] = json::array({json{{"index", 0},
                                             {"delta", delta},
                                             {"logprobs", nullptr},
                                             {"finish_reason", finish_reason ? json(finish_reason) : json(nullptr)}}});
    }
    return chunk;
}

std::string dump(const json &value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json &value) { return "data: " + dump(value) + "\n\n"; }

}  // namespace h2o_server
