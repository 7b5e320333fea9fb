// The KV cache and its eviction policies: victims on hand-made statistics where the right answer is
// known, attention statistics (causal, summed over a GQA group), rolling re-rotation, and
// end-to-end invariants on the real model (budget, pinning, rolling past the context, chunked
// long prompts, constant memory).
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "h2o/h2o.h"
#include "h2o/h2o_experimental.h"
#include "kv_cache.h"
#include "kv_layer_budgets.h"
#include "session_util.h"
#include "model.h"
#include "session.h"
#include "test_util.h"

using namespace h2o;

namespace {

// A cache of one (layer, kv head) with n slots holding stream indices 0..n-1.
struct SmallCache {
    KvCache cache;
    explicit SmallCache(KvPolicyConfig policy, int n = 8, bool rolling = false) {
        KvConfig c;
        c.n_layer = 1;
        c.n_head_kv = 1;
        c.head_dim = 4;
        c.n_slots = n;
        c.policy = policy;
        c.rolling = rolling;
        c.rope.dims = 4;
        c.rope.freq_base = 10000.0f;
        REQUIRE(cache.init(c).ok());
        for (int i = 0; i < n; ++i) cache.claim_slot(0, 0, i, i, false);
    }
    KvCache::CellView view() { return cache.cell(0, 0); }
    // Sets one statistic of every slot.
    void set(float SlotStats::*field, const float *values) {
        for (int s = 0; s < cache.config().n_slots; ++s) view().stats[s].*field = values[s];
    }
    // Evicts for one incoming token (stream index n) and returns the evicted stream indices.
    std::set<int64_t> evict(int n_new = 1) {
        std::vector<int64_t> before(view().stream_index, view().stream_index + cache.config().n_slots);
        cache.make_room(0, 0, n_new, cache.config().n_slots);
        std::set<int64_t> gone;
        for (int s = 0; s < cache.config().n_slots; ++s) {
            if (before[s] >= 0 && view().stream_index[s] < 0) gone.insert(before[s]);
        }
        return gone;
    }
};

KvPolicyConfig policy_of(KvPolicy p, int recent = 0, int sinks = 0) {
    KvPolicyConfig c;
    c.policy = p;
    c.recent = recent;
    c.sinks = sinks;
    return c;
}

}  // namespace

