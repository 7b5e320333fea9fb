#include "common.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace h2o_tools {

uint64_t peak_rss_bytes() {
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

uint64_t current_rss_bytes() {
    unsigned long pages_total = 0, pages_resident = 0;
    FILE *f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    const int read = std::fscanf(f, "%lu %lu", &pages_total, &pages_resident);
    std::fclose(f);
    return read == 2 ? static_cast<uint64_t>(pages_resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

double now_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

h2o_status tokenize(const h2o_model *model, const std::string &text, uint32_t flags, std::vector<int32_t> *ids) {
    size_t n = 0;
    h2o_status st = h2o_tokenize(model, text.data(), text.size(), flags, nullptr, 0, &n);
    ids->assign(n, 0);
    if (st == H2O_OK || st == H2O_ERR_BUFFER_TOO_SMALL)
        st = h2o_tokenize(model, text.data(), text.size(), flags, ids->data(), ids->size(), &n);
    if (st != H2O_OK) ids->clear();
    return st;
}

std::string detokenize(const h2o_model *model, const std::vector<int32_t> &ids) {
    size_t n = 0;
    h2o_detokenize(model, ids.data(), ids.size(), nullptr, 0, &n);
    std::string text(n, '\0');
    if (h2o_detokenize(model, ids.data(), ids.size(), text.data(), text.size(), &n) != H2O_OK) return "";
    text.resize(n);
    return text;
}

double negative_log_prob(const std::vector<float> &logits, int32_t token, int32_t *argmax) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
        if (logits[i] > logits[best]) best = i;
    }
    const double max = logits[best];
    double exp_sum = 0;
    for (float v : logits) exp_sum += std::exp(static_cast<double>(v) - max);
    *argmax = static_cast<int32_t>(best);
    return -(static_cast<double>(logits[token]) - max - std::log(exp_sum));
}

std::string json_escape(const std::string &text) {
    std::string out;
    for (unsigned char c : text) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\u%04x", c);
                    out += buf;
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    return out;
}

namespace {

// The name functions of the library are the one list of names; these adapt them for the tools.
std::string known_names(const char *(*name_of)(uint32_t)) {
    std::string names;
    for (uint32_t i = 0; name_of(i); ++i) names += (i ? ", " : "") + std::string(name_of(i));
    return names;
}

const char *or_unknown(const char *name) { return name ? name : "unknown"; }

}  // namespace

bool parse_policy(const std::string &name, uint32_t *out) { return h2o_kv_policy_from_name(name.c_str(), out) == H2O_OK; }
const char *policy_name(uint32_t policy) { return or_unknown(h2o_kv_policy_name(policy)); }
std::string kv_policy_names() { return known_names(h2o_kv_policy_name); }

bool parse_kv_type(const std::string &name, uint32_t *out) { return h2o_kv_type_from_name(name.c_str(), out) == H2O_OK; }
const char *kv_type_name(uint32_t type) { return or_unknown(h2o_kv_type_name(type)); }
std::string kv_type_names() { return known_names(h2o_kv_type_name); }

bool parse_backend(const std::string &name, uint32_t *out) { return h2o_backend_kind_from_name(name.c_str(), out) == H2O_OK; }
std::string backend_names() { return known_names(h2o_backend_kind_name); }

std::string resolve_model_path(const std::string &given) {
    if (!given.empty()) return given;
    if (const char *env = std::getenv("H2O_MODEL"); env && *env) return env;
    return "";
}

bool parse_double(const char *text, double *out) {
    char *end = nullptr;
    errno = 0;
    const double v = std::strtod(text, &end);
    if (end == text || *end != '\0' || errno == ERANGE) return false;
    *out = v;
    return true;
}

bool parse_uint(const char *text, uint64_t *out) {
    if (*text < '0' || *text > '9') return false;
    char *end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text, &end, 10);
    if (*end != '\0' || errno == ERANGE) return false;
    *out = v;
    return true;
}

std::vector<std::string> split(const std::string &text, char sep) {
    std::vector<std::string> items;
    size_t start = 0;
    for (;;) {
        const size_t end = text.find(sep, start);
        items.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
        if (end == std::string::npos) return items;
        start = end + 1;
    }
}

bool read_file(const std::string &path, std::string *out, std::string *error) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) {
        *error = std::strerror(errno);
        return false;
    }
    std::string text;
    char buf[65536];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) {
        *error = "read error (is it a directory?)";
        return false;
    }
    *out = std::move(text);
    return true;
}

bool write_file(const std::string &path, const std::string &text, std::string *error) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) {
        *error = std::strerror(errno);
        return false;
    }
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !written) {
        *error = "write error";
        return false;
    }
    return true;
}

}  // namespace h2o_tools
