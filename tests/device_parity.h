// The parity harness of the device backends' tests (test_vulkan.cpp, test_cuda.cpp): the same
// tensors on the CPU reference and on a device backend, and the same attention batches through
// both with their KV caches compared after every batch. Each backend's file makes its device and
// runs its cases through these.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "kv_format.h"
#include "kv_layer_budgets.h"
#include "llama_graph.h"
#include "model.h"
#include "quant.h"

namespace h2o_test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float &x : v) x = dist(rng);
    return v;
}

inline double max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    return d;
}

inline double max_abs(const std::vector<float> &a) {
    double m = 0;
    for (float x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
    return m;
}

// The same tensor on the CPU and the device backend.
// Equal bit patterns (NaN payloads included).
inline bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Twin {
    h2o::Tensor cpu, gpu;
};

struct Backends {
    std::unique_ptr<h2o::Backend> cpu, gpu;
    // Weight bytes must outlive the CPU backend, which uses them in place.
    std::vector<std::vector<uint8_t>> weight_data;

    // The CPU reference beside `device` (null: nothing to pair, the test skips).
    bool pair(std::unique_ptr<h2o::Backend> device, int max_batch) {
        if (!device) return false;
        gpu = std::move(device);
        cpu = h2o::make_cpu_backend(2, max_batch);
        return true;
    }

    Twin alloc(h2o::TensorType type, int64_t cols, int64_t rows, const void *data = nullptr) {
        Twin t;
        REQUIRE(cpu->alloc(type, cols, rows, &t.cpu).ok());
        REQUIRE(gpu->alloc(type, cols, rows, &t.gpu).ok());
        if (data) {
            REQUIRE(cpu->upload(t.cpu, data, t.cpu.bytes()).ok());
            REQUIRE(gpu->upload(t.gpu, data, t.gpu.bytes()).ok());
        }
        return t;
    }
    Twin floats(int64_t cols, int64_t rows, const std::vector<float> &data) {
        REQUIRE(data.size() == static_cast<size_t>(cols * rows));
        return alloc(h2o::TensorType::F32, cols, rows, data.data());
    }
    // A weight of `type` made from float values (quantized as llama.cpp does).
    Twin weight(h2o::TensorType type, int64_t cols, int64_t rows, const std::vector<float> &values) {
        const size_t row = h2o::row_bytes(type, cols);
        std::vector<uint8_t> bytes(row * rows);
        for (int64_t r = 0; r < rows; ++r) REQUIRE(h2o::quantize_row(type, values.data() + r * cols, bytes.data() + r * row, cols));
        weight_data.push_back(std::move(bytes));
        Twin t;
        REQUIRE(cpu->adopt_weight(type, cols, rows, weight_data.back().data(), &t.cpu).ok());
        REQUIRE(gpu->adopt_weight(type, cols, rows, weight_data.back().data(), &t.gpu).ok());
        return t;
    }
    std::vector<float> cpu_floats(const h2o::Tensor &t, size_t count) { return floats_of(*cpu, t, count); }
    std::vector<float> gpu_floats(const h2o::Tensor &t, size_t count) { return floats_of(*gpu, t, count); }
    static std::vector<float> floats_of(h2o::Backend &backend, const h2o::Tensor &t, size_t count) {
        std::vector<float> v(count);
        REQUIRE(backend.download(t, v.data(), count * sizeof(float)).ok());
        return v;
    }
};

// A batch's rotary positions as Session computes them (kv_batch_positions).
inline std::vector<int32_t> batch_positions(const h2o::KvConfig &kv, int64_t n_past, int64_t n_cached, int64_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n * kv.position_sets()));
    h2o::kv_batch_positions(kv, n_past, n_cached, n, p.data());
    return p;
}

// The same attention batches on both backends: outputs after every batch, and the KV contents
// (stream indices exactly, statistics within tolerance) after every batch.
struct AttentionRun {
    Backends &b;
    h2o::ModelShape shape;
    h2o::KvConfig kv;
    Twin q, k, v, out, pos;
    int64_t next_index = 0;
    int64_t n_cached = 0;  // for rolling positions, as Session computes them (batch_positions)
    uint32_t seed = 100;

