#include "conversation_store.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <ctime>
#include <random>

namespace h2o_server {

namespace {

ApiError server_error(const std::string &message) { return ApiError{500, "server_error", message, "", ""}; }

bool ends_with(const std::string &text, const std::string &end) {
    return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

}  // namespace

std::string new_conversation_id() {
    static std::mutex mutex;
    static std::random_device device;
    std::lock_guard<std::mutex> lock(mutex);
    static const char kDigits[] = "0123456789abcdef";
    std::string id = "c-";
    for (int i = 0; i < 24; ++i) id += kDigits[device() & 15];
    return id;
}

Lease::Lease(ConversationStore &store, std::shared_ptr<Conversation> conversation)
    : store_(store), conversation_(std::move(conversation)), turn_(conversation_->turn) {}

Lease::~Lease() {
    turn_.unlock();
    store_.release(*conversation_);
}

ConversationStore::~ConversationStore() {
    for (auto &[id, conversation] : by_id_) h2o_session_free(conversation->session);
}

std::string ConversationStore::path_of(const std::string &id) const { return settings_.state_dir + "/" + id + kConversationSuffix; }

bool ConversationStore::open_state_dir(std::string *error) {
    if (settings_.state_dir.empty()) return true;
    if (::mkdir(settings_.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
        *error = "cannot make the state directory " + settings_.state_dir + ": " + std::strerror(errno);
        return false;
    }
    DIR *dir = ::opendir(settings_.state_dir.c_str());
    if (!dir) {
        *error = "cannot read the state directory " + settings_.state_dir + ": " + std::strerror(errno);
        return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    while (const dirent *entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        const std::string path = settings_.state_dir + "/" + name;
        if (ends_with(name, std::string(kConversationSuffix) + ".tmp")) {
            ::unlink(path.c_str());  // a save that did not finish: the file before it stands
            continue;
        }
        if (!ends_with(name, kConversationSuffix)) continue;
        std::string bytes, id;
        HistoryRecord record;
        ConversationFileLayout layout;
        if (!read_file_prefix(path, kMaxConversationHeader, &bytes) || !parse_conversation_header(bytes, &id, &record, &layout) ||
            name != id + kConversationSuffix) {
            std::fprintf(stderr, "h2o-server: %s is not a conversation this server wrote; left alone\n", path.c_str());
            continue;
        }
        struct stat file;
        auto made = std::make_shared<Conversation>(id);
        made->record = record;
        made->saved = true;
        made->file_bytes = ::stat(path.c_str(), &file) == 0 ? static_cast<uint64_t>(file.st_size) : 0;
        by_id_[id] = made;
        by_history_[record.history] = id;
    }
    ::closedir(dir);
    keep_state_bounds();
    return true;
}

std::shared_ptr<Conversation> ConversationStore::find_or_make(const std::string &conversation_id,
                                                              const std::vector<Digest> &prefix_digests) {
    std::string id = conversation_id;
    if (id.empty()) {
        // The longest held history the request's messages begin with (its last message is new).
        for (size_t k = prefix_digests.size() >= 2 ? prefix_digests.size() - 2 : 0; k >= 1 && id.empty(); --k) {
            if (auto it = by_history_.find(prefix_digests[k]); it != by_history_.end()) id = it->second;
        }
        if (id.empty()) id = new_conversation_id();
    }
    std::shared_ptr<Conversation> &conversation = by_id_[id];
    if (!conversation) conversation = std::make_shared<Conversation>(id);
    if (conversation->leases == 0 && conversation->record.n_turns > 0) {
        // An idle conversation used again: what the estimator learns from (no request holds its
        // turn, so its record is not being written).
        const CacheCandidate seen = candidate(*conversation, false);
        estimator_.reused(seen.category, seen.idle_seconds);
        conversation->counted_gone = false;
    }
    conversation->named = conversation->named || !conversation_id.empty();
    ++conversation->leases;
    return conversation;
}

std::optional<ApiError> ConversationStore::acquire(const std::string &conversation_id, const std::vector<Digest> &prefix_digests,
                                                   std::unique_ptr<Lease> *out) {
    std::shared_ptr<Conversation> conversation;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        conversation = find_or_make(conversation_id, prefix_digests);
    }
    auto lease = std::make_unique<Lease>(*this, conversation);  // waits for the requests before it
    if (!conversation->session) {
        if (auto error = bring_live(*conversation)) return error;
    }
    *out = std::move(lease);
    return std::nullopt;
}

CacheCandidate ConversationStore::candidate(const Conversation &conversation, bool file) const {
    CacheCandidate c;
    c.last_used = conversation.last_used;
    const int64_t now = static_cast<int64_t>(std::time(nullptr));
    c.idle_seconds = conversation.record.last_used > 0 ? static_cast<double>(std::max<int64_t>(0, now - conversation.record.last_used)) : 0;
    c.category = reuse_category(conversation.named, conversation.record.n_turns);
    c.tokens = conversation.record.n_tokens;
    c.bytes = file ? std::max<uint64_t>(conversation.file_bytes, 1) : 1;  // every session is the same size
    return c;
}

void ConversationStore::count_long_idle() {
    for (auto &[id, conversation] : by_id_) {
        if (conversation->leases > 0 || conversation->counted_gone || conversation->record.n_turns == 0) continue;
        const CacheCandidate c = candidate(*conversation, false);
        if (c.idle_seconds > estimator_.horizon_seconds(c.category)) {
            estimator_.ended(c.category);
            conversation->counted_gone = true;
        }
    }
}

bool ConversationStore::evict_one() {
    std::vector<Conversation *> idle;
    std::vector<CacheCandidate> candidates;
    for (auto &[id, conversation] : by_id_) {
        if (conversation->leases == 0 && conversation->session) {
            idle.push_back(conversation.get());
            candidates.push_back(candidate(*conversation, false));
        }
    }
    if (idle.empty()) return false;
    Conversation *victim = idle[give_up_order(settings_.cache_policy, estimator_, candidates).front()];
    h2o_session_free(victim->session);
    victim->session = nullptr;
    --live_;
    ++evictions_;
    if (!victim->saved) forget(*victim);
    return true;
}

void ConversationStore::forget(Conversation &conversation) {
    if (auto it = by_history_.find(conversation.record.history); it != by_history_.end() && it->second == conversation.id)
        by_history_.erase(it);
    by_id_.erase(conversation.id);  // the requests holding it keep it alive until they end
}

std::optional<ApiError> ConversationStore::bring_live(Conversation &conversation) {
    bool saved = false;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        const auto deadline = std::chrono::steady_clock::now() + settings_.session_wait;
        while (live_ >= settings_.max_sessions && !evict_one()) {
            if (released_.wait_until(lock, deadline) == std::cv_status::timeout && live_ >= settings_.max_sessions && !evict_one()) {
                return ApiError{503, "server_error",
                                "all " + std::to_string(settings_.max_sessions) +
                                    " sessions are in use by other conversations (--sessions); try again later",
                                "", "server_busy"};
            }
        }
        ++live_;
        saved = conversation.saved;
    }
    std::optional<ApiError> error;
    h2o_session *session = nullptr;
    if (saved) {
        error = restore(conversation);
        if (!error) return std::nullopt;
        // A snapshot that does not load: the conversation starts again from the client's messages.
        std::fprintf(stderr, "h2o-server: conversation %s starts afresh: %s\n", conversation.id.c_str(), error->message.c_str());
        conversation.record = HistoryRecord{};
    }
    if (h2o_session_create(settings_.model, &settings_.session_params, &session) != H2O_OK) {
        std::lock_guard<std::mutex> lock(mutex_);
        --live_;
        released_.notify_all();
        return server_error(std::string("cannot make a session: ") + h2o_last_error());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    conversation.session = session;
    conversation.saved = false;
    return std::nullopt;
}

std::optional<ApiError> ConversationStore::restore(Conversation &conversation) {
    std::lock_guard<std::mutex> one_at_a_time(snapshot_mutex_);
    std::string bytes, id;
    HistoryRecord record;
    ConversationFileLayout layout;
    const std::string path = path_of(conversation.id);
    if (!read_file_prefix(path, SIZE_MAX, &bytes)) return server_error("cannot read " + path + ": " + std::strerror(errno));
    if (!parse_conversation_header(bytes, &id, &record, &layout) || id != conversation.id || layout.snapshot_offset > bytes.size())
        return server_error(path + " has no valid header");
    h2o_session *session = nullptr;
    if (h2o_session_load_from_buffer(settings_.model, bytes.data() + layout.snapshot_offset, bytes.size() - layout.snapshot_offset,
                                     &settings_.session_params, &session) != H2O_OK)
        return server_error(path + ": " + h2o_last_error());
    std::lock_guard<std::mutex> lock(mutex_);
    conversation.session = session;
    conversation.record = record;
    ++restores_;
    return std::nullopt;
}

std::optional<ApiError> ConversationStore::save(Conversation &conversation, uint64_t *file_bytes) {
    std::lock_guard<std::mutex> one_at_a_time(snapshot_mutex_);
    size_t size = 0;
    if (h2o_session_state_size(conversation.session, &size) != H2O_OK) return server_error(h2o_session_last_error(conversation.session));
    std::string buffer(size, '\0');
    if (h2o_session_save_to_buffer(conversation.session, buffer.data(), buffer.size(), &size) != H2O_OK)
        return server_error(h2o_session_last_error(conversation.session));
    buffer.resize(size);
    // Messages past the bound are not kept: the conversation is saved and continues, and
    // GET /v1/conversations/{id}/messages has none for it.
    const std::string_view transcript =
        conversation.transcript_to_save.size() <= kMaxTranscriptBytes ? std::string_view(conversation.transcript_to_save) : "";
    const std::string head = conversation_header(conversation.id, conversation.record, transcript.size());
    std::string error;
    if (!write_file_atomically(path_of(conversation.id), head, transcript, buffer, &error)) return server_error(error);
    *file_bytes = head.size() + transcript.size() + buffer.size();
    conversation.transcript_to_save = std::string();
    return std::nullopt;
}

std::optional<ApiError> ConversationStore::commit(Lease &lease, const HistoryRecord &record, std::string transcript) {
    Conversation &conversation = lease.conversation();
    conversation.transcript_to_save = settings_.state_dir.empty() ? std::string() : std::move(transcript);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (auto it = by_history_.find(conversation.record.history); it != by_history_.end() && it->second == conversation.id)
            by_history_.erase(it);
        conversation.record = record;
        conversation.saved = false;
        if (record.known) by_history_[record.history] = conversation.id;
    }
    if (settings_.state_dir.empty() || !record.known) return std::nullopt;
    uint64_t file_bytes = 0;
    std::optional<ApiError> error = save(conversation, &file_bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    conversation.saved = !error;
    if (!error) conversation.file_bytes = file_bytes;
    keep_state_bounds();
    return error;
}

void ConversationStore::release(Conversation &conversation) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        --conversation.leases;
        conversation.last_used = ++clock_;
        if (conversation.leases == 0 && !conversation.session && !conversation.saved) forget(conversation);
        count_long_idle();
    }
    released_.notify_all();
}

void ConversationStore::cancel_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto &[id, conversation] : by_id_) {
        if (conversation->session) h2o_session_cancel(conversation->session);
    }
}

