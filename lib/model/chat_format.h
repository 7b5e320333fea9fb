// Chat formats: the text a chat model was trained to see for a conversation. Each format is
// written out by hand from the template its models ship (tokenizer.chat_template), and the format
// of a model is recognised from that template's marker strings.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "status.h"

namespace h2o {

enum class ChatFormat {
    Llama2,
    Zephyr,
    ChatML,
    Llama3,
    Phi3,
    Mistral,
    Gemma
};

struct ChatMessage {
    // "system", "user" or "assistant"; the tool turns: "ipython" (Llama 3), "available_tools",
    // "tool_calls", "tool_results" (Mistral)
    std::string_view role;
    std::string_view content;
};

// The format named "llama2", "zephyr", "chatml", "llama3", "phi3", "mistral" or "gemma";
// H2O_ERR_INVALID_ARGUMENT otherwise.
Status chat_format_from_name(std::string_view name, ChatFormat *out);
// The name chat_format_from_name takes for a format.
const char *chat_format_name(ChatFormat format);
// The format a chat template (Jinja text from GGUF metadata) describes; H2O_ERR_UNSUPPORTED when
// it is none of the known ones, or the template is empty.
Status chat_format_from_template(std::string_view chat_template, ChatFormat *out);

// Writes the conversation in `format`. bos/eos: the vocabulary's pieces ("<s>", "</s>"), which
// Llama-2, Zephyr and Mistral write as text (tokenize with special-token parsing to get the tokens).
// add_assistant_prefix: end with what opens the assistant's reply. Errors: an unknown role, or
// a Llama-2 or Gemma conversation whose turns do not alternate user/assistant after an optional system
// message, or such a Gemma conversation (H2O_ERR_INVALID_ARGUMENT).
Status format_chat(ChatFormat format, const std::vector<ChatMessage> &messages, bool add_assistant_prefix, std::string_view bos,
                   std::string_view eos, std::string *out);

}  // namespace h2o