    AttentionRun(Backends &backends, const h2o::KvConfig &config, int n_head, int batch) : b(backends), kv(config) {
        kv.query_group = n_head / config.n_head_kv;
        kv.attention_scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
        shape.n_head = n_head;
        shape.n_head_kv = config.n_head_kv;
        shape.head_dim = config.head_dim;
        shape.n_embd = n_head * config.head_dim;
        shape.n_layer = config.n_layer;
        shape.rope = config.rope;
        REQUIRE(b.cpu->kv_store().create_kv(kv).ok());
        REQUIRE(b.gpu->kv_store().create_kv(kv).ok());
        q = b.alloc(h2o::TensorType::F32, shape.n_embd, batch);
        k = b.alloc(h2o::TensorType::F32, kv.n_head_kv * kv.head_dim, batch);
        v = b.alloc(h2o::TensorType::F32, kv.n_head_kv * kv.head_dim, batch);
        out = b.alloc(h2o::TensorType::F32, shape.n_embd, batch);
        pos = b.alloc(h2o::TensorType::I32, 1, batch * config.n_layer);
    }

    void upload(const Twin &t, const std::vector<float> &data) {
        REQUIRE(b.cpu->upload(t.cpu, data.data(), data.size() * sizeof(float)).ok());
        REQUIRE(b.gpu->upload(t.gpu, data.data(), data.size() * sizeof(float)).ok());
    }

    // Forgets both caches' tokens.
    void clear() {
        REQUIRE(b.cpu->kv_store().clear_kv().ok());
        REQUIRE(b.gpu->kv_store().clear_kv().ok());
        next_index = n_cached = 0;
    }

    // One batch of n tokens through every layer; false once a check failed.
    // tag: the tokens' retention tag (kv_make_tag).
    bool step(int n, uint8_t tag = 0) {
        const std::vector<int32_t> p = batch_positions(kv, next_index, n_cached, n);
        REQUIRE(b.cpu->upload(pos.cpu, p.data(), p.size() * sizeof(int32_t)).ok());
        REQUIRE(b.gpu->upload(pos.gpu, p.data(), p.size() * sizeof(int32_t)).ok());
        bool ok = true;
        for (int layer = 0; layer < kv.n_layer; ++layer) {
            // Scaled queries make the attention peaked, so the statistics differ between slots.
            upload(q, random_floats(shape.n_embd * n, seed++, -3, 3));
            upload(k, random_floats(kv.n_head_kv * kv.head_dim * n, seed++, -1, 1));
            upload(v, random_floats(kv.n_head_kv * kv.head_dim * n, seed++, -1, 1));
            const int64_t first = kv.positions_per_layer() ? int64_t{layer} * n : 0;
            const h2o::AttentionBatch cb{n, next_index, pos.cpu.slice_rows(first, n), tag},
                gb{n, next_index, pos.gpu.slice_rows(first, n), tag};
            REQUIRE(b.cpu->attention(out.cpu, q.cpu, k.cpu, v.cpu, layer, cb, shape).ok());
            REQUIRE(b.gpu->attention(out.gpu, q.gpu, k.gpu, v.gpu, layer, gb, shape).ok());
            const auto c = b.cpu_floats(out.cpu, shape.n_embd * n), g = b.gpu_floats(out.gpu, shape.n_embd * n);
            INFO("layer " << layer << ", tokens " << next_index << ".." << next_index + n - 1);
            const double diff = max_abs_diff(c, g);
            CHECK(diff <= 1e-5);
            ok = ok && diff <= 1e-5;
        }
        next_index += n;
        n_cached = std::min<int64_t>(n_cached + n, kv.max_slots());
        return ok && compare_kv();
    }

