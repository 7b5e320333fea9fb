// Every device backend built in, against the CPU reference: one suite for all of them. Each case
// runs for every device kind of device_kinds() (Vulkan with subgroup reductions and with the
// shared-memory ones, CUDA) that finds a device here, with the checks of device_parity.h: the
// operations on random data, attention and its statistics, the victims of every eviction policy
// with every KV type, rolling or not (retention spans and pins included), and stories260K's logits
// and greedy generation (the golden prompts, and small evicting caches). A kind without a device
// is named in a message; a case that found no device at all prints the skip marker. A new backend
// adds one entry to device_kinds(). What is particular to a backend (Vulkan's validation layer
// and buffer windows, CUDA's supports() and nvcc-compiled device math, each backend's matmul
// tolerances) stays in test_vulkan.cpp and test_cuda.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "device_parity.h"
#include "gguf.h"
#include "kv_layer_budgets.h"
#include "model.h"
#include "quant.h"
#include "quantize_model.h"
#include "synthetic_model.h"
#include "test_util.h"

#ifdef H2O_HAVE_VULKAN
#include "vulkan/vulkan_backend.h"
#include "vulkan_test_util.h"
#endif
#ifdef H2O_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"
#endif

using namespace h2o;
using h2o_test::Backends;
using h2o_test::max_abs;
using h2o_test::max_abs_diff;
using h2o_test::ModelRun;
using h2o_test::random_floats;
using h2o_test::Twin;

namespace {

struct DeviceKind {
    std::string name;
    // The backend, or null with the reason in *no_device when this machine has no such device.
    std::function<std::unique_ptr<Backend>(int max_batch, std::string *no_device)> make;
    std::vector<TensorType> weight_types;  // those its get_rows and matmul take
    int chunked_batch;                     // a batch of more queries than its attention scratch holds at once
    // The backend's own checks after each case (Vulkan: no validation-layer message).
    std::function<void(const Backend &)> check_after;
};

const std::vector<DeviceKind> &device_kinds() {
    static const std::vector<DeviceKind> kinds = [] {
        std::vector<DeviceKind> k;
#ifdef H2O_HAVE_VULKAN
        // The 32 MiB scratch holds 32 queries of the chunked case's 65536 slots. The two kinds
        // differ only in their shaders, so under AddressSanitizer (kAddressSanitized) the
        // shared-memory one is left to the other builds.
        for (bool subgroups : {true, false}) {
            if (h2o_test::kAddressSanitized && !subgroups) continue;
            k.push_back(DeviceKind{
                subgroups ? "vulkan" : "vulkan (shared-memory reductions)",
                [subgroups](int max_batch, std::string *no_device) { return h2o_test::make_vk(max_batch, subgroups, no_device); },
                {vulkan_weight_types().begin(), vulkan_weight_types().end()},
                40,
                [](const Backend &b) { h2o_test::check_validation_clean(b); }});
        }
#endif
#ifdef H2O_HAVE_CUDA
        // 1 MiB of scratch per query: 64 queries per chunk.
        k.push_back(DeviceKind{"cuda", [](int max_batch, std::string *no_device) { return h2o_test::make_cuda(max_batch, no_device); },
                               cuda_weight_types(), 80, nullptr});
#endif
        return k;
    }();
    return kinds;
}

// Runs body(backends, kind) for every device kind present, the CPU beside it.
void for_each_device(int max_batch, const std::function<void(Backends &, const DeviceKind &)> &body) {
    int ran = 0;
    std::string absent;
    for (const DeviceKind &kind : device_kinds()) {
        std::string no_device;
        Backends b;
        if (!b.pair(kind.make(max_batch, &no_device), max_batch)) {
            absent += (absent.empty() ? "" : "; ") + kind.name + ": " + no_device;
            continue;
        }
        INFO("backend " << kind.name);
        body(b, kind);
        if (kind.check_after && b.gpu) kind.check_after(*b.gpu);  // (a body that moved the backend into a model checks it)
        ++ran;
    }
    if (ran == 0) {
        std::printf("H2O-SKIP: no device backend to compare with the CPU (%s)\n", absent.empty() ? "none built" : absent.c_str());
    } else if (!absent.empty()) {
        MESSAGE("not run: " << absent);
    }
}

int32_t argmax(const std::vector<float> &v) { return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()); }

// A random-weight model quantized by h2o-quantize's engine with `preset`, and its twin with every
// tensor in F32, holding exactly the dequantized values (quant.cpp's dequantize_row). Test cases
// run as processes side by side: the file names carry the case's preset and shape.
struct QuantizedModel {
    std::string path, dequantized_path;
    std::set<TensorType> types;  // of its weights
};

