// Weight formats (lib/math/quant.*) and the CPU kernels (backends/cpu/kernels*): exact values where
// they are defined exactly, stated error bounds where they are not, and the SIMD kernels (AVX2;
// NEON, with dotprod, with i8mm) against the portable ones, each level the CPU has.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/kernels_internal.h"
#include "kv_format.h"
#include "kv_policy_spec.h"
#include "quant.h"
#include "rotary.h"
#include "thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

using namespace h2o;

namespace {

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

float float_of(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

bool can_run(cpu::KernelIsa isa) {
    if (cpu::cpu_supports(isa)) return true;
    std::printf("H2O-SKIP: this CPU cannot run the %s kernels; their comparisons were skipped\n", cpu::kernel_isa_name(isa));
    return false;
}

constexpr cpu::KernelIsa kSimdLevels[] = {cpu::KernelIsa::Avx2, cpu::KernelIsa::Avx2Vnni,    cpu::KernelIsa::Avx512,
                                          cpu::KernelIsa::Neon, cpu::KernelIsa::NeonDotprod, cpu::KernelIsa::NeonI8mm};

// The SIMD levels this CPU runs (each is tested against the reference and the scalar path). The
// others belong to another architecture or a newer CPU; only a CPU that runs none marks the test
// skipped (a skip line marks the whole test, which would hide the levels that did run).
std::vector<cpu::KernelIsa> simd_levels() {
    std::vector<cpu::KernelIsa> out;
    for (cpu::KernelIsa isa : kSimdLevels) {
        if (cpu::cpu_supports(isa)) out.push_back(isa);
    }
    if (out.empty()) std::printf("H2O-SKIP: this CPU runs no SIMD kernel level; only the scalar path was tested\n");
    return out;
}

// The kernel table of a level this CPU supports, called directly rather than through dispatch.
const cpu::detail::KernelTable &kernel_table(cpu::KernelIsa isa) { return cpu::detail::table_of(isa); }

// Restores the kernel choice a test changed.
struct IsaGuard {
    cpu::KernelIsa saved = cpu::current_kernel_isa();
    ~IsaGuard() { cpu::set_kernel_isa(saved); }
};

std::vector<float> random_vector(std::mt19937 &rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v) x = nd(rng);
    return v;
}

std::vector<uint8_t> quantize_matrix(TensorType type, const std::vector<float> &w, int64_t rows, int64_t cols) {
    const size_t rb = row_bytes(type, cols);
    std::vector<uint8_t> out(rb * rows);
    for (int64_t r = 0; r < rows; ++r) REQUIRE(quantize_row(type, w.data() + r * cols, out.data() + r * rb, cols));
    return out;
}

const TensorType kAllTypes[] = {TensorType::F32,  TensorType::F16,  TensorType::Q8_0, TensorType::Q4_0,
                                TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};
const TensorType kKTypes[] = {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

bool is_quant(TensorType t) { return t != TensorType::F32 && t != TensorType::F16; }
bool is_k(TensorType t) { return traits(t).block_elements == 256; }

}  // namespace

// ---- fp16 -----------------------------------------------------------------------------------

TEST_CASE("fp16: exact values, rounding and special cases") {
    struct Case {
        float f;
        uint16_t h;
    };
    const Case cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3C00},
        {-2.0f, 0xC000},
        {0.5f, 0x3800},
        {65504.0f, 0x7BFF},  // largest half
        {65519.0f, 0x7BFF},  // below the midpoint to 65536: stays finite
        {65520.0f, 0x7C00},  // the midpoint ties to even, which is infinity
        {1e10f, 0x7C00},
        {-1e10f, 0xFC00},
        {INFINITY, 0x7C00},
        {-INFINITY, 0xFC00},
        {0x1p-14f, 0x0400},  // smallest normal
        {0x1p-24f, 0x0001},  // smallest subnormal
        {-0x1p-24f, 0x8001},
        {1023 * 0x1p-24f, 0x03FF},     // largest subnormal
        {0x1p-25f, 0x0000},            // half of the smallest subnormal ties to even (0)
        {0x1.000002p-25f, 0x0001},     // just above that half rounds up
        {3 * 0x1p-25f, 0x0002},        // 1.5 units ties to even (2)
        {1023.5f * 0x1p-24f, 0x0400},  // ties to even, carrying into the smallest normal
        {1e-30f, 0x0000},
        {1.0f + 0x1p-11f, 0x3C00},             // tie between 0x3C00 and 0x3C01: even
        {1.0f + 3 * 0x1p-11f, 0x3C02},         // tie between 0x3C01 and 0x3C02: even
        {1.0f + 0x1p-11f + 0x1p-23f, 0x3C01},  // just above the tie
        {0.333333333f, 0x3555},
        {31.0f / 127.0f, 0x33D0},
    };
    for (const Case &c : cases) {
        CAPTURE(c.f);
        CHECK(fp32_to_fp16(c.f) == c.h);
    }
    CHECK(fp16_to_fp32(0x3555) == 0.333251953125f);
    CHECK(fp16_to_fp32(0x0001) == 0x1p-24f);
    CHECK(fp16_to_fp32(0x83FF) == -1023 * 0x1p-24f);
    CHECK(fp16_to_fp32(0x7BFF) == 65504.0f);
    CHECK(fp16_to_fp32(0x7C00) == INFINITY);
    CHECK(fp16_to_fp32(0xFC00) == -INFINITY);
    CHECK(bits_of(fp16_to_fp32(0x8000)) == 0x80000000u);
    // NaN stays NaN, keeps its sign, and comes out quiet.
    CHECK(std::isnan(fp16_to_fp32(0x7E00)));
    CHECK(std::isnan(fp16_to_fp32(0x7C01)));  // signalling NaN in, quiet NaN out
    CHECK((bits_of(fp16_to_fp32(0x7C01)) & 0x400000u) != 0);
    CHECK(std::signbit(fp16_to_fp32(0xFE00)));
    CHECK(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()) == 0x7E00);
    CHECK(fp32_to_fp16(-std::numeric_limits<float>::quiet_NaN()) == 0xFE00);
    CHECK(fp32_to_fp16(float_of(0x7F800001)) == 0x7E00);  // signalling NaN with a low payload
}

TEST_CASE("fp16: every half survives a round trip through float") {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = fp16_to_fp32(static_cast<uint16_t>(h));
        const bool nan = ((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF) != 0;
        if (nan) {
            REQUIRE(std::isnan(f));
            REQUIRE((fp32_to_fp16(f) & 0x7E00) == 0x7E00);
        } else {
            REQUIRE(fp32_to_fp16(f) == h);
        }
    }
}

TEST_CASE("fp16: float to half is the nearest half, ties to even") {
    // Independent check: brackets each float between consecutive finite halves (ordered by their
    // bit patterns) and verifies the chosen one is nearest, using double arithmetic.
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> any_bits;
    for (int i = 0; i < 200000; ++i) {
        // Mostly within the half range, to exercise rounding rather than overflow.
        uint32_t u = any_bits(rng);
        u = (u & 0x80000000u) | ((u & 0x7FFFFFFFu) % 0x47800000u);
        const float f = float_of(u);
        const uint16_t h = fp32_to_fp16(f);
        const double v = std::fabs(static_cast<double>(f));
        const uint16_t mag = h & 0x7FFF;
        CAPTURE(f);
        REQUIRE((h & 0x8000) == ((u >> 16) & 0x8000));
        if (mag == 0x7C00) {
            REQUIRE(v >= 65520.0);
            continue;
        }
        const double chosen = fp16_to_fp32(mag);
        const double below = mag > 0 ? static_cast<double>(fp16_to_fp32(static_cast<uint16_t>(mag - 1))) : -1.0;
        const double above = mag < 0x7BFF ? static_cast<double>(fp16_to_fp32(static_cast<uint16_t>(mag + 1))) : 65536.0;
        const double err = std::fabs(v - chosen);
        REQUIRE(err <= v - below);
        REQUIRE(err <= above - v);
        if (err == v - below && mag > 0) REQUIRE((mag & 1) == 0);
        if (err == above - v) REQUIRE((mag & 1) == 0);
    }
}

#if defined(__x86_64__) || defined(__i386__)
namespace {
__attribute__((target("f16c"))) uint16_t hw_fp32_to_fp16(float f) {
    return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) float hw_fp16_to_fp32(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }
}  // namespace

TEST_CASE("fp16: matches the F16C instructions bit for bit") {
    if (!can_run(cpu::KernelIsa::Avx2)) return;
    for (uint32_t h = 0; h < 65536; ++h) {
        REQUIRE(bits_of(fp16_to_fp32(static_cast<uint16_t>(h))) == bits_of(hw_fp16_to_fp32(static_cast<uint16_t>(h))));
    }
    std::mt19937 rng(11);
    std::uniform_int_distribution<uint32_t> any_bits;
    for (int i = 0; i < 1000000; ++i) {
        const float f = float_of(any_bits(rng));
        CAPTURE(f);
        REQUIRE(fp32_to_fp16(f) == hw_fp32_to_fp16(f));
    }
}
#endif

// ---- block formats --------------------------------------------------------------------------

TEST_CASE("Q8_0 and Q4_0 blocks dequantize to hand-computed values") {
    BlockQ8_0 q8{};
    q8.d = 0x3800;  // 0.5
    const int8_t qs8[8] = {-128, -127, -1, 0, 1, 2, 100, 127};
    std::memcpy(q8.qs, qs8, sizeof qs8);
    float out[32];
    REQUIRE(dequantize_row(TensorType::Q8_0, &q8, out, 32));
    const float want8[8] = {-64.0f, -63.5f, -0.5f, 0.0f, 0.5f, 1.0f, 50.0f, 63.5f};
    for (int j = 0; j < 8; ++j) CHECK(out[j] == want8[j]);
    for (int j = 8; j < 32; ++j) CHECK(out[j] == 0.0f);

    BlockQ4_0 q4{};
    q4.d = 0xC000;  // -2
    // Byte j holds element j (low nibble) and element j + 16 (high nibble).
    q4.qs[0] = 0xF0;                               // element 0: (0 - 8) * -2 = 16;  element 16: (15 - 8) * -2 = -14
    q4.qs[1] = 0x08;                               // element 1: 0;                  element 17: (0 - 8) * -2 = 16
    q4.qs[15] = 0x9A;                              // element 15: (10 - 8) * -2 = -4; element 31: (9 - 8) * -2 = -2
    for (int j = 2; j < 15; ++j) q4.qs[j] = 0x88;  // zeros
    REQUIRE(dequantize_row(TensorType::Q4_0, &q4, out, 32));
    CHECK(out[0] == 16.0f);
    CHECK(out[16] == -14.0f);
    CHECK(out[1] == 0.0f);
    CHECK(out[17] == 16.0f);
    CHECK(out[15] == -4.0f);
    CHECK(out[31] == -2.0f);
    for (int j = 2; j < 15; ++j) {
        CHECK(out[j] == 0.0f);
        CHECK(out[j + 16] == 0.0f);
    }
}