TEST_CASE("policies pick the victim their definition names") {
    SUBCASE("h2o: smallest accumulated attention outside the recent window") {
        SmallCache c(policy_of(KvPolicy::H2O, /*recent=*/3));
        const float acc[8] = {5, 0.5f, 2, 0.2f, 3, 4, 0.1f, 0.0f};
        c.set(&SlotStats::accumulated, acc);
        // Indices 6 and 7 are the newest two cached tokens (recent 3 counts the incoming one).
        CHECK(c.evict() == std::set<int64_t>{3});
    }
    SUBCASE("window: the oldest") {
        SmallCache c(policy_of(KvPolicy::Window));
        CHECK(c.view().stats == nullptr);  // window policies keep no statistics
        CHECK(c.evict() == std::set<int64_t>{0});
    }
    SUBCASE("sink_window: the oldest after the sinks") {
        SmallCache c(policy_of(KvPolicy::SinkWindow, 0, /*sinks=*/2));
        CHECK(c.evict() == std::set<int64_t>{2});
        CHECK(c.evict(3).size() == 2);  // one slot is still free
    }
    SUBCASE("scissorhands: least persistent importance") {
        SmallCache c(policy_of(KvPolicy::Scissorhands, 2));
        const float persistence[8] = {3, 2, 0.5f, 4, 1, 2, 5, 0};
        c.set(&SlotStats::persistence, persistence);
        CHECK(c.evict() == std::set<int64_t>{2});
    }
    SUBCASE("tova: lowest attention at the last step, no recent window") {
        SmallCache c(policy_of(KvPolicy::Tova));
        const float last[8] = {0.3f, 0.2f, 0.1f, 0.2f, 0.05f, 0.05f, 0.08f, 0.02f};
        c.set(&SlotStats::last, last);
        CHECK(c.evict() == std::set<int64_t>{7});
    }
    SUBCASE("roco: lowest mean attention since entry") {
        SmallCache c(policy_of(KvPolicy::RoCo, 2));
        // Slot 0 accumulated most but over many steps; slot 4 has the lowest mean.
        const float acc[8] = {8, 3, 3, 3, 1, 3, 2, 0};
        const float steps[8] = {8, 2, 2, 2, 4, 2, 1, 1};
        c.set(&SlotStats::accumulated, acc);
        c.set(&SlotStats::steps, steps);
        CHECK(c.evict() == std::set<int64_t>{4});
    }
    SUBCASE("mean_h2o: lowest mean attention, sinks and recent window protected") {
        SmallCache c(policy_of(KvPolicy::MeanH2O, 2, 1));
        const float acc[8] = {0, 4, 1, 3, 3, 3, 2, 0};
        const float steps[8] = {8, 7, 6, 5, 4, 3, 2, 1};
        c.set(&SlotStats::accumulated, acc);
        c.set(&SlotStats::steps, steps);
        CHECK(c.evict() == std::set<int64_t>{2});
    }
    SUBCASE("random: deterministic for a seed and never a protected token") {
        std::set<int64_t> first;
        for (int run = 0; run < 2; ++run) {
            KvPolicyConfig p = policy_of(KvPolicy::Random, 3, 0);
            p.seed = 11;
            SmallCache c(p);
            c.view().tag[2] = KV_TAG_PINNED;
            const std::set<int64_t> gone = c.evict(2);
            REQUIRE(gone.size() == 2);
            for (int64_t i : gone) CHECK((i != 2 && i < 6));
            if (run == 0)
                first = gone;
            else
                CHECK(gone == first);
        }
    }
    SUBCASE("horizon: stale tokens go first, oldest first, whatever their statistics") {
        KvPolicyConfig p = policy_of(KvPolicy::Scissorhands, 2);
        p.horizon = 6;  // with token 8 coming in, tokens 0..2 lie 6 or more behind it
        const float persistence[8] = {9, 8, 7, 0.5f, 4, 1, 2, 0};
        SmallCache c(p);
        c.set(&SlotStats::persistence, persistence);
        CHECK(kv_stale_before(p, 8, 1) == 3);
        CHECK(c.evict() == std::set<int64_t>{0});
        SmallCache two(p);
        two.set(&SlotStats::persistence, persistence);
        CHECK(two.evict(2) == std::set<int64_t>{0, 1});  // newest is 9: 0..3 are stale
        SmallCache pinned(p);
        pinned.set(&SlotStats::persistence, persistence);
        pinned.view().tag[0] = KV_TAG_PINNED;  // pinning outranks the horizon
        CHECK(pinned.evict() == std::set<int64_t>{1});
        // Once nothing is stale the policy decides again: 3 is the least persistent.
        SmallCache many(p);
        many.set(&SlotStats::persistence, persistence);
        CHECK(many.evict(4) == std::set<int64_t>{0, 1, 2, 3});
    }
    SUBCASE("horizon: sinks stay, and no horizon means no stale tokens") {
        KvPolicyConfig p = policy_of(KvPolicy::MeanH2O, 2, /*sinks=*/1);
        p.horizon = 6;
        SmallCache c(p);
        const float steps[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        const float acc[8] = {9, 8, 7, 0.5f, 4, 1, 2, 0};
        c.set(&SlotStats::accumulated, acc);
        c.set(&SlotStats::steps, steps);
        CHECK(c.evict() == std::set<int64_t>{1});
        p.horizon = 0;
        CHECK(kv_stale_before(p, 1000, 1) == 0);
        SmallCache none(p);
        none.set(&SlotStats::accumulated, acc);
        none.set(&SlotStats::steps, steps);
        CHECK(none.evict() == std::set<int64_t>{3});
    }
    SUBCASE("ties go to the oldest") {
        SmallCache c(policy_of(KvPolicy::H2O, 1));
        CHECK(c.evict() == std::set<int64_t>{0});
    }
}

TEST_CASE("one-shot prompt eviction: a prompt batch ranks by the proxy queries' attention, a token by the policy's") {
    KvPolicyConfig p = policy_of(KvPolicy::H2O, /*recent=*/3);
    p.prompt_proxy = 4;
    const float acc[8] = {5, 0.5f, 2, 0.2f, 3, 4, 0.1f, 0.0f};  // H2O would take 3, then 1
    const float last[8] = {0.3f, 0.9f, 0.05f, 0.8f, 0.01f, 0.6f, 0.2f, 0.1f};
    SUBCASE("a batch of two: the two smallest proxy attentions outside the window (4, then 2)") {
        SmallCache c(p);
        c.set(&SlotStats::accumulated, acc);
        c.set(&SlotStats::last, last);
        CHECK(c.evict(2) == std::set<int64_t>{2, 4});
    }
    SUBCASE("one token: the policy's ranking") {
        SmallCache c(p);
        c.set(&SlotStats::accumulated, acc);
        c.set(&SlotStats::last, last);
        CHECK(c.evict(1) == std::set<int64_t>{3});
    }
    SUBCASE("without a proxy, a batch ranks by the policy too") {
        p.prompt_proxy = 0;
        SmallCache c(p);
        c.set(&SlotStats::accumulated, acc);
        c.set(&SlotStats::last, last);
        CHECK(c.evict(2) == std::set<int64_t>{3, 6});
    }
    SUBCASE("the random share ranks by the proxy attention times each token's random factor") {
        p.prompt_random_share = 0.5f;
        // The victims the spec's factors give tokens 0..6 (7 is in the window) of cell 0, for
        // the first seed where they differ from the plain proxy's (4 and 2).
        std::set<int64_t> expected;
        for (p.seed = 1; p.seed < 100; ++p.seed) {
            std::vector<std::pair<float, int64_t>> ranked;
            for (int64_t i = 0; i < 7; ++i) {
                ranked.push_back({last[i] * kv_prompt_random_factor(static_cast<uint32_t>(i), 0, 0, kv_prompt_seed(p), 0.5f), i});
            }
            std::sort(ranked.begin(), ranked.end());
            expected = {ranked[0].second, ranked[1].second};
            if (expected != std::set<int64_t>{2, 4}) break;
        }
        REQUIRE(p.seed < 100);
        SmallCache c(p);
        c.set(&SlotStats::accumulated, acc);
        c.set(&SlotStats::last, last);
        CHECK(c.evict(2) == expected);
    }
}

TEST_CASE("pinned tokens are never evicted, and a fully protected cache evicts the oldest unpinned") {
    SmallCache c(policy_of(KvPolicy::H2O, /*recent=*/8));  // the window covers everything
    for (int s = 0; s < 3; ++s) c.view().tag[s] = KV_TAG_PINNED;
    c.view().stats[5].accumulated = -1;  // would be the H2O victim if allowed
    CHECK(c.evict() == std::set<int64_t>{3});
    CHECK(c.evict(3) == std::set<int64_t>{4, 5});  // one slot is still free: two more go
}

TEST_CASE("rolling: evicting a token rotates the keys after it back by one position") {
    SmallCache c(policy_of(KvPolicy::Window), 4, /*rolling=*/true);
    const float key[4] = {1.0f, 0.5f, -0.25f, 2.0f};
    // Keys are stored rotated by their rank; slot 3 holds rank 3.
    auto rotated = [&](int position, float *out) {
        for (int i = 0; i < 2; ++i) {
            const double theta = position * std::pow(10000.0, -2.0 * i / 4);
            out[2 * i] = static_cast<float>(key[2 * i] * std::cos(theta) - key[2 * i + 1] * std::sin(theta));
            out[2 * i + 1] = static_cast<float>(key[2 * i] * std::sin(theta) + key[2 * i + 1] * std::cos(theta));
        }
    };
    auto key_of = [&](int s) { return reinterpret_cast<float *>(c.view().keys + 16 * s); };  // F32 rows
    for (int s = 0; s < 4; ++s) rotated(s, key_of(s));
    CHECK(c.evict() == std::set<int64_t>{0});
    float expected[4];
    for (int s = 1; s < 4; ++s) {
        CHECK(c.view().position[s] == s - 1);
        rotated(s - 1, expected);
        for (int d = 0; d < 4; ++d) CHECK(key_of(s)[d] == doctest::Approx(expected[d]).epsilon(1e-5));
    }
}

TEST_CASE("attention statistics are causal and sum the query heads of a kv group") {
    // 1 layer, 2 kv heads, 4 query heads (groups of 2), head_dim 4, 8 slots. Zero queries give
    // uniform attention, so query t gives each of the t+1 visible slots 1/(t+1) per head.
    ModelShape shape;
    shape.n_head = 4;
    shape.n_head_kv = 2;
    shape.head_dim = 4;
    shape.n_embd = 16;
    auto backend = make_cpu_backend(2, 8);
    KvConfig kv;
    kv.n_layer = 1;
    kv.n_head_kv = 2;
    kv.head_dim = 4;
    kv.n_slots = 8;
    kv.policy = policy_of(KvPolicy::H2O, 4);
    REQUIRE(backend->kv_store().create_kv(kv).ok());
    Tensor q, k, v, out, positions;
    REQUIRE(backend->alloc(TensorType::F32, 16, 3, &q).ok());
    REQUIRE(backend->alloc(TensorType::F32, 8, 3, &k).ok());
    REQUIRE(backend->alloc(TensorType::F32, 8, 3, &v).ok());
    REQUIRE(backend->alloc(TensorType::F32, 16, 3, &out).ok());
    REQUIRE(backend->alloc(TensorType::I32, 1, 3, &positions).ok());
    std::vector<float> values(24);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    REQUIRE(backend->upload(v, values.data(), values.size() * sizeof(float)).ok());
    const int32_t pos[3] = {0, 1, 2};
    REQUIRE(backend->upload(positions, pos, sizeof(pos)).ok());
    REQUIRE(backend->attention(out, q, k, v, 0, AttentionBatch{3, 0, positions, 0}, shape).ok());

    // Output of query 2, head 0 (kv head 0): the mean of the three value vectors of kv head 0.
    std::vector<float> o(48);
    REQUIRE(backend->download(out, o.data(), o.size() * sizeof(float)).ok());
    for (int d = 0; d < 4; ++d) CHECK(o[2 * 16 + d] == doctest::Approx((values[d] + values[8 + d] + values[16 + d]) / 3));

    // Slot j of each kv head: steps = queries at or after it; accumulated = 2 heads × Σ_{t>=j} 1/(t+1).
    std::vector<int64_t> indices(2 * 8);
    REQUIRE(backend->kv_store().download_kv_stream_indices(indices.data()).ok());
    std::vector<SlotStats> stats(2 * 8);
    REQUIRE(backend->kv_store().download_kv_statistics(stats.data()).ok());
    const double expected_acc[3] = {2 * (1.0 + 0.5 + 1.0 / 3), 2 * (0.5 + 1.0 / 3), 2 * (1.0 / 3)};
    for (int h = 0; h < 2; ++h) {
        for (int j = 0; j < 3; ++j) {
            const SlotStats &st = stats[h * 8 + j];
            CHECK(indices[h * 8 + j] == j);
            CHECK(st.accumulated == doctest::Approx(expected_acc[j]));
            CHECK(st.steps == 3 - j);
            CHECK(st.last == doctest::Approx(2.0 / 3));  // the last query's weight
        }
        CHECK(indices[h * 8 + 3] == -1);
    }
    // Persistence: query t counts slots above a uniform share 2/(t+1); uniform weights equal it
    // exactly, so nothing is counted.
    CHECK(stats[0].persistence == 0.0f);
}

namespace {

struct RealSession {
    std::unique_ptr<Model> model;
    std::unique_ptr<Session> session;
    RealSession(const std::string &path, int budget, KvPolicy policy, bool rolling, int recent = -1, int n_ctx = 0,
                float layer_slope = 0.0f) {
        REQUIRE(Model::load(path, "", &model).ok());
        SessionSettings s;
        s.n_ctx = n_ctx ? n_ctx : static_cast<int>(model->n_ctx_train());
        s.kv_budget = budget;
        s.policy = policy_of(policy, recent < 0 ? budget / 2 : recent, policy == KvPolicy::SinkWindow ? 4 : 0);
        s.rolling = rolling;
        s.n_threads = 1;  // the model is tiny: a second thread costs more than it brings
        s.n_batch = 64;
        s.seed = 3;
        s.kv_layer_slope = layer_slope;
        REQUIRE(Session::create(*model, s, &session).ok());
    }
    // Stream indices held by every (layer, kv head), [layer * n_head_kv + head] -> sorted list.
    std::vector<std::vector<int64_t>> kept() {
        const KvConfig &kv = session->kv_config();
        std::vector<int64_t> all(static_cast<size_t>(kv.total_slots()));
        REQUIRE(session->backend().kv_store().download_kv_stream_indices(all.data()).ok());
        std::vector<std::vector<int64_t>> heads(static_cast<size_t>(kv.n_layer) * kv.n_head_kv);
        size_t at = 0;
        for (size_t h = 0; h < heads.size(); ++h) {
            const int slots = kv.slots_in(static_cast<int>(h / static_cast<size_t>(kv.n_head_kv)));
            for (int s = 0; s < slots; ++s, ++at) {
                if (all[at] >= 0) heads[h].push_back(all[at]);
            }
            std::sort(heads[h].begin(), heads[h].end());
        }
        return heads;
    }
};

using h2o_test::greedy;

}  // namespace

TEST_CASE("every (layer, kv head) holds exactly the budget, and heads keep different tokens") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    RealSession r(path, 32, KvPolicy::H2O, /*rolling=*/true, 8);
    REQUIRE(r.session->generate("Once upon a time", greedy(600), nullptr, nullptr).ok());
    const auto heads = r.kept();
    const int64_t n_past = r.session->n_past();
    bool heads_differ = false;
    for (const auto &h : heads) {
        CHECK(h.size() == 32);
        CHECK(std::set<int64_t>(h.begin(), h.end()).size() == h.size());
        CHECK(h.back() == n_past - 1);         // the newest token is always kept
        CHECK(h[h.size() - 8] == n_past - 8);  // and the whole recent window
        heads_differ |= h != heads[0];
    }
    CHECK(heads_differ);
}

