#include "grammar.h"

#include <algorithm>
#include <map>

#include "utf8.h"

namespace h2o {

bool Charset::contains(uint32_t cp) const {
    // The ranges are few (a class is written by hand): a linear scan beats a search.
    bool in = false;
    for (size_t i = 0; i < ranges.size() && !in; i += 2) in = cp >= ranges[i] && cp <= ranges[i + 1];
    return in != negated;
}

bool Charset::intersects(uint32_t lo, uint32_t hi) const {
    if (!negated) {
        for (size_t i = 0; i < ranges.size(); i += 2) {
            if (ranges[i] <= hi && ranges[i + 1] >= lo) return true;
        }
        return false;
    }
    // Some code point of [lo, hi] lies outside every excluded range: walk the gaps.
    uint32_t next = lo;
    for (size_t i = 0; i < ranges.size() && next <= hi; i += 2) {
        if (ranges[i + 1] < next) continue;
        if (ranges[i] > next) return true;
        if (ranges[i + 1] == UINT32_MAX) return false;
        next = ranges[i + 1] + 1;
    }
    return next <= hi;
}

namespace {

class Parser {
public:
    Parser(std::string_view text, Grammar *g) : text_(text), g_(*g) {}

    Status parse() {
        skip_space(true);
        while (pos_ < text_.size()) {
            const size_t name_at = pos_;
            std::string name;
            H2O_TRY(parse_name(&name));
            skip_space(false);
            if (text_.substr(pos_, 3) != "::=") return error("expected '::=' after the rule name '" + name + "'");
            pos_ += 3;
            skip_space(true);
            const uint32_t rule = rule_id(name, name_at);
            if (defined_[rule]) return error_at(name_at, "rule '" + name + "' is defined twice");
            defined_[rule] = true;
            std::vector<std::vector<GrammarElement>> alternatives;
            H2O_TRY(parse_alternatives(name, /*nested=*/false, 0, &alternatives));
            H2O_TRY(set_rule(rule, alternatives));
            if (pos_ < text_.size() && text_[pos_] != '\n' && text_[pos_] != '\r') return error("expected the end of the line");
            skip_space(true);
        }
        for (size_t r = 0; r < g_.rule_names.size(); ++r) {
            if (!defined_[r]) return error_at(first_use_[r], "rule '" + g_.rule_names[r] + "' is used but not defined");
        }
        const auto root = ids_.find("root");
        if (root == ids_.end()) return error_at(0, "no rule 'root' (generation starts there)");
        g_.root = root->second;
        return check_left_recursion();
    }

private:
    Status error_at(size_t at, const std::string &what) const {
        return make_error(H2O_ERR_INVALID_ARGUMENT, "grammar: " + what + " (at byte " + std::to_string(at) + ")");
    }
    Status error(const std::string &what) const { return error_at(pos_, what); }

    // Blanks and comments; newlines only where a rule goes on (newlines: true).
    void skip_space(bool newlines) {
        while (pos_ < text_.size()) {
            const char c = text_[pos_];
            if (c == '#') {
                while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
            } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
                ++pos_;
            } else {
                break;
            }
        }
    }

    static bool is_name_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    }

    Status parse_name(std::string *name) {
        const size_t start = pos_;
        while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
        if (pos_ == start) return error("expected a rule name");
        *name = std::string(text_.substr(start, pos_ - start));
        return Status::Ok();
    }

    uint32_t rule_id(const std::string &name, size_t used_at) {
        const auto it = ids_.find(name);
        if (it != ids_.end()) return it->second;
        const auto id = static_cast<uint32_t>(g_.rule_names.size());
        ids_.emplace(name, id);
        g_.rule_names.push_back(name);
        g_.rules.emplace_back();
        defined_.push_back(false);
        first_use_.push_back(used_at);
        return id;
    }

    // A rule the parser makes (for a group or a repetition), defined at once.
    uint32_t new_rule(const std::string &parent) {
        std::string name;
        do {
            name = parent + "_" + std::to_string(++generated_);
        } while (ids_.count(name));
        const uint32_t id = rule_id(name, pos_);
        defined_[id] = true;
        return id;
    }

