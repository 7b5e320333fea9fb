#include "chat_turn.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <vector>

namespace h2o_server {

namespace {

ApiError library_error(const std::string &what, const char *message) {
    return ApiError{500, "server_error", what + ": " + message, "", ""};
}

constexpr std::chrono::milliseconds kComputeSlice{30};

size_t common_prefix(const std::string &a, const std::string &b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

std::string trim(const std::string &text) {
    const size_t begin = text.find_first_not_of(" \t\r\n");
    if (begin == std::string::npos) return "";
    return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

}  // namespace

namespace {

// A library call that writes text (h2o_chat_format and its kind): asked for the size, then called.
template <typename Call>
h2o_status written_text(const Call &call, std::string *out) {
    size_t needed = 0;
    h2o_status st = call(nullptr, 0, &needed);
    if (st == H2O_ERR_BUFFER_TOO_SMALL || st == H2O_OK) {
        out->assign(needed + 1, '\0');
        st = call(out->data(), out->size(), &needed);
        out->resize(needed);
    }
    return st;
}

// The messages as OpenAI's JSON, for h2o_chat_format_tools.
std::string messages_json(const std::vector<Message> &messages, size_t count) {
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < count; ++i) {
        const Message &m = messages[i];
        nlohmann::json item = {{"role", m.role}, {"content", m.content}};
        if (!m.tool_calls.empty()) item["tool_calls"] = nlohmann::json::parse(m.tool_calls);
        if (!m.tool_call_id.empty()) item["tool_call_id"] = m.tool_call_id;
        list.push_back(std::move(item));
    }
    return dump(list);
}

}  // namespace

std::optional<ApiError> format_conversation(const TurnContext &context, const std::vector<Message> &messages, size_t count, bool open_reply,
                                            const std::string &tools, std::string *out) {
    const char *format = context.chat_format.empty() ? nullptr : context.chat_format.c_str();
    const int open = open_reply ? 1 : 0;
    bool plain = tools.empty();
    for (size_t i = 0; i < count; ++i) plain = plain && messages[i].tool_calls.empty() && messages[i].role != "tool";
    h2o_status st;
    if (plain) {
        std::vector<h2o_chat_message> list(count);
        for (size_t i = 0; i < count; ++i) {
            list[i].role = messages[i].role.data();
            list[i].role_len = messages[i].role.size();
            list[i].content = messages[i].content.data();
            list[i].content_len = messages[i].content.size();
        }
        st = written_text([&](char *text, size_t capacity,
                              size_t *n) { return h2o_chat_format(context.model, format, list.data(), count, open, text, capacity, n); },
                          out);
    } else {
        const std::string json = messages_json(messages, count);
        st = written_text(
            [&](char *text, size_t capacity, size_t *n) {
                return h2o_chat_format_tools(context.model, format, json.data(), json.size(), tools.data(), tools.size(), open, text,
                                             capacity, n);
            },
            out);
    }
    if (st == H2O_ERR_INVALID_ARGUMENT) {
        const std::string message = h2o_last_error();
        return bad_request("the chat format refuses the messages: " + message, message.rfind("tools", 0) == 0 ? "tools" : "messages");
    }
    if (st != H2O_OK) return library_error("cannot format the conversation", h2o_last_error());
    return std::nullopt;
}

std::optional<ApiError> ChatTurn::start(const TurnContext &context, const ChatRequest &request, std::unique_ptr<ChatTurn> *out) {
    std::vector<Digest> prefixes{empty_history()};
    for (const Message &m : request.messages) prefixes.push_back(extend_history(prefixes.back(), m.role, m.digest_content()));
    std::unique_ptr<Lease> lease;
    if (auto error = context.store->acquire(request.conversation_id, prefixes, &lease)) return error;
    std::unique_ptr<ChatTurn> turn(new ChatTurn(context, std::move(lease)));
    turn->arrival_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    turn->named_ = !request.conversation_id.empty();
    turn->messages_ = request.messages;
    turn->tools_ = request.tools;
    turn->tool_choice_ = request.tool_choice;
    turn->history_ = prefixes.back();
    // prefixes[k] is checked against what the session holds.
    const HistoryRecord held = turn->lease_->conversation().record;
    const bool continues = held.known && held.n_messages < prefixes.size() - 1 && prefixes[held.n_messages] == held.history;
    if (auto error = format_conversation(context, turn->messages_, turn->messages_.size(), true, turn->tools_, &turn->formatted_))
        return error;
    std::string held_text;
    if (continues && held.n_messages > 0) {
        if (auto error = format_conversation(context, turn->messages_, held.n_messages, false, turn->tools_, &held_text)) return error;
    }
    h2o_session *session = turn->lease_->session();
    const bool fresh = !continues || held.n_messages == 0 || turn->formatted_.compare(0, held_text.size(), held_text) != 0;
    turn->held_messages_ = fresh ? 0 : held.n_messages;
    turn->held_bytes_ = fresh ? 0 : held_text.size();
    // From here until the turn is committed, the session holds text no record describes.
    turn->touched_ = true;
    if (fresh && (held.n_messages > 0 || !held.known)) {
        if (h2o_session_reset(session) != H2O_OK) return library_error("cannot reset the session", h2o_session_last_error(session));
    }
    if (auto error = turn->process_prompt(request)) return error;
    *out = std::move(turn);
    return std::nullopt;
}

namespace {

h2o_kv_usage kv_usage(const h2o_session *session) {
    h2o_kv_usage usage{};
    usage.struct_size = sizeof usage;
    h2o_session_get_kv_usage(session, &usage);
    return usage;
}

uint64_t evicted_tokens(const h2o_session *session) { return kv_usage(session).n_evicted; }

}  // namespace

std::optional<ApiError> ChatTurn::process_prompt(const ChatRequest &request) {
    h2o_session *session = lease_->session();
    evicted_before_ = evicted_tokens(session);
    std::string rest = formatted_;
    if (held_messages_ > 0) {
        rest = formatted_.substr(held_bytes_);  // the session holds what comes before
    } else if (messages_.front().role == "system") {
        // A new conversation pins its system message: eviction never drops the instructions.
        std::string system_text;
        if (auto error = format_conversation(context_, messages_, 1, false, tools_, &system_text)) return error;
        const std::string pinned = formatted_.substr(0, common_prefix(system_text, formatted_));
        h2o_status st = H2O_OK;
        if (!pinned.empty()) {
            ComputeGate::Hold hold(*context_.gate);
            st = h2o_session_add_text(session, pinned.data(), pinned.size(), H2O_TEXT_PIN | H2O_TEXT_SPECIAL);
        }
        if (st == H2O_ERR_INVALID_ARGUMENT) {
            return bad_request(std::string("the system message cannot be pinned: ") + h2o_session_last_error(session) +
                                   " (a larger --kv-budget pins more)",
                               "messages[0]");
        }
        if (st != H2O_OK) return library_error("cannot process the system message", h2o_session_last_error(session));
        rest = formatted_.substr(pinned.size());
    }
    if (request.seed && h2o_session_set_seed(session, *request.seed) != H2O_OK)
        return library_error("cannot seed the sampler", h2o_session_last_error(session));

    h2o_generate_params gen = context_.defaults;
    if (request.max_tokens) gen.max_tokens = request.max_tokens;
    if (request.temperature) gen.temperature = *request.temperature;
    if (request.top_p) gen.top_p = *request.top_p;
    std::vector<const char *> stops;
    for (const std::string &s : request.stop) stops.push_back(s.c_str());
    gen.stop_strings = stops.empty() ? nullptr : stops.data();
    gen.n_stop_strings = stops.size();
    if (!request.json_schema.empty()) {
        gen.json_schema = request.json_schema.data();
        gen.json_schema_len = request.json_schema.size();
    }
    std::vector<int32_t> bias_tokens;
    std::vector<float> bias_values;
    for (const auto &[token, bias] : request.logit_bias) {
        bias_tokens.push_back(token);
        bias_values.push_back(bias);
    }
    std::string tool_grammar;
    if (!tools_.empty() && tool_choice_ != "none") {
        const char *format = context_.chat_format.empty() ? nullptr : context_.chat_format.c_str();
        const h2o_status gst = written_text(
            [&](char *text, size_t capacity, size_t *n) {
                return h2o_tool_call_grammar(context_.model, format, tools_.data(), tools_.size(), tool_choice_.c_str(),
                                             request.parallel_tool_calls ? 1 : 0, text, capacity, n);
            },
            &tool_grammar);
        if (gst == H2O_ERR_INVALID_ARGUMENT) {
            const std::string message = h2o_last_error();
            return bad_request(message, message.find("tool_choice") != std::string::npos ? "tool_choice" : "tools");
        }
        if (gst != H2O_OK) return library_error("cannot make the tool calls' grammar", h2o_last_error());
        gen.grammar = tool_grammar.data();
        gen.grammar_len = tool_grammar.size();
    }
    gen.logit_bias_tokens = bias_tokens.data();
    gen.logit_bias_values = bias_values.data();
    gen.n_logit_bias = bias_tokens.size();
    h2o_status st;
    {
        ComputeGate::Hold hold(*context_.gate);
        st = h2o_generate_begin(session, rest.data(), rest.size(), &gen);
    }
    if (st != H2O_OK) {
        const std::string message = h2o_session_last_error(session);
        if (st == H2O_ERR_CONTEXT_FULL) return ApiError{400, "invalid_request_error", message, "messages", "context_length_exceeded"};
        if (st == H2O_ERR_INVALID_TEXT) return bad_request(message, "messages");
        // What the library refuses of the request's own settings: a schema it cannot enforce, a
        // token outside the vocabulary.
        if (st == H2O_ERR_INVALID_ARGUMENT && message.find("json schema") != std::string::npos)
            return bad_request(message, "response_format");
        if (st == H2O_ERR_INVALID_ARGUMENT && message.find("logit_bias") != std::string::npos) return bad_request(message, "logit_bias");
        return library_error("cannot process the messages", message.c_str());
    }
    h2o_generate_stats stats;
    stats.struct_size = sizeof stats;
    h2o_session_get_stats(session, &stats);
    usage_.prompt_tokens = stats.n_past;
    // A continued conversation processed only its new messages (a new one: all of them, unless
    // the model's prefix cache had its system message; /health counts those hits).
    if (held_messages_ > 0) usage_.cached_tokens = stats.n_past - stats.n_prompt_tokens;
    return std::nullopt;
}

TurnOutcome ChatTurn::generate(const PieceSink &client_sink) {
    TurnOutcome outcome;
    h2o_session *session = lease_->session();
    // With tools, the text waits while it may still open a call (h2o_tool_reply_kind), and a
    // call's text is never sent as content.
    const bool may_call = !tools_.empty() && tool_choice_ != "none";
    const char *format = context_.chat_format.empty() ? nullptr : context_.chat_format.c_str();
    int kind = may_call ? -1 : 0;
    std::string held;
    const PieceSink sink = [&](const std::string &piece) {
        if (kind == 0) return client_sink(piece);
        held += piece;
        if (kind == -1 && h2o_tool_reply_kind(context_.model, format, held.data(), held.size(), &kind) != H2O_OK) kind = 0;
        if (kind != 0) return true;
        const std::string text = std::move(held);
        held.clear();
        return client_sink(text);
    };
    uint32_t reason = H2O_STOP_NONE;
    bool client_gone = false;
    // The compute is taken for slices of kComputeSlice rather than token by token (8 streams on
    // a 0.5B model switching every token measured 15% slower than one stream), and the pieces
    // of a slice go to the client after it is released: a slow client never holds the others up.
    h2o_status st = H2O_OK;
    std::vector<std::string> pieces;
    while (st == H2O_OK && reason == H2O_STOP_NONE && !client_gone) {
        pieces.clear();
        {
            ComputeGate::Hold hold(*context_.gate);
            const auto slice_end = std::chrono::steady_clock::now() + kComputeSlice;
            do {
                const char *text = nullptr;
                size_t length = 0;
                st = h2o_generate_next(session, &text, &length, &reason);
                if (st == H2O_OK && length > 0) pieces.emplace_back(text, length);
            } while (st == H2O_OK && reason == H2O_STOP_NONE && std::chrono::steady_clock::now() < slice_end);
        }
        for (const std::string &piece : pieces) {
            if (!sink(piece)) {
                client_gone = true;
                break;
            }
            outcome.text += piece;
        }
    }
    if (st != H2O_OK && st != H2O_ERR_CANCELLED) outcome.error = library_error("generation failed", h2o_session_last_error(session));
    if (client_gone && reason == H2O_STOP_NONE) {
        // The client is gone: the cancel ends the pull-style generation here.
        h2o_session_cancel(session);
        const char *text = nullptr;
        size_t length = 0;
        h2o_generate_next(session, &text, &length, &reason);
    }
    h2o_generate_stats stats;
    stats.struct_size = sizeof stats;
    h2o_session_get_stats(session, &stats);
    usage_.completion_tokens = stats.n_generated_tokens;
    if (!client_gone && !outcome.error) {
        if (reason == H2O_STOP_MAX_TOKENS)
            outcome.finish_reason = "length";
        else if (reason != H2O_STOP_NONE)
            outcome.finish_reason = "stop";
        if (may_call) read_tool_calls(&outcome);
        // What was held back and is not a call is text after all (a reply cut short mid-call).
        if (outcome.tool_calls.empty() && !held.empty()) client_gone = !client_sink(held);
    }
    // The turn is closed with the text delivered, whatever ended it, so that the record and the
    // session agree; the client may send it back or not (then the next request starts afresh).
    HistoryRecord record;
    Message reply{"assistant", outcome.tool_calls.empty() ? outcome.text : "", outcome.tool_calls.empty() ? "" : outcome.tool_calls.dump(),
                  ""};
    record.known = close_turn(reply, outcome.text, reason == H2O_STOP_EOS);
    // What the cache no longer holds, the closed turn included (its end may evict too).
    usage_.evicted_tokens = evicted_tokens(session);
    if (context_.evictions && usage_.evicted_tokens > evicted_before_) {
        context_.evictions->tokens += usage_.evicted_tokens - evicted_before_;
        if (evicted_before_ == 0) ++context_.evictions->conversations_filled;
    }
    outcome.usage = usage_;
    record.history = extend_history(history_, "assistant", reply.digest_content());
    record.n_messages = static_cast<uint32_t>(messages_.size() + 1);
    describe(session, &record);
    generated_ = true;
    std::vector<Message> transcript = messages_;
    transcript.push_back(reply);
    if (auto error = context_.store->commit(*lease_, record, transcript_json(transcript))) {
        std::fprintf(stderr, "h2o-server: conversation %s is not saved: %s\n", conversation_id().c_str(), error->message.c_str());
    }
    if (context_.trace) record_trace();
    return outcome;
}

void ChatTurn::record_trace() {
    const auto tokens = [this](const std::string &text) {
        size_t n = 0;
        h2o_tokenize(context_.model, text.data(), text.size(), H2O_TOKENIZE_SPECIAL, nullptr, 0, &n);
        return static_cast<uint64_t>(n);
    };
    // The counts as the replayer takes them: the system message, the messages before the last,
    // and the last (with the reply's opening), each from the conversation as formatted (which
    // succeeded for the whole conversation already, so its parts format too).
    std::string system_text, before_text;
    if (messages_.front().role == "system") format_conversation(context_, messages_, 1, false, tools_, &system_text);
    if (messages_.size() > 1) format_conversation(context_, messages_, messages_.size() - 1, false, tools_, &before_text);
    const uint64_t system = tokens(system_text), before = std::max(system, tokens(before_text));
    TraceRequest r;
    r.t = arrival_;
    r.conversation = trace_name(conversation_id());
    r.named = named_;
    r.system = system_text.empty() ? "" : trace_name(system_text);
    r.system_tokens = system;
    r.history_tokens = before - system;
    r.new_tokens = std::max(before, tokens(formatted_)) - before;
    r.reply_tokens = usage_.completion_tokens;
    context_.trace->record(r);
}

void ChatTurn::describe(const h2o_session *session, HistoryRecord *record) const {
    for (const Message &m : messages_) {
        if (m.role == "user") {
            record->title = conversation_title(m.content);
            break;
        }
    }
    record->n_turns = 1;  // this reply
    for (const Message &m : messages_) record->n_turns += m.role == "assistant" ? 1 : 0;
    record->n_tokens = kv_usage(session).n_held;
    record->last_used = static_cast<int64_t>(std::time(nullptr));
}

void ChatTurn::read_tool_calls(TurnOutcome *outcome) const {
    const char *format = context_.chat_format.empty() ? nullptr : context_.chat_format.c_str();
    std::string json;
    const h2o_status st = written_text(
        [&](char *text, size_t capacity, size_t *n) {
            return h2o_parse_tool_calls(context_.model, format, outcome->text.data(), outcome->text.size(), messages_.size(), text,
                                        capacity, n);
        },
        &json);
    if (st != H2O_OK) return;  // not a whole call (cut short): the reply stays text
    outcome->tool_calls = nlohmann::json::parse(json)["tool_calls"];
    if (!outcome->tool_calls.empty()) outcome->finish_reason = "tool_calls";
}

bool ChatTurn::close_turn(const Message &message, const std::string &reply, bool ended_by_eog) {
    std::vector<Message> closed_messages = messages_;
    closed_messages.push_back(message);
    std::string closed;
    if (format_conversation(context_, closed_messages, closed_messages.size(), false, tools_, &closed) ||
        closed.compare(0, formatted_.size(), formatted_) != 0)
        return false;
    // What follows the reply: the chat format may trim the reply, so it is found by its text.
    std::string tail = closed.substr(formatted_.size());
    const std::string trimmed = trim(reply);
    size_t end = 0;  // where the reply ends in tail
    if (!trimmed.empty()) {
        const size_t at = tail.find(trimmed);
        if (at == std::string::npos) return false;
        end = at + trimmed.size();
    } else if (tail.compare(0, reply.size(), reply) == 0) {
        end = reply.size();  // only white space, which the format kept
    }
    std::string closing = tail.substr(end);
    if (ended_by_eog) {
        // The end-of-turn token the model generated is in the session (fed with the next text):
        // the closing's own is left out.
        const size_t start = closing.find_first_not_of(" \t\r\n");
        std::vector<int32_t> ids(4);
        size_t n = 0;
        const std::string rest = start == std::string::npos ? "" : closing.substr(start);
        const h2o_status st = h2o_tokenize(context_.model, rest.data(), rest.size(), H2O_TOKENIZE_SPECIAL, ids.data(), ids.size(), &n);
        if ((st == H2O_OK || st == H2O_ERR_BUFFER_TOO_SMALL) && n > 0 && h2o_token_is_end_of_generation(context_.model, ids[0])) {
            char piece[256];
            size_t piece_len = 0;
            if (h2o_token_to_piece(context_.model, ids[0], piece, sizeof piece, &piece_len) == H2O_OK &&
                rest.compare(0, piece_len, piece, piece_len) == 0)
                closing = rest.substr(piece_len);
        }
    }
    if (closing.empty()) return true;
    h2o_session *session = lease_->session();
    ComputeGate::Hold hold(*context_.gate);
    return h2o_session_add_text(session, closing.data(), closing.size(), H2O_TEXT_SPECIAL) == H2O_OK;
}

ChatTurn::~ChatTurn() {
    // A turn that never generated (the client left before the reply began) leaves the session
    // holding the prompt: it is reset at the next request.
    if (touched_ && !generated_) {
        HistoryRecord unknown;
        unknown.known = false;
        context_.store->commit(*lease_, unknown);
    }
}

}  // namespace h2o_server