TEST_CASE("pinned tokens survive tens of thousands of tokens of heavy eviction in every head") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    RealSession r(path, 48, KvPolicy::H2O, /*rolling=*/true);
    REQUIRE(r.session->add_text("You are a storyteller. Always tell happy stories about a cat named Tom.", true).ok());
    const int64_t n_pinned = r.session->n_past();
    REQUIRE(n_pinned > 10);
    for (int turn = 0; turn < 5; ++turn) {
        GenerateSettings g = greedy(4000);
        g.sampler.temperature = 0.8f;  // varied text, so eviction keeps changing
        REQUIRE(r.session->generate("", g, nullptr, nullptr).ok());
    }
    CHECK(r.session->n_past() > 20000);
    for (const auto &h : r.kept()) {
        for (int64_t i = 0; i < n_pinned; ++i) CHECK(std::binary_search(h.begin(), h.end(), i));
        CHECK(h.size() == 48);
    }
}

TEST_CASE("pinning more than the budget allows is refused and adds nothing") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    RealSession r(path, 8, KvPolicy::H2O, true);
    const Status s = r.session->add_text("Once upon a time there was a little girl who liked to play", true);
    CHECK(s.code == H2O_ERR_INVALID_ARGUMENT);
    CHECK(s.message.find("pin") != std::string::npos);
    CHECK(r.session->n_past() == 0);
}

