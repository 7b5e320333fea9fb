// What the fuzz targets share: a check that aborts (so both libFuzzer and the replay driver
// report the input), and the rule every failing call must follow.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "h2o/h2o.h"

namespace h2o_fuzz {

[[noreturn]] inline void fail(const char *what, const char *detail) {
    std::fprintf(stderr, "h2o fuzz: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    std::abort();
}

inline void check(bool ok, const char *what) {
    if (!ok) fail(what, nullptr);
}

// A failed call must say why; returns whether the call succeeded.
inline bool ok_or_explained(h2o_status st, const char *message) {
    if (st == H2O_OK) return true;
    if (!message || !*message) fail("an error without a message", h2o_status_string(st));
    return false;
}

// The statuses that malformed input and small budgets may legitimately produce. Anything else
// (H2O_ERR_INTERNAL, H2O_ERR_IO on a file we just wrote, ...) is a finding.
inline void check_expected_status(h2o_status st, const char *call) {
    switch (st) {
        case H2O_OK:
        case H2O_ERR_INVALID_ARGUMENT:
        case H2O_ERR_INVALID_TEXT:
        case H2O_ERR_CONTEXT_FULL:
        case H2O_ERR_MODEL_FORMAT:
        case H2O_ERR_UNSUPPORTED:
        case H2O_ERR_TOKENIZER:
        case H2O_ERR_OUT_OF_MEMORY:
            return;
        default:
            fail(call, h2o_status_string(st));
    }
}

// stories260K, loaded once from $H2O_SHARED_DIR or the shared folder beside the checkout; when it
// is absent the process reports a skip and exits.
inline h2o_model *the_model() {
    static h2o_model *model = [] {
        const char *env = std::getenv("H2O_SHARED_DIR");
        const std::string path = std::string(env && *env ? env : H2O_DEFAULT_SHARED_DIR) + "/models/stories260K.gguf";
        if (!std::filesystem::exists(path)) {
            // The shared data is optional for the test suite: report a skip, not a crash.
            std::printf(
                "H2O-SKIP: %s not found. Put the shared data folder beside the checkout or set "
                "H2O_SHARED_DIR to it.\n",
                path.c_str());
            std::exit(0);
        }
        h2o_model *m = nullptr;
        if (h2o_model_load(path.c_str(), nullptr, &m) != H2O_OK) h2o_fuzz::fail("cannot load the model", h2o_last_error());
        return m;
    }();
    return model;
}

}  // namespace h2o_fuzz