    bool compare_kv() {
        const auto slots = static_cast<size_t>(kv.total_slots());
        std::vector<int64_t> ci(slots), gi(slots);
        REQUIRE(b.cpu->kv_store().download_kv_stream_indices(ci.data()).ok());
        REQUIRE(b.gpu->kv_store().download_kv_stream_indices(gi.data()).ok());
        INFO("after tokens up to " << next_index - 1);
        CHECK(gi == ci);
        std::vector<uint8_t> ct(slots), gt(slots);
        REQUIRE(b.cpu->kv_store().download_kv_tags(ct.data()).ok());
        REQUIRE(b.gpu->kv_store().download_kv_tags(gt.data()).ok());
        CHECK(gt == ct);
        std::vector<h2o::SlotStats> cs(slots), gs(slots);
        REQUIRE(b.cpu->kv_store().download_kv_statistics(cs.data()).ok());
        REQUIRE(b.gpu->kv_store().download_kv_statistics(gs.data()).ok());
        int bad = 0;
        auto close = [](float x, float y) { return std::fabs(x - y) <= 1e-5f * std::max(1.0f, std::fabs(x)); };
        for (size_t i = 0; i < slots; ++i) {
            if (ci[i] < 0) continue;
            if (!close(cs[i].accumulated, gs[i].accumulated) || !close(cs[i].squared, gs[i].squared) || cs[i].steps != gs[i].steps ||
                !close(cs[i].last, gs[i].last) || !close(cs[i].persistence, gs[i].persistence)) {
                if (bad++ < 3) {
                    MESSAGE("slot " << i << ": cpu acc " << cs[i].accumulated << " sq " << cs[i].squared << " steps " << cs[i].steps
                                    << " last " << cs[i].last << " pers " << cs[i].persistence << " | device acc " << gs[i].accumulated
                                    << " sq " << gs[i].squared << " steps " << gs[i].steps << " last " << gs[i].last << " pers "
                                    << gs[i].persistence);
                }
            }
        }
        CHECK(bad == 0);
        return gi == ci && gt == ct && bad == 0;
    }
};

// 2 layers of 2 kv heads of 8 dimensions.
inline h2o::KvConfig small_kv(int n_slots, h2o::KvPolicy policy = h2o::KvPolicy::Full, int recent = 0, int sinks = 0, bool rolling = false,
                              h2o::KvType type = h2o::KvType::F32) {
    h2o::KvConfig kv;
    kv.n_layer = 2;
    kv.n_head_kv = 2;
    kv.head_dim = 8;
    kv.n_slots = n_slots;
    kv.type = type;
    kv.policy.policy = policy;
    kv.policy.recent = recent;
    kv.policy.sinks = sinks;
    kv.policy.seed = 7;
    kv.rolling = rolling;
    kv.rope.dims = 8;
    kv.rope.freq_base = 10000.0f;
    return kv;
}

inline const h2o::KvType kKvTypes[] = {h2o::KvType::F32, h2o::KvType::F16, h2o::KvType::Q8, h2o::KvType::Q4, h2o::KvType::K8V4};

// Every policy, each with the windows it uses, for the eviction parity tests.
struct PolicyCase {
    h2o::KvPolicy policy;
    int recent, sinks, horizon;
};
inline const PolicyCase kPolicyCases[] = {
    {h2o::KvPolicy::Full, 0, 0, 0},       {h2o::KvPolicy::H2O, 6, 0, 0},           {h2o::KvPolicy::Window, 0, 0, 0},
    {h2o::KvPolicy::SinkWindow, 0, 3, 0}, {h2o::KvPolicy::Scissorhands, 6, 0, 24}, {h2o::KvPolicy::Tova, 0, 0, 0},
    {h2o::KvPolicy::RoCo, 6, 0, 0},       {h2o::KvPolicy::Random, 4, 0, 0},        {h2o::KvPolicy::MeanH2O, 5, 2, 20},
    {h2o::KvPolicy::KeyNorm, 6, 0, 24},   {h2o::KvPolicy::KeyDiff, 5, 0, 0},       {h2o::KvPolicy::ExpectedAttention, 4, 2, 24},
};

// Whether the victims of a policy depend on the stored values (the statistics or the keys).
inline bool victims_read_values(h2o::KvPolicy policy) {
    return h2o::kv_policy_uses_statistics(policy) || h2o::kv_policy_scores_keys(static_cast<uint32_t>(policy));
}

// stories260K (or any model) run through one backend by the graph, as Session runs it.
struct ModelRun {
    std::unique_ptr<h2o::Model> model;
    std::unique_ptr<h2o::Backend> backend;
    std::unique_ptr<h2o::LlamaGraph> graph;
    int64_t n_past = 0;

    int64_t n_cached = 0;
    h2o::KvConfig kv;

