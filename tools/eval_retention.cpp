#include "eval_retention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <thread>

#include "common.h"
#include "eval_shift.h"

namespace h2o_tools {

namespace {

// One row of the report: a (policy, budget) with the first passage pinned, a retention span of a
// minimum share, or neither; or one of the two references.
struct Row {
    enum Kind {
        Full,
        Unseen,
        Policy
    } kind;
    uint32_t policy = H2O_KV_FULL, budget = 0;
    bool pinned = false;
    float min_share = 0.0f;  // > 0: the passage is a retention span with this minimum share
    std::string label() const {
        if (kind == Full) return "full cache";
        if (kind == Unseen) return "unseen (no 1st passage)";
        char share[32] = "";
        if (min_share > 0.0f) std::snprintf(share, sizeof(share), " share %.3g", min_share);
        return std::string(eval_policy_name(policy)) + "/" + std::to_string(budget) + (pinned ? " pinned" : "") + share;
    }
};

struct Trial {
    std::string passage_text;      // added as text, pinned or not
    std::vector<int32_t> passage;  // its ids, fed again after the other text
    size_t filler_offset = 0;      // where its other text starts in the text's tokens
};

std::vector<int32_t> tokenize(h2o_model *model, const std::string &text) {
    std::vector<int32_t> ids;
    h2o_tools::tokenize(model, text, 0, &ids);  // empty on failure: the caller skips the text
    return ids;
}

// Passages: the first passage_tokens tokens of lines of the text's second half, spread evenly;
// their other text comes from its first half, so the two never overlap.
std::vector<Trial> make_trials(h2o_model *model, const std::string &text, const RetentionOptions &o, size_t first_half_tokens) {
    std::vector<std::string> lines;
    for (size_t at = text.size() / 2; at < text.size();) {
        const size_t end = std::min(text.find('\n', at), text.size());
        if (end > at) lines.push_back(text.substr(at, end - at));
        at = end + 1;
    }
    std::vector<Trial> trials;
    for (size_t i = 1; i < lines.size() && trials.size() < o.trials; i += std::max<size_t>(1, lines.size() / (o.trials + 1))) {
        std::vector<int32_t> ids = tokenize(model, lines[i]);
        if (ids.size() < o.passage_tokens) continue;
        ids.resize(o.passage_tokens);
        Trial t;
        t.passage_text = h2o_tools::detokenize(model, ids);
        t.passage = tokenize(model, t.passage_text);  // the ids h2o_session_add_text will make
        if (t.passage.empty()) continue;
        trials.push_back(t);
    }
    for (size_t i = 0; i < trials.size(); ++i) trials[i].filler_offset = i * (first_half_tokens / trials.size());
    return trials;
}

// Mean NLL of the repeated passage in one trial, or NaN with *error set.
double run_trial(h2o_model *model, const h2o_model_info &info, const RetentionOptions &o, const Row &row, const Trial &trial,
                 const std::vector<int32_t> &filler, std::string *error) {
    h2o_session_params p = row.kind == Row::Policy ? o.session_params(row.policy, row.budget) : o.session_params(H2O_KV_FULL, 0);
    p.n_ctx = static_cast<uint32_t>(1 + 2 * trial.passage.size() + filler.size() + 1);
    h2o_session *session = nullptr;
    h2o_status st = h2o_session_create(model, &p, &session);
    // The first text of a session starts with BOS; "unseen" has BOS and no first passage.
    if (st == H2O_OK && row.kind == Row::Unseen) st = h2o_session_decode(session, &info.bos_token, 1);
    if (st == H2O_OK && row.kind != Row::Unseen) {
        const uint32_t flags = row.pinned ? H2O_TEXT_PIN : 0;
        st = row.min_share > 0.0f
                 ? h2o_session_add_span_text(session, 1, row.min_share, trial.passage_text.data(), trial.passage_text.size(), flags)
                 : h2o_session_add_text(session, trial.passage_text.data(), trial.passage_text.size(), flags);
    }
    const uint32_t policy = row.kind == Row::Policy ? row.policy : uint32_t{H2O_KV_FULL};
    if (st == H2O_OK) st = decode_as(policy, session, filler.data(), filler.size());
    std::vector<float> logits(static_cast<size_t>(info.n_vocab));
    double total = 0;
    for (size_t i = 0; i < trial.passage.size() && st == H2O_OK; ++i) {
        st = h2o_session_get_logits(session, logits.data(), logits.size());
        int32_t argmax = 0;
        if (st == H2O_OK) total += negative_log_prob(logits, trial.passage[i], &argmax);
        if (st == H2O_OK) st = decode_as(policy, session, &trial.passage[i], 1);
    }
    if (st != H2O_OK)
        *error = std::string(session ? h2o_session_last_error(session) : h2o_last_error()) + " (" + h2o_status_string(st) + ")";
    h2o_session_free(session);
    return st == H2O_OK ? total / static_cast<double>(trial.passage.size()) : NAN;
}

}  // namespace

int run_retention(h2o_model *model, const std::string &text, const RetentionOptions &o) {
    h2o_model_info info;
    info.struct_size = sizeof(info);
    h2o_model_get_info(model, &info);
    const std::vector<int32_t> tokens = tokenize(model, text.substr(0, text.size() / 2));  // other text
    const std::vector<Trial> trials = make_trials(model, text, o, tokens.size());
    if (trials.empty() || tokens.empty()) {
        std::fprintf(stderr, "h2o-eval: the text has no line of %u tokens in its second half to use as a passage\n", o.passage_tokens);
        return 2;
    }

    std::vector<Row> rows = {{Row::Full}, {Row::Unseen}};
    for (uint32_t policy : o.policies) {
        if (policy == H2O_KV_FULL) continue;
        for (uint32_t budget : o.budgets) {
            for (bool pinned : {false, true}) rows.push_back({Row::Policy, policy, budget, pinned});
            // A shift cannot keep a span's minimum (h2o_experimental_session_discard).
            if (policy == kShiftPolicy) continue;
            for (float share : o.min_shares) rows.push_back({Row::Policy, policy, budget, false, share});
        }
    }
    // Work items: (row, length, trial); each has its own session.
    const size_t per_row = o.lengths.size() * trials.size();
    std::vector<double> nll(rows.size() * per_row, NAN);
    std::vector<std::string> errors(rows.size());
    std::atomic<size_t> next{0};
    std::mutex mutex;
    const double start = now_seconds();
    auto worker = [&]() {
        for (size_t item = next++; item < nll.size(); item = next++) {
            const size_t r = item / per_row, l = (item % per_row) / trials.size(), t = item % trials.size();
            std::vector<int32_t> filler(o.lengths[l]);
            for (size_t i = 0; i < filler.size(); ++i) filler[i] = tokens[(trials[t].filler_offset + i) % tokens.size()];
            std::string error;
            nll[item] = run_trial(model, info, o, rows[r], trials[t], filler, &error);
            if (!error.empty()) {
                std::lock_guard<std::mutex> lock(mutex);
                if (errors[r].empty()) errors[r] = error;
            }
        }
    };
    std::vector<std::thread> workers;
    for (uint32_t j = 1; j < o.jobs; ++j) workers.emplace_back(worker);
    worker();
    for (std::thread &w : workers) w.join();

    // Per row and length: the mean over trials (every passage has passage_tokens tokens or close).
    auto mean = [&](size_t r, size_t l) {
        double total = 0;
        for (size_t t = 0; t < trials.size(); ++t) total += nll[r * per_row + l * trials.size() + t];
        return total / static_cast<double>(trials.size());
    };
    if (o.json) {
        for (size_t r = 0; r < rows.size(); ++r) {
            for (size_t l = 0; l < o.lengths.size(); ++l) {
                const double v = mean(r, l), full = mean(0, l);
                std::printf(
                    "{\"mode\":\"retention\",\"row\":\"%s\",\"policy\":\"%s\",\"budget\":%u,\"pinned\":%s,\"min_share\":%g,"
                    "\"other_tokens\":%u,\"trials\":%zu,\"repeat_nll\":%s,\"vs_full_pct\":%s}\n",
                    json_escape(rows[r].label()).c_str(), rows[r].kind == Row::Policy ? eval_policy_name(rows[r].policy) : "full",
                    rows[r].budget, rows[r].pinned ? "true" : "false", static_cast<double>(rows[r].min_share), o.lengths[l], trials.size(),
                    std::isfinite(v) ? std::to_string(v).c_str() : "null",
                    std::isfinite(v) ? std::to_string(100 * (v / full - 1)).c_str() : "null");
            }
        }
    } else {
        std::printf(
            "# h2o-eval --retention: BOS + a passage of %u tokens + N tokens of other text + the passage again;\n"
            "# mean NLL of the repeat over %zu passages, and against the full cache; %.1f s\n",
            o.passage_tokens, trials.size(), now_seconds() - start);
        std::printf("%-30s", "configuration");
        for (uint32_t n : o.lengths) std::printf("  %20s", ("N = " + std::to_string(n)).c_str());
        std::printf("\n");
        for (size_t r = 0; r < rows.size(); ++r) {
            std::printf("%-30s", rows[r].label().c_str());
            for (size_t l = 0; l < o.lengths.size(); ++l) {
                const double v = mean(r, l), full = mean(0, l);
                char cell[64] = "failed";
                if (std::isfinite(v)) std::snprintf(cell, sizeof(cell), r == 0 ? "%.4f" : "%.4f (%+.0f%%)", v, 100 * (v / full - 1));
                std::printf("  %20s", cell);
            }
            std::printf("\n");
        }
    }
    int rc = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
        if (errors[r].empty()) continue;
        std::fprintf(stderr, "h2o-eval: %s: %s\n", rows[r].label().c_str(), errors[r].c_str());
        rc = 1;
    }
    return rc;
}

}  // namespace h2o_tools
