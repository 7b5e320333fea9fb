// What is particular to the Vulkan backend (its parity with the CPU, shared with every device
// backend, is test_device_parity.cpp): devices, memory limits, matmul with and without subgroups,
// weights beyond one buffer binding, stored KV rows, traffic per token. Each test runs with
// VK_LAYER_KHRONOS_validation (core and synchronization checks) when it is installed, and fails
// on any validation warning or error. Without a Vulkan device the tests are skipped.
#include <doctest/doctest.h>

#include <cstdio>

#ifndef H2O_HAVE_VULKAN

TEST_CASE("vulkan: backend") { std::printf("H2O-SKIP: built without the Vulkan backend (H2O_VULKAN=OFF)\n"); }

#else

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "device_parity.h"
#include "llama_graph.h"
#include "model.h"
#include "quant.h"
#include "session.h"
#include "session_util.h"
#include "test_util.h"
#include "vulkan/vulkan_backend.h"
#include "vulkan_test_util.h"

using namespace h2o;

#ifdef H2O_TEST_ASAN
// VK_LAYER_KHRONOS_validation 1.3.239 leaks about 3 KB inside the layer for every command buffer
// when synchronization validation is on (reproduced with a plain C program that only creates a
// command buffer). The loader unloads the layer at vkDestroyInstance, after which LeakSanitizer
// cannot name it; keeping it loaded (h2o_test::keep_validation_layer_loaded) lets this suppression
// match that library and nothing else.
extern "C" __attribute__((visibility("default"), used)) const char *__lsan_default_suppressions() {
    return "leak:libVkLayer_khronos_validation.so\n";
}
#endif

namespace {

using h2o_test::check_validation_clean;
using h2o_test::counters_of;
using h2o_test::make_vk;

using h2o_test::AttentionRun;
using h2o_test::Backends;
using h2o_test::kKvTypes;
using h2o_test::kPolicyCases;
using h2o_test::max_abs;
using h2o_test::max_abs_diff;
using h2o_test::ModelRun;
using h2o_test::random_floats;
using h2o_test::small_kv;
using h2o_test::Twin;

int32_t argmax(const std::vector<float> &v) { return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()); }

