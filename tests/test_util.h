// Shared helpers for tests: locating ../shared data, temporary files.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace h2o_test {

// The shared data folder: $H2O_SHARED_DIR, else ../shared beside the checkout.
inline std::string shared_dir() {
    if (const char *env = std::getenv("H2O_SHARED_DIR"); env && *env) return env;
    return H2O_DEFAULT_SHARED_DIR;
}

// Full path of a file under shared/, or "" (after printing a skip notice) when it is absent.
inline std::string shared_file(const std::string &relative) {
    std::string path = shared_dir() + "/" + relative;
    if (std::filesystem::exists(path)) return path;
    std::printf("H2O-SKIP: %s not found. Put the project's shared data folder beside the checkout "
                "(../shared) or set H2O_SHARED_DIR to it.\n", path.c_str());
    return "";
}

// A fresh path in the build tree for a temporary file.
inline std::string temp_path(const std::string &name) {
    std::filesystem::path dir = std::filesystem::path(H2O_TEST_BINARY_DIR) / "tmp";
    std::filesystem::create_directories(dir);
    return (dir / name).string();
}

}  // namespace h2o_test

// Returns from the current test case (reported as skipped) when a shared file is missing.
#define H2O_SHARED_FILE_OR_SKIP(var, relative)              \
    const std::string var = h2o_test::shared_file(relative); \
    if (var.empty()) return