void ConversationStore::save_all() {
    std::vector<std::shared_ptr<Conversation>> live;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto &[id, conversation] : by_id_)
            if (conversation->session) live.push_back(conversation);
    }
    for (auto &conversation : live) {
        std::lock_guard<std::mutex> turn(conversation->turn);
        uint64_t file_bytes = 0;
        const bool saved = !settings_.state_dir.empty() && conversation->record.known && !conversation->saved;
        if (saved) {
            if (auto error = save(*conversation, &file_bytes)) std::fprintf(stderr, "h2o-server: %s\n", error->message.c_str());
        }
        std::lock_guard<std::mutex> lock(mutex_);
        if (saved && file_bytes) conversation->file_bytes = file_bytes;
        h2o_session_free(conversation->session);
        conversation->session = nullptr;
        --live_;
    }
}

ConversationInfo ConversationStore::info_of(const Conversation &conversation) const {
    ConversationInfo info;
    info.id = conversation.id;
    info.title = conversation.record.title;
    info.turns = conversation.record.n_turns;
    info.messages = conversation.record.n_messages;
    info.tokens = conversation.record.n_tokens;
    info.last_used = conversation.record.last_used;
    info.live = conversation.session != nullptr;
    info.in_use = conversation.leases > 0;
    info.bytes_on_disk = conversation.file_bytes;
    return info;
}