    // layer_slots: KvConfig::layer_slots (empty: n_slots in every layer).
    ModelRun(const std::string &path, std::unique_ptr<h2o::Backend> b, int max_batch, int n_slots, h2o::KvPolicyConfig policy = {},
             bool rolling = false, h2o::KvType type = h2o::KvType::F32, std::vector<int> layer_slots = {})
        : backend(std::move(b)) {
        REQUIRE(h2o::Model::load(path, "", &model).ok());
        const h2o::ModelShape &s = model->shape();
        kv.n_layer = s.n_layer;
        kv.n_head_kv = s.n_head_kv;
        kv.head_dim = s.head_dim;
        kv.n_slots = n_slots;
        kv.layer_slots = std::move(layer_slots);
        kv.type = type;
        kv.policy = policy;
        kv.rolling = rolling;
        kv.rope = s.rope;
        kv.query_group = s.n_head / s.n_head_kv;
        kv.attention_scale = s.attention_scale != 0.0f ? s.attention_scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
        REQUIRE(h2o::LlamaGraph::create(*model, kv.rope, *backend, max_batch, kv.position_sets(), &graph).ok());
        REQUIRE(backend->kv_store().create_kv(kv).ok());
    }

    // Feeds tokens in batches of at most graph->max_batch() (a quarter of the smallest layer's
    // budget once it is full, with rank positions when rolling, as Session does) and returns the
    // last logits.
    std::vector<float> feed(const std::vector<int32_t> &tokens) {
        store(tokens);
        std::vector<float> logits(model->shape().n_vocab);
        REQUIRE(graph->download_logits(logits.data()).ok());
        return logits;
    }
    void store(const std::vector<int32_t> &tokens) {
        const int64_t budget = kv.min_slots();
        for (size_t done = 0; done < tokens.size();) {
            int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size() - done), graph->max_batch());
            if (n_cached + n > budget) n = std::max<int64_t>(1, std::min<int64_t>(n, budget / 4));
            const std::vector<int32_t> positions = batch_positions(kv, n_past, n_cached, n);
            REQUIRE(graph->evaluate(tokens.data() + done, positions.data(), kv, static_cast<int>(n), n_past, false).ok());
            n_past += n;
            n_cached = std::min<int64_t>(n_cached + n, kv.max_slots());
            done += static_cast<size_t>(n);
        }
    }
};

// ---- checks every device backend passes, each against the CPU ---------------------------------

// rms_norm (to rounding), add (exactly: one rounding in the same order) and swiglu (to the
// device's exp).
inline void check_rms_norm_add_swiglu(Backends &b) {
    for (int64_t cols : {64, 300}) {
        const int n = 5;
        const Twin in = b.floats(cols, n, random_floats(cols * n, 2, -3, 3));
        const Twin w = b.weight(h2o::TensorType::F32, cols, 1, random_floats(cols, 3));
        const Twin out = b.alloc(h2o::TensorType::F32, cols, n);
        REQUIRE(b.cpu->rms_norm(out.cpu, in.cpu, w.cpu, n, 1e-5f).ok());
        REQUIRE(b.gpu->rms_norm(out.gpu, in.gpu, w.gpu, n, 1e-5f).ok());
        const auto c = b.cpu_floats(out.cpu, cols * n), g = b.gpu_floats(out.gpu, cols * n);
        CHECK(max_abs_diff(c, g) <= 2e-6 * max_abs(c));
    }
    const int64_t cols = 172;
    const int n = 7;
    const auto a_data = random_floats(cols * n, 4, -8, 8), b_data = random_floats(cols * n, 5, -2, 2);
    const Twin a = b.floats(cols, n, a_data), x = b.floats(cols, n, b_data);
    REQUIRE(b.cpu->add(a.cpu, x.cpu, n).ok());
    REQUIRE(b.gpu->add(a.gpu, x.gpu, n).ok());
    CHECK(b.gpu_floats(a.gpu, cols * n) == b.cpu_floats(a.cpu, cols * n));
    const Twin gate = b.floats(cols, n, a_data), up = b.floats(cols, n, b_data);
    REQUIRE(b.cpu->swiglu(gate.cpu, up.cpu, n).ok());
    REQUIRE(b.gpu->swiglu(gate.gpu, up.gpu, n).ok());
    const auto c = b.cpu_floats(gate.cpu, cols * n), g = b.gpu_floats(gate.gpu, cols * n);
    for (size_t i = 0; i < c.size(); ++i) CHECK(g[i] == doctest::Approx(c[i]).epsilon(1e-5).scale(1e-6));
}