QuantizedModel quantized_model(const SyntheticModelSpec &spec, QuantPreset preset) {
    const std::string tag =
        std::string("parity_") + quant_preset_name(preset) + "_ff" + std::to_string(spec.n_ff) + (spec.tied_output ? "_tied" : "");
    const std::string f32 = h2o_test::temp_path(tag + "_f32.gguf");
    REQUIRE(write_synthetic_model(spec, f32).ok());
    QuantizedModel m{h2o_test::temp_path(tag + ".gguf"), h2o_test::temp_path(tag + "_dequantized.gguf"), {}};
    QuantizeOptions options;
    options.preset = preset;
    options.n_threads = 1;
    QuantizeReport report;
    const Status quantized = quantize_model(f32, m.path, options, &report);
    REQUIRE_MESSAGE(quantized.ok(), quantized.message);
    std::unique_ptr<GgufFile> file;
    REQUIRE(GgufFile::open(m.path, &file).ok());
    GgufWriter twin;
    for (const GgufKeyValue &kv : file->metadata()) {
        if (kv.key != "general.file_type") twin.add_copy(kv);
    }
    for (const GgufTensor &t : file->tensors()) {
        m.types.insert(t.type);
        const int64_t cols = t.ne[0], rows = t.n_rows();
        std::vector<uint8_t> values(static_cast<size_t>(cols * rows) * sizeof(float));
        for (int64_t r = 0; r < rows; ++r) {
            REQUIRE(
                dequantize_row(t.type, t.data + r * row_bytes(t.type, cols), reinterpret_cast<float *>(values.data()) + r * cols, cols));
        }
        twin.add_tensor(std::string(t.name), TensorType::F32, std::vector<int64_t>(t.ne, t.ne + t.n_dims), std::move(values));
    }
    REQUIRE(twin.write(m.dequantized_path).ok());
    return m;
}

// The largest logit minus the second largest.
float top2_margin(const std::vector<float> &v) {
    float first = -std::numeric_limits<float>::infinity(), second = first;
    for (float x : v) {
        if (x > first) {
            second = first;
            first = x;
        } else if (x > second) {
            second = x;
        }
    }
    return first - second;
}

}  // namespace

TEST_CASE("device parity: get_rows dequantizes exactly as the CPU for every weight type") {
    for_each_device(16, [](Backends &b, const DeviceKind &kind) {
        const int64_t rows = 40;
        const std::vector<int32_t> ids = {0, 39, 7, 7, 21, 13, 1, 38, 20, 5, 2};
        const int n = static_cast<int>(ids.size());
        const Twin id = b.alloc(TensorType::I32, 1, n, ids.data());
        auto check = [&](TensorType type, int64_t cols) {
            // doctest prints a const char * as its address: names go to INFO as std::string.
            INFO("type " << std::string(type_name(type)) << ", " << cols << " columns");
            const Twin table = b.weight(type, cols, rows, random_floats(cols * rows, 1, -2, 2));
            const Twin out = b.alloc(TensorType::F32, cols, n);
            REQUIRE(b.cpu->get_rows(out.cpu, table.cpu, id.cpu, n).ok());
            REQUIRE(b.gpu->get_rows(out.gpu, table.gpu, id.gpu, n).ok());
            CHECK(h2o_test::same_bits(b.gpu_floats(out.gpu, cols * n), b.cpu_floats(out.cpu, cols * n)));
        };
        for (TensorType type : kind.weight_types) check(type, 512);
        check(TensorType::F16, 75);  // rows of 75 halves are not 4-byte aligned in the file
    });
}

TEST_CASE("device parity: rms_norm, add, swiglu and argmax match the CPU") {
    for_each_device(8, [](Backends &b, const DeviceKind &) {
        h2o_test::check_rms_norm_add_swiglu(b);
        for (int64_t width : {1, 7, 300, 32000, 151936}) {  // up to Qwen's vocabulary
            const int rows = 5;
            std::vector<float> data = random_floats(width * rows, 6, -5, 5);
            if (width > 2) data[width + 2] = data[width + width - 1] = 9.0f;      // row 1: its maximum twice
            std::fill(data.begin() + 2 * width, data.begin() + 3 * width, 1.5f);  // row 2: all equal
            data[3 * width + width - 1] = 7.0f;                                   // row 3: at the end
            data[4 * width] = std::numeric_limits<float>::quiet_NaN();            // row 4: a NaN first
            const Twin in = b.floats(width, rows, data);
            const Twin out = b.alloc(TensorType::I32, 1, rows);
            REQUIRE(b.cpu->argmax(out.cpu, in.cpu, rows).ok());
            REQUIRE(b.gpu->argmax(out.gpu, in.gpu, rows).ok());
            int32_t c[rows], g[rows];
            REQUIRE(b.cpu->download(out.cpu, c, sizeof c).ok());
            REQUIRE(b.gpu->download(out.gpu, g, sizeof g).ok());
            INFO("width " << width);
            CHECK(std::equal(c, c + rows, g));
            if (width > 2) CHECK(c[1] == 2);
            CHECK(c[2] == 0);
            CHECK(c[3] == width - 1);
        }
    });
}

TEST_CASE("device parity: rope matches the CPU, including large positions and partial rotation") {
    for_each_device(16, [](Backends &b, const DeviceKind &) { h2o_test::check_rope(b); });
}

TEST_CASE("device parity: a projection's bias and the per-head norms of q and k match the CPU") {
    for_each_device(8, [](Backends &b, const DeviceKind &) { h2o_test::check_bias_and_head_norm(b); });
}

