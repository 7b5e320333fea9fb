// One request of a conversation: the messages the session does not hold yet are formatted and
// processed (a new conversation's system message pinned), the reply is generated piece by piece,
// and the assistant's turn is closed in the session as the chat format writes it, so that the
// session holds exactly the conversation a client sends back next time.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cache_trace.h"
#include "chat_request.h"
#include "compute_gate.h"
#include "conversation_store.h"
#include "h2o/h2o.h"

namespace h2o_server {

// What every turn shares: set up once by the server.
struct TurnContext {
    h2o_model *model = nullptr;
    std::string chat_format;  // a format name, or "" for the model's template
    ConversationStore *store = nullptr;
    ComputeGate *gate = nullptr;
    h2o_generate_params defaults{};  // sampling when the request does not say
    // What the sessions' caches evicted, over the server's life (/health).
    struct Evictions {
        std::atomic<uint64_t> conversations_filled{0};  // turns in which a conversation's cache first evicted
        std::atomic<uint64_t> tokens{0};                // tokens evicted by every turn
    };
    Evictions *evictions = nullptr;
    TraceRecorder *trace = nullptr;  // --record-trace: each turn is appended (nullptr: none)
};

struct TurnOutcome {
    std::string text;                                     // the reply, as generated (a call's text too)
    std::string finish_reason;                            // "stop", "length" or "tool_calls"; "" when cancelled or failed
    nlohmann::json tool_calls = nlohmann::json::array();  // the reply's calls, when it made them
    Usage usage;
    std::optional<ApiError> error;  // generation failed partway
};

class ChatTurn {
public:
    // Takes the conversation's lease and processes the new messages. Errors come before any
    // reply is sent (400 for messages the chat format or the pins refuse, 503 busy, 500).
    static std::optional<ApiError> start(const TurnContext &context, const ChatRequest &request, std::unique_ptr<ChatTurn> *out);
    ~ChatTurn();

    const std::string &conversation_id() { return lease_->conversation().id; }

    // Receives each piece of the reply's text; false when the client is gone (the turn then stops
    // and is closed with the text generated so far). A reply that may be a tool call is held back
    // until it is known not to be one; calls are given in TurnOutcome, not as pieces.
    using PieceSink = std::function<bool(const std::string &piece)>;
    // Generates the reply, closes the turn and commits the conversation.
    TurnOutcome generate(const PieceSink &sink);

private:
    ChatTurn(const TurnContext &context, std::unique_ptr<Lease> lease) : context_(context), lease_(std::move(lease)) {}
    std::optional<ApiError> process_prompt(const ChatRequest &request);
    // Adds what follows the reply in the formatted conversation (the end of the assistant's turn):
    // message is the assistant's message as the history holds it, reply the text generated.
    bool close_turn(const Message &message, const std::string &reply, bool ended_by_eog);

    // The reply read back as tool calls (TurnOutcome.tool_calls), when the request offered tools.
    void read_tool_calls(TurnOutcome *outcome) const;
    // What the conversations' listing shows of the turn just closed: title, turns, tokens held.
    void describe(const h2o_session *session, HistoryRecord *record) const;
    // The turn as a line of the request trace (context_.trace).
    void record_trace();

    const TurnContext &context_;
    std::unique_ptr<Lease> lease_;
    std::vector<Message> messages_;
    std::string tools_;           // the request's tools ("" none)
    std::string tool_choice_;     // "auto", "none", "required" or a function's name
    std::string formatted_;       // the request's conversation with the assistant's opening
    Digest history_{};            // digest of the request's messages
    uint32_t held_messages_ = 0;  // of messages_, those the session held before this turn,
    size_t held_bytes_ = 0;       // and the bytes of formatted_ they take
    Usage usage_;
    double arrival_ = 0;           // seconds since the Unix epoch when the request came (the trace's t)
    bool named_ = false;           // the request named its conversation (conversation_id)
    uint64_t evicted_before_ = 0;  // the session's evicted tokens when the turn began
    bool touched_ = false;         // the session was changed: until committed, its record is unknown
    bool generated_ = false;       // generate() ran: the record is committed
};

// The first `count` messages formatted as the model's chat format writes them, with the tools
// ("" none: h2o_chat_format, else h2o_chat_format_tools).
std::optional<ApiError> format_conversation(const TurnContext &context, const std::vector<Message> &messages, size_t count, bool open_reply,
                                            const std::string &tools, std::string *out);

}  // namespace h2o_server
