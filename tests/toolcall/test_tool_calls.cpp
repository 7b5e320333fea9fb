// Tool calls (lib/toolcall): the prompts of each syntax (Qwen3's own template as the golden), the
// grammar of a call over every tool, replies read back, and generation through the C API.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "chat_format.h"
#include "grammar.h"
#include "grammar_matcher.h"
#include "h2o/h2o.h"
#include "json_value.h"
#include "test_util.h"
#include "tool_calls.h"

using namespace h2o;

namespace {

std::string golden(const std::string &name) {
    return h2o_test::read_text_file(std::string(H2O_TEST_SOURCE_DIR) + "/toolcall/goldens/" + name);
}

std::vector<ToolFunction> golden_tools() {
    std::vector<ToolFunction> tools;
    const Status st = parse_tools(golden("tools.json"), &tools);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return tools;
}

// The golden conversation `name`, written in `format` with its syntax. one_call: the first call of
// each message only (Llama 3 makes one per turn).
std::string written(ChatFormat format, const std::string &name, const std::vector<ToolFunction> &tools, bool one_call = false) {
    JsonValue all;
    REQUIRE(parse_json(golden("conversations.json"), "conversations", &all).ok());
    const JsonValue *conversation = all.find(name);
    REQUIRE(conversation != nullptr);
    std::vector<ToolMessage> messages;
    const Status st = parse_tool_messages(json_text(*conversation), &messages);
    REQUIRE_MESSAGE(st.ok(), st.message);
    for (ToolMessage &m : messages) {
        if (one_call && m.tool_calls.size() > 1) m.tool_calls.resize(1);
    }
    std::vector<std::pair<std::string, std::string>> lowered;
    const Status lowered_status = lower_tool_conversation(tool_syntax_for(format, false), tools, messages, &lowered);
    REQUIRE_MESSAGE(lowered_status.ok(), lowered_status.message);
    std::vector<ChatMessage> list;
    for (const auto &[role, content] : lowered) list.push_back({role, content});
    std::string out;
    const Status f = format_chat(format, list, true, "<s>", "</s>", &out);
    REQUIRE_MESSAGE(f.ok(), f.message);
    return out;
}

// Token b is the byte b, then end-of-generation (256).
std::shared_ptr<const TokenSurfaces> byte_vocab() {
    std::vector<std::string> texts;
    std::vector<uint8_t> kinds;
    for (int b = 0; b < 256; ++b) {
        texts.emplace_back(1, static_cast<char>(b));
        kinds.push_back(TokenSurfaces::kText);
    }
    texts.emplace_back();
    kinds.push_back(TokenSurfaces::kEndOfGeneration);
    return TokenSurfaces::from_texts(std::move(texts), std::move(kinds));
}

// Whether the grammar takes `text` whole and may end after it.
bool grammar_takes(const std::string &grammar, const std::string &text) {
    auto g = std::make_shared<Grammar>();
    const Status st = parse_grammar(grammar, g.get());
    REQUIRE_MESSAGE(st.ok(), st.message);
    GrammarMatcher m(g, byte_vocab());
    for (char c : text) {
        const auto t = static_cast<int32_t>(static_cast<unsigned char>(c));
        if (!m.allows(t) || !m.accept(t).ok()) return false;
    }
    return m.allows(256);
}

std::string grammar_for(ToolSyntax syntax, const std::vector<ToolFunction> &tools, ToolChoice choice, const std::string &name = "",
                        bool parallel = true) {
    std::string g;
    const Status st = tool_call_grammar(syntax, tools, choice, name, parallel, &g);
    REQUIRE_MESSAGE(st.ok(), st.message);
    return g;
}

}  // namespace

TEST_CASE("tool calls: ChatML prompts with tools, calls and results are Qwen3's template's, byte for byte") {
    const auto tools = golden_tools();
    CHECK(written(ChatFormat::ChatML, "qwen3_tools_first_turn", tools) == golden("qwen3_tools_first_turn.txt"));
    CHECK(written(ChatFormat::ChatML, "qwen3_tools_after_results", tools) == golden("qwen3_tools_after_results.txt"));
}