std::vector<ConversationInfo> ConversationStore::list() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ConversationInfo> out;
    for (auto &[id, conversation] : by_id_) out.push_back(info_of(*conversation));
    std::stable_sort(out.begin(), out.end(),
                     [](const ConversationInfo &a, const ConversationInfo &b) { return a.last_used > b.last_used; });
    return out;
}

std::optional<ConversationInfo> ConversationStore::info(const std::string &id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return std::nullopt;
    return info_of(*it->second);
}

std::optional<ApiError> ConversationStore::messages(const std::string &id, std::string *transcript) {
    auto unknown = [&id](const std::string &why) {
        return ApiError{404, "not_found_error", "no messages of conversation '" + id + "' are kept" + why, "conversation_id",
                        "conversation_not_found"};
    };
    if (!info(id)) return unknown("");
    if (settings_.state_dir.empty()) return unknown(" (the server keeps messages only with --state-dir)");
    // The file is replaced by a rename: this reads one whole version of it, whatever a turn does.
    std::string bytes, file_id;
    HistoryRecord record;
    ConversationFileLayout layout;
    const std::string path = path_of(id);
    if (!read_file_prefix(path, kMaxConversationHeader + kMaxTranscriptBytes, &bytes) ||
        !parse_conversation_header(bytes, &file_id, &record, &layout) || file_id != id ||
        layout.transcript_offset + layout.transcript_bytes > bytes.size())
        return unknown(" (it has no saved file yet)");
    if (layout.transcript_bytes == 0) return unknown(" (its file was saved without them)");
    *transcript = bytes.substr(layout.transcript_offset, layout.transcript_bytes);
    if (!nlohmann::json::parse(*transcript, nullptr, false).is_array()) return unknown(" (its file's messages do not read)");
    return std::nullopt;
}