TEST_CASE("Q8_0 quantization gives llama.cpp's bytes for a known vector") {
    // x = 0, 1, ..., 31: d = 31/127 (fp16 0x33D0); quant j = round(j * 127 / 31). No value is
    // within 0.01 of a rounding tie, so float error cannot flip one.
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j);
    BlockQ8_0 b{};
    REQUIRE(quantize_row(TensorType::Q8_0, x, &b, 32));
    const int8_t want[32] = {0,  4,  8,  12, 16, 20, 25, 29, 33, 37,  41,  45,  49,  53,  57,  61,
                             66, 70, 74, 78, 82, 86, 90, 94, 98, 102, 107, 111, 115, 119, 123, 127};
    CHECK(b.d == 0x33D0);
    for (int j = 0; j < 32; ++j) {
        CAPTURE(j);
        CHECK(b.qs[j] == want[j]);
    }
    // Negated input: same scale, negated quants (roundf is symmetric).
    for (float &v : x) v = -v;
    REQUIRE(quantize_row(TensorType::Q8_0, x, &b, 32));
    CHECK(b.d == 0x33D0);
    for (int j = 0; j < 32; ++j) CHECK(b.qs[j] == -want[j]);
    // All zeros: scale 0, quants 0.
    std::fill(x, x + 32, 0.0f);
    REQUIRE(quantize_row(TensorType::Q8_0, x, &b, 32));
    CHECK(b.d == 0);
    for (int j = 0; j < 32; ++j) CHECK(b.qs[j] == 0);
}

TEST_CASE("Q4_0 quantization gives llama.cpp's bytes for known vectors") {
    // x[j] = j - 8 and x[16 + j] = (j - 8) / 2 for j < 16. The largest magnitude is x[0] = -8, so
    // d = -8 / -8 = 1 exactly; nibble = min(15, trunc(x + 8.5)): j for the first half and
    // 4 + floor((j + 1) / 2) for the second (ties such as -3.5 go up).
    float x[32];
    for (int j = 0; j < 16; ++j) {
        x[j] = static_cast<float>(j - 8);
        x[16 + j] = static_cast<float>(j - 8) * 0.5f;
    }
    BlockQ4_0 b{};
    REQUIRE(quantize_row(TensorType::Q4_0, x, &b, 32));
    const uint8_t want[16] = {0x40, 0x51, 0x52, 0x63, 0x64, 0x75, 0x76, 0x87, 0x88, 0x99, 0x9A, 0xAB, 0xAC, 0xBD, 0xBE, 0xCF};
    CHECK(b.d == 0x3C00);
    for (int j = 0; j < 16; ++j) {
        CAPTURE(j);
        CHECK(b.qs[j] == want[j]);
    }

    // A positive extreme gives a negative scale: x = [8, -8, 4, 0...]: d = 8 / -8 = -1. 8 maps to
    // nibble 0, 4 to trunc(-4 + 8.5) = 4, 0 to 8, and -8 to trunc(16.5) = 16, clamped to 15 (so
    // it comes back as -7: the one value Q4_0 cannot represent).
    std::fill(x, x + 32, 0.0f);
    x[0] = 8.0f;
    x[1] = -8.0f;
    x[2] = 4.0f;
    REQUIRE(quantize_row(TensorType::Q4_0, x, &b, 32));
    CHECK(b.d == 0xBC00);
    CHECK(b.qs[0] == 0x80);
    CHECK(b.qs[1] == 0x8F);
    CHECK(b.qs[2] == 0x84);
    for (int j = 3; j < 16; ++j) CHECK(b.qs[j] == 0x88);
    float back[32];
    REQUIRE(dequantize_row(TensorType::Q4_0, &b, back, 32));
    CHECK(back[0] == 8.0f);
    CHECK(back[1] == -7.0f);
    CHECK(back[2] == 4.0f);
}

TEST_CASE("Q5_0 quantization gives llama.cpp's bytes for known vectors") {
    // llama.cpp's rule (quantize_row_q5_0_ref): d = the largest magnitude, signed, / -16; quant =
    // min(31, trunc(x / d + 16.5)), its low 4 bits in the nibbles as Q4_0, bit 4 of element j in
    // bit j of qh. x[j] = j - 16: d = -16 / -16 = 1 and quant j, so qs[j] = j | j << 4 and the
    // fifth bits are those of elements 16..31.
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
    BlockQ5_0 b{};
    REQUIRE(quantize_row(TensorType::Q5_0, x, &b, 32));
    CHECK(b.d == 0x3C00);
    for (int j = 0; j < 16; ++j) {
        CAPTURE(j);
        CHECK(b.qs[j] == (j | j << 4));
    }
    CHECK((b.qh[0] == 0 && b.qh[1] == 0 && b.qh[2] == 0xFF && b.qh[3] == 0xFF));
    float back[32];
    REQUIRE(dequantize_row(TensorType::Q5_0, &b, back, 32));
    for (int j = 0; j < 32; ++j) CHECK(back[j] == x[j]);

    // A positive extreme: x = [16, -16, 8, 0...] gives d = -1; 16 -> quant 0, 8 -> 8, 0 -> 16
    // (fifth bit set), and -16 -> trunc(32.5), clamped to 31: it comes back as -15.
    std::fill(x, x + 32, 0.0f);
    x[0] = 16.0f;
    x[1] = -16.0f;
    x[2] = 8.0f;
    REQUIRE(quantize_row(TensorType::Q5_0, x, &b, 32));
    CHECK(b.d == 0xBC00);
    CHECK(b.qs[0] == 0x00);
    CHECK(b.qs[1] == 0x0F);
    CHECK(b.qs[2] == 0x08);
    for (int j = 3; j < 16; ++j) CHECK(b.qs[j] == 0x00);
    CHECK((b.qh[0] == 0xFA && b.qh[1] == 0xFF && b.qh[2] == 0xFF && b.qh[3] == 0xFF));
    REQUIRE(dequantize_row(TensorType::Q5_0, &b, back, 32));
    CHECK(back[0] == 16.0f);
    CHECK(back[1] == -15.0f);
    CHECK(back[2] == 8.0f);
    CHECK(back[3] == 0.0f);
}

TEST_CASE("Q5_0 blocks widened to Q8_0 hold the same values, bit for bit") {
    std::mt19937 rng(11);
    const int64_t n = 32 * 96;
    std::vector<BlockQ5_0> q5(n / 32);
    for (int trial = 0; trial < 8; ++trial) {
        CAPTURE(trial);
        if (trial < 4) {
            // Quantized from values of several magnitudes.
            const std::vector<float> x = random_vector(rng, n, std::pow(10.0f, static_cast<float>(trial) - 2.0f));
            REQUIRE(quantize_row(TensorType::Q5_0, x.data(), q5.data(), n));
        } else {
            // Arbitrary bytes: every quant and fifth bit, NaN and infinite scales (compared by bits).
            auto *bytes = reinterpret_cast<uint8_t *>(q5.data());
            for (size_t i = 0; i < q5.size() * sizeof(BlockQ5_0); ++i) bytes[i] = static_cast<uint8_t>(rng());
        }
        std::vector<BlockQ8_0> q8(n / 32);
        widen_q5_0_to_q8_0(q5.data(), q8.data(), n / 32);
        std::vector<float> from_q5(n), from_q8(n);
        REQUIRE(dequantize_row(TensorType::Q5_0, q5.data(), from_q5.data(), n));
        REQUIRE(dequantize_row(TensorType::Q8_0, q8.data(), from_q8.data(), n));
        CHECK(std::memcmp(from_q5.data(), from_q8.data(), n * sizeof(float)) == 0);
        for (const BlockQ8_0 &b : q8) {
            for (int8_t v : b.qs) CHECK((v >= -16 && v <= 15));
        }
    }
    // The source needs no alignment: the same bytes one past an aligned address widen alike.
    std::vector<uint8_t> shifted(q5.size() * sizeof(BlockQ5_0) + 1);
    std::memcpy(shifted.data() + 1, q5.data(), q5.size() * sizeof(BlockQ5_0));
    std::vector<BlockQ8_0> a(n / 32), b(n / 32);
    widen_q5_0_to_q8_0(q5.data(), a.data(), n / 32);
    widen_q5_0_to_q8_0(shifted.data() + 1, b.data(), n / 32);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(BlockQ8_0)) == 0);
}

TEST_CASE("non-finite inputs give a NaN scale instead of undefined quants") {
    float x[32] = {};
    x[3] = INFINITY;
    BlockQ8_0 b8{};
    REQUIRE(quantize_row(TensorType::Q8_0, x, &b8, 32));
    CHECK(std::isnan(fp16_to_fp32(b8.d)));
    for (int j = 0; j < 32; ++j) CHECK(b8.qs[j] == 0);
    x[3] = NAN;
    BlockQ4_0 b4{};
    REQUIRE(quantize_row(TensorType::Q4_0, x, &b4, 32));
    CHECK(std::isnan(fp16_to_fp32(b4.d)));
    for (int j = 0; j < 16; ++j) CHECK(b4.qs[j] == 0x88);
    // Values so small that 1/d overflows: defined results (the fp16 scale is 0 anyway).
    for (int j = 0; j < 32; ++j) x[j] = (j - 16) * 1e-39f;
    REQUIRE(quantize_row(TensorType::Q8_0, x, &b8, 32));
    REQUIRE(quantize_row(TensorType::Q4_0, x, &b4, 32));
    CHECK(b8.d == 0);
    CHECK((b4.d & 0x7FFF) == 0);
}

TEST_CASE("quantize then dequantize stays within each format's error bound") {
    std::mt19937 rng(3);
    const int64_t n = 32 * 64;
    std::vector<float> x = random_vector(rng, n, 3.0f);
    x[5] = 0.0f;
    x[100] = 1e-3f;
    std::vector<float> back(n);

    SUBCASE("F16: relative error at most 2^-11") {
        std::vector<uint16_t> h(n);
        REQUIRE(quantize_row(TensorType::F16, x.data(), h.data(), n));
        REQUIRE(dequantize_row(TensorType::F16, h.data(), back.data(), n));
        for (int64_t i = 0; i < n; ++i) CHECK(std::fabs(back[i] - x[i]) <= std::fabs(x[i]) * 0x1p-11f);
    }
    SUBCASE("Q8_0: at most half a step, plus the fp16 rounding of the scale") {
        // |x - q*d16| <= |x - q*d| + |q|*|d - d16| <= d/2 + 127 * d * 2^-11.
        std::vector<BlockQ8_0> q(n / 32);
        REQUIRE(quantize_row(TensorType::Q8_0, x.data(), q.data(), n));
        REQUIRE(dequantize_row(TensorType::Q8_0, q.data(), back.data(), n));
        for (int64_t b = 0; b < n / 32; ++b) {
            float amax = 0.0f;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
            const float d = amax / 127.0f;
            for (int j = 0; j < 32; ++j) {
                CHECK(std::fabs(back[b * 32 + j] - x[b * 32 + j]) <= d * (0.5f + 127.0f * 0x1p-11f) * 1.0001f);
            }
        }
    }
    // Q4_0 and Q5_0 (half_range 8 and 16): at most half a step, except values beyond
    // half_range - 1 steps on the side opposite the extreme, which are clamped to that many steps.
    auto check_signed_extreme_bound = [&](TensorType type, float half_range) {
        std::vector<uint8_t> q(row_bytes(type, n));
        REQUIRE(quantize_row(type, x.data(), q.data(), n));
        REQUIRE(dequantize_row(type, q.data(), back.data(), n));
        for (int64_t b = 0; b < n / 32; ++b) {
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < 32; ++j) {
                if (amax < std::fabs(x[b * 32 + j])) {
                    amax = std::fabs(x[b * 32 + j]);
                    max = x[b * 32 + j];
                }
            }
            const float d = amax / half_range;
            for (int j = 0; j < 32; ++j) {
                const float v = x[b * 32 + j];
                const bool clamped = (v * max < 0.0f) && std::fabs(v) > (half_range - 0.5f) * d;
                const float bound = clamped ? std::fabs(v) - (half_range - 1.0f) * d : 0.5f * d;
                CHECK(std::fabs(back[b * 32 + j] - v) <= bound + half_range * d * 0x1p-11f + 1e-6f * d);
            }
        }
    };
    SUBCASE("Q5_0: at most half a step, except the clamped opposite extreme") { check_signed_extreme_bound(TensorType::Q5_0, 16.0f); }
    SUBCASE("Q4_0: at most half a step, except the clamped opposite extreme (one step)") {
        check_signed_extreme_bound(TensorType::Q4_0, 8.0f);
    }
}

