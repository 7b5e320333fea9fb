// Runs a grammar (grammar.h) over a vocabulary's tokens: which tokens may come next, and the
// state after one is taken.
//
// The state is a set of stacks, as a pushdown automaton's: each stack the positions in the rules
// still to match, its top a character set. A token is allowed when its bytes, read from the
// state as UTF-8 code points (a character may be split between tokens: its first bytes are
// allowed when some code point they may begin can be matched), leave some stack alive; an
// end-of-generation token when the grammar may end there; a token that renders no text (control
// tokens) never. Stacks live in an arena, each interned as (position, rest), so equal stacks are
// one number and a state is a short sorted list of them.
//
// Two ways to find the allowed tokens: mask() walks the vocabulary's pieces sorted by bytes, so
// that pieces sharing a prefix share its steps and a dead prefix skips every piece that begins
// with it (cheap after punctuation, where few tokens fit); allows() checks one token (cheap when
// most tokens fit, as inside a string, when the sampler checks tokens in the order of their
// logits). The sampler (sampler.h) uses both.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar.h"
#include "status.h"

namespace h2o {

class Tokenizer;

// A vocabulary's tokens as the text they add, sorted by bytes, made once per session.
struct TokenSurfaces {
    enum Kind : uint8_t {
        kText,
        kEndOfGeneration,
        kNever
    };
    std::vector<uint8_t> kind;         // per token
    std::vector<std::string> text;     // per token: the bytes it appends (after_bos false)
    std::vector<uint8_t> drops_space;  // per token: right after BOS it loses its leading space
    std::vector<int32_t> sorted;       // the text tokens by their bytes
    std::vector<uint32_t> common;      // common[i]: bytes sorted[i] shares with sorted[i - 1]
    // The bytes of sorted[i] after those it shares, back to back from suffix_start[i] (the
    // vocabulary's trie as one stream, which a walk reads in order).
    std::vector<uint8_t> suffix_bytes;
    std::vector<uint32_t> suffix_start;  // sorted.size() + 1 entries

    // Control tokens render as nothing and are never generated under a grammar, except those of
    // `spelled` (spelled_controls): they add their own spelling, "[TOOL_CALLS]", as a literal of
    // the grammar asks for it.
    static std::shared_ptr<const TokenSurfaces> build(const Tokenizer &tokenizer, const std::vector<int32_t> &spelled = {});
    // The control tokens (not end-of-generation ones) whose spelling the grammar's text holds.
    static std::vector<int32_t> spelled_controls(const Tokenizer &tokenizer, const Grammar &grammar);
    // From each token's text and kind directly (tests; build() ends here): drops_space stays 0
    // unless given.
    static std::shared_ptr<TokenSurfaces> from_texts(std::vector<std::string> texts, std::vector<uint8_t> kinds,
                                                     std::vector<uint8_t> drops_space = {});
};

class GrammarMatcher {
public:
    GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenSurfaces> vocab);

