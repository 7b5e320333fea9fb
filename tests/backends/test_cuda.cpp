// The CUDA backend. On every machine with the toolkit: the device math headers compiled by nvcc
// against the CPU reference (bit for bit where the formats demand it), and the backend's
// registration (devices, what it supports, the errors without a driver or device). With a CUDA
// device: every operation against the CPU backend on random data, the KV cache with every
// eviction policy and KV type, and stories260K's greedy generation; without one those tests
// print the skip marker.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "kv_format.h"
#include "quant.h"
#include "device_parity.h"
#include "test_util.h"

#ifdef H2O_TEST_CUDA
#include "cuda/device_math_cuda.h"
#include "kv_victim_rules.h"
#endif
#ifdef H2O_HAVE_CUDA
#include "backend_registry.h"
#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "llama_graph.h"
#include "model.h"
#endif

using namespace h2o;

namespace {

using h2o_test::max_abs;
using h2o_test::max_abs_diff;
using h2o_test::random_floats;

using h2o_test::same_bits;

}  // namespace

#ifndef H2O_TEST_CUDA

TEST_CASE("cuda: device math compiled by nvcc") { std::printf("H2O-SKIP: built without the CUDA toolkit (H2O_CUDA=OFF)\n"); }

#else

TEST_CASE("cuda: nvcc-compiled fp16 conversions equal the CPU's for every half and special floats") {
    std::vector<uint16_t> halves(65536);
    for (uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
    std::vector<float> got(65536), expected(65536);
    cuda_host_half_to_float(halves.data(), 65536, got.data());
    for (uint32_t i = 0; i < 65536; ++i) expected[i] = fp16_to_fp32(halves[i]);
    CHECK(same_bits(got, expected));

    std::vector<float> floats = random_floats(100000, 1, -70000.0f, 70000.0f);
    const std::vector<float> small = random_floats(100000, 2, -1e-4f, 1e-4f);
    floats.insert(floats.end(), small.begin(), small.end());
    for (float f : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x3p-26f, 0x1p-14f, 1 + 0x1p-11f,
                    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()}) {
        floats.push_back(f);
    }
    std::vector<uint16_t> h(floats.size());
    cuda_host_half_from_float(floats.data(), static_cast<int>(floats.size()), h.data());
    int bad = 0;
    for (size_t i = 0; i < floats.size(); ++i) bad += h[i] != fp32_to_fp16(floats[i]);
    CHECK(bad == 0);
}

TEST_CASE("cuda: weight_element and weight_group32 give quant.cpp's dequantized values bit for bit, for every weight type") {
    std::mt19937 rng(3);
    for (TensorType type : kWeightTypes) {
        CAPTURE(type_name(type));
        const int64_t cols = 512;
        for (int trial = 0; trial < 12; ++trial) {
            std::vector<uint8_t> row(row_bytes(type, cols));
            if (trial < 6) {
                // Quantized from random values at several magnitudes.
                const std::vector<float> values =
                    random_floats(cols, 10 + trial, -std::pow(10.0f, trial - 3.0f), std::pow(10.0f, trial - 2.0f));
                REQUIRE(quantize_row(type, values.data(), row.data(), cols));
            } else {
                // Arbitrary bytes: every code, scale and packing the format allows (NaN and
                // infinite scales included, compared by their bits).
                for (uint8_t &b : row) b = static_cast<uint8_t>(rng());
            }
            std::vector<float> expected(cols), got(cols);
            REQUIRE(dequantize_row(type, row.data(), expected.data(), cols));
            INFO("trial " << trial);
            cuda_host_weight_row(type, row.data(), cols, got.data());
            CHECK(same_bits(got, expected));
            cuda_host_weight_groups(type, row.data(), cols, got.data());
            CHECK(same_bits(got, expected));
        }
    }
}

