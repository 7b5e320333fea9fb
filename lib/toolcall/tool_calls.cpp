#include "tool_calls.h"

#include "json_schema.h"

namespace h2o {

namespace {

constexpr size_t kMaxTools = 128;

Status bad(const std::string &message) { return make_error(H2O_ERR_INVALID_ARGUMENT, message); }

bool valid_tool_name(std::string_view name) {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name) {
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
    }
    return true;
}

JsonValue json_string(std::string text) {
    JsonValue v;
    v.kind = JsonValue::kString;
    v.text = std::move(text);
    return v;
}

// How a reply of calls is laid out: reply_open, then each call as call_open NAME arguments_key
// ARGUMENTS call_close with separators between, then reply_close.
struct CallLayout {
    std::string_view opening;        // a reply begins so exactly when it calls
    std::string_view reply_open;     // before the first call
    std::string_view call_open;      // before each call's name
    std::string_view arguments_key;  // between the name and the arguments
    std::string_view id_key;         // after the arguments, before an id the model writes ("": none)
    std::string_view call_close;     // after each call's arguments (or id)
    std::string_view separator;      // between calls
    std::string_view reply_close;    // after the last call
    bool single = false;             // one call per reply
};

CallLayout layout_of(ToolSyntax syntax) {
    switch (syntax) {
        case ToolSyntax::Hermes:
            return {"<tool_call>", "", "<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "", "}\n</tool_call>", "\n", "", false};
        case ToolSyntax::Llama3:
            return {"{\"name\": \"", "", "{\"name\": \"", "\", \"parameters\": ", "", "}", "", "", true};
        case ToolSyntax::Mistral:
            return {"[TOOL_CALLS]", "[TOOL_CALLS] [", "{\"name\": \"", "\", \"arguments\": ", ", \"id\": \"", "\"}", ", ", "]", false};
        case ToolSyntax::Json:
            return {"{\"tool_calls\": [", "{\"tool_calls\": [", "{\"name\": \"", "\", \"arguments\": ", "", "}", ", ", "]}", false};
    }
    return {};
}

std::string write_calls(ToolSyntax syntax, const std::vector<ToolCall> &calls) {
    const CallLayout l = layout_of(syntax);
    std::string out(l.reply_open);
    for (size_t i = 0; i < calls.size(); ++i) {
        if (i > 0) out.append(l.separator);
        out.append(l.call_open).append(calls[i].name).append(l.arguments_key).append(calls[i].arguments);
        if (!l.id_key.empty()) out.append(l.id_key).append(calls[i].id);
        out.append(l.call_close);
    }
    return out.append(l.reply_close);
}

// The end of the JSON value that begins at `at` (strings and nesting followed; the value itself
// is checked by parse_json after), or npos.
size_t json_value_end(std::string_view s, size_t at) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = at; i < s.size(); ++i) {
        const char c = s[i];
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"') {
                in_string = false;
                if (depth == 0) return i + 1;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            ++depth;
        } else if (c == '}' || c == ']') {
            if (--depth < 0) return i;
            if (depth == 0) return i + 1;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r')) {
            return i;
        }
    }
    return depth == 0 && !in_string ? s.size() : std::string_view::npos;
}

// Mistral's call ids: 9 letters and digits.
constexpr size_t kMistralIdLength = 9;
bool valid_mistral_id(std::string_view id) {
    if (id.size() != kMistralIdLength) return false;
    for (char c : id) {
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
    }
    return true;
}

std::string base62_id(uint64_t hash, size_t length) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    std::string out;
    for (size_t i = 0; i < length; ++i) {
        if (i % 10 == 0) hash = hash * 6364136223846793005ull + 1442695040888963407ull;  // more digits than 64 bits give
        out.push_back(digits[(hash >> 32) % 62]);
        hash = hash / 62 + (hash << 58);
    }
    return out;
}

uint64_t fnv1a(std::string_view text, uint64_t h) {
    for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
    return h;
}