TEST_CASE("device parity: rolling with rotary pairs of halves and frequency factors evicts and turns keys back as the CPU") {
    RotarySpec rope;
    rope.dims = 8;
    rope.freq_base = 1000000.0f;
    rope.pairing = RotaryPairing::Halves;
    rope.freq_factors = {1.0f, 2.0f, 4.0f, 8.0f};
    for (const auto &c : h2o_test::kPolicyCases) {
        for (KvType type : {KvType::F32, KvType::F16}) {
            INFO("policy " << std::string(kv_policy_name(c.policy)) << ", kv " << std::string(kv_type_name(type)));
            for_each_device(8, [&](Backends &b, const DeviceKind &) { h2o_test::check_eviction(b, c, true, type, {}, 0, 0.0f, &rope); });
        }
    }
}

TEST_CASE("device parity: rolled keys keep the CPU's bits in every KV type, with pairs adjacent and of halves") {
    RotarySpec halves;
    halves.dims = 8;
    halves.freq_base = 1000000.0f;
    halves.pairing = RotaryPairing::Halves;
    for (KvType type : h2o_test::kKvTypes) {
        for (const RotarySpec *rope : {static_cast<const RotarySpec *>(nullptr), static_cast<const RotarySpec *>(&halves)}) {
            INFO("kv " << std::string(kv_type_name(type)) << std::string(rope ? ", pairs of halves" : ""));
            for_each_device(8, [&](Backends &b, const DeviceKind &) { h2o_test::check_rolled_rows(b, type, rope); });
        }
    }
}

TEST_CASE("device parity: attention and its statistics match the CPU for every KV type (no eviction, GQA)") {
    // The devices store the CPU's rows bit for bit, so quantized caches differ from the CPU only
    // by the order of float additions, as F32 does: same tolerances.
    for (KvType type : h2o_test::kKvTypes) {
        INFO("kv " << std::string(kv_type_name(type)));
        for_each_device(32, [type](Backends &b, const DeviceKind &) { h2o_test::check_attention_without_eviction(b, type); });
    }
}

TEST_CASE("device parity: every eviction policy evicts the same tokens as the CPU, with every KV type, rolling or not") {
    // Quantized caches: the stored rows are the CPU's bit for bit, so the statistics differ from
    // the CPU's only by the order of float additions, as with F32, and the victims are the same
    // (exactly equal priorities are not met with random data). Re-rotated keys keep the CPU's
    // bits (the case "rolled keys keep the CPU's bits"). To keep the run short on a software device, F32 runs every policy with and
    // without rolling; the other types run the policies whose victims depend on the stored values
    // (those reading the statistics or the keys) and sinks + window, each once, rolling for every other one
    // (alternating per type so that each policy meets both).
    for (KvType type : h2o_test::kKvTypes) {
        for (size_t ci = 0; ci < std::size(h2o_test::kPolicyCases); ++ci) {
            const auto &c = h2o_test::kPolicyCases[ci];
            for (bool rolling : {false, true}) {
                if (type != KvType::F32) {
                    if (!h2o_test::victims_read_values(c.policy) && c.policy != KvPolicy::SinkWindow) continue;
                    if (rolling != ((ci + static_cast<size_t>(type)) % 2 == 1)) continue;
                }
                INFO("kv " << std::string(kv_type_name(type)) << ", policy " << std::string(kv_policy_name(c.policy))
                           << std::string(rolling ? ", rolling" : ""));
                for_each_device(8, [&](Backends &b, const DeviceKind &) { h2o_test::check_eviction(b, c, rolling, type); });
            }
        }
    }
}

TEST_CASE("device parity: with budgets that differ across layers, every policy evicts the same tokens as the CPU") {
    // Layer 0 has 10 slots and layer 1 has 22 (kv_layer_budgets' shape; each layer's recent window
    // scaled to its slots, its rolling ranks its own). F16, every policy, rolling or not.
    for (const auto &c : h2o_test::kPolicyCases) {
        for (bool rolling : {false, true}) {
            INFO("policy " << std::string(kv_policy_name(c.policy)) << std::string(rolling ? ", rolling" : ""));
            for_each_device(8, [&](Backends &b, const DeviceKind &) { h2o_test::check_eviction(b, c, rolling, KvType::F16, {10, 22}); });
        }
    }
}

TEST_CASE("device parity: one-shot prompt eviction evicts the same tokens as the CPU") {
    // The policies that gather statistics, a proxy of 3 queries (the test's batches have 1 to 4
    // tokens), with and without a random share, rolling for every other one; F16.
    int i = 0;
    for (const auto &c : h2o_test::kPolicyCases) {
        if (!kv_policy_uses_statistics(c.policy)) continue;
        for (float share : {0.0f, 0.4f}) {
            const bool rolling = i++ % 2 == 1;
            INFO("policy " << std::string(kv_policy_name(c.policy)) << ", random share " << share
                           << std::string(rolling ? ", rolling" : ""));
            for_each_device(8,
                            [&](Backends &b, const DeviceKind &) { h2o_test::check_eviction(b, c, rolling, KvType::F16, {}, 3, share); });
        }
    }
}

