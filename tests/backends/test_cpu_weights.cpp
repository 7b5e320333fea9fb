// The CPU backend's Q4_0, Q8_0 and K-quant weights interleaved by 8 rows: one copy per matrix
// shared by the model's sessions, and sessions that use it compute what the file's layout
// computes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/shared_weights.h"
#include "h2o/h2o.h"
#include "quant.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace h2o;

namespace {

std::vector<uint8_t> random_q4_0(int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> w(rows * cols);
    for (float &v : w) v = nd(rng);
    std::vector<uint8_t> out(row_bytes(TensorType::Q4_0, cols) * rows);
    REQUIRE(quantize_row(TensorType::Q4_0, w.data(), out.data(), rows * cols));
    return out;
}

struct IsaGuard {
    cpu::KernelIsa saved = cpu::current_kernel_isa();
    ~IsaGuard() { cpu::set_kernel_isa(saved); }
};

// Logits after `tokens` in a new CPU session of `model` created and run with kernels `isa`.
std::vector<float> session_logits(h2o_model *model, cpu::KernelIsa isa, const std::vector<int32_t> &tokens) {
    REQUIRE(cpu::set_kernel_isa(isa));
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = H2O_BACKEND_CPU;
    sp.n_threads = 2;
    sp.n_ctx = 64;
    // F32 keys and values: rounding them to halves would turn the levels' different float orders
    // into different stored keys, noise this comparison of weight layouts does not need.
    sp.kv_type = H2O_KV_TYPE_F32;
    h2o_session *session = nullptr;
    REQUIRE_MESSAGE(h2o_session_create(model, &sp, &session) == H2O_OK, h2o_last_error());
    h2o_model_info info{};
    info.struct_size = sizeof info;
    REQUIRE(h2o_model_get_info(model, &info) == H2O_OK);
    std::vector<float> logits(info.n_vocab);
    CHECK(h2o_session_decode(session, tokens.data(), tokens.size()) == H2O_OK);
    CHECK(h2o_session_get_logits(session, logits.data(), logits.size()) == H2O_OK);
    h2o_session_free(session);
    return logits;
}

}  // namespace

TEST_CASE("interleaved copies: one per matrix while held, with the interleaved bytes") {
    const int64_t rows = 16, cols = 64;
    const std::vector<uint8_t> w = random_q4_0(rows, cols, 3);
    std::vector<uint8_t> want(w.size());
    cpu::interleave_rows(TensorType::Q4_0, w.data(), want.data(), rows, cols);

    std::shared_ptr<const uint8_t> a, b, other;
    REQUIRE(cpu::shared_interleaved(TensorType::Q4_0, w.data(), rows, cols, &a).ok());
    REQUIRE(cpu::shared_interleaved(TensorType::Q4_0, w.data(), rows, cols, &b).ok());
    CHECK(a.get() == b.get());
    CHECK(std::memcmp(a.get(), want.data(), want.size()) == 0);
    // Another matrix (here: the first 8 rows only) is another copy.
    REQUIRE(cpu::shared_interleaved(TensorType::Q4_0, w.data(), 8, cols, &other).ok());
    CHECK(other.get() != a.get());
    CHECK(std::memcmp(other.get(), want.data(), want.size() / 2) == 0);
    // When the last holder lets go, the next request makes a new copy from the source again.
    a.reset();
    b.reset();
    REQUIRE(cpu::shared_interleaved(TensorType::Q4_0, w.data(), rows, cols, &a).ok());
    CHECK(std::memcmp(a.get(), want.data(), want.size()) == 0);
}

TEST_CASE("Q4_0, Q8_0, Q4_K, Q5_K and Q6_K models: interleaved sessions compute the file layout's logits, and the file stays readable") {
    cpu::KernelIsa fast = cpu::KernelIsa::Scalar;
    for (cpu::KernelIsa isa : {cpu::KernelIsa::Avx2, cpu::KernelIsa::Avx512, cpu::KernelIsa::NeonDotprod, cpu::KernelIsa::NeonI8mm}) {
        if (cpu::cpu_supports(isa)) fast = isa;
    }
    if (fast == cpu::KernelIsa::Scalar) {
        std::printf("H2O-SKIP: no kernel level here prefers interleaved weights; the layouts are tested in test_quant.cpp\n");
        return;
    }
    IsaGuard guard;
    for (TensorType type : {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
        CAPTURE(std::string(type_name(type)));
        SyntheticModelSpec spec;
        spec.n_embd = 256;
        spec.n_layer = 2;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.n_ff = 512;
        spec.n_vocab = 512;
        spec.n_ctx = 64;
        spec.type = type;
        spec.tied_output = true;  // the embedding is then both looked up and multiplied, interleaved
        const std::string path = h2o_test::temp_path(std::string("cpu_weights_") + type_name(type) + ".gguf");
        REQUIRE(write_synthetic_model(spec, path).ok());
        h2o_model *model = nullptr;
        REQUIRE_MESSAGE(h2o_model_load(path.c_str(), nullptr, &model) == H2O_OK, h2o_last_error());
        const std::vector<int32_t> tokens = {1, 50, 300, 7, 99, 260, 13, 42, 511, 3};

        // The first session interleaves every matrix, and the model lets the OS drop the file's
        // pages.
        const std::vector<float> x8 = session_logits(model, fast, tokens);
        // A scalar session uses the file's layout: its pages come back from the file, unchanged.
        const std::vector<float> rows = session_logits(model, cpu::KernelIsa::Scalar, tokens);
        // Same integer block sums and scales; only the order of float operations differs, which
        // two layers of this random model amplify to about 3e-4 of the largest logit for Q4_K
        // (the file's layout on the SIMD level differs from scalar by as much). A wrong layout
        // is off by the size of the logits.
        double norm = 0.0;
        for (float v : rows) norm = std::max(norm, static_cast<double>(std::fabs(v)));
        REQUIRE(norm > 0.0);
        for (size_t i = 0; i < rows.size(); ++i) {
            CAPTURE(i);
            REQUIRE(std::fabs(x8[i] - rows[i]) <= 1e-3 * norm);  // false for a NaN too
        }
        // A second interleaved session shares the copy and computes the very same logits.
        const std::vector<float> again = session_logits(model, fast, tokens);
        CHECK(std::memcmp(again.data(), x8.data(), x8.size() * sizeof(float)) == 0);
        h2o_model_free(model);
    }
}
