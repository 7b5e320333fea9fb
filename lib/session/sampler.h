// Token sampling: greedy, temperature, top-k, top-p, min-p and a repetition penalty, driven by a
// seeded generator whose output is the same on every platform.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "byte_io.h"
#include "greedy_index.h"

namespace h2o {

struct SamplerSettings {
    // Added to these tokens' logits first (h2o_generate_params.logit_bias_*).
    std::vector<std::pair<int32_t, float>> logit_bias;
    float temperature = 0.8f;  // <= 0: greedy
    uint32_t top_k = 40;       // 0: off
    float top_p = 0.95f;       // >= 1: off
    float min_p = 0.05f;       // <= 0: off
    float repeat_penalty = 1.0f;
    uint32_t repeat_last_n = 64;
};

// The most recent tokens of a session, for the repetition penalty. Fixed capacity, allocated once.
class TokenHistory {
public:
    static constexpr uint32_t kCapacity = 4096;
    TokenHistory() : ring_(kCapacity, 0) {}
    void push(int32_t token) {
        ring_[next_] = token;
        next_ = (next_ + 1) % kCapacity;
        if (size_ < kCapacity) ++size_;
    }
    void clear() { size_ = next_ = 0; }
    void save(ByteWriter &out) const {
        out.put(next_);
        out.put(size_);
        out.put_array(ring_);
    }
    Status load(ByteReader &in) {
        H2O_TRY(in.get("token history position", &next_));
        H2O_TRY(in.get("token history size", &size_));
        H2O_TRY(in.get_array("token history", kCapacity, &ring_));
        if (next_ >= kCapacity || size_ > kCapacity) {
            clear();
            return make_error(H2O_ERR_STATE_FORMAT, "token history position or size out of range");
        }
        return Status::Ok();
    }
    uint32_t size() const { return size_; }
    // The i-th most recent token (0 = newest), i < size().
    int32_t recent(uint32_t i) const { return ring_[(next_ + kCapacity - 1 - i) % kCapacity]; }

private:
    std::vector<int32_t> ring_;
    uint32_t next_ = 0, size_ = 0;
};

// What a constraint (a grammar) lets through. The sampler asks for the whole vocabulary within a
// budget of work; where that is too much (most tokens fit), it asks token by token in the order
// of the logits, as far as the draw needs (greedy: the best allowed; top-k: the k best allowed),
// which gives the same distribution as masking everything first.
class TokenFilter {
public:
    virtual ~TokenFilter() = default;
    virtual bool allows(int32_t token) const = 0;
    // allowed[t] for every token; false when that would take more than `budget` steps (0: no bound).
    virtual bool mask(std::vector<uint8_t> *allowed, size_t budget) const = 0;
};

class Sampler {
public:
    Sampler(int n_vocab, uint64_t seed);
    void reseed(uint64_t seed);
    // The generator's state, for session snapshots.
    void save(ByteWriter &out) const {
        for (uint64_t s : state_) out.put(s);
    }
    Status load(ByteReader &in) {
        for (uint64_t &s : state_) H2O_TRY(in.get("sampler state", &s));
        return Status::Ok();
    }
    // Picks a token from logits (modified in place: the bias, the penalty and the filter's mask,
    // -infinity for each token it refuses). -1: the filter allows no token at all.
    int32_t sample(float *logits, const SamplerSettings &settings, const TokenHistory &history, const TokenFilter *filter = nullptr);
    // The tokens sample() draws from for these logits (after the penalty) and a temperature above
    // 0: best first, each with its probability among the top-k candidates (the draw scales them to
    // sum to 1). For tests.
    std::vector<std::pair<float, int32_t>> kept(const float *logits, const SamplerSettings &settings);

private:
    double next_uniform();  // in [0, 1)
    // Leaves what kept() returns at the front of candidates_; returns how many.
    size_t keep_candidates(const float *logits, const SamplerSettings &settings);
    // Sets -infinity on the tokens the filter refuses, or, where finding them all costs too much,
    // on every token but the `wanted` best allowed ones by logit. False: none is allowed.
    bool apply_filter(float *logits, const TokenFilter &filter, size_t wanted);

    int n_vocab_;
    uint64_t state_[4];
    struct Candidate {
        float logit;
        float probability;  // among the top-k candidates
        int32_t token;
    };
    std::vector<Candidate> candidates_;  // sized n_vocab once
    std::vector<uint8_t> allowed_;       // a filter's mask, sized n_vocab on first use
};

}  // namespace h2o