TEST_CASE("unsupported types are reported, not guessed") {
    float x[256] = {};
    uint8_t buf[256];
    const auto q5_1 = static_cast<TensorType>(7);  // a ggml type this runtime does not have
    CHECK(tensor_type_traits(7) == nullptr);
    CHECK_FALSE(quant_supported(q5_1));
    CHECK_FALSE(quantize_row(q5_1, x, buf, 256));
    CHECK_FALSE(dequantize_row(q5_1, buf, x, 256));
    CHECK_FALSE(quant_supported(TensorType::I32));
    CHECK_FALSE(cpu::matmul_supports(TensorType::I32));
    CHECK_FALSE(cpu::matmul_supports(q5_1));
    // Q5_0 is read and written, but run as Q8_0 (widen_q5_0_to_q8_0): no kernel takes it.
    CHECK(quant_supported(TensorType::Q5_0));
    CHECK_FALSE(is_weight_type(TensorType::Q5_0));
    CHECK_FALSE(cpu::matmul_supports(TensorType::Q5_0));
    for (TensorType t : kAllTypes) {
        CHECK(quant_supported(t));
        CHECK(cpu::matmul_supports(t));
    }
}

// ---- K-quant blocks ---------------------------------------------------------------------------

namespace {

// The Q4_K/Q5_K header used below: d = 1, dmin = 0.5, and these scales and mins, packed by hand
// following llama.cpp's get_scale_min_k4 (not with pack_k_scales, which is under test):
//   sc = {1, 2, 3, 4, 33, 45, 63, 17}, m = {0, 5, 10, 63, 16, 31, 1, 48}.
//   bytes 0-3: sc[j] | (sc[j+4] >> 4) << 6 -> 0x81 0x82 0xC3 0x44
//   bytes 4-7: m[j] | (m[j+4] >> 4) << 6   -> 0x40 0x45 0x0A 0xFF
//   bytes 8-11: (sc[j+4] & 15) | (m[j+4] & 15) << 4 -> 0x01 0xFD 0x1F 0x01
const uint8_t kPackedScales[12] = {0x81, 0x82, 0xC3, 0x44, 0x40, 0x45, 0x0A, 0xFF, 0x01, 0xFD, 0x1F, 0x01};
const uint8_t kSc[8] = {1, 2, 3, 4, 33, 45, 63, 17}, kMin[8] = {0, 5, 10, 63, 16, 31, 1, 48};

// Nibble bytes: qs[32g + l] holds element l of sub-block 2g (low) and of 2g+1 (high).
void set_test_nibbles(uint8_t *qs) {
    qs[0] = 0x5A;        // element 0 (sub-block 0): q = 10; element 32 (sub-block 1): q = 5
    qs[32 + 16] = 0x31;  // element 80 (sub-block 2): q = 1; element 112 (sub-block 3): q = 3
    qs[64 + 3] = 0xF7;   // element 131 (sub-block 4): q = 7; element 163 (sub-block 5): q = 15
    qs[96 + 31] = 0x2E;  // element 223 (sub-block 6): q = 14; element 255 (sub-block 7): q = 2
}

}  // namespace

TEST_CASE("K-quant scales: 6-bit unpacking of sub-blocks 0-3 and 4-7, and packing back") {
    uint8_t sc[8], m[8];
    unpack_k_scales(kPackedScales, sc, m);
    for (int j = 0; j < 8; ++j) {
        CAPTURE(j);
        CHECK(sc[j] == kSc[j]);
        CHECK(m[j] == kMin[j]);
    }
    uint8_t packed[12];
    pack_k_scales(kSc, kMin, packed);
    CHECK(std::memcmp(packed, kPackedScales, 12) == 0);
    // Every code in every position survives a round trip.
    for (int v = 0; v < 64; ++v) {
        uint8_t s8[8], m8[8], back_s[8], back_m[8];
        for (int j = 0; j < 8; ++j) {
            s8[j] = static_cast<uint8_t>((v + 7 * j) % 64);
            m8[j] = static_cast<uint8_t>((v * 5 + j) % 64);
        }
        pack_k_scales(s8, m8, packed);
        unpack_k_scales(packed, back_s, back_m);
        REQUIRE(std::memcmp(s8, back_s, 8) == 0);
        REQUIRE(std::memcmp(m8, back_m, 8) == 0);
    }
}

TEST_CASE("Q4_K block dequantizes to hand-computed values") {
    BlockQ4_K b{};
    b.d = 0x3C00;     // 1
    b.dmin = 0x3800;  // 0.5
    std::memcpy(b.scales, kPackedScales, 12);
    set_test_nibbles(b.qs);
    float y[256];
    REQUIRE(dequantize_row(TensorType::Q4_K, &b, y, 256));
    // value = d * sc[j] * q - dmin * m[j]
    CHECK(y[0] == 10.0f);     // 1 * 10 - 0
    CHECK(y[32] == 7.5f);     // 2 * 5 - 0.5 * 5
    CHECK(y[80] == -2.0f);    // 3 * 1 - 0.5 * 10
    CHECK(y[112] == -19.5f);  // 4 * 3 - 0.5 * 63
    CHECK(y[131] == 223.0f);  // 33 * 7 - 0.5 * 16 (sub-block 4: 6-bit scale from bytes 8 and 0)
    CHECK(y[163] == 659.5f);  // 45 * 15 - 0.5 * 31
    CHECK(y[223] == 881.5f);  // 63 * 14 - 0.5 * 1
    CHECK(y[255] == 10.0f);   // 17 * 2 - 0.5 * 48
    // q = 0 elsewhere: -dmin * m[j].
    CHECK(y[1] == 0.0f);
    CHECK(y[33] == -2.5f);
    CHECK(y[254] == -24.0f);
    CHECK(y[130] == -8.0f);
}

TEST_CASE("Q5_K block dequantizes to hand-computed values") {
    BlockQ5_K b{};
    b.d = 0x3C00;
    b.dmin = 0x3800;
    std::memcpy(b.scales, kPackedScales, 12);
    set_test_nibbles(b.qs);
    b.qh[0] = 0x02;   // bit 1: the fifth bit of element 0 of sub-block 1 (element 32)
    b.qh[31] = 0x80;  // bit 7: element 31 of sub-block 7 (element 255)
    b.qh[3] = 0x10;   // bit 4: element 3 of sub-block 4 (element 131)
    float y[256];
    REQUIRE(dequantize_row(TensorType::Q5_K, &b, y, 256));
    CHECK(y[0] == 10.0f);     // bit 0 of qh[0] is clear
    CHECK(y[32] == 39.5f);    // 2 * (5 + 16) - 2.5
    CHECK(y[131] == 751.0f);  // 33 * (7 + 16) - 8
    CHECK(y[163] == 659.5f);  // bit 5 of qh[3] is clear
    CHECK(y[223] == 881.5f);  // bit 6 of qh[31] is clear
    CHECK(y[255] == 282.0f);  // 17 * (2 + 16) - 24
    CHECK(y[33] == -2.5f);
}

TEST_CASE("Q6_K block dequantizes to hand-computed values") {
    BlockQ6_K b{};
    b.d = 0x3400;  // 0.25
    b.scales[0] = 1;
    b.scales[1] = -2;
    b.scales[4] = 3;
    b.scales[6] = 5;
    b.scales[8] = -128;
    b.scales[10] = 7;
    b.scales[15] = 127;
    // Element e = 128h + 32i + l: low 4 bits from ql[64h + l + 32 (i & 1)] (low nibble for i < 2,
    // high for i >= 2), top 2 bits from bits 2i, 2i+1 of qh[32h + l]; value d * scale[e/16] * (q - 32).
    b.ql[0] = 0xA5;    // e = 0: low nibble 5; e = 64: high nibble 10
    b.qh[0] = 0x32;    // e = 0: bits 0-1 = 2; e = 64: bits 4-5 = 3
    b.ql[99] = 0x0C;   // e = 163 (h 1, i 1, l 3): 12
    b.qh[35] = 0x04;   //   bits 2-3 = 1
    b.ql[127] = 0xF0;  // e = 255 (h 1, i 3, l 31): high nibble 15
    b.qh[63] = 0xC0;   //   bits 6-7 = 3
    b.ql[64] = 0x01;   // e = 128 (h 1, i 0, l 0): 1
    b.qh[32] = 0x01;   //   bits 0-1 = 1
    float y[256];
    REQUIRE(dequantize_row(TensorType::Q6_K, &b, y, 256));
    CHECK(y[0] == 1.25f);      // 0.25 * 1 * (37 - 32)
    CHECK(y[64] == 19.5f);     // 0.25 * 3 * (58 - 32)
    CHECK(y[17] == 16.0f);     // 0.25 * -2 * (0 - 32)
    CHECK(y[163] == -7.0f);    // 0.25 * 7 * (28 - 32)
    CHECK(y[255] == 984.25f);  // 0.25 * 127 * (63 - 32)
    CHECK(y[128] == 480.0f);   // 0.25 * -128 * (17 - 32)
    CHECK(y[100] == -40.0f);   // 0.25 * 5 * (0 - 32)
    CHECK(y[200] == 0.0f);     // scale 0
}

