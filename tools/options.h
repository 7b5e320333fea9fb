// Command lines of the programs in tools/: each option is declared once, with its names and what
// its value must be, and parse() reads argv before the program loads anything. Every usage error
// ends the program with one line, "PROGRAM: MESSAGE (see --help)", and exit status 2: an unknown
// option, a missing value, a value out of range, an argument nobody asked for. Every program
// answers --help (its usage on stdout, exit 0) and --version (the library's version, exit 0).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace h2o_tools {

// Ends the program with a usage error (one line on stderr, exit status 2).
[[noreturn]] void usage_error(const std::string &program, const std::string &message);

// The real numbers an option accepts: an interval whose ends may be open or infinite. Values
// outside it, infinities and NaN are refused.
struct Range {
    double min, max;
    bool min_open = false, max_open = false;

    bool contains(double v) const;
    // As the messages show it: "[0, 0.9]", "(0, 1]", ">= 0", "> 0".
    std::string text() const;
};
Range closed(double min, double max);
Range at_least(double min);
Range above(double min);

// Formats a number for messages as %g does ("0.9", not "0.900000").
std::string number_text(double v);

class CommandLine {
public:
    // The names an option answers to, e.g. {"-n", "--n-predict"}; the last one names it in messages.
    struct Names {
        Names(const char *name) : list{name} {}
        Names(std::initializer_list<const char *> names) : list(names.begin(), names.end()) {}
        std::vector<std::string> list;
    };
    using Handler = std::function<void(const std::string &value)>;

    // usage: what --help prints (from "usage: ..." on).
    CommandLine(std::string program, std::string usage);

    // An option without a value.
    CommandLine &flag(const Names &names, std::function<void()> on);
    CommandLine &flag(const Names &names, bool *out);
    // An option with a value; the handler converts it and may call fail().
    CommandLine &option(const Names &names, Handler on);
    CommandLine &text(const Names &names, std::string *out);
    // A whole number in [min, max] (no sign, fraction or trailing text).
    template <class T>
    CommandLine &count(const Names &names, uint64_t min, uint64_t max, T *out) {
        static_assert(std::numeric_limits<T>::is_integer, "count() stores whole numbers");
        return option(names, [this, min, max, out](const std::string &v) { *out = static_cast<T>(to_count(v, min, max)); });
    }
    // A real number in range.
    template <class T>
    CommandLine &number(const Names &names, const Range &range, T *out) {
        return option(names, [this, range, out](const std::string &v) { *out = static_cast<T>(to_number(v, range)); });
    }
    // Arguments that are not options, in order; without this, any is an error.
    CommandLine &positional(Handler on);

    // Reads argv[1..argc-1]: handlers run in the order the options are given. "--name=value"
    // is "--name value"; after "--" every argument is positional.
    void parse(int argc, char **argv);

    // Whether an option was given (by any of its names; pass one of them).
    bool given(const std::string &name) const;
    const std::string &program() const { return program_; }

    // Ends the program with a usage error (usage_error with this program's name).
    [[noreturn]] void fail(const std::string &message) const;
    // Conversions for handlers: a usage error naming the option when the value does not fit.
    uint64_t to_count(const std::string &value, uint64_t min, uint64_t max) const;
    double to_number(const std::string &value, const Range &range) const;

private:
    struct Spec {
        std::vector<std::string> names;
        bool takes_value;
        Handler on;  // the value ("" for a flag)
    };
    const Spec *find(const std::string &name) const;

    std::string program_, usage_;
    std::vector<Spec> specs_;
    Handler positional_;
    std::set<std::string> given_;  // the messages' names of the options given
    std::string current_;          // the option being read, as typed
};

}  // namespace h2o_tools