// Rotary rotation at large positions and with partial rotation. Both sides take cos and sin of
// the same double-precision angle (a device may round a rare one differently in the last bit):
// equal to a few ulps of the inputs (|x| <= 1).
// Both pairings (rotary_spec.h), with and without frequency factors and linear scaling.
inline void check_rope(Backends &b) {
    h2o::ModelShape shape;
    shape.n_head = 4;
    shape.n_head_kv = 2;
    shape.head_dim = 16;
    shape.n_embd = 64;
    for (int variant = 0; variant < 6; ++variant) {
        const int rope_dims = variant % 2 == 0 ? 16 : 12;
        shape.rope.dims = rope_dims;
        shape.rope.pairing = variant / 2 == 0 ? h2o::RotaryPairing::Adjacent : h2o::RotaryPairing::Halves;
        const std::vector<float> factors = {1.0f, 1.0f, 1.25f, 2.5f, 6.0f, 8.0f, 8.0f, 8.0f};
        shape.rope.freq_factors =
            variant / 2 == 2 ? std::vector<float>(factors.begin(), factors.begin() + rope_dims / 2) : std::vector<float>{};
        shape.rope.freq_scale = variant / 2 == 2 ? 0.5f : 1.0f;
        INFO("pairing " << static_cast<int>(shape.rope.pairing) << ", factors " << shape.rope.freq_factors.size());
        // Then per kv head (rolling with budgets per kv head): kv head 1's positions reversed.
        std::vector<int32_t> positions = {0, 1, 2, 7, 100, 511, 4096, 30000, 65535, 1000000, 123456789};
        const int n = static_cast<int>(positions.size());
        for (const bool per_kv_head : {false, true}) {
            if (per_kv_head) positions.insert(positions.end(), positions.rbegin(), positions.rbegin() + n);
            const Twin pos = b.alloc(h2o::TensorType::I32, 1, static_cast<int64_t>(positions.size()), positions.data());
            const Twin q = b.floats(64, n, random_floats(64 * n, 8));
            const Twin k = b.floats(32, n, random_floats(32 * n, 9));
            REQUIRE(b.cpu->rope(q.cpu, k.cpu, pos.cpu, n, shape, per_kv_head).ok());
            REQUIRE(b.gpu->rope(q.gpu, k.gpu, pos.gpu, n, shape, per_kv_head).ok());
            INFO("rope_dims " << rope_dims << ", per kv head " << per_kv_head);
            CHECK(max_abs_diff(b.cpu_floats(q.cpu, 64 * n), b.gpu_floats(q.gpu, 64 * n)) <= 1e-6);
            CHECK(max_abs_diff(b.cpu_floats(k.cpu, 32 * n), b.gpu_floats(k.gpu, 32 * n)) <= 1e-6);
        }
    }
}

// A projection's bias (add_bias: exactly, one rounding each) and the per-head RMS norms of q and k
// (rms_norm in place over a batch's rows seen as one row per head: Tensor::with_cols), to
// rounding.
inline void check_bias_and_head_norm(Backends &b) {
    const int n = 5, heads = 4, head_dim = 32, width = heads * head_dim;
    const auto data = random_floats(width * n, 21, -4, 4);
    const Twin x = b.floats(width, n, data);
    const Twin bias = b.weight(h2o::TensorType::F32, width, 1, random_floats(width, 22, -1, 1));
    REQUIRE(b.cpu->add_bias(x.cpu, bias.cpu, n).ok());
    REQUIRE(b.gpu->add_bias(x.gpu, bias.gpu, n).ok());
    CHECK(same_bits(b.gpu_floats(x.gpu, width * n), b.cpu_floats(x.cpu, width * n)));
    const Twin norm = b.weight(h2o::TensorType::F32, head_dim, 1, random_floats(head_dim, 23, 0.5f, 1.5f));
    const h2o::Tensor c = x.cpu.with_cols(head_dim), g = x.gpu.with_cols(head_dim);
    REQUIRE(b.cpu->rms_norm(c, c, norm.cpu, n * heads, 1e-6f).ok());
    REQUIRE(b.gpu->rms_norm(g, g, norm.gpu, n * heads, 1e-6f).ok());
    const auto cn = b.cpu_floats(x.cpu, width * n), gn = b.gpu_floats(x.gpu, width * n);
    CHECK(max_abs_diff(cn, gn) <= 2e-6 * max_abs(cn));
    // Normalised head by head, not row by row: head 3 of token 2 by hand, from the biased input.
    const auto biased = b.cpu_floats(bias.cpu, width), weights = b.cpu_floats(norm.cpu, head_dim);
    const size_t first = 2 * width + 3 * head_dim;
    double ss = 0;
    for (int i = 0; i < head_dim; ++i) ss += std::pow(static_cast<double>(data[first + i]) + biased[3 * head_dim + i], 2);
    const double scale = 1.0 / std::sqrt(ss / head_dim + 1e-6);
    for (int i = 0; i < head_dim; ++i) {
        CHECK(cn[first + i] == doctest::Approx((data[first + i] + biased[3 * head_dim + i]) * scale * weights[i]).epsilon(1e-5));
    }
}

