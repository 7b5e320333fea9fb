// The server's conversations: at most `max_sessions` of them hold a live session (a fixed-size
// KV cache); an idle one gives its session up when another needs one, chosen by the cache policy
// (reuse_policy.h). With
// a state directory every conversation is saved after each turn (atomically: a kill loses at most
// the reply in progress), so one that lost its session, or lived before a restart, continues from
// its snapshot exactly where it was. Without one, a conversation that loses its session is
// forgotten, and its next request processes the history the client sends again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chat_request.h"
#include "h2o/h2o.h"
#include "conversation_file.h"
#include "reuse_policy.h"

namespace h2o_server {

struct Conversation {
    explicit Conversation(std::string conversation_id) : id(std::move(conversation_id)) {}
    const std::string id;
    std::mutex turn;                 // held by the request using the conversation (its Lease)
    HistoryRecord record;            // guarded by turn
    // The record's messages as JSON (transcript_json), until the state directory's file holds
    // them (guarded by turn; empty without a state directory).
    std::string transcript_to_save;
    h2o_session *session = nullptr;  // live session, or none; changed with the store's mutex and turn held
    bool saved = false;              // a snapshot file holds the record's state (store's mutex)
    uint64_t file_bytes = 0;         // the size of its file in the state directory, 0 for none (store's mutex)
    uint32_t leases = 0;             // requests using or waiting for it (store's mutex)
    uint64_t last_used = 0;          // store's clock of its last release (store's mutex)
    bool named = false;              // a request named it (conversation_id) (store's mutex)
    bool counted_gone = false;       // the estimator counted it gone without reuse (store's mutex)
};

struct StoreSettings {
    h2o_model *model = nullptr;
    h2o_session_params session_params{};
    uint32_t max_sessions = 4;
    std::string state_dir;                          // "" : nothing is saved
    std::chrono::milliseconds session_wait{30000};  // the longest a request waits for a free session
    // Bounds on the state directory (0: none), kept at startup and after each turn: past one,
    // conversations that hold no session and no request go (in the cache policy's order), until
    // the files' sum is within max_bytes and none was last used more than max_age ago.
    uint64_t state_max_bytes = 0;
    std::chrono::seconds state_max_age{0};
    // Which idle conversation gives up its session, or its file past state_max_bytes.
    CachePolicy cache_policy = CachePolicy::kReuse;
};

struct StoreCounts {
    uint32_t conversations = 0, live_sessions = 0, saved = 0;
    uint64_t evictions = 0, restores = 0;
    uint64_t state_bytes = 0;    // the conversations' files in the state directory
    uint64_t state_removed = 0;  // conversations the state directory's bounds removed
};

// One conversation as GET /v1/conversations shows it.
struct ConversationInfo {
    std::string id, title;
    uint32_t turns = 0, messages = 0;
    uint64_t tokens = 0;         // held by its session's cache (per layer and kv head)
    uint64_t bytes_on_disk = 0;  // its file in the state directory (0: none)
    int64_t last_used = 0;       // seconds since 1970 (0: no turn yet)
    bool live = false;           // it holds a session now
    bool in_use = false;         // a request is using it or waiting for it
};

class ConversationStore;

// A request's hold on one conversation: its turn lock and a live session. Released on destruction.
class Lease {
public:
    Lease(ConversationStore &store, std::shared_ptr<Conversation> conversation);
    ~Lease();
    Lease(const Lease &) = delete;
    Lease &operator=(const Lease &) = delete;
    Conversation &conversation() { return *conversation_; }
    h2o_session *session() { return conversation_->session; }

private:
    ConversationStore &store_;
    std::shared_ptr<Conversation> conversation_;
    std::unique_lock<std::mutex> turn_;
};

class ConversationStore {
public:
    explicit ConversationStore(StoreSettings settings) : settings_(std::move(settings)) {}
    ~ConversationStore();
    ConversationStore(const ConversationStore &) = delete;
    ConversationStore &operator=(const ConversationStore &) = delete;

