#include "conversation_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "chat_request.h"

namespace h2o_server {

namespace {

constexpr std::string_view kMagic = "h2o-server conversation 1\n";

}  // namespace

std::string conversation_title(const std::string &first_user_message) {
    constexpr size_t kMaxTitle = 64;
    std::string title;
    for (size_t i = 0; i < first_user_message.size(); ++i) {
        const auto c = static_cast<unsigned char>(first_user_message[i]);
        // A character's bytes go in together, or none of them (messages are valid UTF-8).
        const size_t length = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (title.size() + length > kMaxTitle) break;
        if (c < 0x20 || c == 0x7F)
            title += ' ';
        else
            title.append(first_user_message, i, length);
        i += length - 1;
    }
    const size_t end = title.find_last_not_of(' ');
    return end == std::string::npos ? "" : title.substr(title.find_first_not_of(' '), end + 1 - title.find_first_not_of(' '));
}

std::string conversation_header(const std::string &id, const HistoryRecord &record, size_t transcript_bytes) {
    return std::string(kMagic) +
           dump(nlohmann::json{{"id", id},
                               {"history", to_hex(record.history)},
                               {"messages", record.n_messages},
                               {"title", record.title},
                               {"turns", record.n_turns},
                               {"tokens", record.n_tokens},
                               {"last_used", record.last_used},
                               {"transcript_bytes", transcript_bytes}}) +
           "\n";
}

bool parse_conversation_header(std::string_view bytes, std::string *id, HistoryRecord *record, ConversationFileLayout *layout) {
    if (bytes.substr(0, kMagic.size()) != kMagic) return false;
    const size_t end = bytes.find('\n', kMagic.size());
    if (end == std::string_view::npos || end >= kMaxConversationHeader) return false;
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(kMagic.size(), end - kMagic.size()), nullptr, false);
    if (!header.is_object() || !header.contains("id") || !header["id"].is_string() || !header.contains("history") ||
        !header["history"].is_string() || !header.contains("messages") || !header["messages"].is_number_unsigned() ||
        header["messages"].get<uint64_t>() > UINT32_MAX)
        return false;
    HistoryRecord read;
    if (!from_hex(header["history"].get<std::string>(), &read.history)) return false;
    read.n_messages = header["messages"].get<uint32_t>();
    // What the listing shows; files of earlier servers have none of it.
    if (header.contains("title")) {
        if (!header["title"].is_string() || header["title"].get<std::string>().size() > 256) return false;
        read.title = header["title"].get<std::string>();
    }
    if (header.contains("turns")) {
        if (!header["turns"].is_number_unsigned() || header["turns"].get<uint64_t>() > UINT32_MAX) return false;
        read.n_turns = header["turns"].get<uint32_t>();
    }
    if (header.contains("tokens")) {
        if (!header["tokens"].is_number_unsigned()) return false;
        read.n_tokens = header["tokens"].get<uint64_t>();
    }
    if (header.contains("last_used")) {
        if (!header["last_used"].is_number_integer()) return false;
        read.last_used = header["last_used"].get<int64_t>();
    }
    size_t transcript_bytes = 0;
    if (header.contains("transcript_bytes")) {
        if (!header["transcript_bytes"].is_number_unsigned() || header["transcript_bytes"].get<uint64_t>() > kMaxTranscriptBytes)
            return false;
        transcript_bytes = header["transcript_bytes"].get<size_t>();
    }
    *id = header["id"].get<std::string>();
    if (!valid_conversation_id(*id)) return false;
    *record = read;
    layout->transcript_offset = end + 1;
    layout->transcript_bytes = transcript_bytes;
    layout->snapshot_offset = end + 1 + transcript_bytes;
    return true;
}

bool write_file_atomically(const std::string &path, std::string_view head, std::string_view transcript, std::string_view body,
                           std::string *error) {
    const std::string temporary = path + ".tmp";
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        *error = "cannot write " + temporary + ": " + std::strerror(errno);
        return false;
    }
    auto write_all = [fd](std::string_view bytes) {
        while (!bytes.empty()) {
            const ssize_t w = ::write(fd, bytes.data(), bytes.size());
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return false;
            bytes.remove_prefix(static_cast<size_t>(w));
        }
        return true;
    };
    const bool written = write_all(head) && write_all(transcript) && write_all(body) && ::fsync(fd) == 0;
    const int write_errno = errno;
    ::close(fd);
    if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
        *error = "cannot write " + path + ": " + std::strerror(written ? errno : write_errno);
        ::unlink(temporary.c_str());
        return false;
    }
    // The rename itself is durable once the directory is synced.
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd >= 0) {
        ::fsync(dir_fd);
        ::close(dir_fd);
    }
    return true;
}

bool read_file_prefix(const std::string &path, size_t limit, std::string *out) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    out->clear();
    char buffer[65536];
    size_t n;
    while (out->size() < limit && (n = std::fread(buffer, 1, std::min(sizeof buffer, limit - out->size()), f)) > 0) out->append(buffer, n);
    const bool ok = !std::ferror(f);
    std::fclose(f);
    return ok;
}

}  // namespace h2o_server
