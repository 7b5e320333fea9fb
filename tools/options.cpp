#include "options.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common.h"
#include "h2o/h2o.h"

namespace h2o_tools {

void usage_error(const std::string &program, const std::string &message) {
    std::fprintf(stderr, "%s: %s (see --help)\n", program.c_str(), message.c_str());
    std::exit(2);
}

std::string number_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", v);
    return buf;
}

bool Range::contains(double v) const {
    if (!std::isfinite(v)) return false;
    const bool above_min = min_open ? v > min : v >= min;
    const bool below_max = max_open ? v < max : v <= max;
    return above_min && below_max;
}

std::string Range::text() const {
    if (std::isinf(max)) return (min_open ? "> " : ">= ") + number_text(min);
    return (min_open ? "(" : "[") + number_text(min) + ", " + number_text(max) + (max_open ? ")" : "]");
}

Range closed(double min, double max) { return Range{min, max}; }
Range at_least(double min) { return Range{min, INFINITY, false, true}; }
Range above(double min) { return Range{min, INFINITY, true, true}; }

CommandLine::CommandLine(std::string program, std::string usage) : program_(std::move(program)), usage_(std::move(usage)) {}

CommandLine &CommandLine::flag(const Names &names, std::function<void()> on) {
    specs_.push_back({names.list, false, [on](const std::string &) { on(); }});
    return *this;
}

CommandLine &CommandLine::flag(const Names &names, bool *out) {
    return flag(names, [out]() { *out = true; });
}

CommandLine &CommandLine::option(const Names &names, Handler on) {
    specs_.push_back({names.list, true, std::move(on)});
    return *this;
}

CommandLine &CommandLine::text(const Names &names, std::string *out) {
    return option(names, [out](const std::string &v) { *out = v; });
}

CommandLine &CommandLine::positional(Handler on) {
    positional_ = std::move(on);
    return *this;
}

const CommandLine::Spec *CommandLine::find(const std::string &name) const {
    for (const Spec &spec : specs_) {
        for (const std::string &n : spec.names) {
            if (n == name) return &spec;
        }
    }
    return nullptr;
}

void CommandLine::parse(int argc, char **argv) {
    bool options_ended = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const bool is_option = !options_ended && arg.size() > 1 && arg[0] == '-';
        if (!is_option) {
            if (!positional_) fail("unexpected argument '" + arg + "'");
            current_.clear();
            positional_(arg);
            continue;
        }
        if (arg == "--") {
            options_ended = true;
            continue;
        }
        if (arg == "-h" || arg == "--help") {
            std::fputs(usage_.c_str(), stdout);
            std::exit(0);
        }
        if (arg == "--version") {
            std::printf("%s %s\n", program_.c_str(), h2o_version());
            std::exit(0);
        }
        // "--name=value" (long options only: a short option's value may hold a '=').
        const size_t equals = arg.rfind("--", 0) == 0 ? arg.find('=') : std::string::npos;
        current_ = arg.substr(0, equals);
        const Spec *spec = find(current_);
        if (!spec) fail("unknown option '" + current_ + "'");
        std::string value;
        if (equals != std::string::npos) {
            if (!spec->takes_value) fail(current_ + " takes no value");
            value = arg.substr(equals + 1);
        } else if (spec->takes_value) {
            if (i + 1 >= argc) fail(current_ + " needs a value");
            value = argv[++i];
        }
        given_.insert(spec->names.front());
        spec->on(value);
    }
    current_.clear();
}

bool CommandLine::given(const std::string &name) const {
    const Spec *spec = find(name);
    return spec && given_.count(spec->names.front()) > 0;
}

void CommandLine::fail(const std::string &message) const { usage_error(program_, message); }

uint64_t CommandLine::to_count(const std::string &value, uint64_t min, uint64_t max) const {
    uint64_t v = 0;
    if (!parse_uint(value.c_str(), &v) || v < min || v > max) {
        fail(current_ + " needs a whole number from " + std::to_string(min) + " to " + std::to_string(max) + ", not '" + value + "'");
    }
    return v;
}

double CommandLine::to_number(const std::string &value, const Range &range) const {
    double v = 0;
    if (!parse_double(value.c_str(), &v) || !range.contains(v)) {
        fail(current_ + " needs a number " + (std::isinf(range.max) ? "" : "in ") + range.text() + ", not '" + value + "'");
    }
    return v;
}

}  // namespace h2o_tools