TEST_CASE("K-quant quantization: error bounds, and lower error than Q4_0 at the same size") {
    std::mt19937 rng(21);
    const int64_t n = 256 * 256;
    // Gaussian weights, plus blocks of other shapes: all positive, all negative, tiny, constant,
    // zero, and one with a single outlier.
    std::vector<float> x = random_vector(rng, n, 0.05f);
    for (int i = 0; i < 256; ++i) {
        x[256 + i] = std::fabs(x[256 + i]) + 0.01f;
        x[512 + i] = -std::fabs(x[512 + i]) - 0.01f;
        x[768 + i] *= 1e-3f;
        x[1024 + i] = -0.125f;
        x[1280 + i] = 0.0f;
    }
    x[1536 + 77] = 3.0f;
    double sxx = 0.0;
    for (float v : x) sxx += static_cast<double>(v) * v;
    auto rel_rms = [&](TensorType type) {
        std::vector<uint8_t> q(row_bytes(type, n));
        std::vector<float> back(n);
        REQUIRE(quantize_row(type, x.data(), q.data(), n));
        REQUIRE(dequantize_row(type, q.data(), back.data(), n));
        double err = 0.0;
        for (int64_t i = 0; i < n; ++i) err += (static_cast<double>(back[i]) - x[i]) * (back[i] - x[i]);
        if (is_k(type)) {
            // Per element: within two "naive steps" of its sub-block (range / levels for Q4_K/Q5_K,
            // max |x| / 31.5 for Q6_K). Rounding alone gives half a step; the rest is the 6- and
            // 8-bit coding of the sub-block scales and mins (the worst seen is ~1.6 steps).
            const int sub = type == TensorType::Q6_K ? 16 : 32;
            const float levels = type == TensorType::Q4_K ? 15.0f : type == TensorType::Q5_K ? 31.0f : 31.5f;
            for (int64_t b = 0; b < n / sub; ++b) {
                float lo = 0.0f, hi = 0.0f, amax = 0.0f;
                for (int i = 0; i < sub; ++i) {
                    lo = std::min(lo, x[b * sub + i]);
                    hi = std::max(hi, x[b * sub + i]);
                    amax = std::max(amax, std::fabs(x[b * sub + i]));
                }
                const float step = (type == TensorType::Q6_K ? amax : hi - lo) / levels;
                for (int i = 0; i < sub; ++i) {
                    CAPTURE(b * sub + i);
                    REQUIRE(std::fabs(back[b * sub + i] - x[b * sub + i]) <= 2.0f * step + 1e-9f);
                }
            }
            // The zero block comes back exactly; the constant one up to the fp16 rounding of the
            // super-block scale times a 6- or 8-bit code.
            for (int i = 0; i < 256; ++i) {
                CHECK(back[1280 + i] == 0.0f);
                CHECK(std::fabs(back[1024 + i] + 0.125f) <= 0.125f * 1e-3f);
            }
        }
        return std::sqrt(err / sxx);
    };
    const double q4_0 = rel_rms(TensorType::Q4_0), q8_0 = rel_rms(TensorType::Q8_0);
    const double q4_k = rel_rms(TensorType::Q4_K), q5_k = rel_rms(TensorType::Q5_K), q6_k = rel_rms(TensorType::Q6_K);
    INFO("relative RMS error: Q4_0 " << q4_0 << ", Q4_K " << q4_k << ", Q5_K " << q5_k << ", Q6_K " << q6_k << ", Q8_0 " << q8_0);
    // On Gaussian data these are about 0.086, 0.070, 0.035, 0.017 and 0.0053 (llama.cpp's own
    // reference quantizer: 0.071 Q4_K, 0.036 Q5_K, 0.018 Q6_K).
    CHECK(q4_k < 0.9 * q4_0);
    CHECK(q4_k < 0.075);
    CHECK(q5_k < 0.038);
    CHECK(q6_k < 0.019);
    CHECK(q8_0 < q6_k);
}

TEST_CASE("K-quant quantization: non-finite blocks get a NaN scale, and only those") {
    for (TensorType type : kKTypes) {
        CAPTURE(std::string(type_name(type)));
        std::vector<float> x(512, 0.5f);
        x[300] = NAN;  // second super-block
        std::vector<uint8_t> q(row_bytes(type, 512));
        std::vector<float> back(512);
        REQUIRE(quantize_row(type, x.data(), q.data(), 512));
        REQUIRE(dequantize_row(type, q.data(), back.data(), 512));
        for (int i = 0; i < 256; ++i) CHECK(std::fabs(back[i] - 0.5f) < 1e-3f);
        for (int i = 256; i < 512; ++i) CHECK(std::isnan(back[i]));
        x[300] = -INFINITY;
        REQUIRE(quantize_row(type, x.data(), q.data(), 512));
        REQUIRE(dequantize_row(type, q.data(), back.data(), 512));
        CHECK(std::isnan(back[511]));
    }
}

// ---- kernels --------------------------------------------------------------------------------

TEST_CASE("kernel selection can be forced to the portable path, and to exactly the levels the CPU has") {
    IsaGuard guard;
    CHECK(cpu::set_kernel_isa(cpu::KernelIsa::Scalar));
    CHECK(cpu::current_kernel_isa() == cpu::KernelIsa::Scalar);
    CHECK(std::strcmp(cpu::kernel_isa_name(cpu::KernelIsa::Scalar), "scalar") == 0);
    for (cpu::KernelIsa isa : kSimdLevels) {
        CAPTURE(cpu::kernel_isa_name(isa));
        REQUIRE(cpu::set_kernel_isa(cpu::KernelIsa::Scalar));
        if (cpu::cpu_supports(isa)) {
            CHECK(cpu::set_kernel_isa(isa));
            CHECK(cpu::current_kernel_isa() == isa);
        } else {
            CHECK_FALSE(cpu::set_kernel_isa(isa));
            CHECK(cpu::current_kernel_isa() == cpu::KernelIsa::Scalar);
        }
    }
#if defined(H2O_KERNELS_ARM64)
    CHECK(cpu::cpu_supports(cpu::KernelIsa::Neon));  // every ARM64 CPU
    // i8mm CPUs all have dotprod (ARMv8.6), and the i8mm level uses both.
    if (cpu::cpu_supports(cpu::KernelIsa::NeonI8mm)) CHECK(cpu::cpu_supports(cpu::KernelIsa::NeonDotprod));
#endif
#if defined(H2O_KERNELS_X86)
    // The AVX-512 level uses AVX2 kernels too; the avx2+vnni level runs wherever AVX-512 does (its
    // EVEX encoding).
    if (cpu::cpu_supports(cpu::KernelIsa::Avx512)) CHECK(cpu::cpu_supports(cpu::KernelIsa::Avx2));
    if (cpu::cpu_supports(cpu::KernelIsa::Avx512)) CHECK(cpu::cpu_supports(cpu::KernelIsa::Avx2Vnni));
    if (cpu::cpu_supports(cpu::KernelIsa::Avx2Vnni)) CHECK(cpu::cpu_supports(cpu::KernelIsa::Avx2));
#endif
}

namespace {

// The activation quantization of `isa` writes the same bytes as the scalar one, which are the
// quants of quantize_row(Q8_0).
void check_activation_quantization(cpu::KernelIsa isa) {
    using cpu::detail::ActBlockPair;
    std::mt19937 rng(5);
    const int64_t cols = 32 * 5, n_tokens = 7;  // an odd block count and a partial token group
    std::vector<float> x = random_vector(rng, cols * n_tokens, 2.0f);
    // Edge cases: an all-zero block, exact rounding ties, a tiny block, and non-finite blocks.
    std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
    for (int j = 0; j < 32; ++j) x[cols + j] = (j - 16) * 0.5f;
    for (int j = 0; j < 32; ++j) x[cols + 32 + j] = 1e-40f * static_cast<float>(j);
    x[2 * cols + 70] = INFINITY;
    x[3 * cols + 100] = NAN;
    const int64_t n_groups = 2, n_pairs = 3;
    std::vector<ActBlockPair> a(n_groups * n_pairs), b(n_groups * n_pairs);
    std::memset(a.data(), 0x55, a.size() * sizeof(ActBlockPair));  // stale bytes must be overwritten
    std::memset(b.data(), 0xAA, b.size() * sizeof(ActBlockPair));
    cpu::detail::kScalarKernels.quantize_activations(x.data(), cols, n_tokens, 0, n_groups, a.data());
    kernel_table(isa).quantize_activations(x.data(), cols, n_tokens, 0, n_groups, b.data());
    for (size_t i = 0; i < a.size(); ++i) {
        for (int k = 0; k < 8; ++k) {
            // Compare scales by bits, treating any two NaNs as equal.
            const bool both_nan = std::isnan(a[i].d[k]) && std::isnan(b[i].d[k]);
            CHECK((both_nan || bits_of(a[i].d[k]) == bits_of(b[i].d[k])));
            CHECK(a[i].offset[k] == b[i].offset[k]);
        }
        CHECK(std::memcmp(a[i].lo, b[i].lo, sizeof a[i].lo) == 0);
        CHECK(std::memcmp(a[i].hi, b[i].hi, sizeof a[i].hi) == 0);
    }
    // The quants are exactly those of the reference Q8_0 quantizer (only its scale is fp16).
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t blk = 0; blk < cols / 32; ++blk) {
            BlockQ8_0 ref;
            REQUIRE(quantize_row(TensorType::Q8_0, &x[t * cols + blk * 32], &ref, 32));
            const ActBlockPair &p = a[(t / 4) * n_pairs + blk / 2];
            const int half = static_cast<int>(blk % 2), tt = static_cast<int>(t % 4);
            CAPTURE(t);
            CAPTURE(blk);
            CHECK(std::memcmp(&p.lo[tt][16 * half], ref.qs, 16) == 0);
            CHECK(std::memcmp(&p.hi[tt][16 * half], ref.qs + 16, 16) == 0);
            int32_t sum = 0;
            for (int j = 0; j < 32; ++j) sum += ref.qs[j];
            CHECK(p.offset[half * 4 + tt] == 8 * sum);
        }
    }
    // Padding: token 7 of group 1 and block 5 (the missing half of pair 2) are zero.
    CHECK(a[1 * n_pairs + 0].d[3] == 0.0f);
    CHECK(a[0 * n_pairs + 2].d[4] == 0.0f);
    CHECK(a[0 * n_pairs + 2].lo[0][20] == 0);
}

}  // namespace

TEST_CASE("activation quantization: SIMD levels and scalar write identical bytes, with quantize_row's quants") {
    for (cpu::KernelIsa isa : simd_levels()) {
        CAPTURE(cpu::kernel_isa_name(isa));
        check_activation_quantization(isa);
    }
}

namespace {

// Blocks of every kind the quantizer treats differently, in random order: scales from subnormal
// to near FLT_MAX, exact rounding ties (amax 127 makes d = 1, so x.5 stays a tie), zeros, blocks
// whose 1/d overflows, and infs and NaNs.
std::vector<float> mixed_blocks(std::mt19937 &rng, int64_t n_blocks) {
    const float scales[] = {1e-44f, 1e-39f, 1e-3f, 1.0f, 1e3f, 1e36f, 2e38f};
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(n_blocks * 32);
    for (int64_t b = 0; b < n_blocks; ++b) {
        float *blk = &x[b * 32];
        const unsigned kind = rng() % 10;
        for (int j = 0; j < 32; ++j) {
            if (kind < 7)
                blk[j] = std::min(std::max(nd(rng), -1.5f), 1.5f) * scales[kind];
            else if (kind == 7)
                blk[j] = j == 0 ? -127.0f : static_cast<float>(j - 16) + 0.5f;
            else
                blk[j] = 0.0f;
        }
        if (kind == 9 && rng() % 2) blk[rng() % 32] = rng() % 2 ? -INFINITY : NAN;
    }
    return x;
}

// Every byte of the activation pairs, for several row lengths (one block, odd and even block
// counts, more than one 4096-column slice), token counts (one, partial and whole groups) and a
// range of groups split over two calls, as matmul's threads do.
void check_activation_bytes(cpu::KernelIsa isa) {
    using cpu::detail::ActBlockPair;
    std::mt19937 rng(11);
    for (int64_t cols : {32, 64, 96, 256, 32 * 131}) {
        for (int64_t n_tokens : {1, 2, 3, 4, 5, 9}) {
            CAPTURE(cols);
            CAPTURE(n_tokens);
            const std::vector<float> x = mixed_blocks(rng, cols / 32 * n_tokens);
            const int64_t n_groups = (n_tokens + 3) / 4, n_pairs = (cols / 32 + 1) / 2;
            std::vector<ActBlockPair> a(n_groups * n_pairs), b(n_groups * n_pairs);
            std::memset(a.data(), 0x55, a.size() * sizeof(ActBlockPair));
            std::memset(b.data(), 0xAA, b.size() * sizeof(ActBlockPair));
            cpu::detail::kScalarKernels.quantize_activations(x.data(), cols, n_tokens, 0, n_groups, a.data());
            const int64_t split = n_groups / 2;
            kernel_table(isa).quantize_activations(x.data(), cols, n_tokens, 0, split, b.data());
            kernel_table(isa).quantize_activations(x.data(), cols, n_tokens, split, n_groups, b.data());
            CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(ActBlockPair)) == 0);
        }
    }
}

}  // namespace