TEST_CASE("device parity: attention over a batch larger than the scratch processes it in chunks") {
    // Then with every query of the batch a proxy query, whose sum `last` is folded chunk by chunk.
    for (int proxy : {0, 1 << 12}) {
        INFO("prompt_proxy " << proxy);
        for (const DeviceKind &kind : device_kinds()) {
            const int batch = kind.chunked_batch;
            for_each_device(batch, [&](Backends &b, const DeviceKind &k) {
                if (k.name == kind.name) h2o_test::check_chunked_attention(b, batch, proxy);
            });
        }
    }
}

TEST_CASE("device parity: single tokens over a long cache match the CPU's attention and statistics") {
    for_each_device(512, [](Backends &b, const DeviceKind &) { h2o_test::check_long_cache_decode(b); });
}

TEST_CASE("device parity: stories260K logits match the CPU after a prompt, batched and token by token") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    for_each_device(16, [&](Backends &b, const DeviceKind &kind) {
        ModelRun gpu(path, std::move(b.gpu), 16, 256);
        ModelRun cpu(path, make_cpu_backend(2, 16), 16, 256);
        std::vector<int32_t> tokens;
        REQUIRE(
            gpu.model->tokenizer().encode("Tom and his dog went to the park. They saw a big tree and a little bird.", true, &tokens).ok());
        REQUIRE(tokens.size() > 16);  // more than one batch
        const auto c = cpu.feed(tokens), g = gpu.feed(tokens);
        INFO("max difference " << max_abs_diff(c, g) << ", largest logit " << max_abs(c));
        CHECK(max_abs_diff(c, g) <= 1e-4 * max_abs(c));
        for (int32_t t : {argmax(c), 42, 7}) {  // then token by token
            const auto c1 = cpu.feed({t}), g1 = gpu.feed({t});
            CHECK(max_abs_diff(c1, g1) <= 1e-4 * max_abs(c1));
        }
        if (kind.check_after) kind.check_after(*gpu.backend);
    });
}

TEST_CASE("device parity: each architecture's greedy generation equals the CPU's, with a full cache and evicting rolling ones") {
    // Synthetic models of each architecture (tools/synthetic_model.h), F16 weights: Llama 3 style
    // (frequency factors, tied), Qwen 2 (biases, pairs of halves), Qwen 3 (per-head norms, heads
    // wider than the embedding), Phi-3 (fused projections, half of each head rotated, LongRoPE's
    // factors and attention factor).
    for (const std::string arch : {"llama", "qwen2", "qwen3", "phi3"}) {
        SyntheticModelSpec spec;
        spec.architecture = arch;
        spec.n_embd = 128;
        spec.n_layer = 3;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.n_ff = 256;
        spec.n_vocab = 1000;
        spec.type = TensorType::F16;
        spec.rope_freq_base = arch == "llama" ? 500000.0f : 1000000.0f;
        spec.rope_freqs = arch == "llama";
        spec.tied_output = arch != "qwen2";
        spec.head_dim = arch == "qwen3" ? 64 : 0;
        spec.rope_dims = arch == "phi3" ? 16 : 0;
        spec.long_rope_context = arch == "phi3" ? 256 : 0;
        const std::string path = h2o_test::temp_path("parity-" + arch + ".gguf");
        REQUIRE(write_synthetic_model(spec, path).ok());
        struct Run {
            int slots;
            KvPolicy policy;
            bool rolling;
        };
        for (const Run &r : {Run{256, KvPolicy::Full, false}, Run{24, KvPolicy::H2O, true}, Run{24, KvPolicy::SinkWindow, true},
                             Run{24, KvPolicy::Scissorhands, false}}) {
            INFO(arch << ", " << r.slots << " slots, " << std::string(kv_policy_name(r.policy)) << (r.rolling ? ", rolling" : ""));
            KvPolicyConfig policy;
            policy.policy = r.policy;
            policy.recent = r.policy == KvPolicy::Full ? 0 : 8;
            policy.sinks = r.policy == KvPolicy::SinkWindow ? 4 : 0;
            for_each_device(16, [&](Backends &b, const DeviceKind &kind) {
                ModelRun gpu = h2o_test::check_greedy_generation(path, std::move(b.gpu), r.slots, policy, r.rolling, KvType::F16, 40);
                if (kind.check_after) kind.check_after(*gpu.backend);
            });
        }
    }
}

TEST_CASE("device parity: a tied 128k vocabulary (the Llama 3 shape's) gives the CPU's logits and greedy tokens") {
    // The output matrix is token_embd: 128256 rows, more than one dispatch's workgroups. F16
    // weights: with Q8_0 the CPU's products of 8-bit activations differ from the device's float
    // ones by more than the tolerance, at these unscaled tied embeddings (logits near 35).
    SyntheticModelSpec spec;
    spec.n_embd = 64;
    spec.n_layer = 2;
    spec.n_head = 4;
    spec.n_head_kv = 1;
    spec.n_ff = 128;
    spec.n_vocab = 128256;
    spec.type = TensorType::F16;
    spec.tied_output = true;
    spec.rope_freqs = true;
    spec.rope_freq_base = 500000.0f;
    const std::string path = h2o_test::temp_path("parity-llama-128k.gguf");
    REQUIRE(write_synthetic_model(spec, path).ok());
    KvPolicyConfig policy;
    policy.policy = KvPolicy::Full;
    for_each_device(16, [&](Backends &b, const DeviceKind &kind) {
        ModelRun gpu = h2o_test::check_greedy_generation(path, std::move(b.gpu), 64, policy, false, KvType::F16, 8);
        if (kind.check_after) kind.check_after(*gpu.backend);
    });
}