TEST_CASE("cuda: KV rows encoded and decoded by nvcc-compiled code are kv_store_row's and kv_load_row's") {
    const KvRowFormat formats[] = {KvRowFormat::F32, KvRowFormat::F16, KvRowFormat::Q8, KvRowFormat::Q4};
    const std::vector<std::vector<float>> special = {
        {127, 2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 64.5f, -126.5f},                       // Q8 scale 1: ties
        {15, 0.5f, 2.5f, 14.5f, 0, 1.5f, 7.5f, 8.5f},                                // Q4 scale 1, min 0: ties
        {1 + 0x1p-11f, 1 + 0x3p-11f, -(1 + 0x1p-11f), 2049, 65519, 0x1p-14f, 0, 1},  // half ties, the top
        {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f},                    // constant
        {0, 0, 0, 0, 0, 0, 0, 0},
    };
    for (KvRowFormat format : formats) {
        for (int head_dim : {8, 64, 128, 256}) {
            CAPTURE(kv_row_format_name(format));
            CAPTURE(head_dim);
            const size_t bytes = kv_row_bytes(format, head_dim);
            int mismatches = 0;
            for (int trial = 0; trial < 60; ++trial) {
                std::vector<float> src;
                if (head_dim == 8 && trial < static_cast<int>(special.size())) {
                    src = special[trial];
                } else {
                    src = random_floats(head_dim, 100 + trial, -1, 1);
                    const float magnitude = std::pow(10.0f, (trial % 9) - 4.0f);
                    for (float &x : src) x *= magnitude;
                }
                std::vector<uint8_t> expected(bytes), got(bytes, 0xAB);
                kv_store_row(format, src.data(), head_dim, expected.data());
                cuda_host_kv_encode_row(format, src.data(), head_dim, got.data());
                std::vector<float> expected_values(head_dim), got_values(head_dim);
                kv_load_row(format, expected.data(), head_dim, expected_values.data());
                cuda_host_kv_decode_row(format, expected.data(), head_dim, got_values.data());
                if (got != expected || !same_bits(got_values, expected_values)) ++mismatches;
            }
            CHECK(mismatches == 0);
        }
    }
}

TEST_CASE("cuda: the nvcc-compiled rotary rotation is the CPU backend's rope, bit for bit, for both pairings and frequency factors") {
    auto cpu = make_cpu_backend(1, 4);
    ModelShape shape;
    shape.n_head = 4;
    shape.n_head_kv = 2;
    shape.head_dim = 16;
    shape.n_embd = 64;
    shape.rope.freq_base = 10000.0f;
    const std::vector<float> factors = {1.0f, 1.0f, 1.25f, 2.5f, 6.0f, 8.0f, 8.0f, 8.0f};
    for (int variant = 0; variant < 6; ++variant) {
        const int rope_dims = variant % 2 == 0 ? 16 : 12;
        shape.rope.dims = rope_dims;
        shape.rope.pairing = variant / 2 == 0 ? RotaryPairing::Adjacent : RotaryPairing::Halves;
        shape.rope.freq_factors =
            variant / 2 == 2 ? std::vector<float>(factors.begin(), factors.begin() + rope_dims / 2) : std::vector<float>{};
        const std::vector<double> inv_freq = shape.rope.inv_freqs();
        for (int32_t position : {0, 1, 7, 4096, 30000, 65535, 1000000, 123456789, -3}) {
            CAPTURE(variant);
            CAPTURE(position);
            const std::vector<float> q_in = random_floats(64, 5 + position % 7), k_in = random_floats(32, 6);
            Tensor q, k, pos;
            REQUIRE(cpu->alloc(TensorType::F32, 64, 1, &q).ok());
            REQUIRE(cpu->alloc(TensorType::F32, 32, 1, &k).ok());
            REQUIRE(cpu->alloc(TensorType::I32, 1, 1, &pos).ok());
            REQUIRE(cpu->upload(q, q_in.data(), 64 * sizeof(float)).ok());
            REQUIRE(cpu->upload(k, k_in.data(), 32 * sizeof(float)).ok());
            REQUIRE(cpu->upload(pos, &position, sizeof position).ok());
            REQUIRE(cpu->rope(q, k, pos, 1, shape, false).ok());
            std::vector<float> q_cpu(64), k_cpu(32);
            REQUIRE(cpu->download(q, q_cpu.data(), 64 * sizeof(float)).ok());
            REQUIRE(cpu->download(k, k_cpu.data(), 32 * sizeof(float)).ok());
            std::vector<float> q_cuda = q_in, k_cuda = k_in;
            cuda_host_rope(q_cuda.data(), 4, 16, inv_freq.data(), rope_dims / 2, shape.rope.pairing, position);
            cuda_host_rope(k_cuda.data(), 2, 16, inv_freq.data(), rope_dims / 2, shape.rope.pairing, position);
            CHECK(same_bits(q_cuda, q_cpu));
            CHECK(same_bits(k_cuda, k_cpu));
            if (rope_dims == 12) CHECK(q_cuda[13] == q_in[13]);  // beyond the rotated dimensions: untouched
        }
    }
}