// Attention and statistics without eviction (64 slots, H2O gathering statistics; GQA: 4 query
// heads on 2 kv heads): a prompt, single tokens, a full batch, then a cleared cache.
inline void check_attention_without_eviction(Backends &b, h2o::KvType type) {
    AttentionRun run(b, small_kv(64, h2o::KvPolicy::H2O, 8, 0, false, type), /*n_head=*/4, 32);
    REQUIRE(run.step(17));
    for (int i = 0; i < 6; ++i) REQUIRE(run.step(1));
    REQUIRE(run.step(32));
    run.clear();
    REQUIRE(run.step(5));
    CHECK(b.gpu->kv_store().kv_bytes() > 0);
}

// One policy evicting: two pinned tokens, a prompt that fills most of the 16 slots, single
// tokens that evict, then batches that evict several at once (42 tokens: with a horizon, stale
// tokens appear). The prompt's text is in two retention spans that keep 3 and 2 tokens per
// (layer, kv head), one token of the second pinned. The same victims as the CPU, step by step.
// layer_slots: budgets that differ across the 2 layers (KvConfig::layer_slots; empty: 16 each).
// prompt_proxy, random_share: one-shot prompt eviction's (the batches of several tokens).
// rope: the rotary description rolled keys are turned back by (null: small_kv's, adjacent pairs).
inline void check_eviction(Backends &b, const PolicyCase &c, bool rolling, h2o::KvType type, const std::vector<int> &layer_slots = {},
                           int prompt_proxy = 0, float random_share = 0.0f, const h2o::RotarySpec *rope = nullptr) {
    h2o::KvConfig kv = small_kv(16, c.policy, c.recent, c.sinks, rolling, type);
    if (rope) kv.rope = *rope;
    kv.layer_slots = layer_slots;
    kv.policy.horizon = c.horizon;
    kv.policy.prompt_proxy = prompt_proxy;
    kv.policy.prompt_random_share = random_share;
    AttentionRun run(b, kv, 4, 8);
    const int32_t minimums[h2o::KV_MAX_SPANS] = {3, 2};
    REQUIRE(b.cpu->kv_store().set_kv_span_minimums(minimums).ok());
    REQUIRE(b.gpu->kv_store().set_kv_span_minimums(minimums).ok());
    auto tag = [](bool pinned, uint32_t span) { return static_cast<uint8_t>(h2o::kv_make_tag(pinned, span)); };
    bool ok = run.step(2, tag(true, 0)) && run.step(4, tag(false, 1)) && run.step(1, tag(true, 2)) && run.step(3, tag(false, 2));
    for (int i = 0; i < 20 && ok; ++i) ok = run.step(1);
    for (int i = 0; i < 4 && ok; ++i) ok = run.step(3);
    CHECK(ok);
}