TEST_CASE("device parity: greedy generation equals the CPU's and llama.cpp's for the golden prompts") {
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    H2O_SHARED_FILE_OR_SKIP(golden_path, "golden/stories260K-greedy-llamacpp.jsonl");
    const std::vector<h2o_test::GoldenContinuation> golden = h2o_test::read_golden_continuations(golden_path);
    REQUIRE(golden.size() == 5);
    for (const h2o_test::GoldenContinuation &g : golden) {
        INFO("prompt: " << g.prompt);
        for_each_device(32, [&](Backends &b, const DeviceKind &kind) {
            ModelRun gpu(path, std::move(b.gpu), 32, 512);
            ModelRun cpu(path, make_cpu_backend(2, 32), 32, 512);
            const Tokenizer &tok = gpu.model->tokenizer();
            std::vector<int32_t> prompt_tokens;
            REQUIRE(tok.encode(g.prompt, true, &prompt_tokens).ok());
            auto gl = gpu.feed(prompt_tokens), cl = cpu.feed(prompt_tokens);
            std::vector<int32_t> gpu_tokens, cpu_tokens;
            std::string text;
            int32_t last = prompt_tokens.back();
            for (int i = 0; i < 120; ++i) {
                const int32_t tg = argmax(gl), tc = argmax(cl);
                gpu_tokens.push_back(tg);
                cpu_tokens.push_back(tc);
                if (tg == tok.eos()) break;
                tok.append_piece(tg, last == tok.bos(), &text);
                last = tg;
                gl = gpu.feed({tg});
                cl = cpu.feed({tc});
            }
            CHECK(gpu_tokens == cpu_tokens);
            CHECK(text == g.continuation);
            if (kind.check_after) kind.check_after(*gpu.backend);
        });
    }
}

TEST_CASE("device parity: K-quant models (Q4_K_M mixes, Q4_K, Q5_K, Q6_K) give the CPU's logits and greedy tokens") {
    // A 4-layer model, 256 wide (head size 64, 2 kv heads), quantized by h2o-quantize: the Q4_K_M
    // mix (Q4_K; Q6_K for output.weight and attn_v/ffn_down of layers 2 and 3, and token_embd when
    // tied), pure Q4_K, Q5_K and Q6_K. A feed-forward width of 320 (not a multiple of 256) sends
    // ffn_down to the fallbacks, so the mix also holds Q4_0 and Q8_0 tensors. Token ids are fed in
    // batches of 16, 12, 5 and 9 (the tiled matmul and the few-token matvec), then one at a time,
    // teacher-forced with the reference's greedy token; after each, the last logits are compared.
    //
    // Against the CPU running the F32 twin (the same weight values): both use float activations,
    // so only the order of float operations differs, as for stories260K's F32 weights: within
    // 1e-4 of the largest logit. Against the CPU running the quantized file: its kernels quantize
    // the activations to 8 bits per block of 32 (each value off by up to 1/254 of its block's
    // largest), which moves these logits by up to 0.9% of the largest (measured on these models;
    // 5e-7 from the twin): within 2%. Greedy tokens: equal wherever the reference's top-2 margin
    // exceeds twice the bound, as the bound then implies; such steps must be the majority (16 to
    // 28 of 28 against the quantized run), so the check cannot pass empty.
    const struct {
        QuantPreset preset;
        int n_ff;
        bool tied;
    } cases[] = {{QuantPreset::Q4_K_M, 320, false},
                 {QuantPreset::Q4_K_M, 512, true},
                 {QuantPreset::Q4_K, 512, false},
                 {QuantPreset::Q5_K, 320, false},
                 {QuantPreset::Q6_K, 256, true}};
    for (const auto &c : cases) {
        SyntheticModelSpec spec;
        spec.n_embd = 256;
        spec.n_layer = 4;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.n_ff = c.n_ff;
        spec.n_vocab = 512;
        spec.n_ctx = 256;
        spec.type = TensorType::F32;
        spec.tied_output = c.tied;
        spec.seed = 5;
        const QuantizedModel model = quantized_model(spec, c.preset);
        std::string types;
        for (TensorType t : model.types) types += std::string(types.empty() ? "" : ", ") + type_name(t);
        INFO(std::string(quant_preset_name(c.preset))
             << ", ffn " << c.n_ff << std::string(c.tied ? ", tied embeddings" : "") << " (" << types << ")");
        for_each_device(16, [&](Backends &b, const DeviceKind &kind) {
            for (TensorType t : model.types) {
                if (std::find(kind.weight_types.begin(), kind.weight_types.end(), t) == kind.weight_types.end()) {
                    MESSAGE(kind.name << " does not run " << type_name(t) << " weights: not compared");
                    return;
                }
            }
            ModelRun device(model.path, std::move(b.gpu), 16, 128);
            ModelRun cpu_quantized(model.path, make_cpu_backend(2, 16), 16, 128);
            ModelRun cpu_float(model.dequantized_path, make_cpu_backend(2, 16), 16, 128);
            double worst_float = 0, worst_quantized = 0;
            int clear_float = 0, clear_quantized = 0, steps = 0;
            auto compare = [&](const std::vector<int32_t> &tokens) {
                const auto d = device.feed(tokens), f = cpu_float.feed(tokens), q = cpu_quantized.feed(tokens);
                const double float_diff = max_abs_diff(d, f) / max_abs(f), quantized_diff = max_abs_diff(d, q) / max_abs(q);
                worst_float = std::max(worst_float, float_diff);
                worst_quantized = std::max(worst_quantized, quantized_diff);
                CHECK(float_diff <= 1e-4);
                CHECK(quantized_diff <= 2e-2);
                ++steps;
                if (top2_margin(f) > 2 * 1e-4 * max_abs(f)) {
                    ++clear_float;
                    CHECK(argmax(d) == argmax(f));
                }
                if (top2_margin(q) > 2 * 2e-2 * max_abs(q)) {
                    ++clear_quantized;
                    CHECK(argmax(d) == argmax(q));
                }
                return argmax(f);
            };
            // Fixed token ids spread over the vocabulary.
            std::vector<int32_t> prompt(16 + 12 + 5 + 9);
            for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 193 + 7) % static_cast<size_t>(spec.n_vocab));
            auto at = prompt.begin();
            int32_t next = 0;
            for (int batch : {16, 12, 5, 9}) {
                next = compare({at, at + batch});
                at += batch;
            }
            for (int i = 0; i < 24; ++i) next = compare({next});
            MESSAGE(kind.name << ": largest difference / largest logit: " << worst_float << " from the F32 twin, " << worst_quantized
                              << " from the CPU's quantized run; clear margins " << clear_float << " and " << clear_quantized << " of "
                              << steps);
            CHECK(2 * clear_float > steps);
            CHECK(2 * clear_quantized > steps);
            if (kind.check_after) kind.check_after(*device.backend);
        });
    }
}