TEST_CASE("cuda: the online softmax's weights are the CPU softmax's, masked scores included") {
    for (int n : {1, 2, 7, 100, 1000, 4096}) {
        for (int lanes : {1, 32, 256}) {
            CAPTURE(n);
            CAPTURE(lanes);
            std::vector<float> scores = random_floats(n, 40 + n, -20, 20);
            for (int i = 3; i < n; i += 5) scores[i] = -INFINITY;  // masked slots
            std::vector<float> expected = scores, got(n);
            cpu::softmax(expected.data(), n);
            cuda_host_softmax(scores.data(), n, lanes, got.data());
            double worst = 0, total = 0;
            for (int i = 0; i < n; ++i) {
                worst = std::max(worst,
                                 std::fabs(static_cast<double>(got[i]) - expected[i]) / std::max(1e-30, static_cast<double>(expected[i])));
                total += got[i];
                if (scores[i] == -INFINITY) CHECK(got[i] == 0.0f);
            }
            CHECK(worst <= 2e-6);
            CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
        }
    }
    // Nothing visible: zeros, as the CPU gives.
    std::vector<float> masked(5, -INFINITY), got(5, 1.0f);
    cuda_host_softmax(masked.data(), 5, 4, got.data());
    for (float w : got) CHECK(w == 0.0f);
}

TEST_CASE("cuda: the nvcc-compiled random policy generator draws the C++ build's sequence") {
    for (uint64_t seed : {uint64_t{0}, uint64_t{7}, ~uint64_t{0}}) {
        const uint64_t state = seed ^ 0x9E3779B97F4A7C15ull;  // as KvCache::clear seeds it
        std::vector<uint64_t> got(1000), expected(1000);
        cuda_host_random_draws(state, 1000, got.data());
        uint64_t s = state;
        for (uint64_t &x : expected) x = kv_next_random(&s);
        CHECK(got == expected);
        CHECK(expected[0] != expected[1]);
    }
}

#endif  // H2O_TEST_CUDA

#ifndef H2O_HAVE_CUDA

TEST_CASE("cuda: backend") { std::printf("H2O-SKIP: built without the CUDA backend (H2O_CUDA=OFF)\n"); }

#else

namespace {

BackendRequirements requirements(TensorType weights, KvType kv_type, int head_dim) {
    BackendRequirements needs;
    needs.weight_types = {weights};
    needs.kv.n_layer = 2;
    needs.kv.n_head_kv = 2;
    needs.kv.head_dim = head_dim;
    needs.kv.n_slots = 64;
    needs.kv.type = kv_type;
    needs.kv.rope.dims = head_dim;
    needs.weight_bytes = 1 << 20;
    needs.session_bytes = 1 << 20;
    return needs;
}

}  // namespace