TEST_CASE("tool calls: Llama 3 and the plain-JSON syntax write the tools, one call and the results where their turns go") {
    const auto tools = golden_tools();
    const std::string llama = written(ChatFormat::Llama3, "qwen3_tools_after_results", tools, true);
    CHECK(llama.starts_with("<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython<|eot_id|>"));
    CHECK(llama.find("<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions") != std::string::npos);
    CHECK(llama.find("{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\"") != std::string::npos);
    CHECK(llama.find("<|start_header_id|>ipython<|end_header_id|>\n\n{\"temp\": 21}<|eot_id|>") != std::string::npos);
    CHECK(llama.find("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": "
                     "\"Paris\"}}<|eot_id|>") != std::string::npos);
    // Two calls in one message: Llama 3 makes one per turn, and says so.
    JsonValue all;
    REQUIRE(parse_json(golden("conversations.json"), "conversations", &all).ok());
    std::vector<ToolMessage> messages;
    REQUIRE(parse_tool_messages(json_text(*all.find("qwen3_tools_after_results")), &messages).ok());
    std::vector<std::pair<std::string, std::string>> lowered;
    CHECK(lower_tool_conversation(ToolSyntax::Llama3, tools, messages, &lowered).message.find("one tool call per turn") !=
          std::string::npos);

    const std::string gemma = written(ChatFormat::Gemma, "qwen3_tools_first_turn", tools);
    CHECK(gemma.find("You can call these tools") != std::string::npos);
    const std::string mistral = written(ChatFormat::Mistral, "qwen3_tools_after_results", tools);
    CHECK(mistral.find(" {\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", "
                       "\"arguments\": {}}]}</s>[INST] The result of get_weather, call call_1:\n{\"temp\": 21}\n\nThe result of get_time, "
                       "call call_2:\n14:05[/INST]") != std::string::npos);
}

TEST_CASE("tool calls: Mistral's tools, calls and results are its v0.3 template's blocks, outside the [INST] turns") {
    const auto tools = golden_tools();
    std::vector<ToolMessage> messages;
    REQUIRE(parse_tool_messages(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "abcDEF123", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temp\": 21}"}])",
                                &messages)
                .ok());
    std::vector<std::pair<std::string, std::string>> lowered;
    REQUIRE(lower_tool_conversation(ToolSyntax::Mistral, tools, messages, &lowered).ok());
    std::vector<ChatMessage> list;
    for (const auto &[role, content] : lowered) list.push_back({role, content});
    std::string out;
    REQUIRE(format_chat(ChatFormat::Mistral, list, true, "<s>", "</s>", &out).ok());
    std::string definitions;
    for (const ToolFunction &t : tools) definitions += (definitions.empty() ? "" : ", ") + python_json(t.definition);
    CHECK(out == "[AVAILABLE_TOOLS] [" + definitions +
                     "][/AVAILABLE_TOOLS][INST] Be brief.\n\nWeather in Paris?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", "
                     "\"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcDEF123\"}]</s>[TOOL_RESULTS] {\"content\": {\"temp\": 21}, "
                     "\"call_id\": \"abcDEF123\"}[/TOOL_RESULTS]");
    messages[3].tool_call_id = "a\"}[/TOOL_RESULTS]";  // would close the block early
    CHECK(lower_tool_conversation(ToolSyntax::Mistral, tools, messages, &lowered).message.find("messages[3]") != std::string::npos);
    messages[2].tool_calls[0].id = "call_1";
    CHECK(lower_tool_conversation(ToolSyntax::Mistral, tools, messages, &lowered).message.find("9 letters and digits") !=
          std::string::npos);
    // A reply that is only the opening token, or breaks off after it, is not read past its end.
    for (const char *cut : {"[TOOL_CALLS]", "[TOOL_CALLS] ", "[TOOL_CALLS] [{\"name\": \"get_weather\""}) {
        std::string content;
        std::vector<ToolCall> calls;
        CHECK(parse_tool_reply(ToolSyntax::Mistral, cut, 1, &content, &calls).code == H2O_ERR_INVALID_ARGUMENT);
    }
    CHECK(tool_syntax_for(ChatFormat::Mistral, true) == ToolSyntax::Mistral);
    CHECK(tool_syntax_for(ChatFormat::Mistral, false) == ToolSyntax::Json);  // older Mistrals have no [TOOL_CALLS]
}