TEST_CASE("device parity: a model with Q5_0 tensors runs as its Q8_0 twin, bit for bit on the CPU, and on every device") {
    // Q5_0 is what llama.cpp's Q4_K_M gives rows that are not a multiple of 256 (most of Qwen2.5
    // 0.5B and SmolLM2's matrices); the model widens it to Q8_0 blocks of the same values as it
    // loads. The twin is the same file with each Q5_0 tensor written widened: the CPU's logits
    // must be the twin's bit for bit, batched and token by token; a device's must be the CPU's
    // within the bound of the quantized models above (its kernels keep the activations in float).
    SyntheticModelSpec spec;
    spec.n_embd = 128;
    spec.n_layer = 2;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_ff = 288;
    spec.n_vocab = 512;
    spec.n_ctx = 256;
    spec.type = TensorType::Q5_0;
    spec.seed = 9;
    const std::string path = h2o_test::temp_path("parity_q5_0.gguf"), twin_path = h2o_test::temp_path("parity_q5_0_as_q8_0.gguf");
    REQUIRE(write_synthetic_model(spec, path).ok());
    {
        std::unique_ptr<GgufFile> file;
        REQUIRE(GgufFile::open(path, &file).ok());
        GgufWriter twin;
        for (const GgufKeyValue &kv : file->metadata()) twin.add_copy(kv);
        int widened = 0;
        for (const GgufTensor &t : file->tensors()) {
            const std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
            if (t.type != TensorType::Q5_0) {
                twin.add_tensor(std::string(t.name), t.type, shape, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
                continue;
            }
            std::vector<uint8_t> q8(static_cast<size_t>(t.n_elements() / 32) * sizeof(BlockQ8_0));
            widen_q5_0_to_q8_0(t.data, reinterpret_cast<BlockQ8_0 *>(q8.data()), t.n_elements() / 32);
            twin.add_tensor(std::string(t.name), TensorType::Q8_0, shape, std::move(q8));
            ++widened;
        }
        CHECK(widened == 2 + 7 * spec.n_layer);  // token_embd, output and every layer's matrices
        REQUIRE(twin.write(twin_path).ok());
    }
    ModelRun q5(path, make_cpu_backend(2, 16), 16, 128), q8(twin_path, make_cpu_backend(2, 16), 16, 128);
    CHECK(q5.model->weight_types() == std::vector<TensorType>{TensorType::Q8_0, TensorType::F32});
    CHECK(q5.model->weight_bytes() == q8.model->weight_bytes());
    std::vector<int32_t> prompt(21);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 193 + 7) % 512);
    std::vector<float> from_q5 = q5.feed(prompt), from_q8 = q8.feed(prompt);
    CHECK(std::memcmp(from_q5.data(), from_q8.data(), from_q5.size() * sizeof(float)) == 0);
    for (int i = 0; i < 12; ++i) {
        const int32_t next = argmax(from_q5);
        from_q5 = q5.feed({next});
        from_q8 = q8.feed({next});
        CHECK(std::memcmp(from_q5.data(), from_q8.data(), from_q5.size() * sizeof(float)) == 0);
    }

    for_each_device(16, [&](Backends &b, const DeviceKind &kind) {
        ModelRun device(path, std::move(b.gpu), 16, 128), cpu(path, make_cpu_backend(2, 16), 16, 128);
        std::vector<float> d = device.feed(prompt), c = cpu.feed(prompt);
        for (int i = 0; i < 12; ++i) {
            CHECK(max_abs_diff(d, c) <= 2e-2 * max_abs(c));
            const int32_t next = argmax(c);
            d = device.feed({next});
            c = cpu.feed({next});
        }
        if (kind.check_after) kind.check_after(*device.backend);
    });
}

