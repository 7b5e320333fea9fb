// Internal error type: a public status code plus a message naming what went wrong.
#pragma once

#include <cstdio>
#include <string>
#include <utility>

#include "h2o/h2o.h"

namespace h2o {

struct [[nodiscard]] Status {
    h2o_status code = H2O_OK;
    std::string message;

    bool ok() const { return code == H2O_OK; }
    static Status Ok() { return {}; }
};

inline Status make_error(h2o_status code, std::string message) { return Status{code, std::move(message)}; }

// A real number as messages show it: %g, so 0.9 reads "0.9" (std::to_string would write "0.900000").
inline std::string number_text(double v) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g", v);
    return text;
}

}  // namespace h2o

// Propagates a failed Status to the caller.
#define H2O_TRY(expr)                                      \
    do {                                                   \
        ::h2o::Status h2o_try_status_ = (expr);            \
        if (!h2o_try_status_.ok()) return h2o_try_status_; \
    } while (0)
