// Times h2o's sampler over one vocabulary-sized logit row: prints, for each setting, the median,
// lowest and highest microseconds per call of `calls` calls (each on a fresh copy of the row,
// which the repetition penalty would change). The logits are normal with a standard deviation of
// 3 (seeded), near what a trained model's last layer gives.
// Usage: sample_time N_VOCAB CALLS
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "sampler.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: sample_time N_VOCAB CALLS\n");
        return 2;
    }
    const int n_vocab = std::atoi(argv[1]);
    const int calls = std::atoi(argv[2]);
    if (n_vocab < 2 || calls < 1) {
        std::fprintf(stderr, "sample_time: N_VOCAB must be at least 2 and CALLS at least 1\n");
        return 2;
    }
    std::mt19937 random(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> row(static_cast<size_t>(n_vocab));
    for (float &x : row) x = normal(random);

    struct Setting {
        const char *name;
        h2o::SamplerSettings s;
    };
    h2o::SamplerSettings defaults;  // temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
    h2o::SamplerSettings no_top_k = defaults;
    no_top_k.top_k = 0;
    h2o::SamplerSettings top_p_only = no_top_k;
    top_p_only.min_p = 0.0f;
    h2o::SamplerSettings penalty = defaults;
    penalty.repeat_penalty = 1.1f;
    h2o::SamplerSettings greedy;
    greedy.temperature = 0.0f;
    const Setting settings[] = {{"defaults (t 0.8, top-k 40, top-p 0.95, min-p 0.05)", defaults},
                                {"top-k off (t 0.8, top-p 0.95, min-p 0.05)", no_top_k},
                                {"top-p only (t 0.8, top-p 0.95)", top_p_only},
                                {"defaults + repeat penalty 1.1 over 64", penalty},
                                {"greedy", greedy}};
    h2o::TokenHistory history;
    for (int i = 0; i < 64; ++i) history.push(static_cast<int32_t>(random() % static_cast<unsigned>(n_vocab)));
    h2o::Sampler sampler(n_vocab, 1);
    std::vector<float> logits(row.size());
    for (const Setting &setting : settings) {
        std::vector<double> us;
        for (int i = 0; i < calls; ++i) {
            logits = row;
            const auto t0 = std::chrono::steady_clock::now();
            volatile int32_t token = sampler.sample(logits.data(), setting.s, history);
            (void)token;
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(us.begin(), us.end());
        std::printf("%-55s %8.1f us (%.1f-%.1f), %d calls, %d logits\n", setting.name, us[us.size() / 2], us.front(), us.back(), calls,
                    n_vocab);
    }
    return 0;
}