    Status set_rule(uint32_t rule, const std::vector<std::vector<GrammarElement>> &alternatives) {
        for (const std::vector<GrammarElement> &alt : alternatives) {
            if (g_.elements.size() + alt.size() + 1 > kMaxElements)
                return error("the grammar has more than " + std::to_string(kMaxElements) + " elements");
            g_.rules[rule].push_back(static_cast<uint32_t>(g_.elements.size()));
            g_.elements.insert(g_.elements.end(), alt.begin(), alt.end());
            g_.elements.push_back(GrammarElement{GrammarElement::kEnd, 0});
        }
        return Status::Ok();
    }

    Status parse_alternatives(const std::string &rule, bool nested, int depth, std::vector<std::vector<GrammarElement>> *out) {
        if (depth > kMaxNesting) return error("groups nest deeper than " + std::to_string(kMaxNesting));
        for (;;) {
            out->emplace_back();
            H2O_TRY(parse_sequence(rule, nested, depth, &out->back()));
            if (pos_ >= text_.size() || text_[pos_] != '|') return Status::Ok();
            ++pos_;
            skip_space(true);
        }
    }

    Status parse_sequence(const std::string &rule, bool nested, int depth, std::vector<GrammarElement> *seq) {
        size_t last_item = seq->size();  // where the item a quantifier applies to begins
        bool has_item = false;
        for (;;) {
            skip_space(nested);
            if (pos_ >= text_.size()) break;
            const char c = text_[pos_];
            if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
            if (c == '*' || c == '+' || c == '?' || c == '{') {
                if (!has_item) return error(std::string("'") + c + "' follows nothing");
                H2O_TRY(parse_quantifier(rule, last_item, seq));
                has_item = false;  // "a**" is an error, as in llama.cpp
                continue;
            }
            last_item = seq->size();
            has_item = true;
            if (c == '"') {
                ++pos_;
                while (pos_ < text_.size() && text_[pos_] != '"') {
                    uint32_t cp = 0;
                    H2O_TRY(parse_char(&cp));
                    seq->push_back(GrammarElement{GrammarElement::kChars, single_char(cp)});
                }
                if (pos_ >= text_.size()) return error("unterminated literal");
                ++pos_;
                // An empty literal matches the empty string: nothing to add.
                if (seq->size() == last_item) has_item = false;
            } else if (c == '[') {
                uint32_t set = 0;
                H2O_TRY(parse_class(&set));
                seq->push_back(GrammarElement{GrammarElement::kChars, set});
            } else if (c == '.') {
                ++pos_;
                seq->push_back(GrammarElement{GrammarElement::kChars, any_char()});
            } else if (c == '(') {
                ++pos_;
                skip_space(true);
                std::vector<std::vector<GrammarElement>> alternatives;
                H2O_TRY(parse_alternatives(rule, /*nested=*/true, depth + 1, &alternatives));
                if (pos_ >= text_.size() || text_[pos_] != ')') return error("expected ')'");
                ++pos_;
                const uint32_t group = new_rule(rule);
                H2O_TRY(set_rule(group, alternatives));
                seq->push_back(GrammarElement{GrammarElement::kRule, group});
            } else if (is_name_char(c)) {
                const size_t name_at = pos_;
                std::string name;
                H2O_TRY(parse_name(&name));
                // "name ::=" starts the next rule: the rule before ended at the line's end.
                if (!nested) {
                    const size_t at = pos_;
                    skip_space(false);
                    const bool definition = text_.substr(pos_, 3) == "::=";
                    pos_ = at;
                    if (definition) return error("expected the end of the line before rule '" + name + "'");
                }
                seq->push_back(GrammarElement{GrammarElement::kRule, rule_id(name, name_at)});
            } else {
                return error(std::string("unexpected character '") + c + "'");
            }
        }
        return Status::Ok();
    }