TEST_CASE("position rolling runs far past the model's context, and without it the context ends") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    {
        RealSession r(path, 64, KvPolicy::SinkWindow, /*rolling=*/true, 60, /*n_ctx=*/512);
        for (int i = 0; i < 3; ++i) REQUIRE(r.session->generate(i == 0 ? "Once upon a time" : "", greedy(1000), nullptr, nullptr).ok());
        CHECK(r.session->n_past() > 3000);
    }
    {
        RealSession r(path, 64, KvPolicy::SinkWindow, /*rolling=*/false, 60, /*n_ctx=*/512);
        const Status s = r.session->generate("Once upon a time", greedy(1000), nullptr, nullptr);
        CHECK(s.code == H2O_ERR_CONTEXT_FULL);
        CHECK(s.message.find("position_rolling") != std::string::npos);
        CHECK(r.session->n_past() == 512);
    }
}

TEST_CASE("a long document is fed in chunks with eviction in between") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(text_path, "data/tinystories_val.txt");
    RealSession r(path, 128, KvPolicy::H2O, /*rolling=*/true);
    std::vector<int32_t> tokens;
    std::string text(60000, ' ');
    FILE *f = std::fopen(text_path.c_str(), "rb");
    REQUIRE(f);
    text.resize(std::fread(text.data(), 1, text.size(), f));
    std::fclose(f);
    REQUIRE(r.model->tokenizer().encode(text, true, &tokens).ok());
    REQUIRE(tokens.size() > 10000);
    REQUIRE(r.session->decode(tokens.data(), tokens.size()).ok());
    CHECK(r.session->n_past() == static_cast<int64_t>(tokens.size()));
    for (const auto &h : r.kept()) CHECK(h.size() == 128);
    // The model still predicts sensibly: the logits are finite and not flat.
    REQUIRE(r.session->fetch_logits().ok());
    const auto &logits = r.session->logits();
    const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
    CHECK(std::isfinite(*lo));
    CHECK(*hi - *lo > 1.0f);
}