// A GBNF literal of ASCII or UTF-8 text.
std::string literal(std::string_view text) {
    static const char hex[] = "0123456789ABCDEF";
    std::string out = "\"";
    for (char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out.push_back('\\');
            out.push_back(c);
        } else if (u < 0x20) {
            out += "\\x";
            out.push_back(hex[u >> 4]);
            out.push_back(hex[u & 15]);
        } else {
            out.push_back(c);
        }
    }
    return out + "\"";
}

// Text that does not begin with `opening`: for each proper prefix, either it ends there or the
// next character differs.
std::string not_beginning_with(std::string_view opening) {
    static const char hex[] = "0123456789ABCDEF";
    std::string out = "\"\"";
    for (size_t k = 0; k < opening.size(); ++k) {
        const auto u = static_cast<unsigned char>(opening[k]);
        const std::string head = k == 0 ? "" : literal(opening.substr(0, k)) + " ";
        if (k > 0) out += " | " + literal(opening.substr(0, k));
        out += std::string(" | ") + head + "[^\\x" + hex[u >> 4] + hex[u & 15] + "] .*";
    }
    return out;
}

void python_json_into(const JsonValue &v, int indent, int level, std::string *out) {
    const bool is_object = v.is(JsonValue::kObject);
    if (!is_object && !v.is(JsonValue::kArray)) {
        out->append(json_text(v));
        return;
    }
    const size_t n = is_object ? v.members.size() : v.items.size();
    out->push_back(is_object ? '{' : '[');
    for (size_t i = 0; i < n; ++i) {
        if (i > 0) out->append(indent > 0 ? "," : ", ");
        if (indent > 0) out->append("\n").append(static_cast<size_t>(indent * (level + 1)), ' ');
        if (is_object) {
            out->append(json_text(json_string(v.members[i].first))).append(": ");
            python_json_into(v.members[i].second, indent, level + 1, out);
        } else {
            python_json_into(v.items[i], indent, level + 1, out);
        }
    }
    if (indent > 0 && n > 0) out->append("\n").append(static_cast<size_t>(indent * level), ' ');
    out->push_back(is_object ? '}' : ']');
}

// The tools block a syntax writes into the system message (Hermes, Json) or the first user
// message (Llama3), as those families' templates word it.
std::string tools_block(ToolSyntax syntax, const std::vector<ToolFunction> &tools) {
    std::string out;
    switch (syntax) {
        case ToolSyntax::Hermes:
            out =
                "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
            for (const ToolFunction &t : tools) out += "\n" + python_json(t.definition);
            out +=
                "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>";
            return out;
        case ToolSyntax::Llama3:
            out =
                "Given the following functions, please respond with a JSON for a function call with its proper arguments "
                "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
                "dictionary of argument name and its value}.Do not use variables.\n\n";
            for (const ToolFunction &t : tools) out += python_json(t.definition, 4) + "\n\n";
            return out;
        case ToolSyntax::Mistral:
            out = "[AVAILABLE_TOOLS] [";
            for (size_t i = 0; i < tools.size(); ++i) out += (i > 0 ? ", " : "") + python_json(tools[i].definition);
            return out + "][/AVAILABLE_TOOLS]";
        case ToolSyntax::Json:
            out = "You can call these tools (each with the JSON schema of its arguments):\n";
            for (const ToolFunction &t : tools) out += python_json(t.definition) + "\n";
            out +=
                "\nTo call tools, reply with only this JSON: {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": "
                "<arguments object>}]}. Otherwise reply in plain text.";
            return out;
    }
    return out;
}