    Status parse_count(uint32_t *out) {
        const size_t start = pos_;
        uint64_t v = 0;
        while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
            v = v * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
            if (v > kMaxRepetition) return error_at(start, "a repetition count above " + std::to_string(kMaxRepetition));
        }
        if (pos_ == start) return error("expected a number");
        *out = static_cast<uint32_t>(v);
        return Status::Ok();
    }

    // Replaces seq[item, end) by its repetition as the quantifier says, through rules of its own:
    // X* is R ::= X R | "", X? is R ::= X | "", X{m,n} is m copies of X and then n - m optional
    // ones nested (R_k ::= X R_k-1 | "").
    Status parse_quantifier(const std::string &rule, size_t item, std::vector<GrammarElement> *seq) {
        uint32_t min = 0, max = UINT32_MAX;  // UINT32_MAX: no upper bound
        const char q = text_[pos_++];
        if (q == '+') {
            min = 1;
        } else if (q == '?') {
            max = 1;
        } else if (q == '{') {
            skip_space(false);
            H2O_TRY(parse_count(&min));
            skip_space(false);
            max = min;
            if (pos_ < text_.size() && text_[pos_] == ',') {
                ++pos_;
                skip_space(false);
                max = UINT32_MAX;
                if (pos_ < text_.size() && text_[pos_] != '}') H2O_TRY(parse_count(&max));
                skip_space(false);
            }
            if (pos_ >= text_.size() || text_[pos_] != '}') return error("expected '}'");
            ++pos_;
            if (max < min) return error("a repetition whose maximum is below its minimum");
        }
        const std::vector<GrammarElement> x(seq->begin() + static_cast<std::ptrdiff_t>(item), seq->end());
        seq->resize(item);
        const size_t copies = min + (max == UINT32_MAX ? 1 : max - min);
        if (copies * (x.size() + 3) + g_.elements.size() > kMaxElements)
            return error("the repetition makes more than " + std::to_string(kMaxElements) + " elements");
        for (uint32_t i = 0; i < min; ++i) seq->insert(seq->end(), x.begin(), x.end());
        if (max == UINT32_MAX) {
            const uint32_t star = new_rule(rule);
            std::vector<GrammarElement> again = x;
            again.push_back(GrammarElement{GrammarElement::kRule, star});
            H2O_TRY(set_rule(star, {again, {}}));
            seq->push_back(GrammarElement{GrammarElement::kRule, star});
        } else if (max > min) {
            uint32_t tail = 0;
            for (uint32_t k = 0; k < max - min; ++k) {
                const uint32_t optional = new_rule(rule);
                std::vector<GrammarElement> one = x;
                if (k > 0) one.push_back(GrammarElement{GrammarElement::kRule, tail});
                H2O_TRY(set_rule(optional, {one, {}}));
                tail = optional;
            }
            seq->push_back(GrammarElement{GrammarElement::kRule, tail});
        }
        return Status::Ok();
    }

    Status parse_hex(size_t digits, uint32_t *out) {
        uint32_t v = 0;
        for (size_t i = 0; i < digits; ++i, ++pos_) {
            if (pos_ >= text_.size()) return error("a hexadecimal escape ends early");
            const char c = text_[pos_];
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return error("a hexadecimal escape with '" + std::string(1, c) + "'");
            v = v * 16 + static_cast<uint32_t>(d);
        }
        if (v > 0x10FFFF) return error("an escape beyond U+10FFFF");
        *out = v;
        return Status::Ok();
    }

    // One character of a literal or a class: an escape or a UTF-8 sequence.
    Status parse_char(uint32_t *cp) {
        if (text_[pos_] == '\\') {
            if (++pos_ >= text_.size()) return error("an escape ends the text");
            const char e = text_[pos_++];
            switch (e) {
                case 'n':
                    *cp = '\n';
                    return Status::Ok();
                case 'r':
                    *cp = '\r';
                    return Status::Ok();
                case 't':
                    *cp = '\t';
                    return Status::Ok();
                case '\\':
                case '"':
                case '[':
                case ']':
                case '-':
                case '^':
                    *cp = static_cast<uint8_t>(e);
                    return Status::Ok();
                case 'x':
                    return parse_hex(2, cp);
                case 'u':
                    return parse_hex(4, cp);
                case 'U':
                    return parse_hex(8, cp);
                default:
                    return error_at(pos_ - 1, std::string("unknown escape '\\") + e + "'");
            }
        }
        size_t length = 0;
        if (!decode_utf8(text_.substr(pos_), cp, &length)) return error("text that is not UTF-8");
        pos_ += length;
        return Status::Ok();
    }

    Status parse_class(uint32_t *out) {
        ++pos_;  // '['
        Charset set;
        if (pos_ < text_.size() && text_[pos_] == '^') {
            set.negated = true;
            ++pos_;
        }
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        while (pos_ < text_.size() && text_[pos_] != ']') {
            uint32_t first = 0, last = 0;
            H2O_TRY(parse_char(&first));
            last = first;
            if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
                ++pos_;
                H2O_TRY(parse_char(&last));
                if (last < first) return error("a range whose end comes before its start");
            }
            ranges.emplace_back(first, last);
        }
        if (pos_ >= text_.size()) return error("unterminated character class");
        ++pos_;
        std::sort(ranges.begin(), ranges.end());
        for (const auto &[first, last] : ranges) {
            if (!set.ranges.empty() && first <= set.ranges.back() + 1) {
                set.ranges.back() = std::max(set.ranges.back(), last);
            } else {
                set.ranges.push_back(first);
                set.ranges.push_back(last);
            }
        }
        *out = add_charset(std::move(set));
        return Status::Ok();
    }

    uint32_t add_charset(Charset set) {
        g_.charsets.push_back(std::move(set));
        return static_cast<uint32_t>(g_.charsets.size() - 1);
    }
    uint32_t single_char(uint32_t cp) {
        const auto it = singles_.find(cp);
        if (it != singles_.end()) return it->second;
        Charset set;
        set.ranges = {cp, cp};
        return singles_[cp] = add_charset(std::move(set));
    }
    uint32_t any_char() {
        if (any_ == UINT32_MAX) any_ = add_charset(Charset{{}, true});
        return any_;
    }

    // Left recursion: a rule that reaches itself before consuming a character would make the
    // matcher expand it for ever.
    Status check_left_recursion() const {
        const size_t n = g_.rules.size();
        std::vector<bool> nullable(n, false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                for (uint32_t start : g_.rules[r]) {
                    bool empty = true;
                    for (uint32_t e = start; g_.elements[e].kind != GrammarElement::kEnd && empty; ++e)
                        empty = g_.elements[e].kind == GrammarElement::kRule && nullable[g_.elements[e].index];
                    if (empty) {
                        nullable[r] = changed = true;
                        break;
                    }
                }
            }
        }
        // The rules each rule can begin with, then a depth-first search for a cycle among them.
        std::vector<std::vector<uint32_t>> first(n);
        for (size_t r = 0; r < n; ++r) {
            for (uint32_t start : g_.rules[r]) {
                for (uint32_t e = start; g_.elements[e].kind == GrammarElement::kRule; ++e) {
                    first[r].push_back(g_.elements[e].index);
                    if (!nullable[g_.elements[e].index]) break;
                }
            }
        }
        std::vector<uint8_t> state(n, 0);  // 0 unseen, 1 on the path, 2 done
        std::vector<std::pair<uint32_t, size_t>> path;
        for (uint32_t r0 = 0; r0 < n; ++r0) {
            if (state[r0]) continue;
            path.push_back({r0, 0});
            state[r0] = 1;
            while (!path.empty()) {
                auto &[r, next] = path.back();
                if (next == first[r].size()) {
                    state[r] = 2;
                    path.pop_back();
                    continue;
                }
                const uint32_t s = first[r][next++];
                if (state[s] == 1) return error_at(first_use_[s], "rule '" + g_.rule_names[s] + "' is left-recursive");
                if (state[s] == 0) {
                    state[s] = 1;
                    path.push_back({s, 0});
                }
            }
        }
        return Status::Ok();
    }

    std::string_view text_;
    Grammar &g_;
    size_t pos_ = 0;
    std::map<std::string, uint32_t> ids_;
    std::vector<bool> defined_;
    std::vector<size_t> first_use_;
    std::map<uint32_t, uint32_t> singles_;
    uint32_t any_ = UINT32_MAX;
    int generated_ = 0;
};

}  // namespace

Status parse_grammar(std::string_view text, Grammar *out) {
    if (text.size() > kMaxGrammarBytes)
        return make_error(H2O_ERR_INVALID_ARGUMENT, "grammar: " + std::to_string(text.size()) + " bytes, more than the " +
                                                        std::to_string(kMaxGrammarBytes) + " allowed");
    Grammar g;
    H2O_TRY(Parser(text, &g).parse());
    g.source = std::string(text);
    *out = std::move(g);
    return Status::Ok();
}

}  // namespace h2o
