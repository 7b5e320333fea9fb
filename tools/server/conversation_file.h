// A saved conversation: one file, "<id>.conv" in the state directory, holding a header line that
// says what the session holds (the conversation's id, the digest and count of its messages), the
// conversation's messages as JSON (its transcript: what GET /v1/conversations/{id}/messages
// gives, so that a chat page finds a conversation again after a reload or a restart), and the
// session's snapshot (h2o_session_save_to_buffer). Files are replaced atomically, so a kill
// leaves the previous turn's file or the new one, never a mix.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "history_digest.h"

namespace h2o_server {

// What a conversation's session holds, as messages: their digest and count; and what
// GET /v1/conversations shows of it.
struct HistoryRecord {
    Digest history = empty_history();
    uint32_t n_messages = 0;
    std::string title;      // the first user message's beginning (conversation_title)
    uint32_t n_turns = 0;   // the assistant's replies
    uint64_t n_tokens = 0;  // tokens the session's cache holds (per layer and kv head)
    int64_t last_used = 0;  // when the last turn ended, in seconds since 1970
    // false after a turn failed partway: the session holds text no record describes, and is
    // reset before its next use.
    bool known = true;
};

constexpr const char *kConversationSuffix = ".conv";
// The most bytes a file's head (the magic line and the header line) may take.
constexpr size_t kMaxConversationHeader = 4096;

// A conversation's title: the beginning of its first user message, at most 64 bytes cut at a
// character, its line breaks and other control characters as spaces.
std::string conversation_title(const std::string &first_user_message);

// The largest transcript a file may hold (a longer conversation's file keeps none).
constexpr size_t kMaxTranscriptBytes = size_t{64} << 20;

// Where a file's parts begin: the transcript right after the head, then the snapshot.
struct ConversationFileLayout {
    size_t transcript_offset = 0;
    size_t transcript_bytes = 0;  // 0: none (files of earlier servers, or too long a conversation)
    size_t snapshot_offset = 0;
};

// The file's head: the magic line and the header line, which ends where the transcript (of
// transcript_bytes) begins; the snapshot follows it.
std::string conversation_header(const std::string &id, const HistoryRecord &record, size_t transcript_bytes);
// Reads a file's head; false when it is not a conversation this server wrote (any bytes are
// safe to give).
bool parse_conversation_header(std::string_view bytes, std::string *id, HistoryRecord *record, ConversationFileLayout *layout);

// Writes head, transcript and body to path through a synced temporary file (path + ".tmp") and a rename.
// false with *error (the temporary removed) on failure; path is then unchanged.
bool write_file_atomically(const std::string &path, std::string_view head, std::string_view transcript, std::string_view body,
                           std::string *error);
// Reads at most limit bytes of path.
bool read_file_prefix(const std::string &path, size_t limit, std::string *out);

}  // namespace h2o_server