TEST_CASE("cuda: the backend is registered, and without a driver or device it lists none and says why") {
    const BackendEntry *entry = find_backend(H2O_BACKEND_CUDA);
    REQUIRE(entry);
    std::vector<BackendDevice> devices;
    const Status listed = entry->devices(&devices);
    std::vector<CudaDeviceInfo> infos;
    const Status direct = list_cuda_devices(&infos);
    CHECK(listed.code == direct.code);
    const BackendRequirements needs = requirements(TensorType::Q4_K, KvType::F32, 64);
    std::vector<BackendCandidate> plan;
    if (listed.ok()) {
        REQUIRE(!devices.empty());
        for (const BackendDevice &d : devices) {
            MESSAGE("CUDA device " << d.device_index << ": " << d.name << " (" << d.type << ", " << (d.memory_bytes >> 20) << " MiB)");
            CHECK(!d.name.empty());
            CHECK(d.memory_bytes > 0);
        }
        std::unique_ptr<Backend> backend;
        const Status bad = make_cuda_backend(static_cast<int>(devices.size()), 8, &backend);
        CHECK(bad.code == H2O_ERR_BACKEND_UNAVAILABLE);
        CHECK(bad.message.find("out of range") != std::string::npos);
        REQUIRE(plan_backends(H2O_BACKEND_CUDA, -1, needs, &plan).ok());
        CHECK(plan.size() == 1);
        return;
    }
    // No driver here (cudaErrorInsufficientDriver) or no device (cudaErrorNoDevice): the message
    // names the CUDA call and error.
    MESSAGE("no CUDA device: " << listed.message);
    CHECK(listed.code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(devices.empty());
    CHECK(listed.message.find("cudaGetDeviceCount") != std::string::npos);
    CHECK(listed.message.find("cudaError") != std::string::npos);
    std::unique_ptr<Backend> backend;
    const Status made = make_cuda_backend(-1, 8, &backend);
    CHECK(made.code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(made.message == listed.message);
    CHECK(!backend);

    // An explicit request fails with that error.
    const Status st = plan_backends(H2O_BACKEND_CUDA, -1, needs, &plan);
    CHECK(st.code == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(st.message == listed.message);
    // Auto passes over it, saying why.
    REQUIRE(plan_backends(H2O_BACKEND_AUTO, -1, needs, &plan).ok());
    size_t cuda_at = plan.size(), chosen = plan.size();
    for (size_t i = 0; i < plan.size(); ++i) {
        if (plan[i].backend->kind == H2O_BACKEND_CUDA) cuda_at = i;
        if (chosen == plan.size() && plan[i].verdict.ok()) chosen = i;
    }
    REQUIRE(cuda_at < plan.size());
    REQUIRE(chosen < plan.size());
    CHECK(cuda_at < chosen);
    CHECK(plan[cuda_at].device.device_index == -1);
    CHECK(plan[cuda_at].verdict.message == listed.message);
    const std::string why = explain_auto_choice(plan, chosen);
    CAPTURE(why);
    CHECK(why.find("the CUDA backend: " + listed.message) != std::string::npos);
    CHECK(list_backend_devices().size() + 1 >= plan.size());  // CUDA adds no device
}

TEST_CASE("cuda: a session asking for CUDA without a device is refused with the CUDA error, and auto runs on another device") {
    std::vector<CudaDeviceInfo> infos;
    const Status listed = list_cuda_devices(&infos);
    if (listed.ok()) {
        std::printf("H2O-SKIP: a CUDA device is present; this test is about machines without one\n");
        return;
    }
    H2O_SHARED_FILE_OR_SKIP(path, "models/stories260K.gguf");
    h2o_model *model = nullptr;
    REQUIRE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK);
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.n_ctx = 64;
    h2o_session *session = nullptr;
    sp.backend = H2O_BACKEND_CUDA;
    CHECK(h2o_session_create(model, &sp, &session) == H2O_ERR_BACKEND_UNAVAILABLE);
    CHECK(std::string(h2o_last_error()).find("cudaGetDeviceCount") != std::string::npos);
    CHECK(session == nullptr);
    sp.backend = H2O_BACKEND_AUTO;
    REQUIRE(h2o_session_create(model, &sp, &session) == H2O_OK);
    h2o_backend_info info;
    info.struct_size = sizeof info;
    REQUIRE(h2o_session_get_backend(session, &info) == H2O_OK);
    CHECK(info.kind != H2O_BACKEND_CUDA);
    h2o_session_free(session);
    h2o_model_free(model);
}

TEST_CASE("cuda: supports() answers from the kernels' weight types, KV formats, head sizes and memory") {
    const BackendEntry *entry = find_backend(H2O_BACKEND_CUDA);
    REQUIRE(entry);
    BackendDevice device;
    device.kind = H2O_BACKEND_CUDA;
    device.name = "test device";
    device.type = "discrete";
    device.memory_bytes = uint64_t{8} << 30;
    for (TensorType type : kWeightTypes) {
        CAPTURE(type_name(type));
        CHECK(entry->supports(requirements(type, KvType::F32, 64), device).ok());
    }
    CHECK(cuda_weight_types().size() == std::size(kWeightTypes));
    const Status i32 = entry->supports(requirements(TensorType::I32, KvType::F32, 64), device);
    CHECK(i32.code == H2O_ERR_UNSUPPORTED);
    CHECK(i32.message.find("CUDA") != std::string::npos);
    for (KvType type : {KvType::F32, KvType::F16, KvType::Q8, KvType::Q4, KvType::K8V4}) {
        CAPTURE(kv_type_name(type));
        CHECK(entry->supports(requirements(TensorType::F16, type, 128), device).ok());
        CHECK(entry->supports(requirements(TensorType::F16, type, kCudaMaxHeadDim), device).ok());
        CHECK(entry->supports(requirements(TensorType::F16, type, 2 * kCudaMaxHeadDim), device).code == H2O_ERR_UNSUPPORTED);
    }
    CHECK(entry->supports(requirements(TensorType::F16, KvType::Q4, 7), device).code == H2O_ERR_UNSUPPORTED);
    CHECK(entry->supports(requirements(TensorType::F16, KvType::Q8, 7), device).ok());
    BackendRequirements big = requirements(TensorType::Q8_0, KvType::F16, 64);
    big.weight_bytes = uint64_t{9} << 30;
    const Status oom = entry->supports(big, device);
    CHECK(oom.code == H2O_ERR_OUT_OF_MEMORY);
    CHECK(oom.message.find("MiB") != std::string::npos);
}

// ---- with a device: what is particular to this backend (the rest: test_device_parity.cpp) -------

namespace {

using h2o_test::Backends;
using h2o_test::Twin;

// The CPU beside a CUDA backend.
#define BACKENDS_OR_SKIP(var, max_batch) \
    Backends var;                        \
    if (!var.pair(h2o_test::make_cuda(max_batch), max_batch)) return

}  // namespace

TEST_CASE("cuda: matmul matches a double-precision product of the dequantized weights, one token and batches") {
    BACKENDS_OR_SKIP(b, 64);
    // Rows that fill no whole block of the kernels, rows longer than the matrix-vector kernel's
    // chunk of columns, float rows ending in a partial group; batches on both sides of the
    // matrix-vector kernel's limit (8) and of the tiled kernel's tile (64 tokens).
    struct Shape {
        TensorType type;
        int64_t cols;
    };
    std::vector<Shape> shapes;
    for (TensorType type : kWeightTypes) {
        for (int64_t cols : {512, 2304}) shapes.push_back({type, cols});
        if (type == TensorType::F32 || type == TensorType::F16) {
            for (int64_t cols : {45, 1000}) shapes.push_back({type, cols});
        }
    }
    for (const Shape &shape : shapes) {
        const TensorType type = shape.type;  // (not a structured binding: INFO captures these)
        const int64_t cols = shape.cols, rows = 70;
        const Twin w = b.weight(type, cols, rows, random_floats(cols * rows, 6));
        std::vector<float> deq(cols * rows);
        for (int64_t r = 0; r < rows; ++r) {
            REQUIRE(dequantize_row(type, b.weight_data.back().data() + r * row_bytes(type, cols), &deq[r * cols], cols));
        }
        for (int n : {1, 3, 8, 9, 17, 64}) {
            INFO("type " << type_name(type) << ", cols " << cols << ", n " << n);
            const auto x_values = random_floats(cols * n, 7 + n, -2, 2);
            const Twin x = b.floats(cols, n, x_values);
            const Twin y = b.alloc(TensorType::F32, rows, n);
            REQUIRE(b.gpu->matmul(y.gpu, w.gpu, x.gpu, n).ok());
            const auto g = b.gpu_floats(y.gpu, rows * n);
            int bad = 0;
            for (int t = 0; t < n; ++t) {
                for (int64_t r = 0; r < rows; ++r) {
                    double exact = 0, magnitude = 0;
                    for (int64_t k = 0; k < cols; ++k) {
                        exact += static_cast<double>(deq[r * cols + k]) * x_values[t * cols + k];
                        magnitude += std::fabs(static_cast<double>(deq[r * cols + k]) * x_values[t * cols + k]);
                    }
                    if (std::fabs(g[t * rows + r] - exact) > 1e-5 * magnitude + 1e-6) ++bad;
                }
            }
            CHECK(bad == 0);
        }
    }
}

#endif  // H2O_HAVE_CUDA
