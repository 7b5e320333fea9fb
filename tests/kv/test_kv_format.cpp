// KV cache row formats: storage round trips within stated error bounds. (Attention over rows in
// their stored form is tested with the CPU kernels, test_quant.cpp, at every level.)
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kv_format.h"

using namespace h2o;

TEST_CASE("KV rows round-trip within each format's error bound") {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.5f);
    for (int head_dim : {8, 64, 128}) {
        for (uint32_t t = 0; t < kKvRowFormatCount; ++t) {
            const KvRowFormat type = static_cast<KvRowFormat>(t);
            CAPTURE(kv_row_format_name(type));
            CAPTURE(head_dim);
            std::vector<float> x(head_dim), back(head_dim);
            for (float &v : x) v = normal(rng);
            std::vector<uint8_t> row(kv_row_bytes(type, head_dim));
            kv_store_row(type, x.data(), head_dim, row.data());
            kv_load_row(type, row.data(), head_dim, back.data());
            float amax = 0, lo = x[0], hi = x[0];
            for (float v : x) {
                amax = std::fmax(amax, std::fabs(v));
                lo = std::fmin(lo, v);
                hi = std::fmax(hi, v);
            }
            // Half a quantization step (plus the rounding of a half-precision scale and minimum).
            const float bound = type == KvRowFormat::F32   ? 0.0f
                                : type == KvRowFormat::F16 ? amax * 0x1p-11f
                                : type == KvRowFormat::Q8  ? amax / 127.0f * 0.5f + 1e-6f
                                                           : (hi - lo) / 15.0f * 0.5f * 1.01f + std::fabs(lo) * 0x1p-11f;
            for (int i = 0; i < head_dim; ++i) CHECK(std::fabs(back[i] - x[i]) <= bound);
        }
    }
}

TEST_CASE("KV row sizes: what a budget of slots costs") {
    CHECK(kv_row_bytes(KvRowFormat::F32, 64) == 256);
    CHECK(kv_row_bytes(KvRowFormat::F16, 64) == 128);
    CHECK(kv_row_bytes(KvRowFormat::Q8, 64) == 68);
    CHECK(kv_row_bytes(KvRowFormat::Q4, 64) == 36);
    CHECK(kv_row_bytes(KvRowFormat::Q4, 8) == 8);  // stories260K: 8 dimensions per head
}

TEST_CASE("Q4 rows store grid values exactly and a constant row without error") {
    const float grid[8] = {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f, 6.5f, -1.0f};  // min -1, step 0.5
    std::vector<uint8_t> row(kv_row_bytes(KvRowFormat::Q4, 8));
    float back[8];
    kv_store_row(KvRowFormat::Q4, grid, 8, row.data());
    kv_load_row(KvRowFormat::Q4, row.data(), 8, back);
    for (int i = 0; i < 8; ++i) CHECK(back[i] == grid[i]);
    const float constant[8] = {3, 3, 3, 3, 3, 3, 3, 3};
    kv_store_row(KvRowFormat::Q4, constant, 8, row.data());
    kv_load_row(KvRowFormat::Q4, row.data(), 8, back);
    for (int i = 0; i < 8; ++i) CHECK(back[i] == 3.0f);
    const float zeros[8] = {};
    std::vector<uint8_t> q8(kv_row_bytes(KvRowFormat::Q8, 8));
    kv_store_row(KvRowFormat::Q8, zeros, 8, q8.data());
    kv_load_row(KvRowFormat::Q8, q8.data(), 8, back);
    for (int i = 0; i < 8; ++i) CHECK(back[i] == 0.0f);
}