// Tool results in one turn: Hermes's <tool_response> blocks, or Json's labelled results.
std::string results_text(ToolSyntax syntax, const std::vector<const ToolMessage *> &results, const std::vector<ToolMessage> &messages) {
    std::string out;
    for (const ToolMessage *r : results) {
        if (!out.empty()) out += syntax == ToolSyntax::Hermes ? "\n" : "\n\n";
        if (syntax == ToolSyntax::Hermes) {
            out += "<tool_response>\n" + r->content + "\n</tool_response>";
            continue;
        }
        std::string name;  // the call's function, from the assistant message that made it
        for (const ToolMessage &m : messages) {
            for (const ToolCall &c : m.tool_calls) {
                if (c.id == r->tool_call_id) name = c.name;
            }
        }
        out += "The result of " + (name.empty() ? std::string("tool call ") : name + ", call ") + r->tool_call_id + ":\n" + r->content;
    }
    return out;
}

Status read_content(const JsonValue &m, const std::string &where, std::string *out) {
    const JsonValue *content = m.find("content");
    out->clear();
    if (!content || content->is(JsonValue::kNull)) return Status::Ok();
    if (content->is(JsonValue::kString)) {
        *out = content->text;
        return Status::Ok();
    }
    if (!content->is(JsonValue::kArray)) return bad(where + ".content must be a string, null or an array of text parts");
    for (const JsonValue &part : content->items) {
        const JsonValue *type = part.find("type"), *text = part.find("text");
        if (!type || type->text != "text" || !text || !text->is(JsonValue::kString))
            return bad(where + ".content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
        out->append(text->text);
    }
    return Status::Ok();
}

Status read_call(const JsonValue &c, const std::string &where, ToolCall *out) {
    const JsonValue *id = c.find("id"), *function = c.find("function");
    if (!id || !id->is(JsonValue::kString) || id->text.empty()) return bad(where + ".id must be a non-empty string");
    const JsonValue *type = c.find("type");
    if (type && type->text != "function") return bad(where + ".type must be \"function\"");
    if (!function || !function->is(JsonValue::kObject)) return bad(where + ".function must be an object");
    const JsonValue *name = function->find("name"), *arguments = function->find("arguments");
    if (!name || !name->is(JsonValue::kString) || !valid_tool_name(name->text))
        return bad(where + ".function.name must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'");
    if (!arguments || !arguments->is(JsonValue::kString)) return bad(where + ".function.arguments must be a string of JSON");
    JsonValue parsed;
    H2O_TRY(parse_json(arguments->text, (where + ".function.arguments").c_str(), &parsed));
    if (!parsed.is(JsonValue::kObject)) return bad(where + ".function.arguments must be a JSON object");
    *out = ToolCall{id->text, name->text, arguments->text};
    return Status::Ok();
}

}  // namespace

ToolSyntax tool_syntax_for(ChatFormat format, bool mistral_tokens) {
    if (format == ChatFormat::ChatML) return ToolSyntax::Hermes;
    if (format == ChatFormat::Llama3) return ToolSyntax::Llama3;
    if (format == ChatFormat::Mistral && mistral_tokens) return ToolSyntax::Mistral;
    return ToolSyntax::Json;
}

const char *tool_syntax_name(ToolSyntax syntax) {
    switch (syntax) {
        case ToolSyntax::Hermes:
            return "hermes";
        case ToolSyntax::Llama3:
            return "llama3";
        case ToolSyntax::Mistral:
            return "mistral";
        case ToolSyntax::Json:
            return "json";
    }
    return "unknown";
}

std::string python_json(const JsonValue &value, int indent) {
    std::string out;
    python_json_into(value, indent, 0, &out);
    return out;
}