std::optional<ApiError> ConversationStore::remove(const std::string &id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_id_.find(id);
    if (it == by_id_.end())
        return ApiError{404, "not_found_error", "no conversation '" + id + "'", "conversation_id", "conversation_not_found"};
    const std::shared_ptr<Conversation> keep = it->second;  // alive until forget() has erased it
    Conversation &conversation = *keep;
    // A request holding it may be saving it: refused rather than waited for.
    if (conversation.leases > 0)
        return ApiError{409, "invalid_request_error", "conversation '" + id + "' is in use by a request; try again when it ends",
                        "conversation_id", "conversation_in_use"};
    if (conversation.session) {
        h2o_session_free(conversation.session);
        conversation.session = nullptr;
        --live_;
        released_.notify_all();
    }
    std::string error;
    if (!remove_file_and_forget(conversation, &error)) return server_error(error);
    // Deleted by its client: gone without reuse.
    if (conversation.record.n_turns > 0 && !conversation.counted_gone) estimator_.ended(candidate(conversation, false).category);
    return std::nullopt;
}

bool ConversationStore::remove_file_and_forget(Conversation &conversation, std::string *error) {
    if (!settings_.state_dir.empty() && ::unlink(path_of(conversation.id).c_str()) != 0 && errno != ENOENT) {
        *error = "cannot delete " + path_of(conversation.id) + ": " + std::strerror(errno);
        return false;
    }
    conversation.file_bytes = 0;
    conversation.saved = false;
    forget(conversation);
    return true;
}

void ConversationStore::keep_state_bounds() {
    if (settings_.state_dir.empty() || (settings_.state_max_bytes == 0 && settings_.state_max_age.count() == 0)) return;
    uint64_t total = 0;
    std::vector<std::shared_ptr<Conversation>> removable;  // held: forget() erases them from by_id_
    std::vector<CacheCandidate> candidates;
    for (auto &[id, conversation] : by_id_) {
        total += conversation->file_bytes;
        if (conversation->saved && !conversation->session && conversation->leases == 0) {
            removable.push_back(conversation);
            // Ordered by the end of their last turn, which survives restarts (the store's clock does not).
            candidates.push_back(candidate(*conversation, true));
            candidates.back().last_used = static_cast<uint64_t>(std::max<int64_t>(0, conversation->record.last_used));
        }
    }
    const int64_t now = static_cast<int64_t>(std::time(nullptr));
    for (const size_t i : give_up_order(settings_.cache_policy, estimator_, candidates)) {
        const std::shared_ptr<Conversation> &conversation = removable[i];
        const bool too_old = settings_.state_max_age.count() > 0 && now - conversation->record.last_used > settings_.state_max_age.count();
        const bool too_much = settings_.state_max_bytes > 0 && total > settings_.state_max_bytes;
        if (!too_old && !too_much) continue;
        const uint64_t bytes = conversation->file_bytes;
        std::string error;
        if (!remove_file_and_forget(*conversation, &error)) {
            std::fprintf(stderr, "h2o-server: %s\n", error.c_str());
            continue;
        }
        total -= bytes;
        ++state_removed_;
        std::fprintf(stderr, "h2o-server: conversation %s removed from the state directory (%s)\n", conversation->id.c_str(),
                     too_old ? "--state-max-age" : "--state-max-bytes");
    }
}

ReuseEstimator ConversationStore::estimates() {
    std::lock_guard<std::mutex> lock(mutex_);
    return estimator_;
}

StoreCounts ConversationStore::counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    StoreCounts c;
    c.conversations = static_cast<uint32_t>(by_id_.size());
    c.live_sessions = live_;
    for (auto &[id, conversation] : by_id_) {
        c.saved += conversation->saved ? 1 : 0;
        c.state_bytes += conversation->file_bytes;
    }
    c.state_removed = state_removed_;
    c.evictions = evictions_;
    c.restores = restores_;
    return c;
}

}  // namespace h2o_server