TEST_CASE("device parity: stories260K greedy generation equals the CPU's, with a full and with small evicting caches") {
    // 64 slots for about 215 tokens: H2O (with and without rolling positions), sinks + window,
    // Scissorhands and the key scorers with their horizon run far past the budget; the kept tokens of every (layer, kv
    // head) must be the CPU's too. Quantized caches (rows stored as the CPU stores them) run for
    // 120 tokens (still twice the budget) to keep the test short. The last two spread the budget
    // across layers (kv_layer_slope): 32 to 96 slots, or 96 to 32.
    //
    // Three slope-0.5 cases are left out: a near-tie decides one of their evictions, and rounding
    // puts the backends on either side of it. That happens in every run, alone or beside other
    // tests (each backend repeats its own bits, which the next test case checks on two of them);
    // the eviction suite compares their policies' victims in shorter runs.
    //  - H2O, F32, not rolling: after 135 generated tokens, the tokens at stream indices 88 and 101
    //    of layer 3, kv head 2, have accumulated 2.4268708 and 2.4268718 on Vulkan, 2.4268792 and
    //    2.4268704 on the CPU (the backends agree on such sums to about 4e-6 of their size); each
    //    evicts the other token.
    //  - Scissorhands, F16, rolling or not: F16 rows amplify rounding. A value of layer 0 is
    //    0.553955019 on the CPU and 0.553955138 on Vulkan, on either side of the halfway point
    //    0.553955078 between two halves, and from layer 1 on the statistics differ by up to 5e-3
    //    of their size. Rolling: the 23rd generated token gives stream index 29 of layer 2, kv
    //    head 2, a weight of 0.0500049 on Vulkan, 0.0500343 with the CPU's AVX2 kernels and
    //    0.0498677 with its AVX-512 ones, around the importance threshold 2/40 = 0.05, and 48 tokens
    //    later even the CPU's two kernel levels keep different tokens. Not rolling: stream index 38
    //    of layer 1, kv head 3, gets 0.0416242 with Vulkan's shared-memory reductions and 0.0417279
    //    on the CPU, around 2/48.
    // Expected Attention (rolling, F32) runs 120 tokens: its scores are continuous (a softmax of
    // closed-form logits times a value's norm), and close ones are common. Traced without rolling
    // at 64 slots: the backends' query statistics agree to 3e-5 of their size (their projections
    // round differently) until the 115th generated token, where one eviction takes the other of
    // two tokens (two slots then differ); by 200 tokens most settings have met such a near-tie.
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const struct {
        KvPolicy policy;
        bool rolling;
        KvType type;
        int n_slots, generated;
        float layer_slope;  // kv_layer_budgets over stories260K's 5 layers
    } cases[] = {{KvPolicy::Full, false, KvType::F32, 512, 150, 0},       {KvPolicy::H2O, true, KvType::F32, 64, 200, 0},
                 {KvPolicy::H2O, false, KvType::F32, 64, 200, 0},         {KvPolicy::SinkWindow, true, KvType::F32, 64, 200, 0},
                 {KvPolicy::Scissorhands, true, KvType::F32, 64, 200, 0}, {KvPolicy::Scissorhands, true, KvType::Q8, 64, 120, 0},
                 {KvPolicy::H2O, true, KvType::K8V4, 64, 120, 0},         {KvPolicy::Scissorhands, true, KvType::F32, 64, 200, 0.5f},
                 {KvPolicy::Window, false, KvType::F32, 64, 120, -0.5f},  {KvPolicy::KeyNorm, true, KvType::F32, 64, 200, 0},
                 {KvPolicy::KeyDiff, false, KvType::F32, 64, 120, 0},     {KvPolicy::ExpectedAttention, true, KvType::F32, 64, 120, 0}};
    for (const auto &run : cases) {
        // Plain copies: clang 14 cannot capture structured bindings in the lambda INFO makes.
        const KvPolicy policy = run.policy;
        const bool rolling = run.rolling;
        const KvType type = run.type;
        const float slope = run.layer_slope;
        INFO("kv " << std::string(kv_type_name(type)) << ", policy " << std::string(kv_policy_name(policy))
                   << std::string(rolling ? ", rolling" : "") << ", layer slope " << slope);
        KvPolicyConfig config;
        config.policy = policy;
        config.recent = 32;
        config.sinks = policy == KvPolicy::SinkWindow || policy == KvPolicy::ExpectedAttention ? 4 : 0;
        // The API's default for 64 slots.
        config.horizon = policy == KvPolicy::Scissorhands || kv_policy_scores_keys(static_cast<uint32_t>(policy)) ? 96 : 0;
        for_each_device(16, [&](Backends &b, const DeviceKind &kind) {
            const ModelRun gpu =
                h2o_test::check_greedy_generation(path, std::move(b.gpu), run.n_slots, config, rolling, type, run.generated,
                                                  kv_layer_budgets(5, run.n_slots, slope, kMinKvLayerSlots));
            if (kind.check_after) kind.check_after(*gpu.backend);
        });
    }
}