Status parse_tools(std::string_view json, std::vector<ToolFunction> *out) {
    JsonValue tools;
    H2O_TRY(parse_json(json, "tools", &tools));
    if (!tools.is(JsonValue::kArray)) return bad("tools must be an array");
    if (tools.items.size() > kMaxTools) return bad("tools holds at most " + std::to_string(kMaxTools) + " functions");
    out->clear();
    for (size_t i = 0; i < tools.items.size(); ++i) {
        const JsonValue &t = tools.items[i];
        const std::string where = "tools[" + std::to_string(i) + "]";
        const JsonValue *type = t.find("type"), *function = t.find("function");
        if (!type || type->text != "function") return bad(where + ".type must be \"function\"");
        if (!function || !function->is(JsonValue::kObject)) return bad(where + ".function must be an object");
        const JsonValue *name = function->find("name"), *parameters = function->find("parameters");
        if (!name || !name->is(JsonValue::kString) || !valid_tool_name(name->text))
            return bad(where + ".function.name must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'");
        for (const ToolFunction &f : *out) {
            if (f.name == name->text) return bad(where + ".function.name '" + name->text + "' is given twice");
        }
        ToolFunction f;
        f.name = name->text;
        f.definition = t;
        if (parameters && !parameters->is(JsonValue::kObject)) return bad(where + ".function.parameters must be a JSON schema object");
        if (parameters) {
            f.parameters = *parameters;
        } else {
            f.parameters.kind = JsonValue::kObject;
            f.parameters.members.push_back(JsonMember{"type", json_string("object")});
        }
        out->push_back(std::move(f));
    }
    return Status::Ok();
}