TEST_CASE("the full policy refuses to evict") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    RealSession r(path, 32, KvPolicy::Full, false);
    const Status s = r.session->generate("Once upon a time", greedy(100), nullptr, nullptr);
    CHECK(s.code == H2O_ERR_CONTEXT_FULL);
    CHECK(r.session->n_past() == 32);
}

TEST_CASE("kv_horizon: defaults by policy, validation, and no kept token beyond it on a long stream") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    auto horizon_of = [&](uint32_t policy, uint32_t horizon) -> int64_t {
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.n_threads = 1;
        sp.kv_budget = 64;
        sp.position_rolling = 1;
        sp.kv_policy = policy;
        sp.kv_horizon = horizon;
        h2o_session *session = nullptr;
        if (h2o_session_create(model, &sp, &session) != H2O_OK) return -1;
        h2o_kv_layout layout;
        layout.struct_size = sizeof layout;
        REQUIRE(h2o_session_get_kv_layout(session, &layout) == H2O_OK);
        h2o_session_free(session);
        return layout.horizon;
    };
    CHECK(horizon_of(H2O_KV_SCISSORHANDS, 0) == 96);  // the default: 1.5 budgets
    CHECK(horizon_of(H2O_KV_SCISSORHANDS, H2O_KV_HORIZON_NONE) == 0);
    CHECK(horizon_of(H2O_KV_H2O, 0) == 0);
    CHECK(horizon_of(H2O_KV_H2O, 80) == 80);
    CHECK(horizon_of(H2O_KV_TOVA, 64) == 64);
    CHECK(horizon_of(H2O_KV_WINDOW, 80) == 0);  // ranks by age already: ignored
    CHECK(horizon_of(H2O_KV_SCISSORHANDS, 63) == -1);
    CHECK(std::string(h2o_last_error()).find("kv_horizon 63 is smaller than kv_budget 64") != std::string::npos);
    CHECK(horizon_of(H2O_KV_H2O, 0x80000000u) == -1);
    CHECK(std::string(h2o_last_error()).find("exceeds the maximum") != std::string::npos);
    h2o_model_free(model);

    // Every eviction takes the stale tokens first, so after a long stream no (layer, kv head)
    // holds a token 96 or more behind the newest, whatever the policy thought of it.
    RealSession r(path, 64, KvPolicy::Scissorhands, /*rolling=*/true, 56);
    KvPolicyConfig policy = r.session->settings().policy;
    REQUIRE(policy.horizon == 0);
    policy.horizon = 96;
    SessionSettings s = r.session->settings();
    s.policy = policy;
    REQUIRE(Session::create(*r.model, s, &r.session).ok());
    REQUIRE(r.session->generate("Once upon a time", greedy(600), nullptr, nullptr).ok());
    const int64_t newest = r.session->n_past() - 1;
    size_t kept_far_back = 0;  // beyond the recent window: kept for their attention
    for (const auto &h : r.kept()) {
        REQUIRE(h.size() == 64);
        CHECK(h.front() > newest - 96);
        kept_far_back += static_cast<size_t>(std::count_if(h.begin(), h.end(), [&](int64_t i) { return i <= newest - 56; }));
    }
    CHECK(kept_far_back > 0);
}

