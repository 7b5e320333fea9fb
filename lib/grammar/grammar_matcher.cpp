#include "grammar_matcher.h"

#include <algorithm>

#include "tokenizer.h"

namespace h2o {

namespace {

// Bounds on the work one grammar may make: distinct stacks in the arena, and the stacks one
// expansion visits (a hostile grammar of nested optional rules could otherwise take exponential
// time without consuming a character).
constexpr size_t kMaxStackNodes = 1u << 22;
constexpr size_t kMaxExpansionVisits = 1u << 16;
// And the stacks one character may open before they are merged: a repetition of something that
// may match nothing, such as ("a" | "b"*){300}, opens one per later copy after every copy, so each
// byte would cost the square of the count.
constexpr size_t kMaxStepStacks = 1u << 14;
// The bounds on the cache of states: a state between characters has a row of 256 transitions, one
// inside a character 64 (its continuation bytes: any other byte ends it), 8 MiB of rows in all
// at most. The characters a vocabulary's pieces begin make most states: a bounded string of a
// JSON schema has a few hundred per position on a 150k-token vocabulary.
constexpr size_t kMaxCachedStates = 1u << 16;
constexpr size_t kMaxTransitionEntries = 1u << 21;
// A transition as stored: 0 not known yet, 1 dead, else the state + 2.
constexpr int32_t kUnknownTransition = 0, kDeadTransition = 1;

// The smallest code point a UTF-8 sequence of `length` bytes may hold (shorter forms are overlong).
uint32_t smallest_of_length(uint8_t length) { return length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000; }

// The code points a UTF-8 character of `length` bytes may be, once its first bytes are known:
// `code` holds their bits and `need` continuation bytes are still to come.
void pending_range(uint32_t code, uint8_t need, uint8_t length, uint32_t *lo, uint32_t *hi) {
    *lo = std::max(code << (6 * need), smallest_of_length(length));
    *hi = std::min(code << (6 * need) | ((1u << (6 * need)) - 1), 0x10FFFFu);
}

}  // namespace

std::vector<int32_t> TokenSurfaces::spelled_controls(const Tokenizer &tokenizer, const Grammar &grammar) {
    std::vector<int32_t> out;
    for (int32_t id = 0; id < tokenizer.n_vocab(); ++id) {
        if (!tokenizer.is_control(id) || tokenizer.is_end_of_generation(id)) continue;
        const std::string &piece = tokenizer.piece(id);
        if (!piece.empty() && grammar.source.find(piece) != std::string::npos) out.push_back(id);
    }
    return out;
}

std::shared_ptr<const TokenSurfaces> TokenSurfaces::build(const Tokenizer &tokenizer, const std::vector<int32_t> &spelled) {
    const int32_t n = tokenizer.n_vocab();
    std::vector<std::string> texts(static_cast<size_t>(n));
    std::vector<uint8_t> kinds(static_cast<size_t>(n), kNever), drops(static_cast<size_t>(n), 0);
    for (int32_t id = 0; id < n; ++id) {
        const auto i = static_cast<size_t>(id);
        if (tokenizer.is_end_of_generation(id)) {
            kinds[i] = kEndOfGeneration;
            continue;
        }
        if (std::binary_search(spelled.begin(), spelled.end(), id)) {
            texts[i] = tokenizer.piece(id);
            kinds[i] = kText;
            continue;
        }
        tokenizer.append_piece(id, false, &texts[i]);
        if (texts[i].empty()) continue;  // renders nothing: never under a grammar
        kinds[i] = kText;
        std::string first;
        tokenizer.append_piece(id, true, &first);
        drops[i] = first.size() < texts[i].size();
    }
    return from_texts(std::move(texts), std::move(kinds), std::move(drops));
}

std::shared_ptr<TokenSurfaces> TokenSurfaces::from_texts(std::vector<std::string> texts, std::vector<uint8_t> kinds,
                                                         std::vector<uint8_t> drops_space) {
    auto v = std::make_shared<TokenSurfaces>();
    v->text = std::move(texts);
    v->kind = std::move(kinds);
    v->drops_space = drops_space.empty() ? std::vector<uint8_t>(v->text.size(), 0) : std::move(drops_space);
    for (size_t t = 0; t < v->text.size(); ++t) {
        if (v->kind[t] == kText && v->text[t].empty()) v->kind[t] = kNever;
        if (v->kind[t] == kText) v->sorted.push_back(static_cast<int32_t>(t));
    }
    const auto &text = v->text;
    std::sort(v->sorted.begin(), v->sorted.end(), [&](int32_t a, int32_t b) {
        const std::string &x = text[static_cast<size_t>(a)], &y = text[static_cast<size_t>(b)];
        return x < y || (x == y && a < b);
    });
    v->common.assign(v->sorted.size(), 0);
    for (size_t i = 1; i < v->sorted.size(); ++i) {
        const std::string &a = text[static_cast<size_t>(v->sorted[i - 1])], &b = text[static_cast<size_t>(v->sorted[i])];
        uint32_t k = 0;
        while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
        v->common[i] = k;
    }
    v->suffix_start.assign(v->sorted.size() + 1, 0);
    for (size_t i = 0; i < v->sorted.size(); ++i) {
        const std::string &t = text[static_cast<size_t>(v->sorted[i])];
        v->suffix_start[i] = static_cast<uint32_t>(v->suffix_bytes.size());
        v->suffix_bytes.insert(v->suffix_bytes.end(), t.begin() + v->common[i], t.end());
    }
    v->suffix_start[v->sorted.size()] = static_cast<uint32_t>(v->suffix_bytes.size());
    return v;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenSurfaces> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
    reset();
}

int32_t GrammarMatcher::intern(uint32_t element, int32_t rest) const {
    const uint64_t key = (uint64_t{element} << 32) | static_cast<uint32_t>(rest + 1);
    const auto it = node_ids_.find(key);
    if (it != node_ids_.end()) return it->second;
    if (node_element_.size() >= kMaxStackNodes) {
        if (failure_.ok())
            failure_ = make_error(H2O_ERR_OUT_OF_MEMORY, "grammar: more than " + std::to_string(kMaxStackNodes) + " distinct parse stacks");
        return -2;
    }
    const auto id = static_cast<int32_t>(node_element_.size());
    node_element_.push_back(element);
    node_rest_.push_back(rest);
    expanded_.emplace_back();
    expanded_done_.push_back(0);
    advanced_.push_back(kNotYet);
    node_ids_.emplace(key, id);
    return id;
}

const std::vector<int32_t> &GrammarMatcher::expand(int32_t node) const {
    static const std::vector<int32_t> kNone;
    if (node < 0) return kNone;
    if (expanded_done_[static_cast<size_t>(node)]) return expanded_[static_cast<size_t>(node)];
    std::vector<int32_t> out, work = {node};
    size_t visits = 0;
    const Grammar &g = *grammar_;
    while (!work.empty()) {
        const int32_t n = work.back();
        work.pop_back();
        if (n == -2) break;  // the arena is full: failure_ says so
        if (++visits > kMaxExpansionVisits) {
            if (failure_.ok()) failure_ = make_error(H2O_ERR_INVALID_ARGUMENT, "grammar: a rule expands to too many alternatives at once");
            break;
        }
        const uint32_t e = node_element_[static_cast<size_t>(n)];
        const GrammarElement &el = g.elements[e];
        if (el.kind == GrammarElement::kChars) {
            out.push_back(n);
        } else if (el.kind == GrammarElement::kEnd) {
            const int32_t rest = node_rest_[static_cast<size_t>(n)];
            if (rest < 0) {
                out.push_back(-1);  // the whole grammar matched
            } else {
                work.push_back(rest);
            }
        } else {
            const int32_t rest = intern(e + 1, node_rest_[static_cast<size_t>(n)]);
            const std::vector<uint32_t> &alternatives = g.rules[el.index];
            for (size_t a = alternatives.size(); a-- > 0;) work.push_back(rest == -2 ? -2 : intern(alternatives[a], rest));
        }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    expanded_[static_cast<size_t>(node)] = std::move(out);
    expanded_done_[static_cast<size_t>(node)] = 1;
    return expanded_[static_cast<size_t>(node)];
}

int32_t GrammarMatcher::advanced(int32_t node) const {
    const auto i = static_cast<size_t>(node);
    if (advanced_[i] == kNotYet) {
        const int32_t next = intern(node_element_[i] + 1, node_rest_[i]);  // may grow advanced_
        advanced_[i] = next;
    }
    return advanced_[i];
}

void GrammarMatcher::push_expanded(int32_t node, State *out) const {
    for (int32_t s : expand(node)) {
        if (s == -1)
            out->complete = true;
        else
            out->stacks.push_back(s);
    }
}

int32_t GrammarMatcher::state_id(State &&state) const {
    std::string key(reinterpret_cast<const char *>(state.stacks.data()), state.stacks.size() * sizeof(int32_t));
    key.push_back(static_cast<char>(state.complete));
    key.push_back(static_cast<char>(state.need));
    key.push_back(static_cast<char>(state.length));
    key.append(reinterpret_cast<const char *>(&state.code), sizeof state.code);
    const auto it = state_ids_.find(key);
    if (it != state_ids_.end()) return it->second;
    const size_t row = state.need > 0 ? 64 : 256;
    if (states_.size() >= kMaxCachedStates || transitions_.size() + row > kMaxTransitionEntries) return kUncached;
    const auto id = static_cast<int32_t>(states_.size());
    states_.push_back(std::move(state));
    row_start_.push_back(static_cast<uint32_t>(transitions_.size()));
    transitions_.resize(transitions_.size() + row, kUnknownTransition);
    state_ids_.emplace(std::move(key), id);
    return id;
}

int32_t GrammarMatcher::current_state() const {
    if (current_id_ == kUncached) current_id_ = state_id(State{stacks_, complete_, partial_need_, partial_length_, partial_code_});
    return current_id_;
}

int32_t GrammarMatcher::next_state(int32_t id, uint8_t b) const {
    const bool inside = states_[static_cast<size_t>(id)].need > 0;
    if (inside && (b & 0xC0) != 0x80) return kDead;  // a character begun takes only continuation bytes
    const size_t at = row_start_[static_cast<size_t>(id)] + (inside ? b & 0x3F : b);
    if (transitions_[at] != kUnknownTransition) return transitions_[at] == kDeadTransition ? kDead : transitions_[at] - 2;
    State next;
    int32_t to = kDead;
    if (step(states_[static_cast<size_t>(id)], b, &next)) {
        to = state_id(std::move(next));  // may grow transitions_
        if (to == kUncached) return kUncached;
    }
    transitions_[at] = to == kDead ? kDeadTransition : to + 2;
    return to;
}

int32_t GrammarMatcher::walk_cached(std::string_view bytes, int32_t id) const {
    for (char c : bytes) {
        id = next_state(id, static_cast<uint8_t>(c));
        if (id < 0) return id;
    }
    return id;
}

void GrammarMatcher::trim_cache() const {
    if (states_.size() < kMaxCachedStates && transitions_.size() + 256 <= kMaxTransitionEntries) return;
    states_.clear();
    row_start_.clear();
    state_ids_.clear();
    transitions_.clear();
    transitions_.shrink_to_fit();
    kept_masks_.clear();
    current_id_ = kUncached;
}

void GrammarMatcher::reset() {
    State start;
    for (uint32_t alt : grammar_->rules[grammar_->root]) push_expanded(intern(alt, -1), &start);
    std::sort(start.stacks.begin(), start.stacks.end());
    start.stacks.erase(std::unique(start.stacks.begin(), start.stacks.end()), start.stacks.end());
    stacks_ = std::move(start.stacks);
    complete_ = start.complete;
    partial_need_ = partial_length_ = 0;
    partial_code_ = 0;
    current_id_ = kUncached;
}

bool GrammarMatcher::advance_code_point(const State &state, uint32_t cp, State *next) const {
    next->stacks.clear();
    next->complete = false;
    next->need = next->length = 0;
    next->code = 0;
    if (!failure_.ok()) return false;  // a bound was hit: nothing more is computed
    const Grammar &g = *grammar_;
    for (int32_t s : state.stacks) {
        const uint32_t e = node_element_[static_cast<size_t>(s)];
        if (!g.charsets[g.elements[e].index].contains(cp)) continue;
        push_expanded(advanced(s), next);
        if (next->stacks.size() > kMaxStepStacks) {
            failure_ = make_error(H2O_ERR_INVALID_ARGUMENT, "grammar: one character leaves more than " + std::to_string(kMaxStepStacks) +
                                                                " alternatives open (a long repetition of something that may match nothing?)");
            next->stacks.clear();
            return false;
        }
    }
    if (next->stacks.size() > 1) {
        std::sort(next->stacks.begin(), next->stacks.end());
        next->stacks.erase(std::unique(next->stacks.begin(), next->stacks.end()), next->stacks.end());
    }
    return !next->stacks.empty() || next->complete;
}

bool GrammarMatcher::step(const State &state, uint8_t b, State *next) const {
    uint8_t need = 0, length = state.length;
    uint32_t code = 0;
    if (state.need == 0) {
        if (b < 0x80) return advance_code_point(state, b, next);
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1, length = 2, code = b & 0x1F;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2, length = 3, code = b & 0x0F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3, length = 4, code = b & 0x07;
        } else {
            return false;  // not a UTF-8 lead byte
        }
    } else {
        if ((b & 0xC0) != 0x80) return false;
        code = (state.code << 6) | (b & 0x3F);
        need = static_cast<uint8_t>(state.need - 1);
        if (need == 0) {
            // Overlong forms, surrogates and values past U+10FFFF are not characters.
            if (code < smallest_of_length(length) || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return false;
            return advance_code_point(state, code, next);
        }
    }
    // A character begun: it lives while some stack can take a code point it may become.
    uint32_t lo = 0, hi = 0;
    pending_range(code, need, length, &lo, &hi);
    if (lo > hi) return false;
    const Grammar &g = *grammar_;
    bool feasible = false;
    for (int32_t s : state.stacks) {
        feasible = g.charsets[g.elements[node_element_[static_cast<size_t>(s)]].index].intersects(lo, hi);
        if (feasible) break;
    }
    if (!feasible) return false;
    next->stacks = state.stacks;
    next->complete = false;
    next->need = need;
    next->length = length;
    next->code = code;
    return true;
}

bool GrammarMatcher::walk(std::string_view bytes, State *state) const {
    State next;
    for (char c : bytes) {
        if (!step(*state, static_cast<uint8_t>(c), &next)) return false;
        std::swap(*state, next);
    }
    return true;
}

std::string_view GrammarMatcher::text_of(int32_t token, bool after_bos) const {
    std::string_view text = vocab_->text[static_cast<size_t>(token)];
    if (after_bos && vocab_->drops_space[static_cast<size_t>(token)]) text.remove_prefix(1);
    return text;
}

bool GrammarMatcher::allows(int32_t token, bool after_bos) const {
    if (token < 0 || static_cast<size_t>(token) >= vocab_->kind.size()) return false;
    const uint8_t kind = vocab_->kind[static_cast<size_t>(token)];
    if (kind == TokenSurfaces::kEndOfGeneration) return can_end();
    if (kind != TokenSurfaces::kText) return false;
    trim_cache();
    const int32_t start = current_state();
    if (start != kUncached) {
        const int32_t end = walk_cached(text_of(token, after_bos), start);
        if (end != kUncached) return end != kDead;
        trim_cache();
    }
    State s{stacks_, complete_, partial_need_, partial_length_, partial_code_};
    return walk(text_of(token, after_bos), &s);
}

Status GrammarMatcher::accept(int32_t token, bool after_bos) {
    if (!allows(token, after_bos))
        return make_error(H2O_ERR_INVALID_ARGUMENT, "token " + std::to_string(token) + " does not continue the grammar here");
    if (vocab_->kind[static_cast<size_t>(token)] == TokenSurfaces::kEndOfGeneration) {
        stacks_.clear();  // the end: nothing may follow
        current_id_ = kUncached;
        return failure_;
    }
    State s{stacks_, complete_, partial_need_, partial_length_, partial_code_};
    walk(text_of(token, after_bos), &s);
    stacks_ = std::move(s.stacks);
    complete_ = s.complete;
    partial_need_ = s.need;
    partial_length_ = s.length;
    partial_code_ = s.code;
    current_id_ = kUncached;
    return failure_;
}

bool GrammarMatcher::mask(std::vector<uint8_t> *allowed, size_t budget) const {
    const TokenSurfaces &v = *vocab_;
    allowed->assign(v.kind.size(), 0);
    for (size_t t = 0; t < v.kind.size(); ++t) {
        if (v.kind[t] == TokenSurfaces::kEndOfGeneration) (*allowed)[t] = can_end();
    }
    trim_cache();
    const int32_t state = current_state();
    for (size_t i = 0; i < kept_masks_.size(); ++i) {
        if (kept_masks_[i].first != state) continue;
        *allowed = kept_masks_[i].second;
        std::rotate(kept_masks_.begin() + static_cast<std::ptrdiff_t>(i), kept_masks_.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                    kept_masks_.end());
        return true;
    }
    int done = mask_walk(allowed, budget, true);
    if (done < 0) {
        trim_cache();
        done = mask_walk(allowed, budget, false);
    }
    if (!failure_.ok()) return false;
    if (done == 1 && state >= 0 && current_state() == state) {
        if (kept_masks_.size() == kKeptMasks) kept_masks_.erase(kept_masks_.begin());
        kept_masks_.emplace_back(state, *allowed);
    }
    return done == 1;
}

int GrammarMatcher::mask_walk(std::vector<uint8_t> *allowed, size_t budget, bool cached) const {
    const TokenSurfaces &v = *vocab_;
    if (cached) {
        if (scratch_ids_.empty()) scratch_ids_.resize(1);
        scratch_ids_[0] = current_state();
        if (scratch_ids_[0] == kUncached) return -1;
    } else {
        if (scratch_.empty()) scratch_.resize(1);
        scratch_[0] = State{stacks_, complete_, partial_need_, partial_length_, partial_code_};
    }
    size_t steps = 0, dead = SIZE_MAX;  // dead: the prefix of that many bytes cannot continue
    for (size_t i = 0; i < v.sorted.size(); ++i) {
        const size_t shared = v.common[i];
        if (dead <= shared) continue;  // begins with the dead prefix
        dead = SIZE_MAX;
        const uint8_t *suffix = v.suffix_bytes.data() + v.suffix_start[i];
        const size_t length = shared + (v.suffix_start[i + 1] - v.suffix_start[i]);
        if (cached && scratch_ids_.size() < length + 1) scratch_ids_.resize(length + 1);
        if (!cached && scratch_.size() < length + 1) scratch_.resize(length + 1);
        bool alive = true;
        for (size_t j = shared; j < length; ++j) {
            if (budget != 0 && ++steps > budget) return 0;
            const uint8_t b = suffix[j - shared];
            bool next = false;
            if (cached) {
                const int32_t to = next_state(scratch_ids_[j], b);
                if (to == kUncached) return -1;
                scratch_ids_[j + 1] = to;
                next = to != kDead;
            } else {
                next = step(scratch_[j], b, &scratch_[j + 1]);
            }
            if (!next) {
                dead = j + 1;
                alive = false;
                break;
            }
        }
        (*allowed)[static_cast<size_t>(v.sorted[i])] = alive;
    }
    return 1;
}

}  // namespace h2o