TEST_CASE("activation quantization: SIMD levels write the scalar path's bytes for blocks of every magnitude") {
    for (cpu::KernelIsa isa : simd_levels()) {
        CAPTURE(cpu::kernel_isa_name(isa));
        check_activation_bytes(isa);
    }
}

namespace {

struct MatmulCase {
    TensorType type;
    int64_t rows, cols, n_tokens;
    cpu::WeightLayout layout = cpu::WeightLayout::Rows;  // Interleaved8: run_matmul interleaves the weights
};

// Runs matmul with the current kernels; checks it writes exactly y and leaves the guards alone.
std::vector<float> run_matmul(ThreadPool &pool, const MatmulCase &c, const std::vector<uint8_t> &w, const std::vector<float> &x) {
    const float sentinel = -12345.0f;
    std::vector<float> y(c.rows * c.n_tokens + 16, sentinel);
    // Scratch at an odd address: matmul must align it itself.
    std::vector<uint8_t> scratch(cpu::matmul_scratch_bytes(c.type, c.cols, c.n_tokens) + 1);
    std::vector<uint8_t> interleaved;
    const void *weights = w.data();
    if (c.layout == cpu::WeightLayout::Interleaved8) {
        interleaved.resize(cpu::interleaved_bytes(c.type, c.rows, c.cols));
        cpu::interleave_rows(c.type, w.data(), interleaved.data(), c.rows, c.cols);
        weights = interleaved.data();
    }
    cpu::matmul(pool, c.type, weights, c.rows, c.cols, x.data(), c.n_tokens, y.data() + 8, scratch.data() + 1, c.layout);
    for (int i = 0; i < 8; ++i) {
        REQUIRE(y[i] == sentinel);
        REQUIRE(y[y.size() - 1 - i] == sentinel);
    }
    return std::vector<float>(y.begin() + 8, y.end() - 8);
}

}  // namespace

namespace {

std::vector<MatmulCase> matmul_cases() {
    std::vector<MatmulCase> cases;
    for (TensorType type : kAllTypes) {
        // Rows that are not multiples of any tile; odd block counts (32, 96 columns; 256 and 768
        // for the K-quants' 256-element super-blocks); full and partial groups of 4 tokens.
        for (int64_t rows : {1, 7, 70}) {
            for (int64_t cols : is_k(type) ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 96, 320}) {
                for (int64_t n_tokens : {1, 3, 17, 64}) cases.push_back({type, rows, cols, n_tokens});
            }
        }
        // Long rows: the kernels work on column slices of 4096 (this has an odd block, or for the
        // K-quants one super-block, after the first slice).
        cases.push_back({type, 3, is_k(type) ? 256 * 17 : 32 * 131, 5});
        // Float types: row lengths that leave a remainder after 8-wide vectors, and after a
        // 64-byte line of halves one of more than 16 columns (two masked steps).
        if (!is_quant(type)) {
            cases.push_back({type, 9, 37, 5});
            cases.push_back({type, 9, 53, 5});
        }
    }
    // Q4_0, Q8_0 and the K-quants interleaved by 8 rows: one group and several (an odd number, 17,
    // whose thread chunks end inside the matrix; the AVX-512 kernels take groups in pairs, and a
    // lone last one), odd block counts, and a row longer than one 4096-column slice (Q6_K: also
    // one slice and a lone super-block after it).
    constexpr auto kX8 = cpu::WeightLayout::Interleaved8;
    for (int64_t rows : {8, 136}) {
        for (int64_t n_tokens : {1, 3, 4, 5, 17, 64}) {
            for (int64_t cols : {32, 96, 320}) {
                cases.push_back({TensorType::Q4_0, rows, cols, n_tokens, kX8});
                cases.push_back({TensorType::Q8_0, rows, cols, n_tokens, kX8});
            }
            for (int64_t cols : {256, 768}) {
                cases.push_back({TensorType::Q4_K, rows, cols, n_tokens, kX8});
                cases.push_back({TensorType::Q5_K, rows, cols, n_tokens, kX8});
                cases.push_back({TensorType::Q6_K, rows, cols, n_tokens, kX8});
            }
        }
    }
    cases.push_back({TensorType::Q4_0, 16, 32 * 131, 5, kX8});
    cases.push_back({TensorType::Q8_0, 24, 32 * 131, 5, kX8});
    cases.push_back({TensorType::Q4_K, 16, 256 * 17, 5, kX8});
    cases.push_back({TensorType::Q5_K, 24, 256 * 17, 5, kX8});
    for (int64_t n_tokens : {1, 2, 7}) cases.push_back({TensorType::Q6_K, 24, 256 * 17, n_tokens, kX8});
    cases.push_back({TensorType::Q6_K, 40, 256 * 16, 9, kX8});
    return cases;
}

// Checks matmul with `isa` against a double-precision reference on the dequantized weights, for
// 1, 2 and 3 threads, and (for a SIMD level) against the scalar path.
void check_matmul(cpu::KernelIsa isa) {
    IsaGuard guard;
    std::mt19937 rng(42);
    for (const MatmulCase &c : matmul_cases()) {
        const bool interleaved = c.layout == cpu::WeightLayout::Interleaved8;
        if (interleaved && kernel_table(isa).interleaved_support == 0) continue;
        CAPTURE(std::string(type_name(c.type)));
        CAPTURE(interleaved);
        CAPTURE(c.rows);
        CAPTURE(c.cols);
        CAPTURE(c.n_tokens);
        const std::vector<float> wf = random_vector(rng, c.rows * c.cols, 0.1f);
        std::vector<float> x = random_vector(rng, c.n_tokens * c.cols);
        // Give token 0 a wide dynamic range: a few large values coarsen its 8-bit blocks.
        for (int64_t j = 0; j < c.cols; j += 29) x[j] *= 20.0f;
        const std::vector<uint8_t> w = quantize_matrix(c.type, wf, c.rows, c.cols);
        std::vector<float> wd(c.rows * c.cols);
        REQUIRE(dequantize_row(c.type, w.data(), wd.data(), c.rows * c.cols));
        const bool quant = is_quant(c.type);

        // Reference in double, with an error bound per output:
        //  - float accumulation: each term and partial sum is rounded a bounded number of times,
        //    so the error is at most about (log2(n) + 2) * 2^-24 relative to sum |w x| for pairwise
        //    and blocked sums; 1e-5 covers every n here with a wide margin.
        //  - for quantized weights the activations are quantized to 8 bits per 32-value block with scale
        //    d = amax/127, so each x is off by at most d/2 (times 1 + 1e-6 for the float rounding of
        //    d and 1/d), and the output by at most the sum over blocks of d/2 * sum |w| there.
        std::vector<double> ref(c.rows * c.n_tokens), tol(c.rows * c.n_tokens), mag(c.rows * c.n_tokens);
        for (int64_t t = 0; t < c.n_tokens; ++t) {
            const float *xt = &x[t * c.cols];
            for (int64_t r = 0; r < c.rows; ++r) {
                const float *wr = &wd[r * c.cols];
                double s = 0.0, m = 0.0, act = 0.0;
                for (int64_t j = 0; j < c.cols; ++j) {
                    s += static_cast<double>(wr[j]) * xt[j];
                    m += std::fabs(static_cast<double>(wr[j]) * xt[j]);
                }
                if (quant) {
                    for (int64_t b = 0; b < c.cols / 32; ++b) {
                        double amax = 0.0, wsum = 0.0;
                        for (int j = 0; j < 32; ++j) {
                            amax = std::max(amax, static_cast<double>(std::fabs(xt[b * 32 + j])));
                            wsum += std::fabs(wr[b * 32 + j]);
                        }
                        act += amax / 127.0 * 0.5 * (1.0 + 1e-6) * wsum;
                    }
                }
                ref[t * c.rows + r] = s;
                mag[t * c.rows + r] = m;
                tol[t * c.rows + r] = act + 1e-5 * m + 1e-30;
            }
        }
        for (int threads : {1, 2, 3}) {
            CAPTURE(threads);
            ThreadPool pool(threads);
            REQUIRE(cpu::set_kernel_isa(isa));
            const std::vector<float> y = run_matmul(pool, c, w, x);
            for (size_t i = 0; i < ref.size(); ++i) {
                CAPTURE(i);
                REQUIRE(std::fabs(y[i] - ref[i]) <= tol[i]);
            }
            if (isa == cpu::KernelIsa::Scalar) continue;
            REQUIRE(cpu::set_kernel_isa(cpu::KernelIsa::Scalar));
            const std::vector<float> ys = run_matmul(pool, c, w, x);
            for (size_t i = 0; i < ref.size(); ++i) {
                CAPTURE(i);
                // Same integer block sums and scales in both; only the float summation order
                // differs, so they agree to twice the accumulation bound, far inside the
                // quantization bound.
                REQUIRE(std::fabs(y[i] - ys[i]) <= 2e-5 * mag[i] + 1e-30);
            }
        }
    }
}

}  // namespace

TEST_CASE("matmul: scalar path against a double-precision reference") { check_matmul(cpu::KernelIsa::Scalar); }

TEST_CASE("matmul: AVX2 path against the reference and the scalar path") {
    if (can_run(cpu::KernelIsa::Avx2)) check_matmul(cpu::KernelIsa::Avx2);
}

TEST_CASE("matmul: AVX2+VNNI path against the reference and the scalar path") {
    if (can_run(cpu::KernelIsa::Avx2Vnni)) check_matmul(cpu::KernelIsa::Avx2Vnni);
}

namespace {

// Checks that level `b` gives level `a`'s bits on every matmul case `wanted` accepts.
template <typename Wanted>
void check_same_bits(cpu::KernelIsa a, cpu::KernelIsa b, Wanted wanted) {
    if (!can_run(a) || !can_run(b)) return;
    IsaGuard guard;
    std::mt19937 rng(43);
    ThreadPool pool(2);
    for (const MatmulCase &c : matmul_cases()) {
        if (!wanted(c)) continue;
        CAPTURE(std::string(type_name(c.type)));
        CAPTURE(c.rows);
        CAPTURE(c.cols);
        CAPTURE(c.n_tokens);
        CAPTURE(c.layout == cpu::WeightLayout::Interleaved8);
        const std::vector<uint8_t> w = quantize_matrix(c.type, random_vector(rng, c.rows * c.cols), c.rows, c.cols);
        const std::vector<float> x = random_vector(rng, c.n_tokens * c.cols);
        REQUIRE(cpu::set_kernel_isa(a));
        const std::vector<float> ya = run_matmul(pool, c, w, x);
        REQUIRE(cpu::set_kernel_isa(b));
        const std::vector<float> yb = run_matmul(pool, c, w, x);
        CHECK(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)) == 0);
    }
}

}  // namespace

TEST_CASE("matmul: the AVX2+VNNI level gives the AVX2 level's bits for every weight type and layout") {
    // vpdpbusd makes the integer sums maddubs and madd make; everything after is the same code.
    check_same_bits(cpu::KernelIsa::Avx2, cpu::KernelIsa::Avx2Vnni, [](const MatmulCase &) { return true; });
}

TEST_CASE("matmul: the AVX-512 level gives the AVX2 level's bits for interleaved weights") {
    // Its kernels take two 8-row groups per 512-bit register (and a lone last group in 256 bits),
    // each lane doing the 8-row kernel's operations in the same order.
    check_same_bits(cpu::KernelIsa::Avx2, cpu::KernelIsa::Avx512,
                    [](const MatmulCase &c) { return c.layout == cpu::WeightLayout::Interleaved8; });
}