TEST_CASE("kv_prompt_proxy: validation, and a prompt longer than the budget read by it") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    auto create = [&](uint32_t policy, uint32_t budget, uint32_t proxy, float share, h2o_session **out) {
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.n_threads = 1;
        sp.n_ctx = 256;
        sp.kv_budget = budget;
        sp.kv_policy = policy;
        if (budget == 0) sp.kv_overflow = H2O_KV_OVERFLOW_ERROR;  // the cache that never evicts
        sp.experimental[H2O_EXP_KV_PROMPT_PROXY] = proxy;
        sp.experimental[H2O_EXP_KV_PROMPT_RANDOM_SHARE] = share;
        return h2o_session_create(model, &sp, out);
    };
    h2o_session *session = nullptr;
    CHECK(create(H2O_KV_WINDOW, 32, 8, 0.0f, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_prompt_proxy needs a policy that gathers attention statistics") != std::string::npos);
    CHECK(create(H2O_KV_RANDOM, 32, 8, 0.0f, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(create(H2O_KV_H2O, 32, 4097, 0.0f, &session) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(std::string(h2o_last_error()).find("kv_prompt_proxy 4097 must be a whole number in [0, 4096]") != std::string::npos);
    for (float share : {-0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
        CHECK(create(H2O_KV_H2O, 32, 8, share, &session) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_last_error()).find("kv_prompt_random_share") != std::string::npos);
    }
    CHECK(session == nullptr);
    // A full cache never evicts, with or without rolling: it ignores the setting.
    REQUIRE(create(H2O_KV_WINDOW, 0, 8, 0.0f, &session) == H2O_OK);
    h2o_session_free(session);
    session = nullptr;
    REQUIRE(create(H2O_KV_FULL, 32, 8, 0.0f, &session) == H2O_OK);
    h2o_session_free(session);
    session = nullptr;
    // A 200-token prompt into 32 slots, read in batches ranked by the proxy, then generation.
    REQUIRE(create(H2O_KV_SCISSORHANDS, 32, 16, 0.25f, &session) == H2O_OK);
    std::string prompt;
    while (prompt.size() < 600) prompt += " Lily and Tom went to the park to play with the ball.";
    REQUIRE(h2o_session_add_text(session, prompt.data(), prompt.size(), 0) == H2O_OK);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 20;
    gen.stop_at_eos = 0;
    CHECK(h2o_generate(session, "", 0, &gen, nullptr, nullptr) == H2O_OK);
    h2o_session_free(session);
    h2o_model_free(model);
}

TEST_CASE("kv_layer_budgets spreads a budget across layers in the same total") {
    CHECK(kv_layer_budgets(5, 64, 0.5f, 2) == std::vector<int>{32, 48, 64, 80, 96});
    CHECK(kv_layer_budgets(5, 64, -0.5f, 2) == std::vector<int>{96, 80, 64, 48, 32});
    CHECK(kv_layer_budgets(5, 64, 0.0f, 2).empty());  // uniform: every layer the budget
    CHECK(kv_layer_budgets(1, 64, 0.5f, 2).empty());
    CHECK(kv_layer_budgets(3, 2, 0.9f, 2) == std::vector<int>{2, 2, 2});  // the floor holds the total
    for (int n_layer : {2, 5, 22, 80}) {
        for (int budget : {2, 3, 17, 64, 1000}) {
            for (float slope : {-0.9f, -0.3f, 0.1f, 0.37f, 0.9f}) {
                CAPTURE(n_layer);
                CAPTURE(budget);
                CAPTURE(slope);
                const std::vector<int> slots = kv_layer_budgets(n_layer, budget, slope, 2);
                REQUIRE(slots.size() == static_cast<size_t>(n_layer));
                CHECK(std::accumulate(slots.begin(), slots.end(), int64_t{0}) == int64_t{n_layer} * budget);
                CHECK(*std::min_element(slots.begin(), slots.end()) >= 2);
                for (int l = 1; l < n_layer; ++l) CHECK((slope > 0 ? slots[l] >= slots[l - 1] : slots[l] <= slots[l - 1]));
            }
        }
    }
}

TEST_CASE("kv_layer_slope: each layer holds its own budget and recent window, in the memory of a uniform cache") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    // stories260K has 5 layers: budget 32 with slope 0.5 gives 16, 24, 32, 40, 48 slots.
    RealSession r(path, 32, KvPolicy::Scissorhands, /*rolling=*/true, 16, 0, 0.5f);
    RealSession uniform(path, 32, KvPolicy::Scissorhands, /*rolling=*/true, 16);
    CHECK(r.session->memory().kv_bytes == uniform.session->memory().kv_bytes);
    REQUIRE(r.session->generate("Once upon a time", greedy(400), nullptr, nullptr).ok());
    const int64_t newest = r.session->n_past() - 1;
    const auto heads = r.kept();
    const int n_kv = r.model->shape().n_head_kv;
    for (size_t h = 0; h < heads.size(); ++h) {
        const int layer = static_cast<int>(h) / n_kv;
        const int slots = 16 + 8 * layer, recent = slots / 2;  // 16 of 32 recent: half of each layer's
        CAPTURE(layer);
        CHECK(heads[h].size() == static_cast<size_t>(slots));
        CHECK(heads[h].back() == newest);
        CHECK(heads[h][heads[h].size() - recent] == newest - recent + 1);  // the layer's recent window is whole
    }
    // Pins must fit the smallest layer (16 slots): 15 may be held, not more.
    RealSession p(path, 32, KvPolicy::H2O, /*rolling=*/true, -1, 0, 0.5f);
    const Status refused = p.session->add_text("Once upon a time there was a little girl who liked to play", true);
    CHECK(refused.code == H2O_ERR_INVALID_ARGUMENT);
    CHECK(refused.message.find("smallest layer budget") != std::string::npos);

    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    double resolved_slope = 0.0;  // h2o_session_get_experimental's, of the last session made
    auto layout_of = [&](uint32_t budget, float slope, h2o_kv_layout *layout) {
        h2o_session_params sp;
        h2o_session_params_init(&sp, sizeof sp);
        sp.n_threads = 1;
        sp.kv_budget = budget;
        // Budget 0: the cache that never evicts (n_ctx slots, kv_overflow = error).
        if (budget == 0) sp.kv_overflow = H2O_KV_OVERFLOW_ERROR;
        sp.experimental[H2O_EXP_KV_LAYER_SLOPE] = slope;
        h2o_session *session = nullptr;
        const h2o_status st = h2o_session_create(model, &sp, &session);
        if (st != H2O_OK) return st;
        layout->struct_size = sizeof *layout;
        REQUIRE(h2o_session_get_kv_layout(session, layout) == H2O_OK);
        REQUIRE(h2o_session_get_experimental(session, H2O_EXP_KV_LAYER_SLOPE, &resolved_slope) == H2O_OK);
        h2o_session_free(session);
        return st;
    };
    h2o_kv_layout layout;
    REQUIRE(layout_of(64, -0.5f, &layout) == H2O_OK);
    CHECK(layout.budget == 64);
    CHECK(resolved_slope == -0.5);
    CHECK(layout.min_layer_budget == 32);
    CHECK(layout.max_layer_budget == 96);
    REQUIRE(layout_of(0, 0.5f, &layout) == H2O_OK);  // a full cache: every layer all of n_ctx
    CHECK(resolved_slope == 0.0);
    CHECK(layout.min_layer_budget == layout.n_ctx);
    CHECK(layout.max_layer_budget == layout.n_ctx);
    for (float bad : {0.95f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
        CHECK(layout_of(64, bad, &layout) == H2O_ERR_INVALID_ARGUMENT);
        CHECK(std::string(h2o_last_error()).find("kv_layer_slope") != std::string::npos);
    }
    h2o_model_free(model);
}

TEST_CASE("session memory is fixed at creation") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.kv_budget = 64;
    sp.position_rolling = 1;
    sp.n_threads = 1;
    h2o_session *session = nullptr;
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    h2o_memory_report before{}, after{};
    before.struct_size = after.struct_size = sizeof(h2o_memory_report);
    REQUIRE(h2o_session_memory(session, &before) == H2O_OK);
    // 5 layers x 4 kv heads x 64 slots x 8 dims x (key + value) x 4 bytes, plus bookkeeping.
    CHECK(before.kv_bytes >= 5u * 4 * 64 * 8 * 2 * 4);
    CHECK(before.kv_bytes < 5u * 4 * 64 * (8 * 2 * 4 + 64));
    CHECK(before.weight_bytes > 1000000);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 2000;
    gen.stop_at_eos = 0;
    REQUIRE(h2o_generate(session, "Once upon a time", std::strlen("Once upon a time"), &gen, nullptr, nullptr) == H2O_OK);
    REQUIRE(h2o_session_memory(session, &after) == H2O_OK);
    CHECK(std::memcmp(&before, &after, sizeof(before)) == 0);
    h2o_memory_report bad{};
    bad.struct_size = 4;
    CHECK(h2o_session_memory(session, &bad) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_add_text(session, "x", 1, 0x80) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(h2o_session_add_text(session, nullptr, 1, 0) == H2O_ERR_INVALID_ARGUMENT);
    h2o_session_free(session);
    h2o_model_free(model);
}

TEST_CASE("every KV format works with every policy and with rolling, and its memory is exact") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    for (uint32_t t = 0; t < kKvTypeCount; ++t) {
        for (uint32_t p = 1; p < kKvPolicyCount; ++p) {
            const KvType type = static_cast<KvType>(t);
            CAPTURE(kv_type_name(type));
            CAPTURE(kv_policy_name(static_cast<KvPolicy>(p)));
            SessionSettings s;
            s.n_ctx = 2048;
            s.kv_budget = 32;
            s.kv_type = type;
            s.policy = policy_of(static_cast<KvPolicy>(p), 8, 2);
            s.rolling = (p % 2) == 1;
            s.n_threads = 1;
            s.n_batch = 16;
            std::unique_ptr<Session> session;
            REQUIRE(Session::create(*model, s, &session).ok());
            REQUIRE(session->generate("Once upon a time", greedy(120), nullptr, nullptr).ok());
            CHECK(session->n_past() > 100);
            // 5 layers x 4 kv heads x 32 slots, keys and values of 8 dimensions in their formats,
            // plus the per-slot bookkeeping (stream index, position, pin, free list, and 5 attention
            // statistics for the policies that read them).
            const size_t slots = 5 * 4 * 32;
            const size_t rows = kv_row_bytes(kv_key_format(type), 8) + kv_row_bytes(kv_value_format(type), 8);
            const size_t statistics = kv_policy_uses_statistics(static_cast<KvPolicy>(p)) ? 5 * 4 : 0;
            // Expected Attention's query statistics: per cell, a count, a position, and a mean and
            // mean square per dimension of each of the group's 2 query heads.
            const size_t query_statistics = static_cast<KvPolicy>(p) == KvPolicy::ExpectedAttention ? 5 * 4 * (2 + 2 * 2 * 8) * 4 : 0;
            CHECK(session->memory().kv_bytes == slots * (rows + 8 + 4 + 1 + statistics + 4) + query_statistics);
        }
    }
}