// The CPU beside a Vulkan backend (with validation); subgroups=false forces the shared-memory
// reductions.
#define BACKENDS_OR_SKIP(var, max_batch, ...) \
    Backends var;                             \
    if (!var.pair(make_vk(max_batch, ##__VA_ARGS__), max_batch)) return

}  // namespace

TEST_CASE("vulkan: devices are listed, and a bad index is refused") {
    std::vector<VulkanDeviceInfo> devices;
    const Status st = list_vulkan_devices(&devices);
    if (!st.ok() || devices.empty()) {
        std::printf("H2O-SKIP: no Vulkan device: %s\n", st.message.c_str());
        return;
    }
    for (const VulkanDeviceInfo &d : devices) {
        MESSAGE("Vulkan device " << d.index << ": " << d.name << " (" << std::string(vulkan_device_type_name(d.type)) << ", "
                                 << (d.device_local_bytes >> 20) << " MiB device-local)");
        CHECK(!d.name.empty());
    }
    std::unique_ptr<Backend> backend;
    const Status bad = make_vulkan_backend(static_cast<int>(devices.size()), 8, &backend);
    CHECK(bad.code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(bad.message.find("out of range") != std::string::npos);
    CHECK(!backend);
    VULKAN_OR_SKIP(vk, 8);
    CHECK(std::string(vk->name()) == "vulkan");
    check_validation_clean(*vk);
}

TEST_CASE("vulkan: an allocation beyond the device's memory fails with H2O_ERR_OUT_OF_MEMORY") {
    VULKAN_OR_SKIP(vk, 8);
    Tensor huge;
    const Status st = vk->alloc(TensorType::F32, int64_t{1} << 20, int64_t{1} << 16, &huge);  // 256 GiB
    CHECK(st.code == H2O_ERR_OUT_OF_MEMORY);
    MESSAGE(st.message);
    CHECK(st.message.find("MiB") != std::string::npos);
    // The backend is still usable.
    Tensor small;
    REQUIRE(vk->alloc(TensorType::F32, 4, 1, &small).ok());
    const float in[4] = {1, 2, 3, 4};
    float back[4] = {};
    REQUIRE(vk->upload(small, in, sizeof in).ok());
    REQUIRE(vk->download(small, back, sizeof back).ok());
    CHECK(std::equal(in, in + 4, back));
    check_validation_clean(*vk);
}

TEST_CASE("vulkan: a greedy session reads back 4 bytes per generated token, in one submission") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    std::unique_ptr<Model> model;
    REQUIRE(Model::load(path, "", &model).ok());
    SessionSettings settings;
    settings.n_ctx = 256;
    settings.kv_budget = 256;
    settings.backend = H2O_BACKEND_VULKAN;
    const std::unique_ptr<Session> session = h2o_test::session_or_skip(*model, settings);
    if (!session) return;
    REQUIRE(session->begin_generation("Once upon a time", h2o_test::greedy(40)).ok());
    std::string piece;
    h2o_stop_reason reason = H2O_STOP_NONE;
    REQUIRE(session->next_piece(&piece, &reason).ok());  // the first token: sampled from the prompt's logits
    const uint32_t first = session->stats().n_generated_tokens;
    const Backend::Traffic before = session->backend().traffic();
    while (reason == H2O_STOP_NONE) REQUIRE(session->next_piece(&piece, &reason).ok());
    const Backend::Traffic after = session->backend().traffic();
    const uint64_t tokens = session->stats().n_generated_tokens - first;
    REQUIRE(tokens > 0);
    // Each later token: its id and position go up (8 bytes), its successor's id comes back.
    CHECK(after.bytes_to_host - before.bytes_to_host == 4 * tokens);
    CHECK(after.bytes_to_device - before.bytes_to_device == 8 * tokens);
    CHECK(after.submissions - before.submissions == tokens);
}

TEST_CASE("vulkan: matmul matches the CPU for every weight type, one token and batches") {
    // Tolerances. F32/F16: both compute the exact dot product of the same values, up to the order
    // of float additions: 1e-5 of sum |w x|. Quantized types (Q8_0, Q4_0 and the K-quants): the
    // CPU quantizes the activations to 8 bits per 32-block (error up to amax/254 per value) while
    // the GPU uses them as floats, so the two may differ by sum over blocks of amax_b(x)/254 *
    // sum |w| in the block; on top, the GPU result must match a double-precision product of the
    // dequantized weights to 1e-5 of sum |w x|. K-quant rows are multiples of 256 long: 256 (one
    // super-block) and 768, the latter with 130 rows (the tiled kernel's partial row tile).
    struct Shape {
        int64_t cols, rows;
    };
    for (bool subgroups : {true, false}) {
        INFO("subgroups " << subgroups);
        BACKENDS_OR_SKIP(b, 64, subgroups);
        for (TensorType type : vulkan_weight_types()) {
            const bool quantized = traits(type).block_elements > 1;
            const bool k_quant = traits(type).block_elements == 256;
            std::vector<Shape> shapes = {{256, 96}, {k_quant ? 768 : 64, 130}};
            if (!quantized) {
                shapes.push_back({172, 70});  // stories260K's FFN width, not a multiple of 32
                shapes.push_back({75, 33});   // odd: F16 rows are not 4-byte aligned in the file
            }
            for (const Shape &s : shapes) {
                const auto w_values = random_floats(s.cols * s.rows, 6);
                const Twin w = b.weight(type, s.cols, s.rows, w_values);
                // The weights as the kernels see them.
                std::vector<float> deq(s.cols * s.rows);
                const std::vector<uint8_t> &raw = b.weight_data.back();
                for (int64_t r = 0; r < s.rows; ++r) {
                    if (type == TensorType::F32) {
                        std::memcpy(&deq[r * s.cols], raw.data() + r * s.cols * 4, s.cols * 4);
                    } else if (type == TensorType::F16) {
                        for (int64_t c = 0; c < s.cols; ++c) {
                            uint16_t h;
                            std::memcpy(&h, raw.data() + 2 * (r * s.cols + c), 2);
                            deq[r * s.cols + c] = fp16_to_fp32(h);
                        }
                    } else {
                        REQUIRE(dequantize_row(type, raw.data() + r * row_bytes(type, s.cols), &deq[r * s.cols], s.cols));
                    }
                }
                for (int n : {1, 3, 17, 64}) {
                    INFO("type " << type_name(type) << ", " << s.rows << " x " << s.cols << ", n " << n);
                    const auto x_values = random_floats(s.cols * n, 7 + n, -2, 2);
                    const Twin x = b.floats(s.cols, n, x_values);
                    const Twin y = b.alloc(TensorType::F32, s.rows, n);
                    REQUIRE(b.cpu->matmul(y.cpu, w.cpu, x.cpu, n).ok());
                    REQUIRE(b.gpu->matmul(y.gpu, w.gpu, x.gpu, n).ok());
                    const auto c = b.cpu_floats(y.cpu, s.rows * n), g = b.gpu_floats(y.gpu, s.rows * n);
                    int bad = 0;
                    for (int t = 0; t < n; ++t) {
                        for (int64_t r = 0; r < s.rows; ++r) {
                            double exact = 0, magnitude = 0, quant_bound = 0;
                            for (int64_t k = 0; k < s.cols; ++k) {
                                exact += static_cast<double>(deq[r * s.cols + k]) * x_values[t * s.cols + k];
                                magnitude += std::fabs(static_cast<double>(deq[r * s.cols + k]) * x_values[t * s.cols + k]);
                            }
                            if (quantized) {
                                for (int64_t b0 = 0; b0 < s.cols; b0 += 32) {
                                    double amax = 0, wsum = 0;
                                    for (int64_t k = b0; k < b0 + 32; ++k) {
                                        amax = std::max(amax, std::fabs(static_cast<double>(x_values[t * s.cols + k])));
                                        wsum += std::fabs(static_cast<double>(deq[r * s.cols + k]));
                                    }
                                    quant_bound += amax / 254 * wsum;
                                }
                            }
                            const double got = g[t * s.rows + r], cpu = c[t * s.rows + r];
                            if (std::fabs(got - exact) > 1e-5 * magnitude + 1e-6) ++bad;
                            if (std::fabs(got - cpu) > quant_bound + 1e-5 * magnitude + 1e-6) ++bad;
                        }
                    }
                    CHECK(bad == 0);
                }
            }
        }
        check_validation_clean(*b.gpu);
    }
}

TEST_CASE("vulkan: weights larger than one storage buffer binding are processed in windows") {
    // With bindings limited to 16 KiB, a 300 x 256 F32 weight (300 KiB) takes 20 windows.
    Backends b;
    bool ok = false;
    {
        const h2o_test::ScopedEnv limit("H2O_VULKAN_BINDING_LIMIT", "16384");
        ok = b.pair(make_vk(32), 32);
    }
    if (!ok) return;
    VULKAN_OR_SKIP(ref, 32);
    // Q6_K rows (212 bytes on the device) are not a multiple of the offset alignment.
    for (TensorType type : {TensorType::F32, TensorType::Q4_0, TensorType::Q6_K}) {
        INFO("type " << type_name(type));
        const int64_t cols = 256, rows = 300;
        const Twin w = b.weight(type, cols, rows, random_floats(cols * rows, 12));
        const std::vector<int32_t> ids = {299, 0, 150, 64, 65, 298};
        const int n_ids = static_cast<int>(ids.size());
        const Twin id = b.alloc(TensorType::I32, 1, n_ids, ids.data());
        const Twin rows_out = b.alloc(TensorType::F32, cols, n_ids);
        REQUIRE(b.cpu->get_rows(rows_out.cpu, w.cpu, id.cpu, n_ids).ok());
        REQUIRE(b.gpu->get_rows(rows_out.gpu, w.gpu, id.gpu, n_ids).ok());
        CHECK(b.gpu_floats(rows_out.gpu, cols * n_ids) == b.cpu_floats(rows_out.cpu, cols * n_ids));
        // Each output row is computed the same way whatever window holds it: the result equals
        // that of a backend without the limit exactly.
        Tensor w_ref;
        REQUIRE(ref->adopt_weight(type, cols, rows, b.weight_data.back().data(), &w_ref).ok());
        for (int n : {1, 9}) {
            const auto x_values = random_floats(cols * n, 13);
            const Twin x = b.floats(cols, n, x_values);
            const Twin y = b.alloc(TensorType::F32, rows, n);
            REQUIRE(b.gpu->matmul(y.gpu, w.gpu, x.gpu, n).ok());
            Tensor x_ref, y_ref;
            REQUIRE(ref->alloc(TensorType::F32, cols, n, &x_ref).ok());
            REQUIRE(ref->alloc(TensorType::F32, rows, n, &y_ref).ok());
            REQUIRE(ref->upload(x_ref, x_values.data(), x_values.size() * sizeof(float)).ok());
            REQUIRE(ref->matmul(y_ref, w_ref, x_ref, n).ok());
            std::vector<float> expected(rows * n);
            REQUIRE(ref->download(y_ref, expected.data(), expected.size() * sizeof(float)).ok());
            CHECK(b.gpu_floats(y.gpu, rows * n) == expected);
        }
    }
    check_validation_clean(*b.gpu);
}

TEST_CASE("vulkan: weight rows that are not whole blocks are refused, naming the type and the block") {
    // The kernels read whole blocks: 32 elements for Q8_0 and Q4_0, 256-element super-blocks for
    // the K-quants. A model file cannot hold such rows (row_bytes needs whole blocks), but the
    // backend does not rely on its caller for that.
    VULKAN_OR_SKIP(vk, 8);
    const std::vector<uint8_t> bytes(1 << 16, 0);  // more than any row below, never read
    const struct {
        TensorType type;
        int64_t cols;
        int block;
    } cases[] = {{TensorType::Q4_K, 320, 256},
                 {TensorType::Q5_K, 128, 256},
                 {TensorType::Q6_K, 4096 + 32, 256},
                 {TensorType::Q8_0, 48, 32},
                 {TensorType::Q4_0, 100, 32}};
    for (const auto &c : cases) {
        const TensorType type = c.type;
        const int64_t cols = c.cols;
        INFO("type " << type_name(type) << ", " << cols << " columns");
        Tensor t;
        const Status st = vk->adopt_weight(type, cols, 4, bytes.data(), &t);
        CHECK(st.code == H2O_ERR_UNSUPPORTED);
        CHECK(st.message == std::string(type_name(type)) + " weight rows must be a multiple of " + std::to_string(c.block) +
                                " long on the Vulkan backend, not " + std::to_string(cols));
    }
    Tensor t;
    CHECK(vk->adopt_weight(TensorType::Q4_K, 0, 4, bytes.data(), &t).code == H2O_ERR_INVALID_ARGUMENT);
    CHECK(vk->adopt_weight(TensorType::F32, 16, 0, bytes.data(), &t).code == H2O_ERR_INVALID_ARGUMENT);
    // Whole super-blocks are taken, and the backend is still usable.
    for (TensorType type : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
        CHECK(vk->adopt_weight(type, 512, 4, bytes.data(), &t).ok());
    }
    REQUIRE(vk->synchronize().ok());
    check_validation_clean(*vk);
}

TEST_CASE("vulkan: stored KV rows decode to exactly the CPU's values for every KV type") {
    // One token in an empty cache gets attention weight 1, so the output is its value row as
    // decoded: equal to the CPU's only if the GPU rounded every scale, code and half as
    // kv_store_row() does. The rows include rounding ties (lround goes away from zero, halves to
    // even), a constant row (Q4 scale 0), a zero row and magnitudes from 1e-3 to 1e3.
    const std::vector<std::vector<float>> special = {
        {127, 2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 64.5f, -126.5f},                       // Q8 scale 1: ties
        {15, 0.5f, 2.5f, 14.5f, 0, 1.5f, 7.5f, 8.5f},                                // Q4 scale 1, min 0: ties
        {1 + 0x1p-11f, 1 + 0x3p-11f, -(1 + 0x1p-11f), 2049, 65519, 0x1p-14f, 0, 1},  // half ties, the top
        {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f},                    // constant
        {0, 0, 0, 0, 0, 0, 0, 0},
    };
    for (KvType type : kKvTypes) {
        INFO("kv " << std::string(kv_type_name(type)));
        BACKENDS_OR_SKIP(b, 1);
        KvConfig kv = small_kv(4, KvPolicy::Full, 0, 0, false, type);
        AttentionRun run(b, kv, /*n_head=*/4, 1);
        const int row = kv.n_head_kv * kv.head_dim;
        int trials = 0, mismatches = 0;
        for (size_t trial = 0; trial < special.size() + 40; ++trial) {
            std::vector<float> values(row);
            const bool is_special = trial < special.size();
            for (int h = 0; h < kv.n_head_kv; ++h) {
                // Special rows as they are (kv head 0) and scaled (1); random rows at scales from
                // 1e-3 to 1e3, each kv head at its own.
                const std::vector<float> r = is_special ? special[trial] : random_floats(kv.head_dim, 500 + static_cast<uint32_t>(trial));
                const float magnitude = is_special ? (h == 0 ? 1.0f : -0.37f) : std::pow(10.0f, (trial % 7) - 3.0f + 0.3f * h);
                for (int d = 0; d < kv.head_dim; ++d) values[h * kv.head_dim + d] = r[d] * magnitude;
            }
            REQUIRE(b.cpu->kv_store().clear_kv().ok());
            REQUIRE(b.gpu->kv_store().clear_kv().ok());
            run.upload(run.v, values);
            run.upload(run.k, random_floats(row, 900 + static_cast<uint32_t>(trial)));
            run.upload(run.q, random_floats(run.shape.n_embd, 700 + static_cast<uint32_t>(trial)));
            const int32_t position = 0;
            REQUIRE(b.cpu->upload(run.pos.cpu, &position, sizeof position).ok());
            REQUIRE(b.gpu->upload(run.pos.gpu, &position, sizeof position).ok());
            const AttentionBatch cb{1, 0, run.pos.cpu, false}, gb{1, 0, run.pos.gpu, false};
            REQUIRE(b.cpu->attention(run.out.cpu, run.q.cpu, run.k.cpu, run.v.cpu, 0, cb, run.shape).ok());
            REQUIRE(b.gpu->attention(run.out.gpu, run.q.gpu, run.k.gpu, run.v.gpu, 0, gb, run.shape).ok());
            const auto c = b.cpu_floats(run.out.cpu, run.shape.n_embd), g = b.gpu_floats(run.out.gpu, run.shape.n_embd);
            if (g != c && mismatches++ < 3) MESSAGE("trial " << trial << ": max difference " << max_abs_diff(c, g));
            ++trials;
        }
        CHECK(trials == static_cast<int>(special.size()) + 40);
        CHECK(mismatches == 0);
        check_validation_clean(*b.gpu);
    }
}

namespace {}  // namespace

TEST_CASE("vulkan: measurement: transfers, submissions and memory per decoded token") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    // F32 and the smallest cache that keeps keys at 8 bits.
    size_t f32_kv_bytes = 0;
    for (KvType type : {KvType::F32, KvType::K8V4}) {
        INFO("kv " << std::string(kv_type_name(type)));
        VULKAN_OR_SKIP(vk, 64);
        const VulkanCounters created = counters_of(*vk);
        ModelRun run(path, std::move(vk), 64, 512, {}, false, type);
        const VulkanCounters ready = counters_of(*run.backend);
        std::vector<int32_t> tokens;
        REQUIRE(run.model->tokenizer().encode("Once upon a time", true, &tokens).ok());
        auto logits = run.feed(tokens);
        const VulkanCounters after_prompt = counters_of(*run.backend);
        const int kTokens = 32;
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < kTokens; ++i) logits = run.feed({argmax(logits)});
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / kTokens;
        const VulkanCounters after = counters_of(*run.backend);
        const double per_token_up = static_cast<double>(after.bytes_to_device - after_prompt.bytes_to_device) / kTokens;
        const double per_token_down = static_cast<double>(after.bytes_to_host - after_prompt.bytes_to_host) / kTokens;
        const double submissions = static_cast<double>(after.submissions - after_prompt.submissions) / kTokens;
        const double dispatches = static_cast<double>(after.dispatches - after_prompt.dispatches) / kTokens;
        const double barriers = static_cast<double>(after.barriers - after_prompt.barriers) / kTokens;
        MESSAGE("KV cache " << std::string(kv_type_name(type)) << ": Vulkan on " << after.device_name
                            << std::string(after.subgroups ? ", subgroup reductions" : ", shared-memory reductions")
                            << std::string(after.validation ? ", validation layer on" : ", no validation layer"));
        MESSAGE("device memory of the backend's own: "
                << created.device_memory_bytes << " bytes after creation, " << ready.device_memory_bytes
                << " with activations and a 512-slot KV cache; stories260K's weights (shared) " << ready.shared_weight_bytes
                << " bytes; host staging " << after.host_memory_bytes << " bytes");
        MESSAGE("weights uploaded: " << ready.weight_bytes_to_device << " bytes; allocated_bytes() " << run.backend->allocated_bytes()
                                     << ", kv_bytes() " << run.backend->kv_store().kv_bytes());
        MESSAGE("per decoded token: " << per_token_up << " bytes to the device, " << per_token_down << " bytes to the host, " << submissions
                                      << " submissions, " << dispatches << " dispatches, " << barriers << " barriers, " << ms
                                      << " ms (with validation when on)");
        CHECK(submissions == 1.0);
        CHECK(per_token_up == 8.0);                                 // the token id and its position
        CHECK(per_token_down == 4.0 * run.model->shape().n_vocab);  // the logits

        // Greedy decoding takes the argmax on the device: 4 bytes come back per token.
        int32_t token = argmax(logits);
        const VulkanCounters before_greedy = counters_of(*run.backend);
        for (int i = 0; i < kTokens; ++i) {
            run.store({token});
            REQUIRE(run.graph->greedy_token(&token).ok());
        }
        const VulkanCounters greedy = counters_of(*run.backend);
        const double greedy_down = static_cast<double>(greedy.bytes_to_host - before_greedy.bytes_to_host) / kTokens;
        MESSAGE("per greedy token: " << static_cast<double>(greedy.bytes_to_device - before_greedy.bytes_to_device) / kTokens
                                     << " bytes to the device, " << greedy_down << " bytes to the host, "
                                     << static_cast<double>(greedy.submissions - before_greedy.submissions) / kTokens << " submissions");
        CHECK(greedy_down == 4.0);
        CHECK(greedy.submissions - before_greedy.submissions == kTokens);
        CHECK(greedy.bytes_to_device - before_greedy.bytes_to_device == 8u * kTokens);
        CHECK(after.device_memory_bytes == ready.device_memory_bytes);  // nothing is allocated while decoding
        // Rows of head_dim 8 are whole words in every format, so the device holds the CPU's row
        // sizes (kv_format.h) exactly; the bookkeeping does not depend on the type.
        const KvConfig &kv = run.kv;
        const size_t rows = static_cast<size_t>(kv.n_layer) * kv.n_head_kv * kv.n_slots;
        const size_t row_bytes = kv_row_bytes(kv_key_format(type), kv.head_dim) + kv_row_bytes(kv_value_format(type), kv.head_dim);
        if (type == KvType::F32) f32_kv_bytes = run.backend->kv_store().kv_bytes() - rows * row_bytes;
        CHECK(run.backend->kv_store().kv_bytes() == f32_kv_bytes + rows * row_bytes);
        check_validation_clean(*run.backend);
    }
}

#endif  // H2O_HAVE_VULKAN
