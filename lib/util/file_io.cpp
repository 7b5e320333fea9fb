#include "file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace h2o {

namespace {

std::string os_error(const std::string &what, const std::string &path, int error_number) {
    return what + " '" + path + "': " + std::strerror(error_number);
}

// Removes PATH.tmp.PID files left by processes that no longer exist (killed mid-write).
void remove_stale_temporaries(const std::string &path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path target(path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    const std::string prefix = target.filename().string() + ".tmp.";
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string digits = name.substr(prefix.size());
        if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
        const pid_t pid = static_cast<pid_t>(std::stol(digits));
        if (pid > 0 && pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH) ::unlink(it->path().c_str());
    }
}

}  // namespace

Status write_file_atomically(const std::string &path, const std::function<bool(const ByteSink &)> &produce) {
    remove_stale_temporaries(path);
    const std::string temp = path + ".tmp." + std::to_string(getpid());
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return make_error(H2O_ERR_IO, os_error("cannot create", temp, errno));

    int error_number = 0;
    bool write_failed = false;
    const ByteSink write_all = [fd, &error_number, &write_failed](const uint8_t *p, size_t n) {
        while (n > 0) {
            const ssize_t written = ::write(fd, p, n);
            if (written < 0) {
                if (errno == EINTR) continue;
                error_number = errno;
                write_failed = true;
                return false;
            }
            p += written;
            n -= static_cast<size_t>(written);
        }
        return true;
    };
    std::string failed_step;
    if (!produce(write_all)) {
        failed_step = write_failed ? "cannot write" : "could not produce the content of";
    } else if (fsync(fd) != 0) {
        failed_step = "cannot sync";
        error_number = errno;
    }
    // close() can report a deferred write error, so it is checked too.
    if (::close(fd) != 0 && failed_step.empty()) {
        failed_step = "cannot close";
        error_number = errno;
    }
    if (failed_step.empty() && std::rename(temp.c_str(), path.c_str()) != 0) {
        error_number = errno;
        ::unlink(temp.c_str());
        return make_error(H2O_ERR_IO, os_error("cannot rename '" + temp + "' to", path, error_number));
    }
    if (!failed_step.empty()) {
        ::unlink(temp.c_str());
        if (!write_failed && error_number == 0) return make_error(H2O_ERR_IO, failed_step + " '" + path + "'");
        return make_error(H2O_ERR_IO, os_error(failed_step, temp, error_number));
    }
    return Status::Ok();
}

Status read_file(const std::string &path, uint64_t max_bytes, std::vector<uint8_t> *out, uint64_t *file_size) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return make_error(H2O_ERR_IO, os_error("cannot open", path, errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const int error_number = errno;
        ::close(fd);
        return make_error(H2O_ERR_IO, S_ISDIR(st.st_mode) ? "cannot read '" + path + "': is a directory"
                                                          : os_error("cannot read", path, error_number ? error_number : EINVAL));
    }
    *file_size = static_cast<uint64_t>(st.st_size);
    out->resize(static_cast<size_t>(std::min<uint64_t>(max_bytes, *file_size)));
    size_t done = 0;
    while (done < out->size()) {
        const ssize_t got = ::read(fd, out->data() + done, out->size() - done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            const int error_number = got < 0 ? errno : EIO;
            ::close(fd);
            return make_error(H2O_ERR_IO,
                              os_error("cannot read", path, error_number) + (got == 0 ? " (the file shrank while it was read)" : ""));
        }
        done += static_cast<size_t>(got);
    }
    ::close(fd);
    return Status::Ok();
}

}  // namespace h2o