Status parse_tool_messages(std::string_view json, std::vector<ToolMessage> *out) {
    JsonValue messages;
    H2O_TRY(parse_json(json, "messages", &messages));
    if (!messages.is(JsonValue::kArray)) return bad("messages must be an array");
    out->clear();
    for (size_t i = 0; i < messages.items.size(); ++i) {
        const JsonValue &m = messages.items[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        const JsonValue *role = m.find("role");
        if (!role || !role->is(JsonValue::kString)) return bad(where + ".role must be a string");
        ToolMessage message;
        message.role = role->text == "developer" ? "system" : role->text;
        if (message.role != "system" && message.role != "user" && message.role != "assistant" && message.role != "tool")
            return bad(where + ".role '" + role->text + "' is not one of system, developer, user, assistant, tool");
        H2O_TRY(read_content(m, where, &message.content));
        if (const JsonValue *calls = m.find("tool_calls"); calls && !calls->is(JsonValue::kNull)) {
            if (message.role != "assistant" || !calls->is(JsonValue::kArray))
                return bad(where + ".tool_calls must be an array, on an assistant message");
            for (size_t k = 0; k < calls->items.size(); ++k) {
                ToolCall call;
                H2O_TRY(read_call(calls->items[k], where + ".tool_calls[" + std::to_string(k) + "]", &call));
                message.tool_calls.push_back(std::move(call));
            }
        }
        if (message.role == "tool") {
            const JsonValue *id = m.find("tool_call_id");
            if (!id || !id->is(JsonValue::kString) || id->text.empty()) return bad(where + ".tool_call_id must be a non-empty string");
            message.tool_call_id = id->text;
        }
        out->push_back(std::move(message));
    }
    return Status::Ok();
}

Status lower_tool_conversation(ToolSyntax syntax, const std::vector<ToolFunction> &tools, const std::vector<ToolMessage> &messages,
                               std::vector<std::pair<std::string, std::string>> *out) {
    out->clear();
    const std::string block = tools.empty() ? "" : tools_block(syntax, tools);
    // Where the tools go: Hermes's and Json's in the system message (made when there is none),
    // Llama 3's in the first user message, Mistral's before the last user turn (and the system
    // message that opens it).
    const bool in_system = !block.empty() && (syntax == ToolSyntax::Hermes || syntax == ToolSyntax::Json);
    if (in_system && (messages.empty() || messages[0].role != "system")) out->emplace_back("system", block);
    if (!tools.empty() && syntax == ToolSyntax::Llama3 && (messages.empty() || messages[0].role != "system"))
        out->emplace_back("system", "Environment: ipython");
    size_t mistral_at = messages.size();
    for (size_t k = 0; k < messages.size(); ++k) {
        if (messages[k].role == "user") mistral_at = k;
    }
    if (mistral_at > 0 && mistral_at < messages.size() && messages[mistral_at - 1].role == "system") --mistral_at;
    bool tools_written = block.empty();
    for (size_t i = 0; i < messages.size(); ++i) {
        const ToolMessage &m = messages[i];
        if (syntax == ToolSyntax::Mistral && !block.empty() && i == mistral_at) {
            out->emplace_back("available_tools", block);
            tools_written = true;
        }
        if (m.role == "tool") {
            if (syntax == ToolSyntax::Llama3) {
                out->emplace_back("ipython", m.content);
                continue;
            }
            if (syntax == ToolSyntax::Mistral) {
                // The id goes into the block as it is: one of the 9-character ids calls have.
                if (!valid_mistral_id(m.tool_call_id))
                    return bad("messages[" + std::to_string(i) +
                               "]: Mistral's tool results answer a call id of 9 letters and digits, not '" + m.tool_call_id + "'");
                out->emplace_back("tool_results", "[TOOL_RESULTS] {\"content\": " + m.content + ", \"call_id\": \"" + m.tool_call_id +
                                                      "\"}[/TOOL_RESULTS]");
                continue;
            }
            std::vector<const ToolMessage *> results;  // this run of results is one user turn
            for (; i < messages.size() && messages[i].role == "tool"; ++i) results.push_back(&messages[i]);
            --i;
            out->emplace_back("user", results_text(syntax, results, messages));
            continue;
        }
        std::string content = m.content;
        if (m.role == "system" && i == 0 && !tools.empty()) {
            if (syntax == ToolSyntax::Llama3)
                content = "Environment: ipython\n\n" + content;
            else if (in_system)
                content += "\n\n" + block;
        }
        if (m.role == "user" && syntax == ToolSyntax::Llama3 && !tools_written) {
            content = block + content;
            tools_written = true;
        }
        std::string role = m.role;
        if (!m.tool_calls.empty()) {
            const std::string where = "messages[" + std::to_string(i) + "]";
            if (syntax == ToolSyntax::Llama3 && m.tool_calls.size() > 1)
                return bad(where + ": Llama 3 makes one tool call per turn, this message has " + std::to_string(m.tool_calls.size()));
            for (const ToolCall &c : m.tool_calls) {
                if (syntax == ToolSyntax::Mistral && !valid_mistral_id(c.id))
                    return bad(where + ": Mistral's tool call ids are 9 letters and digits, not '" + c.id + "'");
            }
            const std::string calls = write_calls(syntax, m.tool_calls);
            // Hermes writes text before the calls (Qwen's template); the others a call alone.
            content = syntax == ToolSyntax::Hermes && !content.empty() ? content + "\n" + calls : calls;
            if (syntax == ToolSyntax::Mistral) role = "tool_calls";
        }
        out->emplace_back(role, std::move(content));
    }
    if (syntax == ToolSyntax::Mistral && !tools_written) out->emplace_back("available_tools", block);
    return Status::Ok();
}

Status tool_call_grammar(ToolSyntax syntax, const std::vector<ToolFunction> &tools, ToolChoice choice, std::string_view name, bool parallel,
                         std::string *grammar) {
    if (tools.empty()) return bad("tool_choice needs tools");
    const CallLayout l = layout_of(syntax);
    std::string rules, functions;
    for (size_t i = 0; i < tools.size(); ++i) {
        const ToolFunction &t = tools[i];
        if (choice == ToolChoice::Named && t.name != name) continue;
        std::string arguments;
        const std::string prefix = "t" + std::to_string(i) + "-";
        if (Status s = json_schema_rules(t.parameters, prefix, &arguments, &rules); !s.ok())
            return bad("tools[" + std::to_string(i) + "] (" + t.name + ").function.parameters: " + s.message);
        if (!functions.empty()) functions += " | ";
        functions += "(" + literal(std::string(t.name) + std::string(l.arguments_key)) + " " + arguments + ")";
    }
    if (functions.empty()) return bad("tool_choice names '" + std::string(name) + "', which is not one of the tools");
    const std::string id = l.id_key.empty() ? "" : literal(l.id_key) + " [a-zA-Z0-9]{" + std::to_string(kMistralIdLength) + "} ";
    std::string out = "call ::= " + literal(l.call_open) + " (" + functions + ") " + id + literal(l.call_close) + "\n";
    const std::string more = parallel && !l.single ? " (" + literal(l.separator) + " call)*" : "";
    out += "calls ::= " + (l.reply_open.empty() ? "" : literal(l.reply_open) + " ") + "call" + more +
           (l.reply_close.empty() ? "" : " " + literal(l.reply_close)) + "\n";
    out += choice == ToolChoice::Auto ? "root ::= calls | " + not_beginning_with(l.opening) + "\n" : "root ::= calls\n";
    *grammar = out + json_common_rules() + rules;
    return Status::Ok();
}

int tool_reply_kind(ToolSyntax syntax, std::string_view text) {
    const std::string_view opening = layout_of(syntax).opening;
    if (text.starts_with(opening)) return 1;
    return opening.starts_with(text) ? -1 : 0;
}

Status parse_tool_reply(ToolSyntax syntax, std::string_view reply, uint64_t id_salt, std::string *content, std::vector<ToolCall> *calls) {
    calls->clear();
    content->clear();
    if (tool_reply_kind(syntax, reply) != 1) {
        *content = std::string(reply);
        return Status::Ok();
    }
    const CallLayout l = layout_of(syntax);
    size_t at = 0;  // never past the reply: only what was found moves it
    auto expect = [&](std::string_view what) -> Status {
        if (reply.substr(at, what.size()) != what)
            return bad("the tool call does not continue with " + json_text(json_string(std::string(what))) + " at byte " +
                       std::to_string(at));
        at += what.size();
        return Status::Ok();
    };
    // What makes a reply a call may be shorter than what opens its calls (Mistral's
    // "[TOOL_CALLS]" and "[TOOL_CALLS] [").
    H2O_TRY(expect(l.reply_open));
    while (true) {
        H2O_TRY(expect(l.call_open));
        const size_t name_end = reply.find('"', at);
        if (name_end == std::string_view::npos || !valid_tool_name(reply.substr(at, name_end - at)))
            return bad("the tool call has no function name at byte " + std::to_string(at));
        ToolCall call;
        call.name = std::string(reply.substr(at, name_end - at));
        at = name_end;
        H2O_TRY(expect(l.arguments_key.substr(0, 1)));  // the closing quote of the name
        H2O_TRY(expect(l.arguments_key.substr(1)));
        const size_t end = json_value_end(reply, at);
        JsonValue arguments;
        if (end == std::string_view::npos || !parse_json(reply.substr(at, end - at), "arguments", &arguments).ok() ||
            !arguments.is(JsonValue::kObject))
            return bad("the arguments of tool call " + std::to_string(calls->size()) + " at byte " + std::to_string(at) +
                       " are not a JSON object");
        call.arguments = std::string(reply.substr(at, end - at));
        at = end;
        if (!l.id_key.empty()) {
            H2O_TRY(expect(l.id_key));
            call.id = std::string(reply.substr(at, kMistralIdLength));
            if (!valid_mistral_id(call.id)) return bad("the tool call's id at byte " + std::to_string(at) + " is not 9 letters and digits");
            at += kMistralIdLength;
        } else {
            const uint64_t h = fnv1a(reply, fnv1a(std::to_string(calls->size()) + ":" + std::to_string(id_salt), 1469598103934665603ull));
            call.id = "call_" + base62_id(h, 24);
        }
        H2O_TRY(expect(l.call_close));
        calls->push_back(std::move(call));
        if (l.single || reply.substr(at, l.separator.size()) != l.separator || l.separator.empty() ||
            reply.substr(at + l.separator.size(), l.call_open.size()) != l.call_open)
            break;
        at += l.separator.size();
    }
    H2O_TRY(expect(l.reply_close));
    const std::string_view rest = reply.substr(at);
    if (rest.find_first_not_of(" \t\r\n") != std::string_view::npos)
        return bad("text follows the tool calls at byte " + std::to_string(at));
    return Status::Ok();
}

}  // namespace h2o