TEST_CASE("tool calls: every syntax's grammar takes the calls it writes, and its replies read back to the same calls") {
    const auto tools = golden_tools();
    // Ids of 9 letters and digits, as Mistral's are (the other syntaxes write none).
    const std::vector<ToolCall> calls = {{"abcDEF123", "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}"},
                                         {"xyz789ABC", "get_time", "{}"}};
    for (ToolSyntax syntax : {ToolSyntax::Hermes, ToolSyntax::Llama3, ToolSyntax::Mistral, ToolSyntax::Json}) {
        CAPTURE(tool_syntax_name(syntax));
        std::vector<ToolMessage> messages = {{"user", "hi", {}, ""}, {"assistant", "", calls, ""}};
        if (syntax == ToolSyntax::Llama3) messages[1].tool_calls.pop_back();
        std::vector<std::pair<std::string, std::string>> lowered;
        REQUIRE(lower_tool_conversation(syntax, tools, messages, &lowered).ok());
        const std::string reply = lowered.back().second;
        for (ToolChoice choice : {ToolChoice::Auto, ToolChoice::Required}) CHECK(grammar_takes(grammar_for(syntax, tools, choice), reply));
        CHECK_FALSE(grammar_takes(grammar_for(syntax, tools, ToolChoice::Named, "get_time"), reply));
        CHECK(grammar_takes(grammar_for(syntax, tools, ToolChoice::Auto), "It is sunny."));
        CHECK(grammar_takes(grammar_for(syntax, tools, ToolChoice::Auto), ""));
        CHECK_FALSE(grammar_takes(grammar_for(syntax, tools, ToolChoice::Required), "It is sunny."));
        // Arguments outside a tool's schema: a missing required city, an unknown unit.
        std::string bad = reply;
        bad.replace(bad.find("\"city\": \"Paris\", "), std::strlen("\"city\": \"Paris\", "), "");
        CHECK_FALSE(grammar_takes(grammar_for(syntax, tools, ToolChoice::Required), bad));
        CHECK_FALSE(grammar_takes(grammar_for(syntax, tools, ToolChoice::Required),
                                  std::string(reply).replace(reply.find("celsius"), 7, "kelvin")));

        std::string content;
        std::vector<ToolCall> parsed;
        REQUIRE(parse_tool_reply(syntax, reply, 7, &content, &parsed).ok());
        REQUIRE(parsed.size() == messages[1].tool_calls.size());
        for (size_t i = 0; i < parsed.size(); ++i) {
            CHECK(parsed[i].name == calls[i].name);
            CHECK(parsed[i].arguments == calls[i].arguments);
            if (syntax == ToolSyntax::Mistral) {
                CHECK(parsed[i].id == calls[i].id);  // the model's own
            } else {
                CHECK(parsed[i].id.size() == 29);
                CHECK(parsed[i].id.starts_with("call_"));
            }
        }
        // The calls written again are the reply.
        messages[1].tool_calls = parsed;
        REQUIRE(lower_tool_conversation(syntax, tools, messages, &lowered).ok());
        CHECK(lowered.back().second == reply);
        std::vector<ToolCall> other;
        REQUIRE(parse_tool_reply(syntax, reply, 8, &content, &other).ok());
        if (syntax != ToolSyntax::Mistral) CHECK(other[0].id != parsed[0].id);  // another salt, another id
        // Text stays text; a broken call is an error naming the byte.
        REQUIRE(parse_tool_reply(syntax, "It is sunny.", 0, &content, &parsed).ok());
        CHECK(parsed.empty());
        CHECK(content == "It is sunny.");
        const Status broken = parse_tool_reply(syntax, reply.substr(0, reply.size() - 3), 0, &content, &parsed);
        CHECK(broken.code == H2O_ERR_INVALID_ARGUMENT);
        CHECK(broken.message.find("byte") != std::string::npos);
        CHECK(tool_reply_kind(syntax, reply.substr(0, 3)) == -1);
        CHECK(tool_reply_kind(syntax, reply) == 1);
        CHECK(tool_reply_kind(syntax, "Sunny") == 0);
    }
    // One call only when not parallel.
    const std::string two =
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
        "\"arguments\": {}}\n</tool_call>";
    CHECK(grammar_takes(grammar_for(ToolSyntax::Hermes, tools, ToolChoice::Required, "", true), two));
    CHECK_FALSE(grammar_takes(grammar_for(ToolSyntax::Hermes, tools, ToolChoice::Required, "", false), two));
}

