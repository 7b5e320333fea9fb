// Shared helpers for tests: locating ../shared data, temporary files.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "h2o/h2o.h"

namespace h2o_test {

// True in the AddressSanitizer build. There the Vulkan device (a software one) runs 3-4 times
// slower under the instrumented allocator, so the Vulkan loops whose cases differ only in what
// runs on the device take a representative subset: the host code they exercise, which is what the
// sanitizer checks, is the same for every case. The unsanitized builds of CI run every case.
// H2O_TEST_ASAN is defined there too, for code that must be left out elsewhere (gcc says
// __SANITIZE_ADDRESS__, clang __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define H2O_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define H2O_TEST_ASAN 1
#endif
#endif
#ifdef H2O_TEST_ASAN
inline constexpr bool kAddressSanitized = true;
#else
inline constexpr bool kAddressSanitized = false;
#endif

// The shared data folder: $H2O_SHARED_DIR, else ../shared beside the checkout.
inline std::string shared_dir() {
    if (const char *env = std::getenv("H2O_SHARED_DIR"); env && *env) return env;
    return H2O_DEFAULT_SHARED_DIR;
}

// Full path of a file under shared/, or "" (after printing a skip notice) when it is absent.
inline std::string shared_file(const std::string &relative) {
    std::string path = shared_dir() + "/" + relative;
    if (std::filesystem::exists(path)) return path;
    std::printf(
        "H2O-SKIP: %s not found. Put the project's shared data folder beside the checkout "
        "(../shared) or set H2O_SHARED_DIR to it.\n",
        path.c_str());
    return "";
}

// A fresh path in the build tree for a temporary file.
// Sets an environment variable for the scope of a test, then restores it (also when a
// failed REQUIRE leaves the test early).
class ScopedEnv {
public:
    ScopedEnv(const char *name, const std::string &value) : name_(name) {
        if (const char *old = std::getenv(name)) old_ = old;
        setenv(name, value.c_str(), 1);
    }
    ~ScopedEnv() {
        if (old_) {
            setenv(name_, old_->c_str(), 1);
        } else {
            unsetenv(name_);
        }
    }
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv &operator=(const ScopedEnv &) = delete;

private:
    const char *name_;
    std::optional<std::string> old_;
};

// A file in the tests' scratch folder: $H2O_TEST_TMPDIR (for runs of the same cases side by
// side), else tmp/ in the build's tests folder.
inline std::string temp_path(const std::string &name) {
    const char *env = std::getenv("H2O_TEST_TMPDIR");
    std::filesystem::path dir = env && *env ? std::filesystem::path(env) : std::filesystem::path(H2O_TEST_BINARY_DIR) / "tmp";
    std::filesystem::create_directories(dir);
    return (dir / name).string();
}

inline std::string read_text_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The value of a string field in a one-line JSON object (the escapes JSON allows; code points
// below U+D800, which is all the golden files hold). Throws on a missing field.
inline std::string json_string_field(const std::string &line, const std::string &field) {
    const std::string key = "\"" + field + "\": \"";
    size_t i = line.find(key);
    if (i == std::string::npos) throw std::runtime_error("no field '" + field + "' in: " + line);
    std::string out;
    for (i += key.size(); i < line.size() && line[i] != '"'; ++i) {
        char c = line[i];
        if (c != '\\') {
            out += c;
            continue;
        }
        c = line[++i];
        switch (c) {
            case 'n':
                out += '\n';
                break;
            case 't':
                out += '\t';
                break;
            case 'r':
                out += '\r';
                break;
            case 'b':
                out += '\b';
                break;
            case 'f':
                out += '\f';
                break;
            case 'u': {
                const unsigned cp = static_cast<unsigned>(std::stoul(line.substr(i + 1, 4), nullptr, 16));
                i += 4;
                if (cp >= 0xD800) throw std::runtime_error("surrogate escapes are not supported");
                if (cp < 0x80) {
                    out += static_cast<char>(cp);
                } else if (cp < 0x800) {
                    out += static_cast<char>(0xC0 | (cp >> 6));
                    out += static_cast<char>(0x80 | (cp & 0x3F));
                } else {
                    out += static_cast<char>(0xE0 | (cp >> 12));
                    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                    out += static_cast<char>(0x80 | (cp & 0x3F));
                }
                break;
            }
            default:
                out += c;  // \" \\ \/
        }
    }
    return out;
}

// A prompt and the greedy continuation an independent implementation produced for it.
struct GoldenContinuation {
    std::string prompt, continuation;
};

// The cases of golden/stories260K-greedy-llamacpp.jsonl (one JSON object per line).
inline std::vector<GoldenContinuation> read_golden_continuations(const std::string &path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::vector<GoldenContinuation> cases;
    for (std::string line; std::getline(in, line);) {
        if (!line.empty()) cases.push_back({json_string_field(line, "prompt"), json_string_field(line, "continuation")});
    }
    return cases;
}

// An h2o_token_callback that appends the text to the std::string behind user_data.
inline int append_text(const char *text, size_t length, void *user_data) {
    static_cast<std::string *>(user_data)->append(text, length);
    return 0;
}

// A model and one session through the public API, freed together.
struct ApiSession {
    h2o_model *model = nullptr;
    h2o_session *session = nullptr;
    ApiSession() = default;
    ApiSession(const ApiSession &) = delete;
    ApiSession &operator=(const ApiSession &) = delete;
    ~ApiSession() {
        h2o_session_free(session);
        h2o_model_free(model);
    }
    // Loads the model and creates the session; false (with h2o_last_error()) on failure.
    bool open(const std::string &path, const h2o_session_params &params) {
        return h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK && h2o_session_create(model, &params, &session) == H2O_OK;
    }
};

}  // namespace h2o_test

// Returns from the current test case (reported as skipped) when a shared file is missing.
#define H2O_SHARED_FILE_OR_SKIP(var, relative)               \
    const std::string var = h2o_test::shared_file(relative); \
    if (var.empty()) return