    // Back to the start of the grammar.
    void reset();
    // Whether `token` may come next; after_bos: it follows BOS directly (a sentencepiece piece
    // then drops its leading space).
    bool allows(int32_t token, bool after_bos = false) const;
    // Takes `token`, which must be allowed (H2O_ERR_INVALID_ARGUMENT otherwise, the state kept).
    Status accept(int32_t token, bool after_bos = false);
    // The grammar may end here / nothing but the end may follow.
    bool can_end() const { return complete_ && partial_need_ == 0; }
    bool must_end() const { return can_end() && stacks_.empty(); }
    // allowed[token] = allows(token) for every token, walking the sorted pieces. With a budget of
    // steps (code-point or byte advances; 0: none), returns false, leaving allowed unspecified,
    // once the walk takes more, or when a bound on the work was hit (failure() says which:
    // the arena's, H2O_ERR_OUT_OF_MEMORY; too many alternatives, H2O_ERR_INVALID_ARGUMENT).
    bool mask(std::vector<uint8_t> *allowed, size_t budget = 0) const;
    // An error the arena hit (too many distinct stacks), or Ok.
    const Status &failure() const { return failure_; }

private:
    // A state: the stacks whose top is a character set (sorted ids), whether the grammar may end,
    // and the bytes of a character begun but not finished.
    struct State {
        std::vector<int32_t> stacks;
        bool complete = false;
        uint8_t need = 0;    // continuation bytes still to come
        uint8_t length = 0;  // the character's bytes in all
        uint32_t code = 0;   // the character's bits so far
    };
    int32_t intern(uint32_t element, int32_t rest) const;
    // The stacks with a character set on top that the stack `node` expands to (memoized), with -1
    // for the empty stack: the grammar matched.
    const std::vector<int32_t> &expand(int32_t node) const;
    // The stack after node's top character set matched: its next position over the same rest
    // (memoized, as a walk asks it once per byte).
    int32_t advanced(int32_t node) const;
    void push_expanded(int32_t node, State *out) const;
    // next = state after byte b; false when nothing survives.
    bool step(const State &state, uint8_t b, State *next) const;
    bool advance_code_point(const State &state, uint32_t cp, State *next) const;
    bool walk(std::string_view bytes, State *state) const;

    // The states a walk reaches, interned, and their transitions by byte, so that walking the
    // vocabulary takes each (state, byte) once: inside a string, most tokens' bytes leave the
    // state as it was, and the next mask finds every step done. The cache is bounded
    // (grammar_matcher.cpp); a walk that fills it is done again without it.
    static constexpr int32_t kDead = -1, kUncached = -2;
    // The current state's id (interned on first use after accept or a trim).
    int32_t current_state() const;
    int32_t state_id(State &&state) const;            // or kUncached
    int32_t next_state(int32_t id, uint8_t b) const;  // kDead, kUncached or the state after b
    // The state after bytes from `id`: kDead, kUncached or its id.
    int32_t walk_cached(std::string_view bytes, int32_t id) const;
    void trim_cache() const;  // empties it when full
    // The walks of mask() with and without the cache: 1 done, 0 past the budget, -1 (cached
    // only) the cache filled.
    int mask_walk(std::vector<uint8_t> *allowed, size_t budget, bool cached) const;
    bool ends_allowed(const State &state) const { return state.complete && state.need == 0; }
    std::string_view text_of(int32_t token, bool after_bos) const;

    std::shared_ptr<const Grammar> grammar_;
    std::shared_ptr<const TokenSurfaces> vocab_;
    // The stack arena: node i is (element i is at, the rest of the stack below: -1 none).
    mutable std::vector<uint32_t> node_element_;
    mutable std::vector<int32_t> node_rest_;
    mutable std::unordered_map<uint64_t, int32_t> node_ids_;
    mutable std::vector<std::vector<int32_t>> expanded_;
    mutable std::vector<uint8_t> expanded_done_;
    static constexpr int32_t kNotYet = -3;
    mutable std::vector<int32_t> advanced_;  // advanced(node), or kNotYet
    mutable Status failure_;
    std::vector<int32_t> stacks_;  // the current state's
    bool complete_ = false;
    uint8_t partial_need_ = 0, partial_length_ = 0;
    uint32_t partial_code_ = 0;
    mutable std::vector<State> scratch_;  // per depth of a walk

    mutable std::vector<State> states_;
    mutable std::unordered_map<std::string, int32_t> state_ids_;
    // transitions_[row_start_[id] + b] (b & 0x3F inside a character): the state after byte b,
    // stored + 2 (0: not known yet, 1: dead).
    mutable std::vector<int32_t> transitions_;
    mutable std::vector<uint32_t> row_start_;
    mutable int32_t current_id_ = kUncached;  // kUncached: not interned yet
    // The last few whole masks by state (a state recurs token after token inside a string):
    // most recent last.
    static constexpr size_t kKeptMasks = 4;
    mutable std::vector<std::pair<int32_t, std::vector<uint8_t>>> kept_masks_;
    mutable std::vector<int32_t> scratch_ids_;
};

}  // namespace h2o