    // Reads the state directory's conversations (their headers only) and removes the temporary
    // files a killed save left. false with *error when the directory cannot be used.
    bool open_state_dir(std::string *error);

    // The conversation a request continues: the one named by conversation_id (made when new), else
    // the one whose history is the longest prefix of the request's messages (prefix_digests[k]:
    // the first k messages), else a new one. The lease holds its turn (waiting for the requests
    // before it) and a live session, restored from its snapshot when it had none.
    std::optional<ApiError> acquire(const std::string &conversation_id, const std::vector<Digest> &prefix_digests,
                                    std::unique_ptr<Lease> *out);

    // After a turn: the session now holds `record`, whose messages `transcript` gives
    // (transcript_json). Saves the conversation when there is a state directory; the index
    // follows the new history.
    std::optional<ApiError> commit(Lease &lease, const HistoryRecord &record, std::string transcript = "");

    // Cancels every running generation (h2o_session_cancel; shutdown).
    void cancel_all();
    // Saves every live conversation whose record is known and frees the sessions (shutdown).
    void save_all();

    StoreCounts counts();
    // What the reuse estimator has learned (for /health).
    ReuseEstimator estimates();
    // The conversations it knows (live or saved), the most recently used first.
    std::vector<ConversationInfo> list();
    std::optional<ConversationInfo> info(const std::string &id);
    // A conversation's messages as its file holds them (transcript_json), for
    // GET /v1/conversations/{id}/messages: 404 for an unknown id, and when the server keeps no
    // messages (no state directory, or a conversation saved by an earlier server or too long).
    std::optional<ApiError> messages(const std::string &id, std::string *transcript);
    // Deletes a conversation: frees its session and removes its file (one unlink: a crash leaves
    // the conversation whole or gone). 404 for an unknown id, 409 while a request uses it.
    std::optional<ApiError> remove(const std::string &id);
    const StoreSettings &settings() const { return settings_; }

private:
    friend class Lease;
    void release(Conversation &conversation);
    std::shared_ptr<Conversation> find_or_make(const std::string &conversation_id, const std::vector<Digest> &prefix_digests);
    // Frees the idle session the cache policy gives up first; false when every live session is in use.
    bool evict_one();
    // Idle conversations as the cache policy sees them (mutex_ held); file: what giving one up frees
    // is its file, not its session.
    CacheCandidate candidate(const Conversation &conversation, bool file) const;
    // Counts the conversations idle past the estimator's horizon as gone without reuse (mutex_ held).
    void count_long_idle();
    std::optional<ApiError> bring_live(Conversation &conversation);
    std::string path_of(const std::string &id) const;
    std::optional<ApiError> save(Conversation &conversation, uint64_t *file_bytes);
    // Removes what the state directory's bounds allow no more (with mutex_ held).
    void keep_state_bounds();
    // Unlinks a conversation's file and forgets it (mutex_ held; no session, no lease). false
    // when the file cannot be removed: the conversation stays.
    bool remove_file_and_forget(Conversation &conversation, std::string *error);
    std::optional<ApiError> restore(Conversation &conversation);
    void forget(Conversation &conversation);
    ConversationInfo info_of(const Conversation &conversation) const;  // with mutex_ held

    StoreSettings settings_;
    std::mutex mutex_;
    std::condition_variable released_;
    std::map<std::string, std::shared_ptr<Conversation>> by_id_;
    std::map<Digest, std::string> by_history_;  // history digest -> conversation id
    uint32_t live_ = 0;                         // sessions live or being made
    uint64_t clock_ = 0;
    uint64_t evictions_ = 0, restores_ = 0, state_removed_ = 0;
    ReuseEstimator estimator_;  // mutex_
    std::mutex snapshot_mutex_;  // one snapshot buffer at a time (saved or restored)
};

// A new conversation id: "c-" and 24 random hexadecimal digits.
std::string new_conversation_id();

}  // namespace h2o_server