TEST_CASE("matmul: AVX-512 path against the reference and the scalar path") {
    if (can_run(cpu::KernelIsa::Avx512)) check_matmul(cpu::KernelIsa::Avx512);
}

TEST_CASE("matmul_group: products of one input have the bits of separate matmuls, at every level and thread count") {
    // A layer's q, k and v (or gate and up) as the graph groups them, with mixed types and layouts
    // (a Q4_K_M file's Q4_K and Q6_K; interleaved and not), matrices far apart in size, one token
    // (decoding), a partial token group and several (prompts; the activations then quantized by
    // every thread at once).
    IsaGuard guard;
    std::mt19937 rng(41);
    constexpr auto kX8 = cpu::WeightLayout::Interleaved8;
    const struct Product {
        TensorType type;
        int64_t rows;
        cpu::WeightLayout layout;
    } groups[][3] = {
        {{TensorType::Q4_K, 136, kX8}, {TensorType::Q6_K, 24, cpu::WeightLayout::Rows}, {TensorType::Q6_K, 16, kX8}},
        {{TensorType::Q4_0, 136, kX8}, {TensorType::Q8_0, 7, cpu::WeightLayout::Rows}, {TensorType::F16, 33, cpu::WeightLayout::Rows}},
        {{TensorType::F32, 70, cpu::WeightLayout::Rows}, {TensorType::Q5_K, 9, cpu::WeightLayout::Rows}, {TensorType::Q4_0, 8, kX8}}};
    std::vector<cpu::KernelIsa> levels = simd_levels();
    levels.push_back(cpu::KernelIsa::Scalar);
    for (const auto &group : groups) {
        const int64_t cols = 768;
        // Each matrix in the file's layout and, for the interleaved products, interleaved too (the
        // NEON levels cannot run that layout, and take the file's).
        std::vector<std::vector<uint8_t>> file_layout, interleaved;
        for (const Product &product : group) {
            file_layout.push_back(quantize_matrix(product.type, random_vector(rng, product.rows * cols), product.rows, cols));
            interleaved.emplace_back();
            if (product.layout != kX8) continue;
            interleaved.back().resize(cpu::interleaved_bytes(product.type, product.rows, cols));
            cpu::interleave_rows(product.type, file_layout.back().data(), interleaved.back().data(), product.rows, cols);
        }
        for (int64_t n_tokens : {1, 3, 37}) {
            const std::vector<float> x = random_vector(rng, n_tokens * cols);
            size_t scratch_bytes = 0;
            for (const Product &product : group)
                scratch_bytes = std::max(scratch_bytes, cpu::matmul_scratch_bytes(product.type, cols, n_tokens));
            std::vector<uint8_t> scratch(scratch_bytes);
            for (cpu::KernelIsa isa : levels) {
                for (int threads : {1, 2, 3}) {
                    CAPTURE(cpu::kernel_isa_name(isa));
                    CAPTURE(n_tokens);
                    CAPTURE(threads);
                    REQUIRE(cpu::set_kernel_isa(isa));
                    ThreadPool pool(threads);
                    std::vector<std::vector<float>> alone(3), together(3);
                    cpu::MatmulOutput outputs[3];
                    for (int i = 0; i < 3; ++i) {
                        const bool x8 = group[i].layout == kX8 && kernel_table(isa).interleaved_support > 0;
                        const auto layout = x8 ? kX8 : cpu::WeightLayout::Rows;
                        const void *w = x8 ? interleaved[i].data() : file_layout[i].data();
                        alone[i].assign(group[i].rows * n_tokens, -1.0f);
                        together[i].assign(group[i].rows * n_tokens, -2.0f);
                        cpu::matmul(pool, group[i].type, w, group[i].rows, cols, x.data(), n_tokens, alone[i].data(), scratch.data(),
                                    layout);
                        outputs[i] = {group[i].type, w, group[i].rows, together[i].data(), layout};
                    }
                    cpu::matmul_group(pool, outputs, 3, cols, x.data(), n_tokens, scratch.data());
                    for (int i = 0; i < 3; ++i) {
                        CAPTURE(i);
                        CHECK(std::memcmp(alone[i].data(), together[i].data(), alone[i].size() * sizeof(float)) == 0);
                    }
                }
            }
        }
    }
}

TEST_CASE("matmul: NEON levels against the reference and the scalar path") {
    for (cpu::KernelIsa isa : {cpu::KernelIsa::Neon, cpu::KernelIsa::NeonDotprod, cpu::KernelIsa::NeonI8mm}) {
        if (!can_run(isa)) continue;
        CAPTURE(cpu::kernel_isa_name(isa));
        check_matmul(isa);
    }
}

