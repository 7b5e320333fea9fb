// Tool calls: the functions a conversation offers a model, written into its prompt as its family
// was trained to read them; the grammar of a reply that calls them; the reply read back.
//
// A call is written in one exact layout per syntax, and its arguments are kept as the JSON text
// the model generated, so that a reply read back and written again in the history is the text
// the session already holds (a continued conversation is not processed again).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat_format.h"
#include "json_value.h"
#include "status.h"

namespace h2o {

// How a family writes tools, calls and results.
//   Hermes: Qwen 2.5 and 3, and every ChatML model. Tools in the system message inside
//     <tools></tools>; each call "<tool_call>\n{"name": N, "arguments": A}\n</tool_call>", calls
//     one per line; results in a user turn, each inside <tool_response></tool_response>.
//   Llama3: Llama 3.1 to 3.3. "Environment: ipython" in the system message, the tools in the first
//     user message; one call per turn, {"name": N, "parameters": A}; results in "ipython" turns.
//   Mistral: Mistral v0.3 and later, whose vocabulary has [TOOL_CALLS]. "[AVAILABLE_TOOLS] [...]
//     [/AVAILABLE_TOOLS]" before the last user turn; "[TOOL_CALLS] [{"name": N, "arguments": A,
//     "id": ID}, ...]" with ids of 9 letters and digits the model writes; results as
//     "[TOOL_RESULTS] {"content": C, "call_id": ID}[/TOOL_RESULTS]".
//   Json: the formats whose templates have no tools (Llama 2, Zephyr, Phi-3, older Mistrals,
//     Gemma): the tools described in the system message, calls as {"tool_calls": [{"name": N,
//     "arguments": A}]}, results in a user turn.
enum class ToolSyntax {
    Hermes,
    Llama3,
    Mistral,
    Json
};
// mistral_tokens: the vocabulary has Mistral's [TOOL_CALLS] control token.
ToolSyntax tool_syntax_for(ChatFormat format, bool mistral_tokens);
const char *tool_syntax_name(ToolSyntax syntax);

struct ToolFunction {
    std::string name;      // 1 to 64 of [A-Za-z0-9_-], as OpenAI's
    JsonValue definition;  // the tool object as given ({"type": "function", "function": {...}})
    JsonValue parameters;  // the JSON schema of its arguments (an empty object schema if none)
};

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // JSON text
};

// One message of a conversation with tools (OpenAI's shape).
struct ToolMessage {
    std::string role;  // "system", "user", "assistant" or "tool"
    std::string content;
    std::vector<ToolCall> tool_calls;  // an assistant's calls
    std::string tool_call_id;          // a tool result's call
};

// OpenAI's "tools": [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
// Errors (H2O_ERR_INVALID_ARGUMENT) name the entry and the field.
Status parse_tools(std::string_view json, std::vector<ToolFunction> *out);
// OpenAI's "messages" with tool turns: content a string, null or text parts; an assistant's
// "tool_calls" [{"id", "type": "function", "function": {"name", "arguments": string}}]; a tool
// message's "tool_call_id". "developer" is read as "system".
Status parse_tool_messages(std::string_view json, std::vector<ToolMessage> *out);

// The conversation as the plain messages of its chat format: the tools written in (none: the
// messages as they are), calls and results written as the syntax writes them.
Status lower_tool_conversation(ToolSyntax syntax, const std::vector<ToolFunction> &tools, const std::vector<ToolMessage> &messages,
                               std::vector<std::pair<std::string, std::string>> *out);

// Which replies the grammar allows: Auto, a call or text that does not begin as a call does;
// Required, calls; Named, calls of that function.
enum class ToolChoice {
    Auto,
    Required,
    Named
};
// The GBNF grammar of a reply. parallel: more than one call (Llama 3 makes one whatever it says).
// Errors: an unknown name, a parameter schema the JSON-schema subset refuses (named by tool).
Status tool_call_grammar(ToolSyntax syntax, const std::vector<ToolFunction> &tools, ToolChoice choice, std::string_view name, bool parallel,
                         std::string *grammar);

// What a reply that begins with `text` is: 1 calls, 0 text, -1 not known yet (a prefix of what
// opens a call).
int tool_reply_kind(ToolSyntax syntax, std::string_view text);
// A reply read back: its calls (ids made from the reply, the call's place and id_salt; Mistral's
// are the model's own), or none
// and *content the reply. A reply that opens a call but is not one in the syntax's layout is
// H2O_ERR_INVALID_ARGUMENT naming the byte.
Status parse_tool_reply(ToolSyntax syntax, std::string_view reply, uint64_t id_salt, std::string *content, std::vector<ToolCall> *calls);

// A JSON value as Python's json.dumps writes it, which the templates' tojson is (", " and ": ";
// indent > 0: one member per line), keys in their order.
std::string python_json(const JsonValue &value, int indent = 0);

}  // namespace h2o