TEST_CASE("tool calls: malformed tools, messages and choices are refused naming the field") {
    std::vector<ToolFunction> tools;
    auto tools_error = [&](const char *json) {
        const Status st = parse_tools(json, &tools);
        CHECK(st.code == H2O_ERR_INVALID_ARGUMENT);
        return st.message;
    };
    CHECK(tools_error("{}").find("array") != std::string::npos);
    CHECK(tools_error(R"([{"type": "retrieval"}])").find("tools[0].type") != std::string::npos);
    CHECK(tools_error(R"([{"type": "function", "function": {"name": "a b"}}])").find("tools[0].function.name") != std::string::npos);
    CHECK(tools_error(R"([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}])")
              .find("twice") != std::string::npos);
    CHECK(tools_error(R"([{"type": "function", "function": {"name": "a", "parameters": 3}}])").find("parameters") != std::string::npos);
    std::vector<ToolMessage> messages;
    auto messages_error = [&](const char *json) {
        const Status st = parse_tool_messages(json, &messages);
        CHECK(st.code == H2O_ERR_INVALID_ARGUMENT);
        return st.message;
    };
    CHECK(messages_error(R"([{"role": "robot", "content": "x"}])").find("messages[0].role") != std::string::npos);
    CHECK(messages_error(R"([{"role": "tool", "content": "x"}])").find("tool_call_id") != std::string::npos);
    CHECK(messages_error(R"([{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{"}}]}])")
              .find("messages[0].tool_calls[0].function.arguments") != std::string::npos);
    CHECK(messages_error(R"([{"role": "user", "tool_calls": []}])").find("assistant") != std::string::npos);
    REQUIRE(parse_tools(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "a+"}}}])", &tools)
                .ok());
    std::string g;
    const Status st = tool_call_grammar(ToolSyntax::Hermes, tools, ToolChoice::Required, "", true, &g);
    CHECK(st.message.find("tools[0] (f)") != std::string::npos);
    CHECK(st.message.find("pattern") != std::string::npos);
    CHECK(tool_call_grammar(ToolSyntax::Hermes, tools, ToolChoice::Named, "g", true, &g).message.find("'g'") != std::string::npos);
}

