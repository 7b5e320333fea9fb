#include "chat_format.h"

namespace h2o {

namespace {

constexpr const char *kFormatNames = "llama2, zephyr, chatml, llama3, phi3, mistral, gemma";

Status bad_role(std::string_view role, size_t index) {
    return make_error(H2O_ERR_INVALID_ARGUMENT,
                      "message " + std::to_string(index) + " has role '" + std::string(role) + "' (known: system, user, assistant)");
}

bool known_role(std::string_view role) { return role == "system" || role == "user" || role == "assistant"; }

// The turns tool calls add: Llama 3's results are "ipython" turns; Mistral's tools, calls and
// results are blocks outside its [INST] turns, written as given.
bool tool_role(ChatFormat format, std::string_view role) {
    if (format == ChatFormat::Llama3) return role == "ipython";
    return format == ChatFormat::Mistral && (role == "available_tools" || role == "tool_calls" || role == "tool_results");
}

// Leading and trailing whitespace removed, as Llama-2's template does with .strip().
std::string_view strip(std::string_view s) {
    const char *space = " \t\n\r\f\v";
    const size_t begin = s.find_first_not_of(space);
    if (begin == std::string_view::npos) return {};
    return s.substr(begin, s.find_last_not_of(space) - begin + 1);
}

// Whether the conversation has user and assistant turns in turn after an optional first system
// message, as the llama2 and gemma templates require; *first: the first turn's message.
Status check_alternating_turns(const std::vector<ChatMessage> &messages, const char *format, size_t *first) {
    *first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
    for (size_t i = *first; i < messages.size(); ++i) {
        const bool user_turn = (i - *first) % 2 == 0;
        if (messages[i].role != (user_turn ? "user" : "assistant")) {
            return make_error(H2O_ERR_INVALID_ARGUMENT, "message " + std::to_string(i) + " has role '" + std::string(messages[i].role) +
                                                            "': the " + format +
                                                            " format needs user and assistant turns in turn, "
                                                            "after an optional first system message");
        }
    }
    return Status::Ok();
}

// Llama-2 chat: "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>" and
// "<s>[INST] {user} [/INST]" for each later exchange; the system message goes inside the first
// user turn. The template has no separate assistant prefix: a prompt ends with " [/INST]".
Status format_llama2(const std::vector<ChatMessage> &messages, std::string_view bos, std::string_view eos, std::string *out) {
    size_t first = 0;
    H2O_TRY(check_alternating_turns(messages, "llama2", &first));
    std::string system = first == 0 ? "" : "<<SYS>>\n" + std::string(strip(messages[0].content)) + "\n<</SYS>>\n\n";
    for (size_t i = first; i < messages.size(); ++i) {
        if ((i - first) % 2 == 0) {
            out->append(bos).append("[INST] ").append(system).append(strip(messages[i].content)).append(" [/INST]");
            system.clear();
        } else {
            out->append(" ").append(strip(messages[i].content)).append(" ").append(eos);
        }
    }
    return Status::Ok();
}

// Gemma 2 and 3: "<start_of_turn>{user|model}\n{content, trimmed}<end_of_turn>\n" per message;
// a system message opens the first user turn, followed by a blank line; the reply opens with
// "<start_of_turn>model\n". The template's BOS is left to the tokenizer.
Status format_gemma(const std::vector<ChatMessage> &messages, bool add_assistant_prefix, std::string *out) {
    size_t first = 0;
    H2O_TRY(check_alternating_turns(messages, "gemma", &first));
    std::string system = first == 0 ? "" : std::string(messages[0].content) + "\n\n";
    for (size_t i = first; i < messages.size(); ++i) {
        out->append("<start_of_turn>").append((i - first) % 2 == 0 ? "user" : "model").append("\n");
        out->append(system).append(strip(messages[i].content)).append("<end_of_turn>\n");
        system.clear();
    }
    if (add_assistant_prefix) out->append("<start_of_turn>model\n");
    return Status::Ok();
}

// Mistral Instruct (v0.2, v0.3): "[INST] {user}[/INST] {assistant, trimmed}</s>" per exchange;
// a system message opens the next user turn, followed by a blank line. Consecutive user or system
// messages share one [INST] turn, as Mistral's own templates write them; the model's BOS is the
// tokenizer's, added once at the start of a session.
void format_mistral(const std::vector<ChatMessage> &messages, std::string_view eos, std::string *out) {
    bool in_turn = false;
    for (const ChatMessage &m : messages) {
        if (m.role == "available_tools" || m.role == "tool_results" || m.role == "tool_calls") {
            out->append(m.content);  // tool_calls: the assistant's turn, ended as any
            if (m.role == "tool_calls") out->append(eos);
            in_turn = false;
            continue;
        }
        if (!in_turn && m.role != "assistant") {
            out->append("[INST] ");
            in_turn = true;
        }
        if (m.role == "system") {
            out->append(m.content).append("\n\n");
        } else if (m.role == "user") {
            out->append(m.content).append("[/INST]");
        } else {
            out->append(" ").append(strip(m.content)).append(eos);
            in_turn = false;
        }
    }
}

}  // namespace

Status chat_format_from_name(std::string_view name, ChatFormat *out) {
    if (name == "llama2")
        *out = ChatFormat::Llama2;
    else if (name == "zephyr")
        *out = ChatFormat::Zephyr;
    else if (name == "chatml")
        *out = ChatFormat::ChatML;
    else if (name == "llama3")
        *out = ChatFormat::Llama3;
    else if (name == "phi3")
        *out = ChatFormat::Phi3;
    else if (name == "mistral")
        *out = ChatFormat::Mistral;
    else if (name == "gemma")
        *out = ChatFormat::Gemma;
    else
        return make_error(H2O_ERR_INVALID_ARGUMENT, "unknown chat format '" + std::string(name) + "' (known: " + kFormatNames + ")");
    return Status::Ok();
}

const char *chat_format_name(ChatFormat format) {
    switch (format) {
        case ChatFormat::Llama2:
            return "llama2";
        case ChatFormat::Zephyr:
            return "zephyr";
        case ChatFormat::ChatML:
            return "chatml";
        case ChatFormat::Llama3:
            return "llama3";
        case ChatFormat::Phi3:
            return "phi3";
        case ChatFormat::Mistral:
            return "mistral";
        case ChatFormat::Gemma:
            return "gemma";
    }
    return "unknown";  // unreachable: every enumerator has its case
}

Status chat_format_from_template(std::string_view chat_template, ChatFormat *out) {
    if (chat_template.empty()) {
        return make_error(H2O_ERR_UNSUPPORTED,
                          std::string("the model has no chat template (tokenizer.chat_template): name a format (") + kFormatNames + ")");
    }
    // Each format's template spells out its own markers.
    if (chat_template.find("<|start_header_id|>") != std::string_view::npos)
        *out = ChatFormat::Llama3;
    else if (chat_template.find("<start_of_turn>") != std::string_view::npos)
        *out = ChatFormat::Gemma;
    else if (chat_template.find("<|im_start|>") != std::string_view::npos)
        *out = ChatFormat::ChatML;
    else if (chat_template.find("<|assistant|>") != std::string_view::npos && chat_template.find("<|end|>") != std::string_view::npos)
        *out = ChatFormat::Phi3;  // Phi-3's turns end with <|end|>, Zephyr's with </s>
    else if (chat_template.find("<|user|>") != std::string_view::npos)
        *out = ChatFormat::Zephyr;
    else if (chat_template.find("<<SYS>>") != std::string_view::npos)
        *out = ChatFormat::Llama2;  // Llama-2's [INST] turns, with its system block
    else if (chat_template.find("[INST]") != std::string_view::npos)
        *out = ChatFormat::Mistral;
    else
        return make_error(H2O_ERR_UNSUPPORTED,
                          std::string("the model's chat template is not one of the known formats (") + kFormatNames + "): name one");
    return Status::Ok();
}

Status format_chat(ChatFormat format, const std::vector<ChatMessage> &messages, bool add_assistant_prefix, std::string_view bos,
                   std::string_view eos, std::string *out) {
    out->clear();
    for (size_t i = 0; i < messages.size(); ++i) {
        if (!known_role(messages[i].role) && !tool_role(format, messages[i].role)) return bad_role(messages[i].role, i);
    }
    switch (format) {
        case ChatFormat::Llama2:
            return format_llama2(messages, bos, eos, out);
        case ChatFormat::Zephyr:
            // "<|{role}|>\n{content}</s>\n" per message; the reply opens with "<|assistant|>\n".
            for (const ChatMessage &m : messages)
                out->append("<|").append(m.role).append("|>\n").append(m.content).append(eos).append("\n");
            if (add_assistant_prefix) out->append("<|assistant|>\n");
            return Status::Ok();
        case ChatFormat::ChatML:
            // "<|im_start|>{role}\n{content}<|im_end|>\n" per message; the reply opens with
            // "<|im_start|>assistant\n".
            for (const ChatMessage &m : messages)
                out->append("<|im_start|>").append(m.role).append("\n").append(m.content).append("<|im_end|>\n");
            if (add_assistant_prefix) out->append("<|im_start|>assistant\n");
            return Status::Ok();
        case ChatFormat::Phi3:
            // "<|{role}|>\n{content}<|end|>\n" per message; the reply opens with "<|assistant|>\n"
            // (Phi-3, Phi-3.5, Phi-4-mini).
            for (const ChatMessage &m : messages) out->append("<|").append(m.role).append("|>\n").append(m.content).append("<|end|>\n");
            if (add_assistant_prefix) out->append("<|assistant|>\n");
            return Status::Ok();
        case ChatFormat::Mistral:
            format_mistral(messages, eos, out);
            return Status::Ok();
        case ChatFormat::Gemma:
            return format_gemma(messages, add_assistant_prefix, out);
        case ChatFormat::Llama3:
            // "<|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>" per
            // message; the reply opens with "<|start_header_id|>assistant<|end_header_id|>\n\n".
            // The template's leading <|begin_of_text|> is left to the tokenizer, which adds the
            // model's BOS at the start of a session (once, not per message).
            for (const ChatMessage &m : messages) {
                out->append("<|start_header_id|>")
                    .append(m.role)
                    .append("<|end_header_id|>\n\n")
                    .append(strip(m.content))
                    .append("<|eot_id|>");
            }
            if (add_assistant_prefix) out->append("<|start_header_id|>assistant<|end_header_id|>\n\n");
            return Status::Ok();
    }
    return make_error(H2O_ERR_INTERNAL, "unknown chat format");
}

}  // namespace h2o
