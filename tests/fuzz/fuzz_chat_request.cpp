// Fuzz target: what h2o-server reads from outside, below HTTP: a chat-completions request body
// (parse_chat_request), the head of a conversation file in its state directory
// (parse_conversation_header), and a line of a request trace for h2o-cache-replay
// (parse_trace_request).
//
// Input layout: byte 0 < 128 reads the rest as a request body, 128-191 as a conversation file,
// 192 and above as a trace line. A request is accepted whole with every field in range, or
// refused with a 400 or 413 whose body is JSON; a head is read back the same when written again;
// a trace line is read or refused with a reason.
#include <cstdint>
#include <string>

#include "cache_trace.h"
#include "chat_request.h"
#include "conversation_file.h"
#include "fuzz_common.h"

namespace {

using namespace h2o_server;

void check_request(const std::string &body) {
    RequestLimits limits;
    limits.max_messages = 64;
    ChatRequest r;
    const std::optional<ApiError> error = parse_chat_request(body, limits, &r);
    if (error) {
        h2o_fuzz::check(error->http_status == 400 || error->http_status == 413, "a refusal that is not 400 or 413");
        h2o_fuzz::check(!error->message.empty(), "a refusal without a message");
        h2o_fuzz::check(nlohmann::json::parse(error_body(*error), nullptr, false).is_object(), "an error body that is not JSON");
        return;
    }
    h2o_fuzz::check(!r.messages.empty() && r.messages.size() <= limits.max_messages, "accepted: the messages' count");
    h2o_fuzz::check(r.messages.back().role == "user", "accepted: the last message is not the user's");
    for (const Message &m : r.messages)
        h2o_fuzz::check(m.role == "system" || m.role == "user" || m.role == "assistant", "accepted: an unknown role");
    h2o_fuzz::check(r.max_tokens <= limits.max_tokens, "accepted: max_tokens past the limit");
    h2o_fuzz::check(!r.temperature || (*r.temperature >= 0 && *r.temperature <= 2), "accepted: temperature out of range");
    h2o_fuzz::check(!r.top_p || (*r.top_p > 0 && *r.top_p <= 1), "accepted: top_p out of range");
    h2o_fuzz::check(r.stop.size() <= 4, "accepted: more than 4 stop strings");
    for (const std::string &s : r.stop) h2o_fuzz::check(!s.empty(), "accepted: an empty stop string");
    h2o_fuzz::check(r.conversation_id.empty() || valid_conversation_id(r.conversation_id), "accepted: a conversation id naming no file");
    // What the server writes back from an accepted request is JSON.
    const Usage usage;
    const CompletionHeader header{"chatcmpl-x", 0, r.model, r.conversation_id};
    h2o_fuzz::check(
        nlohmann::json::parse(dump(completion_json(header, r.messages.back().content, "stop", usage)), nullptr, false).is_object(),
        "a reply that is not JSON");
}

void check_file(const std::string &bytes) {
    std::string id;
    HistoryRecord record;
    ConversationFileLayout layout;
    if (!parse_conversation_header(bytes, &id, &record, &layout)) return;
    h2o_fuzz::check(layout.transcript_offset <= bytes.size() && layout.transcript_offset <= kMaxConversationHeader,
                    "a head past the file or the limit");
    h2o_fuzz::check(layout.transcript_bytes <= kMaxTranscriptBytes &&
                        layout.snapshot_offset == layout.transcript_offset + layout.transcript_bytes,
                    "a transcript past the limit, or a snapshot not after it");
    h2o_fuzz::check(valid_conversation_id(id), "a head naming an id that names no file");
    std::string again_id;
    HistoryRecord again;
    ConversationFileLayout again_layout;
    const std::string written = conversation_header(id, record, layout.transcript_bytes);
    h2o_fuzz::check(parse_conversation_header(written, &again_id, &again, &again_layout), "a head written again does not read");
    h2o_fuzz::check(again_layout.transcript_bytes == layout.transcript_bytes, "a transcript's size reads back otherwise");
    h2o_fuzz::check(again_id == id && again.history == record.history && again.n_messages == record.n_messages &&
                        again.title == record.title && again.n_turns == record.n_turns && again.n_tokens == record.n_tokens &&
                        again.last_used == record.last_used,
                    "a head reads back otherwise");
}

void check_trace_line(const std::string &line) {
    TraceRequest request;
    std::string error;
    if (!parse_trace_request(line, &request, &error)) {
        h2o_fuzz::check(!error.empty(), "a trace line refused without a reason");
        return;
    }
    h2o_fuzz::check(request.t >= 0 && request.system_tokens <= UINT32_MAX && request.history_tokens <= UINT32_MAX &&
                        request.new_tokens <= UINT32_MAX && request.reply_tokens <= UINT32_MAX,
                    "a trace line read out of range");
    TraceRequest again;
    h2o_fuzz::check(parse_trace_request(trace_line(request), &again, &error), "a trace line written again does not read");
    h2o_fuzz::check(again.t == request.t && again.conversation == request.conversation && again.named == request.named &&
                        again.system == request.system && again.system_tokens == request.system_tokens &&
                        again.history_tokens == request.history_tokens && again.new_tokens == request.new_tokens &&
                        again.reply_tokens == request.reply_tokens,
                    "a trace line reads back otherwise");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const std::string rest(reinterpret_cast<const char *>(data + 1), size - 1);
    if (data[0] < 128)
        check_request(rest);
    else if (data[0] < 192)
        check_file(rest);
    else
        check_trace_line(rest);
    return 0;
}
