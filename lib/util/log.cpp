#include "log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

namespace {

void log_to_stderr(h2o_log_level level, const char *message, void *) {
    static const char *const kNames[] = {"debug", "info", "warning", "error"};
    std::fprintf(stderr, "h2o %s: %s\n", kNames[level], message);
}

struct LogSink {
    std::mutex mutex;
    h2o_log_callback callback = log_to_stderr;
    void *user_data = nullptr;
    h2o_log_level min_level = H2O_LOG_WARN;
};

LogSink &sink() {
    static LogSink s;
    return s;
}

}  // namespace

namespace h2o {

void set_log_sink(h2o_log_callback callback, void *user_data, h2o_log_level min_level) {
    LogSink &s = sink();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.callback = callback;
    s.user_data = user_data;
    s.min_level = min_level;
}

void log(h2o_log_level level, const std::string &message) {
    LogSink &s = sink();
    h2o_log_callback callback;
    void *user_data;
    {
        // The callback runs after the lock is released, so that it may call into the library
        // (even h2o_set_log_callback) without deadlocking.
        std::lock_guard<std::mutex> lock(s.mutex);
        if (!s.callback || level < s.min_level || level >= H2O_LOG_NONE) return;
        callback = s.callback;
        user_data = s.user_data;
    }
    callback(level, message.c_str(), user_data);
}

}  // namespace h2o