TEST_CASE("tool calls: through the C API, required calls sampled from a model always read back, and auto may answer in text") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    const std::string tools = golden("tools.json");
    const std::string messages = R"([{"role": "user", "content": "Weather in Paris?"}])";
    for (const std::string format_name : {"chatml", "llama3", "zephyr"}) {
        CAPTURE(format_name);
        const char *format = format_name.c_str();
        size_t n = 0;
        REQUIRE(h2o_chat_format_tools(model, format, messages.data(), messages.size(), tools.data(), tools.size(), 1, nullptr, 0, &n) ==
                H2O_ERR_BUFFER_TOO_SMALL);
        std::string prompt(n + 1, '\0');
        REQUIRE(h2o_chat_format_tools(model, format, messages.data(), messages.size(), tools.data(), tools.size(), 1, prompt.data(),
                                      prompt.size(), &n) == H2O_OK);
        prompt.resize(n);
        for (const std::string choice_name : {"required", "get_weather", "auto"}) {
            CAPTURE(choice_name);
            const char *choice = choice_name.c_str();
            // One call where a call is required (a tiny model would go on calling), any under auto.
            const int parallel = choice_name == "auto" ? 1 : 0;
            REQUIRE(h2o_tool_call_grammar(model, format, tools.data(), tools.size(), choice, parallel, nullptr, 0, &n) ==
                    H2O_ERR_BUFFER_TOO_SMALL);
            std::string grammar(n + 1, '\0');
            REQUIRE(h2o_tool_call_grammar(model, format, tools.data(), tools.size(), choice, parallel, grammar.data(), grammar.size(),
                                          &n) == H2O_OK);
            grammar.resize(n);
            size_t calls_seen = 0;
            for (uint64_t seed = 1; seed <= 6; ++seed) {
                h2o_session_params sp;
                h2o_session_params_init(&sp, sizeof sp);
                sp.backend = H2O_BACKEND_CPU;
                sp.n_threads = 1;
                sp.seed = seed;
                h2o_session *session = nullptr;
                REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
                REQUIRE(h2o_session_add_text(session, prompt.data(), prompt.size(), H2O_TEXT_SPECIAL) == H2O_OK);
                h2o_generate_params gen;
                h2o_generate_params_init(&gen, sizeof gen);
                gen.max_tokens = 200;
                gen.temperature = 1.0f;
                gen.grammar = grammar.data();
                gen.grammar_len = grammar.size();
                std::string reply;
                REQUIRE(h2o_generate(session, "", 0, &gen, h2o_test::append_text, &reply) == H2O_OK);
                h2o_generate_stats stats;
                stats.struct_size = sizeof stats;
                REQUIRE(h2o_session_get_stats(session, &stats) == H2O_OK);
                h2o_session_free(session);
                if (stats.stop_reason == H2O_STOP_MAX_TOKENS) continue;  // cut short: not a whole reply
                std::string json(4096, '\0');
                const h2o_status st = h2o_parse_tool_calls(model, format, reply.data(), reply.size(), seed, json.data(), json.size(), &n);
                REQUIRE_MESSAGE(st == H2O_OK, reply << ": " << h2o_last_error());
                json.resize(n);
                JsonValue parsed;
                REQUIRE(parse_json(json, "reply", &parsed).ok());
                const JsonValue *calls = parsed.find("tool_calls");
                REQUIRE(calls != nullptr);
                if (std::string(choice) != "auto") REQUIRE_MESSAGE(!calls->items.empty(), reply);
                for (const JsonValue &call : calls->items) {
                    const JsonValue *function = call.find("function");
                    JsonValue arguments;
                    REQUIRE(parse_json(function->find("arguments")->text, "arguments", &arguments).ok());
                    if (function->find("name")->text == "get_weather") CHECK(arguments.find("city") != nullptr);
                    if (std::string(choice) == "get_weather") CHECK(function->find("name")->text == "get_weather");
                    ++calls_seen;
                }
            }
            if (std::string(choice) != "auto") CHECK(calls_seen > 0);
        }
    }
    int kind = 5;
    CHECK(h2o_tool_reply_kind(model, "chatml", "<tool", 5, &kind) == H2O_OK);
    CHECK(kind == -1);
    size_t n = 0;
    CHECK(h2o_parse_tool_calls(model, "chatml", "<tool_call>\n{", 13, 0, nullptr, 0, &n) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_chat_format_tools(nullptr, "chatml", "[]", 2, nullptr, 0, 1, nullptr, 0, &n) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_tool_call_grammar(model, "chatml", tools.data(), tools.size(), nullptr, 1, nullptr, 0, &n) == H2O_ERR_INVALID_ARGUMENT);
    h2o_model_free(model);
}