// Rolling with sinks + window, which gathers no statistics: after evictions and rolled keys, both
// caches save the same snapshot bytes, rows included (the device rotates keys back by the host's
// table: kv_rotate_back_table). rope: as check_eviction's.
inline void check_rolled_rows(Backends &b, h2o::KvType type, const h2o::RotarySpec *rope = nullptr) {
    h2o::KvConfig kv = small_kv(16, h2o::KvPolicy::SinkWindow, 0, 3, true, type);
    if (rope) kv.rope = *rope;
    AttentionRun run(b, kv, 4, 8);
    bool ok = true;
    for (int i = 0; i < 24 && ok; ++i) ok = run.step(i % 3 + 1);
    REQUIRE(ok);
    auto saved = [](h2o::Backend &backend) {
        std::vector<uint8_t> bytes;
        h2o::ByteWriter out(&bytes);
        REQUIRE(backend.kv_store().save_kv(out).ok());
        return bytes;
    };
    const std::vector<uint8_t> cpu = saved(*b.cpu), gpu = saved(*b.gpu);
    CHECK(cpu.size() == gpu.size());
    CHECK(cpu == gpu);
}

// A batch of `batch` tokens over 65536 slots of 2 kv heads (1 MiB of scores per query), more than
// the device's attention scratch holds at once: processed in chunks, as the CPU does in one go.
// prompt_proxy: the queries summed into `last`, which then span chunks.
inline void check_chunked_attention(Backends &b, int batch, int prompt_proxy = 0) {
    h2o::KvConfig kv = small_kv(65536, h2o::KvPolicy::Scissorhands, 8);
    kv.n_layer = 1;
    kv.policy.prompt_proxy = prompt_proxy;
    AttentionRun run(b, kv, 4, batch);
    REQUIRE(run.step(batch));
    REQUIRE(run.step(1));
}

// A long cache read by single tokens: 1300 of 1536 slots filled by three prompts, then tokens
// one at a time, whose few (query, head) pairs a device spreads over ranges of the slots (CUDA's
// split attention), the last range partly filled.
inline void check_long_cache_decode(Backends &b) {
    AttentionRun run(b, small_kv(1536, h2o::KvPolicy::H2O, 8), 4, 512);
    REQUIRE(run.step(512));
    REQUIRE(run.step(512));
    REQUIRE(run.step(276));
    for (int i = 0; i < 4; ++i) REQUIRE(run.step(1));
}

// Greedy generation of `generated` tokens after a prompt, on the device and on the CPU, with the
// same cache: the same tokens, every (layer, kv head) keeping the same ones, and the last logits
// close. Returns the device's run for backend-specific checks.
inline ModelRun check_greedy_generation(const std::string &path, std::unique_ptr<h2o::Backend> device, int n_slots,
                                        const h2o::KvPolicyConfig &policy, bool rolling, h2o::KvType type, int generated,
                                        const std::vector<int> &layer_slots = {},
                                        const std::string &prompt = "Once upon a time, there was a little dog named Max.") {
    ModelRun gpu(path, std::move(device), 16, n_slots, policy, rolling, type, layer_slots);
    ModelRun cpu(path, h2o::make_cpu_backend(2, 16), 16, n_slots, policy, rolling, type, layer_slots);
    std::vector<int32_t> tokens;
    REQUIRE(gpu.model->tokenizer().encode(prompt, true, &tokens).ok());
    auto g = gpu.feed(tokens), c = cpu.feed(tokens);
    auto argmax = [](const std::vector<float> &v) { return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()); };
    std::vector<int32_t> gpu_tokens, cpu_tokens;
    for (int i = 0; i < generated; ++i) {
        gpu_tokens.push_back(argmax(g));
        cpu_tokens.push_back(argmax(c));
        g = gpu.feed({gpu_tokens.back()});
        c = cpu.feed({cpu_tokens.back()});
    }
    CHECK(gpu_tokens == cpu_tokens);
    const auto slots = static_cast<size_t>(gpu.kv.total_slots());
    std::vector<int64_t> gi(slots), ci(slots);
    REQUIRE(gpu.backend->kv_store().download_kv_stream_indices(gi.data()).ok());
    REQUIRE(cpu.backend->kv_store().download_kv_stream_indices(ci.data()).ok());
    size_t first_difference = 0, differences = 0;
    for (size_t i = 0; i < slots; ++i) {
        if (gi[i] != ci[i] && differences++ == 0) first_difference = i;
    }
    INFO(differences << " slots hold other tokens, the first at slot " << first_difference << " of " << slots);
    CHECK(gi == ci);
    CHECK(max_abs_diff(g, c) <= 1e-3 * max_abs(c));
    return gpu;
}

}  // namespace h2o_test
