// Fuzz target: tool calls (lib/toolcall), all untrusted input: OpenAI's tools and messages, and
// a model's reply read back in each syntax.
//
// Input layout: byte 0 picks the part (mod 3): 0 the rest is a tools array, whose grammars are
// made under each choice; 1 a messages array, written with a fixed tool in each syntax; 2 a reply,
// read back in each syntax. Calls read back are written again and must give the reply's text.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "grammar.h"
#include "tool_calls.h"

namespace {

constexpr h2o::ToolSyntax kSyntaxes[] = {h2o::ToolSyntax::Hermes, h2o::ToolSyntax::Llama3, h2o::ToolSyntax::Mistral, h2o::ToolSyntax::Json};

const std::vector<h2o::ToolFunction> &fixed_tools() {
    static const std::vector<h2o::ToolFunction> tools = [] {
        std::vector<h2o::ToolFunction> t;
        const h2o::Status st = h2o::parse_tools(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"a": {"type": "string"}}}}}])",
                                                &t);
        h2o_fuzz::check(st.ok(), "the fixed tool does not parse");
        return t;
    }();
    return tools;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const std::string_view text(reinterpret_cast<const char *>(data + 1), size - 1);
    switch (data[0] % 3) {
        case 0: {
            std::vector<h2o::ToolFunction> tools;
            if (!h2o::parse_tools(text, &tools).ok() || tools.empty()) return 0;
            for (h2o::ToolSyntax syntax : kSyntaxes) {
                for (h2o::ToolChoice choice : {h2o::ToolChoice::Auto, h2o::ToolChoice::Required, h2o::ToolChoice::Named}) {
                    std::string gbnf;
                    if (!h2o::tool_call_grammar(syntax, tools, choice, tools[0].name, true, &gbnf).ok()) continue;
                    h2o::Grammar grammar;
                    h2o_fuzz::check(h2o::parse_grammar(gbnf, &grammar).ok(), "a tool-call grammar does not parse");
                }
            }
            return 0;
        }
        case 1: {
            std::vector<h2o::ToolMessage> messages;
            if (!h2o::parse_tool_messages(text, &messages).ok()) return 0;
            std::vector<std::pair<std::string, std::string>> lowered;
            for (h2o::ToolSyntax syntax : kSyntaxes) {
                if (h2o::lower_tool_conversation(syntax, fixed_tools(), messages, &lowered).ok())
                    h2o_fuzz::check(messages.empty() || !lowered.empty(), "the conversation was lost");
            }
            return 0;
        }
        default: {
            for (h2o::ToolSyntax syntax : kSyntaxes) {
                std::string content;
                std::vector<h2o::ToolCall> calls;
                h2o::tool_reply_kind(syntax, text);
                if (!h2o::parse_tool_reply(syntax, text, 1, &content, &calls).ok() || calls.empty()) continue;
                if (syntax == h2o::ToolSyntax::Llama3 && calls.size() > 1) continue;
                // The calls written again are the reply, up to the white space after it.
                std::vector<h2o::ToolMessage> messages = {{"user", "u", {}, ""}, {"assistant", "", calls, ""}};
                std::vector<std::pair<std::string, std::string>> lowered;
                h2o_fuzz::check(h2o::lower_tool_conversation(syntax, {}, messages, &lowered).ok(), "calls read back cannot be written");
                h2o_fuzz::check(text.starts_with(lowered.back().second), "calls read back are written otherwise");
            }
            return 0;
        }
    }
}