TEST_CASE("device parity: stories260K read by one-shot prompt eviction, then greedy generation, equals the CPU's") {
    // A prompt of about 150 tokens into 48 slots: it is read in batches of up to 12 tokens that
    // evict by the proxy attention (8 queries, a random share of 0.25), then generation evicts by
    // the policy. The same tokens and the same kept tokens in every (layer, kv head).
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const std::string prompt =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, she saw a big "
        "red ball in the park. She ran to the ball and kicked it very hard. The ball flew over the fence and into the garden of "
        "an old man. Lily was scared, but she went to the old man's door and knocked. The old man smiled and gave her the ball.";
    for (KvPolicy policy : {KvPolicy::H2O, KvPolicy::RoCo}) {
        INFO("policy " << std::string(kv_policy_name(policy)));
        KvPolicyConfig config;
        config.policy = policy;
        config.recent = 16;
        config.prompt_proxy = 8;
        config.prompt_random_share = 0.25f;
        config.seed = 11;
        for_each_device(16, [&](Backends &b, const DeviceKind &kind) {
            const ModelRun gpu =
                h2o_test::check_greedy_generation(path, std::move(b.gpu), 48, config, /*rolling=*/true, KvType::F32, 60, {}, prompt);
            if (kind.check_after) kind.check_after(*gpu.backend);
        });
    }
}

TEST_CASE("device parity: a device backend repeats its own bits, token after token, with evicting per-layer budgets") {
    // Every comparison with the CPU assumes that a device computes the same bits each time it runs
    // the same work: no float atomics, no reduction in an order the scheduling picks, no race on
    // shared or device memory, no missing barrier between kernels. Two backends of one kind
    // generate greedily in step, and after every token their logits, statistics and kept tokens
    // must be equal bits. The configurations are two of the slope cases the greedy comparison
    // above leaves out: layers of 32 to 96 slots, so each layer's kernels see another first slot
    // and slot count.
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    const struct {
        KvPolicy policy;
        bool rolling;
        KvType type;
    } cases[] = {{KvPolicy::Scissorhands, true, KvType::F16}, {KvPolicy::H2O, false, KvType::F32}};
    for (const auto &run : cases) {
        // The cases differ in device work only: AddressSanitizer checks the host's with the first.
        if (h2o_test::kAddressSanitized && &run != &cases[0]) continue;
        const KvPolicy policy = run.policy;
        const bool rolling = run.rolling;
        const KvType type = run.type;
        INFO("kv " << std::string(kv_type_name(type)) << ", policy " << std::string(kv_policy_name(policy))
                   << std::string(rolling ? ", rolling" : ""));
        KvPolicyConfig config;
        config.policy = policy;
        config.recent = 32;
        config.horizon = policy == KvPolicy::Scissorhands ? 96 : 0;
        const std::vector<int> layer_slots = kv_layer_budgets(5, 64, 0.5f, kMinKvLayerSlots);
        for_each_device(16, [&](Backends &b, const DeviceKind &kind) {
            std::string no_device;
            std::unique_ptr<Backend> second_device = kind.make(16, &no_device);
            REQUIRE_MESSAGE(second_device, no_device);
            ModelRun first(path, std::move(b.gpu), 16, 64, config, rolling, type, layer_slots);
            ModelRun second(path, std::move(second_device), 16, 64, config, rolling, type, layer_slots);
            const auto slots = static_cast<size_t>(first.kv.total_slots());
            std::vector<SlotStats> first_stats(slots), second_stats(slots);
            std::vector<int64_t> first_kept(slots), second_kept(slots);
            std::vector<int32_t> tokens;
            REQUIRE(first.model->tokenizer().encode("Once upon a time, there was a little dog named Max.", true, &tokens).ok());
            for (int step = 0; step <= 80; ++step) {  // far past the smallest layer's 32 slots
                CAPTURE(step);
                const std::vector<float> logits = first.feed(tokens);
                REQUIRE(h2o_test::same_bits(second.feed(tokens), logits));
                REQUIRE(first.backend->kv_store().download_kv_statistics(first_stats.data()).ok());
                REQUIRE(second.backend->kv_store().download_kv_statistics(second_stats.data()).ok());
                REQUIRE(std::memcmp(first_stats.data(), second_stats.data(), slots * sizeof(SlotStats)) == 0);
                REQUIRE(first.backend->kv_store().download_kv_stream_indices(first_kept.data()).ok());
                REQUIRE(second.backend->kv_store().download_kv_stream_indices(second_kept.data()).ok());
                REQUIRE(first_kept == second_kept);
                tokens = {argmax(logits)};
            }
            if (kind.check_after) {
                kind.check_after(*first.backend);
                kind.check_after(*second.backend);
            }
        });
    }
}