namespace {

// A NaN in one token's activations must reach that token's outputs (and only those) instead of
// being quantized away.
void check_nan_propagation(cpu::KernelIsa isa) {
    IsaGuard guard;
    REQUIRE(cpu::set_kernel_isa(isa));
    std::mt19937 rng(9);
    const int64_t rows = 6, cols = 256, n_tokens = 5;  // one K-quant super-block
    ThreadPool pool(2);
    for (TensorType type : kAllTypes) {
        CAPTURE(std::string(type_name(type)));
        const std::vector<uint8_t> w = quantize_matrix(type, random_vector(rng, rows * cols), rows, cols);
        std::vector<float> x = random_vector(rng, n_tokens * cols);
        x[2 * cols + 40] = NAN;  // token 2
        const std::vector<float> y = run_matmul(pool, {type, rows, cols, n_tokens}, w, x);
        for (int64_t t = 0; t < n_tokens; ++t) {
            for (int64_t r = 0; r < rows; ++r) CHECK(std::isnan(y[t * rows + r]) == (t == 2));
        }
    }
    if (kernel_table(isa).interleaved_support == 0) return;
    const int64_t x8_rows = 16;
    for (TensorType type : {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
        CAPTURE(std::string(type_name(type)));
        const std::vector<uint8_t> w = quantize_matrix(type, random_vector(rng, x8_rows * cols), x8_rows, cols);
        std::vector<float> x = random_vector(rng, n_tokens * cols);
        x[2 * cols + 40] = NAN;
        const std::vector<float> y = run_matmul(pool, {type, x8_rows, cols, n_tokens, cpu::WeightLayout::Interleaved8}, w, x);
        for (int64_t t = 0; t < n_tokens; ++t) {
            for (int64_t r = 0; r < x8_rows; ++r) CHECK(std::isnan(y[t * x8_rows + r]) == (t == 2));
        }
    }
}

// Interleaving Q4_0, Q8_0 and the K-quants by 8 rows rearranges bits (Q4_K and Q5_K: and unpacks the
// 6-bit scales; Q6_K: and regroups each quant's bits) and nothing else: every row comes back, and an embedding
// lookup in the interleaved layout gives the reference's floats.
void check_interleaved_layout(cpu::KernelIsa isa) {
    IsaGuard guard;
    REQUIRE(cpu::set_kernel_isa(isa));
    std::mt19937 rng(17);
    for (TensorType type : {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
        CAPTURE(std::string(type_name(type)));
        const int64_t rows = 24, cols = is_k(type) ? 512 : 96;
        const std::vector<uint8_t> w = quantize_matrix(type, random_vector(rng, rows * cols), rows, cols);
        std::vector<uint8_t> x8(cpu::interleaved_bytes(type, rows, cols)), row(row_bytes(type, cols));
        CHECK(x8.size() == (type == TensorType::Q4_K ? w.size() / 144 * 148 : type == TensorType::Q5_K ? w.size() / 176 * 180 : w.size()));
        cpu::interleave_rows(type, w.data(), x8.data(), rows, cols);
        for (int64_t r = 0; r < rows; ++r) {
            cpu::deinterleave_row(type, x8.data(), cols, r, row.data());
            REQUIRE(std::memcmp(row.data(), w.data() + r * row.size(), row.size()) == 0);
        }
        // Block 1 of row 10 (group 1, lane 2).
        const uint8_t *blk = w.data() + 10 * row.size() + traits(type).block_bytes;
        if (type == TensorType::Q4_0) {
            const uint8_t *grp = x8.data() + (1 * 3 + 1) * 144;
            CHECK(std::memcmp(grp + 2 * 2, blk, 2) == 0);                        // scale
            CHECK(std::memcmp(grp + 16 + 32 * 1 + 4 * 2, blk + 2 + 4, 4) == 0);  // quant bytes 4..7
        } else if (type == TensorType::Q8_0) {
            const uint8_t *grp = x8.data() + (1 * 3 + 1) * 272;
            CHECK(std::memcmp(grp + 2 * 2, blk, 2) == 0);                         // scale
            CHECK(std::memcmp(grp + 16 + 32 * 6 + 4 * 2, blk + 2 + 24, 4) == 0);  // quants 24..27
        } else if (type == TensorType::Q4_K || type == TensorType::Q5_K) {
            const bool q5 = type == TensorType::Q5_K;
            const uint8_t *grp = x8.data() + (1 * 2 + 1) * (q5 ? 1440 : 1184);
            const uint8_t *qs = blk + (q5 ? 48 : 16);  // Q5_K: after 32 bytes of qh
            uint8_t sc[8], m[8];
            unpack_k_scales(blk + 4, sc, m);
            CHECK(std::memcmp(grp + 2 * 2, blk, 2) == 0);           // d
            CHECK(std::memcmp(grp + 16 + 2 * 2, blk + 2, 2) == 0);  // dmin
            CHECK(grp[32 + 8 * 5 + 2] == sc[5]);
            CHECK(grp[96 + 8 * 5 + 2] == m[5]);
            CHECK(std::memcmp(grp + 160 + 32 * 9 + 4 * 2, qs + 36, 4) == 0);                 // quant bytes 36..39
            if (q5) CHECK(std::memcmp(grp + 1184 + 32 * 7 + 4 * 2, blk + 16 + 28, 4) == 0);  // qh bytes 28..31
        } else if (type == TensorType::Q6_K) {
            const uint8_t *grp = x8.data() + (1 * 2 + 1) * 1680;
            BlockQ6_K b;
            std::memcpy(&b, blk, sizeof b);
            CHECK(std::memcmp(grp + 1536 + 2 * 2, &b.d, 2) == 0);
            CHECK(static_cast<int8_t>(grp[1552 + 8 * 11 + 2]) == b.scales[11]);
            // Columns 176..191 are scale group 11; the file's quant of column e (its q, 0..63):
            auto file_q = [&](int e) {
                const int h = e / 128, i = (e % 128) / 32, l = e % 32;
                return ((b.ql[64 * h + l + 32 * (i & 1)] >> (4 * (i / 2))) & 0x0F) | ((b.qh[32 * h + l] >> (2 * i)) & 3) << 4;
            };
            for (int c = 0; c < 3; ++c) {
                for (int j = 0; j < 4; ++j) {
                    const uint8_t v = grp[96 * 11 + 32 * c + 4 * 2 + j];
                    CHECK((v & 0x3F) == file_q(176 + 4 * c + j));
                    CHECK((v >> 6) == ((file_q(188 + j) >> (2 * c)) & 3));
                }
            }
        }
        std::vector<float> ref(rows * cols), some(3 * cols);
        REQUIRE(dequantize_row(type, w.data(), ref.data(), rows * cols));
        const int32_t ids[3] = {23, 0, 9};
        cpu::dequantize_rows(type, x8.data(), cols, ids, 3, some.data(), cpu::WeightLayout::Interleaved8);
        for (int i = 0; i < 3; ++i) CHECK(std::memcmp(&some[i * cols], &ref[ids[i] * cols], cols * sizeof(float)) == 0);
    }
}

// dequantize/dequantize_rows with `isa` equal the reference dequantize_row exactly.
void check_dequantize(cpu::KernelIsa isa) {
    IsaGuard guard;
    REQUIRE(cpu::set_kernel_isa(isa));
    std::mt19937 rng(13);
    const int64_t rows = 5;
    for (TensorType type : kAllTypes) {
        CAPTURE(std::string(type_name(type)));
        const int64_t cols = is_k(type) ? 512 : 96;
        const std::vector<float> wf = random_vector(rng, rows * cols);
        const std::vector<uint8_t> w = quantize_matrix(type, wf, rows, cols);
        std::vector<float> ref(rows * cols);
        REQUIRE(dequantize_row(type, w.data(), ref.data(), rows * cols));
        const int32_t ids[3] = {4, 0, 4};
        std::vector<float> all(rows * cols), some(3 * cols);
        cpu::dequantize(type, w.data(), all.data(), rows * cols);
        CHECK(std::memcmp(all.data(), ref.data(), all.size() * sizeof(float)) == 0);
        cpu::dequantize_rows(type, w.data(), cols, ids, 3, some.data());
        for (int i = 0; i < 3; ++i) CHECK(std::memcmp(&some[i * cols], &ref[ids[i] * cols], cols * sizeof(float)) == 0);
    }
    // Every fp16 bit pattern (NaNs compared as NaN), including an odd-length tail.
    std::vector<uint16_t> all_halves(65536 + 3);
    for (uint32_t h = 0; h < all_halves.size(); ++h) all_halves[h] = static_cast<uint16_t>(h * 40503u);
    std::vector<float> ref(all_halves.size()), got(all_halves.size());
    REQUIRE(dequantize_row(TensorType::F16, all_halves.data(), ref.data(), static_cast<int64_t>(ref.size())));
    cpu::dequantize(TensorType::F16, all_halves.data(), got.data(), static_cast<int64_t>(got.size()));
    for (size_t i = 0; i < ref.size(); ++i) {
        REQUIRE((std::isnan(ref[i]) ? std::isnan(got[i]) : bits_of(got[i]) == bits_of(ref[i])));
    }
}

// The vector operations with `isa` against double-precision references.
void check_vector_ops(cpu::KernelIsa isa) {
    IsaGuard guard;
    REQUIRE(cpu::set_kernel_isa(isa));
    std::mt19937 rng(17);
    for (int64_t n : {1, 7, 8, 33, 100, 1000}) {
        CAPTURE(n);
        const std::vector<float> a = random_vector(rng, n), b = random_vector(rng, n), wt = random_vector(rng, n);

        double dot = 0.0, mag = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            dot += static_cast<double>(a[i]) * b[i];
            mag += std::fabs(static_cast<double>(a[i]) * b[i]);
        }
        CHECK(std::fabs(cpu::dot_f32(a.data(), b.data(), n) - dot) <= 1e-5 * mag);

        std::vector<float> y = b;
        cpu::axpy(y.data(), 0.75f, a.data(), n);
        for (int64_t i = 0; i < n; ++i) CHECK(std::fabs(y[i] - (b[i] + 0.75 * a[i])) <= 1e-6 * (std::fabs(b[i]) + std::fabs(a[i])));

        cpu::add(y.data(), a.data(), b.data(), n);
        for (int64_t i = 0; i < n; ++i) CHECK(y[i] == a[i] + b[i]);

        // rmsnorm: a few float roundings per element.
        double ss = 0.0;
        for (float v : a) ss += static_cast<double>(v) * v;
        const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
        cpu::rmsnorm(y.data(), a.data(), wt.data(), n, 1e-5f);
        for (int64_t i = 0; i < n; ++i) CHECK(std::fabs(y[i] - a[i] * scale * wt[i]) <= 1e-6 * std::fabs(a[i] * scale * wt[i]) + 1e-30);

        // softmax, with scaled-up scores and one masked (-inf) entry. The vector exp is good to
        // a few ulp, so 1e-6 relative per probability.
        std::vector<float> s(n);
        for (int64_t i = 0; i < n; ++i) s[i] = a[i] * 8.0f;
        if (n > 1) s[n / 2] = -INFINITY;
        double mx = -INFINITY, sum = 0.0;
        for (float v : s) mx = std::max(mx, static_cast<double>(v));
        std::vector<double> e(n);
        for (int64_t i = 0; i < n; ++i) sum += e[i] = std::exp(s[i] - mx);
        cpu::softmax(s.data(), n);
        double total = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            CHECK(std::fabs(s[i] - e[i] / sum) <= 1e-6 * e[i] / sum + 1e-12);
            total += s[i];
        }
        CHECK(std::fabs(total - 1.0) <= 1e-5);
        if (n > 1) CHECK(s[n / 2] == 0.0f);

        // silu(g) * u over a wide range of g, including where exp(-g) over- or underflows.
        std::vector<float> g(n);
        for (int64_t i = 0; i < n; ++i) g[i] = a[i] * 30.0f;
        g[0] = -200.0f;
        cpu::silu_mul(y.data(), g.data(), b.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * b[i];
            CHECK(std::fabs(y[i] - want) <= 2e-6 * std::fabs(want) + 1e-30);
        }
        // gelu(g) * u (tanh approximation) in double precision, in its sigmoid form: the tanh form
        // cancels for very negative g. Where the vector exp nears underflow the relative error
        // grows, on values far below any that matter (the absolute 1e-12).
        cpu::gelu_mul(y.data(), g.data(), b.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            const double x = g[i];
            const double want = x / (1.0 + std::exp(-1.5957691216057308 * (x + 0.044715 * x * x * x))) * b[i];
            CHECK(std::fabs(y[i] - want) <= 4e-6 * std::fabs(want) + 1e-12);
        }
    }
    // Fully masked softmax: zeros, not NaN.
    float masked[3] = {-INFINITY, -INFINITY, -INFINITY};
    cpu::softmax(masked, 3);
    for (float v : masked) CHECK(v == 0.0f);
    // The maximum softmax subtracts, wherever it lies (vector body, tail, past a NaN): one score
    // of 200 among small ones gives exactly 1 there and 0 elsewhere; a maximum missed would
    // overflow exp(200 - small) to infinity and make NaN.
    for (int64_t n = 1; n <= 70; ++n) {
        for (int64_t at = 0; at < n; ++at) {
            std::vector<float> x(n);
            for (int64_t i = 0; i < n; ++i) x[i] = -3.0f + 0.01f * static_cast<float>(i);
            if (n > 2) x[(at + 1) % n] = -INFINITY;
            x[at] = 200.0f;
            cpu::softmax(x.data(), n);
            for (int64_t i = 0; i < n; ++i) CHECK(x[i] == (i == at ? 1.0f : 0.0f));
        }
    }

    // Pair rotation (rolling re-rotates kept keys with it): rotary.h's rotate_pair's bits exactly,
    // for pair counts with and without a tail, angles of every quadrant and large values.
    for (int64_t n_pairs : {0, 1, 3, 4, 32, 37}) {
        CAPTURE(n_pairs);
        std::vector<float> x = random_vector(rng, 2 * n_pairs, 100.0f), cos_sin(2 * n_pairs);
        for (int64_t i = 0; i < n_pairs; ++i) {
            rotary_cos_sin(static_cast<int>(-17 * i - 3), 0.37, &cos_sin[2 * i], &cos_sin[2 * i + 1]);
        }
        std::vector<float> want = x;
        for (int64_t i = 0; i < n_pairs; ++i) rotate_pair(&want[2 * i], &want[2 * i + 1], cos_sin[2 * i], cos_sin[2 * i + 1]);
        // An F16 row: widened, rotated and rounded back, the pairs past n_pairs untouched.
        std::vector<uint16_t> halves(2 * n_pairs + 6), want_halves(halves.size());
        for (size_t i = 0; i < halves.size(); ++i) halves[i] = fp32_to_fp16(i < x.size() ? x[i] : 1.5f * static_cast<float>(i));
        std::vector<float> widened(2 * n_pairs);
        for (int64_t i = 0; i < 2 * n_pairs; ++i) widened[i] = fp16_to_fp32(halves[i]);
        for (int64_t i = 0; i < n_pairs; ++i) rotate_pair(&widened[2 * i], &widened[2 * i + 1], cos_sin[2 * i], cos_sin[2 * i + 1]);
        for (size_t i = 0; i < halves.size(); ++i) want_halves[i] = i < widened.size() ? fp32_to_fp16(widened[i]) : halves[i];
        cpu::rotate_pairs(x.data(), cos_sin.data(), n_pairs);
        CHECK((x.empty() || std::memcmp(x.data(), want.data(), x.size() * sizeof(float)) == 0));
        cpu::rotate_half_pairs(halves.data(), cos_sin.data(), n_pairs);
        CHECK(halves == want_halves);
    }

    // Attention over KV rows of every format, for the head sizes some levels unroll (64, 128) and
    // others (with tails: 37, 38), with rows further apart than they are long. Scores and outputs
    // against double-precision sums over the rows' decoded values (kv_load_row; Q4's SIMD levels
    // round min + scale * q once, well within the bound). Rows whose weight is 0 hold NaN (a NaN
    // scale for Q8 and Q4): they must never be read.
    for (uint32_t f = 0; f < kKvRowFormatCount; ++f) {
        const auto format = static_cast<KvRowFormat>(f);
        for (int64_t len : {64, 128, 37, 38, 16}) {
            if (format == KvRowFormat::Q4 && len % 2 != 0) continue;
            CAPTURE(kv_row_format_name(format));
            CAPTURE(len);
            // Rows 12 bytes apart, the last one ending the buffer (the sanitizers catch reads past it).
            const int64_t n = 35, row_bytes = static_cast<int64_t>(kv_row_bytes(format, static_cast<int>(len))) + 12;
            const std::vector<float> q = random_vector(rng, len), w0 = random_vector(rng, n), out0 = random_vector(rng, len);
            std::vector<uint8_t> rows((n - 1) * row_bytes + kv_row_bytes(format, static_cast<int>(len)));
            std::vector<float> values(n * len);
            for (int64_t i = 0; i < n; ++i) {
                const std::vector<float> x = random_vector(rng, len);
                kv_store_row(format, x.data(), static_cast<int>(len), rows.data() + i * row_bytes);
                kv_load_row(format, rows.data() + i * row_bytes, static_cast<int>(len), values.data() + i * len);
            }
            std::vector<float> w = w0;
            const std::vector<float> nan_row(len, NAN);
            for (int64_t i : {int64_t{2}, int64_t{7}, int64_t{20}, int64_t{33}}) {
                w[i] = 0.0f;
                uint8_t *row = rows.data() + i * row_bytes;
                if (format == KvRowFormat::Q8) {
                    const float nan = NAN;
                    std::memcpy(row, &nan, sizeof nan);
                } else if (format == KvRowFormat::Q4) {
                    const uint16_t nan = 0x7e00;
                    std::memcpy(row, &nan, sizeof nan);
                } else {
                    kv_store_row(format, nan_row.data(), static_cast<int>(len), row);
                }
            }
            std::vector<float> scores(n + 1, -7.0f);
            const float *query = q.data();
            cpu::dot_kv_rows(format, &query, 1, rows.data(), row_bytes, n, len, scores.data(), n);
            CHECK(scores[n] == -7.0f);
            for (int64_t i = 0; i < n; ++i) {
                if (w[i] == 0.0f) continue;  // the NaN rows
                double want = 0.0, mag = 0.0;
                for (int64_t j = 0; j < len; ++j) {
                    want += static_cast<double>(q[j]) * values[i * len + j];
                    mag += std::fabs(static_cast<double>(q[j]) * values[i * len + j]);
                }
                CHECK(std::fabs(scores[i] - want) <= 1e-5 * mag);
            }
            std::vector<float> out = out0;
            out.push_back(-7.0f);
            float *out_row = out.data();
            cpu::weighted_kv_row_sum(format, &out_row, 1, w.data(), n, rows.data(), row_bytes, n, len);
            CHECK(out[len] == -7.0f);
            for (int64_t j = 0; j < len; ++j) {
                double want = out0[j], mag = std::fabs(out0[j]);
                for (int64_t i = 0; i < n; ++i) {
                    if (w[i] == 0.0f) continue;
                    want += static_cast<double>(w[i]) * values[i * len + j];
                    mag += std::fabs(static_cast<double>(w[i]) * values[i * len + j]);
                }
                CHECK(std::fabs(out[j] - want) <= 1e-5 * mag);
            }
        }
    }

    // Several queries at once (a prompt's tile): every score and output has exactly the bits it
    // has alone, for query counts below, at and past the kernels' register blocks, each query with
    // its own zero weights, in every row format.
    for (uint32_t f = 0; f < kKvRowFormatCount; ++f) {
        const auto format = static_cast<KvRowFormat>(f);
        for (int64_t len : {64, 128, 38}) {
            for (int m : {2, 4, 5, 11}) {
                CAPTURE(kv_row_format_name(format));
                CAPTURE(len);
                CAPTURE(m);
                const int64_t n = 37, row_bytes = static_cast<int64_t>(kv_row_bytes(format, static_cast<int>(len))) + 4;
                std::vector<uint8_t> rows((n - 1) * row_bytes + kv_row_bytes(format, static_cast<int>(len)));
                for (int64_t i = 0; i < n; ++i) {
                    kv_store_row(format, random_vector(rng, len).data(), static_cast<int>(len), rows.data() + i * row_bytes);
                }
                const std::vector<float> qs = random_vector(rng, m * len);
                std::vector<float> w = random_vector(rng, m * n);
                for (int j = 0; j < m; ++j) w[j * n + (j * 5) % n] = w[j * n + (j * 3 + 1) % n] = 0.0f;
                const std::vector<float> out0 = random_vector(rng, m * len);
                std::vector<const float *> queries(m);
                for (int j = 0; j < m; ++j) queries[j] = qs.data() + j * len;
                std::vector<float> together(m * n), alone(m * n);
                cpu::dot_kv_rows(format, queries.data(), m, rows.data(), row_bytes, n, len, together.data(), n);
                for (int j = 0; j < m; ++j) {
                    cpu::dot_kv_rows(format, &queries[j], 1, rows.data(), row_bytes, n, len, alone.data() + j * n, n);
                }
                CHECK(std::memcmp(together.data(), alone.data(), together.size() * sizeof(float)) == 0);

                std::vector<float> out_together = out0, out_alone = out0;
                std::vector<float *> outs(m);
                for (int j = 0; j < m; ++j) outs[j] = out_together.data() + j * len;
                cpu::weighted_kv_row_sum(format, outs.data(), m, w.data(), n, rows.data(), row_bytes, n, len);
                for (int j = 0; j < m; ++j) {
                    float *one = out_alone.data() + j * len;
                    cpu::weighted_kv_row_sum(format, &one, 1, w.data() + j * n, n, rows.data(), row_bytes, n, len);
                }
                CHECK(std::memcmp(out_together.data(), out_alone.data(), out_together.size() * sizeof(float)) == 0);
            }
        }
    }
}

}  // namespace

TEST_CASE("matmul: a NaN activation makes its outputs NaN (scalar)") { check_nan_propagation(cpu::KernelIsa::Scalar); }

TEST_CASE("matmul: a NaN activation makes its outputs NaN (SIMD levels)") {
    for (cpu::KernelIsa isa : simd_levels()) {
        CAPTURE(cpu::kernel_isa_name(isa));
        check_nan_propagation(isa);
    }
}

TEST_CASE("interleaved Q4_0, Q8_0, Q4_K, Q5_K and Q6_K: only a rearrangement, and lookups read it back (every level that runs it)") {
    check_interleaved_layout(cpu::KernelIsa::Scalar);
    for (cpu::KernelIsa isa : simd_levels()) {
        if (kernel_table(isa).interleaved_support == 0) continue;
        CAPTURE(cpu::kernel_isa_name(isa));
        check_interleaved_layout(isa);
    }
}

TEST_CASE("interleaving is preferred exactly by the levels with kernels for it, for Q4_0, Q8_0 and the K-quants") {
    IsaGuard guard;
    REQUIRE(cpu::set_kernel_isa(cpu::KernelIsa::Scalar));
    CHECK_FALSE(cpu::interleaving_preferred(TensorType::Q4_0));
    for (cpu::KernelIsa isa : simd_levels()) {
        CAPTURE(cpu::kernel_isa_name(isa));
        REQUIRE(cpu::set_kernel_isa(isa));
        // Every SIMD level but ARMv8.0 NEON, which has no sdot to put one row in each lane.
        const bool x8_level = isa != cpu::KernelIsa::Neon;
        for (TensorType type : kAllTypes) {
            CAPTURE(std::string(type_name(type)));
            const bool x8_type = type == TensorType::Q4_0 || type == TensorType::Q8_0 || is_k(type);
            CHECK(cpu::interleaving_preferred(type) == (x8_level && x8_type));
        }
    }
}

TEST_CASE("dequantize and dequantize_rows equal the reference exactly (scalar)") { check_dequantize(cpu::KernelIsa::Scalar); }

TEST_CASE("dequantize and dequantize_rows equal the reference exactly (SIMD levels)") {
    for (cpu::KernelIsa isa : simd_levels()) {
        CAPTURE(cpu::kernel_isa_name(isa));
        check_dequantize(isa);
    }
}

TEST_CASE("vector operations against double-precision references (scalar)") { check_vector_ops(cpu::KernelIsa::Scalar); }

TEST_CASE("vector operations against double-precision references (SIMD levels)") {
    for (cpu::KernelIsa isa : simd_levels()) {
        CAPTURE(cpu::kernel_isa_name(isa));
        check_vector_ops(isa);
    }
}

TEST_CASE("half conversions: every kernel level gives fp16.h's halves and floats, bit for bit") {
    // The F16 KV rows are written by these (rolling re-rotates keys through them) and read by every
    // backend's codec (kv_row_codec.h), so the bits must be fp16.h's: specials, ties and all.
    std::vector<float> values = {0.0f,     -0.0f,    1.0f,     65504.0f, 65519.0f,     65520.0f,     -65520.0f, 1e9f,      0x1p-14f,
                                 0x1p-24f, 0x1p-25f, 0x3p-26f, 0x1p-26f, 1 + 0x1p-11f, 1 + 0x3p-11f, INFINITY,  -INFINITY, NAN};
    std::mt19937 rng(5);
    while (values.size() < 4099) values.push_back(float_of(static_cast<uint32_t>(rng())));
    std::vector<uint16_t> expected_halves(values.size());
    for (size_t i = 0; i < values.size(); ++i) expected_halves[i] = fp32_to_fp16(values[i]);
    std::vector<float> expected_floats(65536);
    std::vector<uint16_t> every_half(65536);
    for (uint32_t h = 0; h < 65536; ++h) {
        every_half[h] = static_cast<uint16_t>(h);
        expected_floats[h] = fp16_to_fp32(static_cast<uint16_t>(h));
    }
    std::vector<cpu::KernelIsa> levels = simd_levels();
    levels.push_back(cpu::KernelIsa::Scalar);
    for (cpu::KernelIsa isa : levels) {
        const cpu::detail::KernelTable &k = kernel_table(isa);
        INFO("level " << cpu::kernel_isa_name(isa));
        if (!k.floats_to_halves) continue;  // the portable loops of kernels.cpp: fp16.h itself
        for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{64}, values.size()}) {
            std::vector<uint16_t> halves(n);
            k.floats_to_halves(values.data(), halves.data(), static_cast<int64_t>(n));
            CHECK(std::equal(halves.begin(), halves.end(), expected_halves.begin()));
        }
        std::vector<float> floats(every_half.size());
        k.halves_to_floats(every_half.data(), floats.data(), static_cast<int64_t>(floats.size()));
        CHECK(std::memcmp(floats.data(), expected_floats.data(), floats.size() * sizeof(float)) == 0);
    }
}

// add_query_stats at every level: kv_stats_add_query's bits on the slots the query sees (by the
// seers' range), nothing on the others, for counts with and without a tail, weights at, above and
// below the threshold, and a proxy query or not.
TEST_CASE("add_query_stats: every level gives kv_stats_add_query's bits on the slots a query sees") {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    std::uniform_int_distribution<int> seer(-2, 9);
    std::vector<cpu::KernelIsa> levels = simd_levels();
    levels.insert(levels.begin(), cpu::KernelIsa::Scalar);
    for (int64_t n : {0, 1, 7, 8, 9, 37, 64}) {
        for (int32_t query : {0, 3, 7}) {
            for (bool proxy : {false, true}) {
                CAPTURE(n);
                CAPTURE(query);
                CAPTURE(proxy);
                const float threshold = 0.25f, persistence_weight = 0.81f;
                std::vector<float> w(static_cast<size_t>(n));
                std::vector<int32_t> first(w.size()), last(w.size());
                std::vector<SlotStats> start(w.size()), want(w.size());
                for (size_t s = 0; s < w.size(); ++s) {
                    w[s] = s % 5 == 0 ? threshold : unit(rng);
                    first[s] = seer(rng);
                    last[s] = std::max(first[s] + seer(rng), -1);
                    start[s] = SlotStats{unit(rng) * 9, unit(rng), float(s % 11), unit(rng), unit(rng) * 3};
                    const bool sees = first[s] <= query && query <= last[s];
                    want[s] = sees ? kv_stats_add_query(start[s], w[s], threshold, persistence_weight, proxy) : start[s];
                }
                for (cpu::KernelIsa isa : levels) {
                    CAPTURE(cpu::kernel_isa_name(isa));
                    IsaGuard guard;
                    REQUIRE(cpu::set_kernel_isa(isa));
                    std::vector<float> fields[5];
                    for (int f = 0; f < 5; ++f) fields[f].resize(w.size());
                    for (size_t s = 0; s < w.size(); ++s) {
                        fields[0][s] = start[s].accumulated, fields[1][s] = start[s].squared, fields[2][s] = start[s].steps;
                        fields[3][s] = start[s].last, fields[4][s] = start[s].persistence;
                    }
                    const cpu::QueryStats stats{fields[0].data(), fields[1].data(), fields[2].data(), fields[3].data(), fields[4].data()};
                    cpu::add_query_stats(stats, w.data(), first.data(), last.data(), n, query, threshold, persistence_weight, proxy);
                    size_t wrong = 0;
                    for (size_t s = 0; s < w.size(); ++s) {
                        const SlotStats got{fields[0][s], fields[1][s], fields[2][s], fields[3][s], fields[4][s]};
                        wrong += std::memcmp(&got, &want[s], sizeof got) != 0;
                    }
                    CHECK(wrong == 0);
                }
            }
        }
    }
}
