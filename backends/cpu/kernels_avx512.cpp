// AVX-512 kernels: F, BW, VL and VNNI (vpdpbusd). Built with those flags plus the AVX2 file's
// (CMakeLists.txt does it for every *_avx512.cpp) and called only after kernels.cpp has checked
// the CPU and that the OS saves the 512-bit registers.
//
// What 512-bit registers and VNNI speed up is the compute-bound work: prompts (groups of 4 tokens)
// against Q4_0, Q8_0, F16 and F32 weights, decoding against Q6_K, whose unpacking (not memory)
// limited the AVX2 kernel, both against Q5_K in the file's layout, where the 5-bit unpacking
// limited it likewise (one thread: prompts 1.6-1.8x as fast; decoding 1.3x from cache, 1.1x for
// weights that come from memory), and both against Q4_0, Q8_0, Q4_K and Q6_K in the interleaved
// layouts (two 8-row groups per 512-bit register, below). Decoding against F16 and F32 is bound by memory, but 64 bytes
// of a row per step take fewer instructions per byte than the AVX2 kernel's 16 (10-20% faster for
// F16 at 2 threads). The activation quantization has its own too (1.7-1.9x as fast). The rest
// calls the AVX2 kernels, which every AVX-512 CPU can run: Q4_K and Q6_K prompts in the file's
// layout, Q4_K decoding in it, and the vector operations have no 512-bit version yet.
//
// Same rules as kernels_avx2.cpp: every helper has internal linkage, and no standard-library
// templates are instantiated here (see kernels_internal.h).

// GCC 12's AVX-512 headers trip its own uninitialized-value warnings (GCC bug 105593, fixed in 13):
// the intrinsics start from _mm512_undefined_*() on purpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels_internal.h"
#include "cpu/kernels_x86_shared.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__)
#error "kernels_avx512.cpp must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni"
#endif

namespace h2o::cpu::detail {

namespace {

inline __m512i load512(const void *p) { return _mm512_loadu_si512(p); }

// Sum of the lower (half 0) or upper (half 1) 8 floats of v.
inline float hsum_half(__m512 v, int half) {
    const __m256 h = half == 0 ? _mm512_castps512_ps256(v) : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// ---- activation quantization ----------------------------------------------------------------
//
// Eight blocks of 32 values at a time: their maxima, and their quant sums, fold into one register
// each (fold8) instead of one horizontal reduction per block, and their scales come from one
// division. A whole token group takes the 8 blocks of an activation pair (2 blocks x 4 tokens,
// whose scales and offsets ActBlockPair keeps side by side); a group of fewer tokens (decoding,
// the tail of a prompt) takes 8 consecutive blocks of one token, so that no work goes to padding.
// The bytes are those of quantize_block_q8 in kernels.cpp: the same maximum, the same IEEE
// divisions for the scale and its inverse, the same x * (1/d) and rounding.

// Lane i (of 8): the 16 lanes of r[i] combined by op, an associative and commutative operation
// on the lanes' bits (max or add of int32: the shuffles only move bits).
template <typename Op>
inline __m256 fold8(const __m512 r[8], Op op) {
    __m512 h[4], q[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {  // h[i]: [r[2i] in 8 lanes | r[2i+1] in 8 lanes]
        h[i] = op(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                  _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {  // quarter k of q[i]: r[4i + k] in 4 lanes
        q[i] = op(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                  _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    // Quarter k: [r[k], r[4 + k], r[k], r[4 + k]] after two more steps within 128 bits.
    const __m512 x = op(_mm512_unpacklo_ps(q[0], q[1]), _mm512_unpackhi_ps(q[0], q[1]));
    const __m512 y = op(x, _mm512_shuffle_ps(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), y));
}

// 16 values times their block's 1/d, rounded as roundf() (half away from zero: truncate, then
// step away from zero when the dropped fraction is at least one half; exact for |v| < 2^23) and
// kept only in [-127, 127], 0 otherwise as in scalar (1/d overflowed, or an inf or NaN).
inline __m512i quantize16(__m512 v, __m512 id) {
    const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u)), one = _mm512_castps_si512(_mm512_set1_ps(1.0f));
    const __m512 p = _mm512_mul_ps(v, id);
    const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(p, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    // 0xEA is (A & B) | C: p's sign on 1.0.
    const __m512 step = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(p), sign, one, 0xEA));
    const __m512 r = _mm512_mask_add_ps(t, up, t, step);
    return _mm512_maskz_cvttps_epi32(_mm512_cmp_ps_mask(_mm512_abs_ps(r), _mm512_set1_ps(127.0f), _CMP_LE_OQ), r);
}

// Where quantize_blocks8 reads block i (zeros where null) and writes it: 16 quants at lo[i] and
// at hi[i], the scale at d[i], 8 * the quants' sum at offset[i]; nothing where lo[i] is null.
struct Blocks8 {
    const float *src[8];
    int8_t *lo[8], *hi[8];
    float *d[8];
    int32_t *offset[8];
};

void quantize_blocks8(const Blocks8 &blk) {
    const __m512i abs_bits = _mm512_set1_epi32(0x7FFFFFFF);
    auto max_i32 = [](__m512 a, __m512 b) { return _mm512_castsi512_ps(_mm512_max_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b))); };
    auto add_i32 = [](__m512 a, __m512 b) { return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b))); };
    __m512 v[8][2], amax[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        if (blk.src[i] != nullptr) {
            v[i][0] = _mm512_loadu_ps(blk.src[i]);
            v[i][1] = _mm512_loadu_ps(blk.src[i] + 16);
        } else {
            v[i][0] = v[i][1] = _mm512_setzero_ps();
        }
        // |x| compared as integers: for floats without a sign the order is the same, and every
        // inf or NaN lies above FLT_MAX, so the maximum also says whether the block is finite.
        amax[i] = max_i32(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v[i][0]), abs_bits)),
                          _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v[i][1]), abs_bits)));
    }
    const __m256 top = fold8(amax, max_i32);
    const __mmask8 finite = _mm256_cmple_epi32_mask(_mm256_castps_si256(top), _mm256_set1_epi32(0x7F7FFFFF));
    const __m256 d = _mm256_mask_div_ps(_mm256_set1_ps(__builtin_nanf("")), finite, top, _mm256_set1_ps(127.0f));
    const __mmask8 invertible = finite & _mm256_cmp_ps_mask(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    alignas(32) float id[8], scale[8];
    alignas(32) int32_t offset[8];
    _mm256_store_ps(id, _mm256_maskz_div_ps(invertible, _mm256_set1_ps(1.0f), d));
    _mm256_store_ps(scale, d);
    __m512 sums[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        const __m512 idv = _mm512_set1_ps(id[i]);
        const __m512i q0 = quantize16(v[i][0], idv), q1 = quantize16(v[i][1], idv);
        if (blk.lo[i] != nullptr) {
            _mm_storeu_si128(reinterpret_cast<__m128i *>(blk.lo[i]), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(blk.hi[i]), _mm512_cvtsepi32_epi8(q1));
        }
        sums[i] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
    }
    _mm256_store_si256(reinterpret_cast<__m256i *>(offset), _mm256_slli_epi32(_mm256_castps_si256(fold8(sums, add_i32)), 3));
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        if (blk.lo[i] == nullptr) continue;
        *blk.d[i] = scale[i];
        *blk.offset[i] = offset[i];
    }
}

void quantize_activations_avx512(const float *x, int64_t cols, int64_t n_tokens, int64_t g0, int64_t g1, ActBlockPair *act) {
    const int64_t n_blocks = cols / 32, n_pairs = (n_blocks + 1) / 2;
    for (int64_t g = g0; g < g1; ++g) {
        ActBlockPair *pairs = act + g * n_pairs;
        const int64_t n_tok = n_tokens - g * kGroupTokens;
        Blocks8 blk;
        if (n_tok >= kGroupTokens) {
            // Block i is half i / 4 of the pair, for token i % 4: ActBlockPair's order of d and
            // offset. A missing odd block is quantized from zeros, which writes the zeros the
            // scalar path does, so every byte of the pair is written once.
            for (int64_t pair = 0; pair < n_pairs; ++pair) {
                ActBlockPair &a = pairs[pair];
                for (int i = 0; i < 8; ++i) {
                    const int t = i % 4, half = i / 4;
                    const int64_t b = 2 * pair + half;
                    blk.src[i] = b < n_blocks ? x + (g * kGroupTokens + t) * cols + b * 32 : nullptr;
                    blk.lo[i] = &a.lo[t][16 * half];
                    blk.hi[i] = &a.hi[t][16 * half];
                    blk.d[i] = &a.d[i];
                    blk.offset[i] = &a.offset[i];
                }
                quantize_blocks8(blk);
            }
            continue;
        }
        // Padding tokens and a missing odd block stay zero.
        for (int64_t pair = 0; pair < n_pairs; ++pair) {
            auto *bytes = reinterpret_cast<__m512i *>(pairs + pair);
            for (size_t i = 0; i < sizeof(ActBlockPair) / 64; ++i) _mm512_storeu_si512(bytes + i, _mm512_setzero_si512());
        }
        for (int t = 0; t < n_tok; ++t) {
            for (int64_t b0 = 0; b0 < n_blocks; b0 += 8) {
                for (int i = 0; i < 8; ++i) {
                    const int64_t b = b0 + i;
                    if (b >= n_blocks) {  // past the row: zeros in, nothing out
                        blk.src[i] = nullptr;
                        blk.lo[i] = nullptr;
                        continue;
                    }
                    ActBlockPair &a = pairs[b / 2];
                    const int half = static_cast<int>(b % 2);
                    blk.src[i] = x + (g * kGroupTokens + t) * cols + b * 32;
                    blk.lo[i] = &a.lo[t][16 * half];
                    blk.hi[i] = &a.hi[t][16 * half];
                    blk.d[i] = &a.d[half * kGroupTokens + t];
                    blk.offset[i] = &a.offset[half * kGroupTokens + t];
                }
                quantize_blocks8(blk);
            }
        }
    }
}

// ---- Q4_0 and Q8_0 weights against a token group -----------------------------------------------
//
// A 64-byte register holds the activations of one block pair for two tokens at once: a.lo[t] and
// a.lo[t+1] are adjacent in ActBlockPair, [t: b 0..15 | b+1 0..15 | t+1: b 0..15 | b+1 0..15].
// The weight pair is broadcast to match, and vpdpbusd (unsigned weight bytes times signed
// activation bytes, 4 products into each int32 lane) leaves the int32 lanes as
//   [b,t x4 | b+1,t x4 | b,t+1 x4 | b+1,t+1 x4],
// each (block, token) sum spread over 4 lanes. Each lane is then scaled by its block's weight scale
// and its (block, token)'s activation scale and accumulated in float; a token's result is the sum
// of its 8 lanes at the end of the row. The weights must be unsigned for vpdpbusd:
//   Q4_0: the nibbles (0..15) as they are, which is q + 8: subtract 8 * sum(y) = offset;
//   Q8_0: q + 128 (flipping the sign bit): subtract 128 * sum(y) = 16 * offset.
// The correction starts the first lane of each (block, token), so the integer sums stay exact.

// One activation block pair of a group, ready for every row of a tile.
struct GroupAct {
    __m512i lo[2], hi[2];  // tokens (0, 1) and (2, 3)
    __m512 d[2];           // each lane's activation scale
    __m512i init[2];       // each lane's starting value: minus the offset correction on lane 0 of 4
};

template <TensorType kType>
inline GroupAct group_act(const ActBlockPair &a) {
    const __m512 d8 = _mm512_castps256_ps512(_mm256_loadu_ps(a.d));
    const __m512i offset8 = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(a.offset)));
    GroupAct g;
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
        const int t0 = 2 * k, t1 = 2 * k + 1;
        g.lo[k] = load512(a.lo[t0]);
        g.hi[k] = load512(a.hi[t0]);
        // a.d and a.offset are ordered [b: tokens 0..3 | b+1: tokens 0..3].
        const __m512i idx =
            _mm512_setr_epi32(t0, t0, t0, t0, 4 + t0, 4 + t0, 4 + t0, 4 + t0, t1, t1, t1, t1, 4 + t1, 4 + t1, 4 + t1, 4 + t1);
        g.d[k] = _mm512_permutexvar_ps(idx, d8);
        const __m512i offset = _mm512_maskz_permutexvar_epi32(0x1111, idx, offset8);
        const __m512i correction = kType == TensorType::Q8_0 ? _mm512_slli_epi32(offset, 4) : offset;
        g.init[k] = _mm512_sub_epi32(_mm512_setzero_si512(), correction);
    }
    return g;
}

// A weight block pair as unsigned bytes in the activations' order, once for each of the two
// tokens of a register, and each lane's weight scale. Without kPair (a lone last block) the second
// block's lanes are zero (its activations are zero too).
struct WeightPair {
    __m512i lo, hi;
    __m512 d;
};

template <TensorType kType, bool kPair>
inline WeightPair weight_pair(const uint8_t *blk, const float *fp16_table) {
    constexpr int64_t kBytes = kType == TensorType::Q4_0 ? kQ4Bytes : kQ8Bytes;
    constexpr __mmask16 kFirst = 0x0F0F, kSecond = 0xF0F0;  // 32-bit lanes of block b, of block b+1
    const uint8_t *blk1 = blk + kBytes;
    // Broadcasts 16 bytes of block b (and of block b+1) into the lanes of their block.
    auto spread = [&](int64_t offset) {
        const __m512i b0 = _mm512_broadcast_i32x4(load128(blk + offset));
        return kPair ? _mm512_mask_broadcast_i32x4(b0, kSecond, load128(blk1 + offset)) : _mm512_maskz_mov_epi32(kFirst, b0);
    };
    WeightPair w;
    const __m512 d0 = _mm512_set1_ps(fp16_table[load_u16(blk)]);
    w.d = kPair ? _mm512_mask_blend_ps(kSecond, d0, _mm512_set1_ps(fp16_table[load_u16(blk1)])) : _mm512_maskz_mov_ps(kFirst, d0);
    if constexpr (kType == TensorType::Q4_0) {
        const __m512i raw = spread(2), mask = _mm512_set1_epi8(0x0F);
        w.lo = _mm512_and_si512(raw, mask);
        w.hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
    } else {
        const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
        w.lo = _mm512_xor_si512(spread(2), sign);
        w.hi = _mm512_xor_si512(spread(18), sign);
    }
    return w;
}

inline void group_step(const WeightPair &w, const GroupAct &a, __m512 acc[2]) {
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a.init[k], w.lo, a.lo[k]), w.hi, a.hi[k]);
        acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(w.d, a.d[k]), acc[k]);
    }
}

// kRows rows x the 4 tokens of group g, over the block pairs [q0, q1) (a column slice): y is set
// for the first slice and added to for the others. The activations of a pair are prepared once
// for all kRows rows.
template <TensorType kType, int kRows>
void quant_group_rows(const MatmulProblem &p, int64_t r, int64_t g, int64_t q0, int64_t q1) {
    constexpr int64_t kPairBytes = 2 * (kType == TensorType::Q4_0 ? kQ4Bytes : kQ8Bytes);
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t n_blocks = p.cols / 32, n_full = n_blocks / 2;
    const uint8_t *row[kRows];
    __m512 acc[kRows][2];
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
        row[i] = p.w + (r + i) * p.w_row_bytes;
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    }
    const int64_t q_full_end = q1 < n_full ? q1 : n_full;
    for (int64_t q = q0; q < q_full_end; ++q) {
        const GroupAct a = group_act<kType>(act[q]);
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) group_step(weight_pair<kType, true>(row[i] + q * kPairBytes, p.fp16_table), a, acc[i]);
    }
    if ((n_blocks & 1) && q1 > n_full) {  // the lone last block
        const GroupAct a = group_act<kType>(act[n_full]);
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
            group_step(weight_pair<kType, false>(row[i] + n_full * kPairBytes, p.fp16_table), a, acc[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
        for (int t = 0; t < kGroupTokens; ++t) {
            const float out = hsum_half(acc[i][t / 2], t % 2);
            float &y = p.y[(g * kGroupTokens + t) * p.rows + r + i];
            y = q0 == 0 ? out : y + out;
        }
    }
}

// ---- Q8_0 weights against one token (decoding) ----------------------------------------------
//
// A block pair of a row in the file's order, [b 0..31 | b+1 0..31], is one register; the token's
// activations are put in that order once per pair for the whole row tile (ActBlockPair holds them
// as [b 0..15 | b+1 0..15] and [b 16..31 | b+1 16..31]). vpdpbusd multiplies unsigned by signed
// bytes, so the weights go in as q + 128 (the sign bit flipped) and each block starts from -128
// times its activations' sum (16 * offset, in the block's first lane). One vpdpbusd serves 64
// weights where the AVX2 kernel needs two sign flips, maddubs, madd and an add per 32.

// The pair's activations of token t in the weights' order, and each block's starting value.
struct Q8TokenPair {
    __m512i y, init;
    __m512 d;  // the activation scale of each lane's block
};

template <bool kPair>
inline Q8TokenPair q8_token_pair(const ActBlockPair &a, int t) {
    const __m512i halves = _mm512_inserti64x4(_mm512_castsi256_si512(load256(a.lo[t])), load256(a.hi[t]), 1);
    Q8TokenPair y;
    y.y = _mm512_shuffle_i64x2(halves, halves, _MM_SHUFFLE(3, 1, 2, 0));
    y.init = _mm512_setr_epi32(-16 * a.offset[t], 0, 0, 0, 0, 0, 0, 0, kPair ? -16 * a.offset[kGroupTokens + t] : 0, 0, 0, 0, 0, 0, 0, 0);
    y.d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a.d[t]), _mm512_set1_ps(kPair ? a.d[kGroupTokens + t] : 0.0f));
    return y;
}

template <bool kPair>
inline __m512 q8_token_step(const uint8_t *blk, const Q8TokenPair &y, const float *fp16_table, __m512 acc) {
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i w = _mm512_castsi256_si512(load256(blk + 2));
    __m512 d = _mm512_set1_ps(fp16_table[load_u16(blk)]);
    if constexpr (kPair) {
        w = _mm512_inserti64x4(w, load256(blk + kQ8Bytes + 2), 1);
        d = _mm512_mask_blend_ps(0xFF00, d, _mm512_set1_ps(fp16_table[load_u16(blk + kQ8Bytes)]));
    }
    w = _mm512_xor_si512(w, sign);
    if constexpr (!kPair) w = _mm512_maskz_mov_epi32(0x00FF, w);  // no block b+1: nothing in its lanes
    const __m512i sums = _mm512_dpbusd_epi32(y.init, w, y.y);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(d, y.d), acc);
}

// Row r x token t of group g. One row at a time: tiles of 4 rows (which share each pair's
// activations) decoded Q8_0 at half the speed on the current machines (one thread, 134M Q8_0
// model: 4 rows 80-85 tok/s, 1 row 166-167; the AVX2 kernel's 4 rows 78-80).
void q8_token_row(const MatmulProblem &p, int64_t r, int64_t g, int t) {
    constexpr int64_t kPairBytes = 2 * kQ8Bytes;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t n_blocks = p.cols / 32, n_full = n_blocks / 2;
    const uint8_t *row = p.w + r * p.w_row_bytes;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t q = 0; q < n_full; ++q) {
        acc = q8_token_step<true>(row + q * kPairBytes, q8_token_pair<true>(act[q], t), p.fp16_table, acc);
    }
    if (n_blocks & 1) acc = q8_token_step<false>(row + n_full * kPairBytes, q8_token_pair<false>(act[n_full], t), p.fp16_table, acc);
    p.y[(g * kGroupTokens + t) * p.rows + r] = _mm512_reduce_add_ps(acc);
}

template <TensorType kType>
void quant_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    constexpr int kGroupRows = 4;
    constexpr int64_t kSlicePairs = 64;  // 4096 columns: 20 KiB of a group's activations stay in L1
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n_tok = p.n_tokens - g * kGroupTokens;
        if (n_tok < kGroupTokens && kType == TensorType::Q8_0) {
            for (int t = 0; t < n_tok; ++t) {
                for (int64_t r = r0; r < r1; ++r) q8_token_row(p, r, g, t);
            }
            continue;
        }
        if (n_tok < kGroupTokens) {
            kAvx2Kernels.matmul_range(p, r0, r1, g, g + 1);  // Q4_0 single tokens: interleaved unless rows % 8
            continue;
        }
        for (int64_t q0 = 0; q0 < p.n_pairs; q0 += kSlicePairs) {
            const int64_t q1 = q0 + kSlicePairs < p.n_pairs ? q0 + kSlicePairs : p.n_pairs;
            int64_t r = r0;
            for (; r + kGroupRows <= r1; r += kGroupRows) quant_group_rows<kType, kGroupRows>(p, r, g, q0, q1);
            for (; r < r1; ++r) quant_group_rows<kType, 1>(p, r, g, q0, q1);
        }
    }
}

// ---- interleaved weights (8-row groups; layouts in kernels.h) ------------------------------
//
// As in kernels_avx2.cpp (one row per 32-bit lane, activation bytes broadcast), with vpdpbusd for
// the integer sums, and two neighbouring 8-row groups at once: the same chunk of groups rg and
// rg + 1, which lie `stride` bytes apart, one in each half of a 512-bit register, so every
// unpacking, vpdpbusd and float step serves 16 rows (a 512-bit vpdpbusd does the work of two
// 256-bit ones at the same throughput on Zen 4, and at twice it on Intel cores with two 512-bit
// ports). Rows 8 rg .. 8 rg + 15 are adjacent in y, so one store takes both groups. Without kPair
// (the lone last group of a range) the high half is loaded as zeros, computed and not stored.
// Each lane does the AVX2 kernel's operations in its order, and the integer sums are exact, so
// the results have the AVX2 level's bits (a test compares them).

// The 32 bytes at p (group rg) and, with kPair, at p + stride (group rg + 1), side by side.
template <bool kPair>
inline __m512i load_groups(const uint8_t *p, int64_t stride) {
    if constexpr (!kPair) return _mm512_zextsi256_si512(load256(p));
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(p)), load256(p + stride), 1);
}

// The 8 fp16 values at p and, with kPair, the 8 at p + stride, as floats.
template <bool kPair>
inline __m512 halves_of_groups(const uint8_t *p, int64_t stride) {
    if constexpr (!kPair) return _mm512_cvtph_ps(_mm256_zextsi128_si256(load128(p)));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(load128(p)), load128(p + stride), 1));
}

// The 8 unsigned bytes at p and, with kPair, the 8 at p + stride, as floats.
template <bool kPair>
inline __m512 bytes_of_groups(const uint8_t *p, int64_t stride) {
    const __m128i low = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p));
    const __m128i both = kPair ? _mm_unpacklo_epi64(low, _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + stride))) : low;
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(both));
}

// The 4 activation bytes at p, in every 32-bit lane.
inline __m512i broadcast4(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

// Every cache line of block `blk` of group rg and, with kPair, of group rg + 1, ahead (or part
// `part` of `parts` of their lines: prefetch_block_ahead).
template <bool kPair>
inline void prefetch_groups(const uint8_t *blk, int64_t stride, int64_t bytes, int part = 0, int parts = 1) {
    prefetch_block_ahead(blk, bytes, part, parts);
    if constexpr (kPair) prefetch_block_ahead(blk + stride, bytes, part, parts);
}

// Writes (first) or adds the rows' results of tokens t0.. of group g, one register per token: 16
// rows from rg on, or 8 without kPair.
template <int kTokens, bool kPair>
inline void store_groups(const MatmulProblem &p, int64_t rg, int64_t g, int t0, bool first, const __m512 *acc) {
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) {
        float *y = p.y + (g * kGroupTokens + t0 + t) * p.rows + 8 * rg;
        if constexpr (kPair) {
            _mm512_storeu_ps(y, first ? acc[t] : _mm512_add_ps(_mm512_loadu_ps(y), acc[t]));
        } else {
            const __m256 low = _mm512_castps512_ps256(acc[t]);
            _mm256_storeu_ps(y, first ? low : _mm256_add_ps(_mm256_loadu_ps(y), low));
        }
    }
}

// Q4_0x8 and Q8_0x8: adds a block's integer sums s[t], scaled by the rows' scales dw and token
// t0 + t's activation scale (half `half` of pair a), to acc[t].
template <int kTokens>
inline void add_block_sums(const __m512i *s, __m512 dw, const ActBlockPair &a, int half, int t0, __m512 *acc) {
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) {
        const float d = a.d[half * kGroupTokens + t0 + t];
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, _mm512_set1_ps(d)), acc[t]);
    }
}

// Q4_0x8: kTokens tokens (t0.. of group g) x row groups rg (and rg + 1) over blocks [b0, b1): y is
// set for b0 == 0 and added to otherwise. kTokens = 1 decodes; 4 unpacks each chunk once for the
// group. The -8 offset is the starting value.
template <int kTokens, bool kPair>
void q4x8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t b0, int64_t b1) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t stride = (p.cols / 32) * kQ4x8Bytes;
    const uint8_t *w = p.w + rg * stride;
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 acc[kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = b0; b < b1; ++b) {
        const uint8_t *blk = w + b * kQ4x8Bytes;
        if constexpr (kTokens == 1) prefetch_groups<kPair>(blk, stride, kQ4x8Bytes);
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        __m512i s[kTokens];
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) s[t] = _mm512_set1_epi32(-a.offset[half * kGroupTokens + t0 + t]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
            const __m512i v = load_groups<kPair>(blk + 16 + 32 * c, stride);
            const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                s[t] = _mm512_dpbusd_epi32(s[t], lo, broadcast4(&a.lo[t0 + t][16 * half + 4 * c]));
                s[t] = _mm512_dpbusd_epi32(s[t], hi, broadcast4(&a.hi[t0 + t][16 * half + 4 * c]));
            }
        }
        add_block_sums<kTokens>(s, halves_of_groups<kPair>(blk, stride), a, half, t0, acc);
    }
    store_groups<kTokens, kPair>(p, rg, g, t0, b0 == 0, acc);
}

// Q8_0x8, as Q4_0x8 with 8 chunks of signed quants, which go into vpdpbusd as q + 128 (the sign bit
// flipped); the block's sum starts from -128 * sum(y) = -16 * offset to take that back.
template <int kTokens, bool kPair>
void q8x8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t b0, int64_t b1) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t stride = (p.cols / 32) * kQ8x8Bytes;
    const uint8_t *w = p.w + rg * stride;
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512 acc[kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = b0; b < b1; ++b) {
        const uint8_t *blk = w + b * kQ8x8Bytes;
        if constexpr (kTokens == 1) prefetch_groups<kPair>(blk, stride, kQ8x8Bytes);
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        __m512i s[kTokens];
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) s[t] = _mm512_set1_epi32(-16 * a.offset[half * kGroupTokens + t0 + t]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
            const __m512i u = _mm512_xor_si512(load_groups<kPair>(blk + 16 + 32 * c, stride), sign);
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                const int8_t *y = (c < 4 ? a.lo[t0 + t] : a.hi[t0 + t]) + 16 * half + 4 * (c % 4);
                s[t] = _mm512_dpbusd_epi32(s[t], u, broadcast4(y));
            }
        }
        add_block_sums<kTokens>(s, halves_of_groups<kPair>(blk, stride), a, half, t0, acc);
    }
    store_groups<kTokens, kPair>(p, rg, g, t0, b0 == 0, acc);
}

// Bit 4 of each byte of Q5_Kx8's low (kHigh false) or high nibbles of quant chunk 8j + c, from
// its qh chunk h, as kernels_avx2.cpp's q5_bit4 makes it.
template <bool kHigh>
inline __m512i q5_bit4(__m512i h, int j) {
    const __m512i down = _mm512_srli_epi16(h, static_cast<unsigned>(2 * j));
    return _mm512_and_si512(kHigh ? _mm512_slli_epi16(down, 3) : _mm512_slli_epi16(down, 4), _mm512_set1_epi8(0x10));
}

// Q4_Kx8 or Q5_Kx8 (kType), over super-blocks [s0, s1).
template <TensorType kType, int kTokens, bool kPair>
void q4kx8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t s0, int64_t s1) {
    constexpr int64_t kBlockBytes = kType == TensorType::Q5_K ? kQ5Kx8Bytes : kQ4Kx8Bytes;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t stride = (p.cols / 256) * kBlockBytes;
    const uint8_t *w = p.w + rg * stride;
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 acc[kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = s0; sb < s1; ++sb) {
        const uint8_t *blk = w + sb * kBlockBytes;
        const __m512 d = halves_of_groups<kPair>(blk, stride), dmin = halves_of_groups<kPair>(blk + 16, stride);
        for (int j = 0; j < 4; ++j) {
            if constexpr (kTokens == 1) prefetch_groups<kPair>(blk, stride, kBlockBytes, j, 4);
            const ActBlockPair &a = act[4 * sb + j];
            float min_scale[2 * kGroupTokens];
            q4k_min_scales(a, min_scale);
            __m512i s[2][kTokens];  // [sub-block 2j, 2j+1][token]
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) s[0][t] = s[1][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c) {
                const __m512i v = load_groups<kPair>(blk + 160 + 32 * (8 * j + c), stride);
                __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
                if constexpr (kType == TensorType::Q5_K) {
                    const __m512i h = load_groups<kPair>(blk + kQ4Kx8Bytes + 32 * c, stride);
                    lo = _mm512_or_si512(lo, q5_bit4<false>(h, j));
                    hi = _mm512_or_si512(hi, q5_bit4<true>(h, j));
                }
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) {
                    const int8_t *x = (c < 4 ? a.lo[t0 + t] : a.hi[t0 + t]) + 4 * (c % 4);
                    s[0][t] = _mm512_dpbusd_epi32(s[0][t], lo, broadcast4(x));
                    s[1][t] = _mm512_dpbusd_epi32(s[1][t], hi, broadcast4(x + 16));
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const __m512 step = _mm512_mul_ps(d, bytes_of_groups<kPair>(blk + 32 + 8 * (2 * j + h), stride));
                const __m512 off = _mm512_mul_ps(dmin, bytes_of_groups<kPair>(blk + 96 + 8 * (2 * j + h), stride));
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) {
                    const int k = h * kGroupTokens + t0 + t;
                    const __m512 ad = _mm512_set1_ps(a.d[k]);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[h][t]), _mm512_mul_ps(step, ad), acc[t]);
                    acc[t] = _mm512_fnmadd_ps(off, _mm512_set1_ps(min_scale[k]), acc[t]);
                }
            }
        }
    }
    store_groups<kTokens, kPair>(p, rg, g, t0, s0 == 0, acc);
}

// Q6_Kx8, as in kernels_avx2.cpp's q6kx8_rows: a scale group's 4 chunks add up in int32 from the
// starting value -32 sum(y) (q6kx8_range's table), which takes back the quants' +32, so the
// group's sum is already sum((q - 32) * y); one vpmulld by the rows' scales and the two groups of
// a block sum below 2^24, exact in float. The top bits of chunk 3 are gathered with vpternlogd, an
// and and an or in one.

// Chunks 0..3 of the scale group at p (and p + stride), unsigned (0..63).
template <bool kPair>
inline void q6x8_group_quants(const uint8_t *p, int64_t stride, __m512i q[4]) {
    const __m512i low6 = _mm512_set1_epi8(0x3F), top2 = _mm512_set1_epi8(static_cast<char>(0xC0));
    const __m512i v0 = load_groups<kPair>(p, stride), v1 = load_groups<kPair>(p + 32, stride), v2 = load_groups<kPair>(p + 64, stride);
    q[0] = _mm512_and_si512(v0, low6);
    q[1] = _mm512_and_si512(v1, low6);
    q[2] = _mm512_and_si512(v2, low6);
    // Chunk 3's bits 0-1, 2-3 and 4-5 are bits 6-7 of v0, v1 and v2, gathered from the top down;
    // bits 0-1 of every byte are clear before each 16-bit shift, so none crosses bytes.
    // 0xF8 is A | (B & C) for the operands (A, B, C).
    __m512i top = _mm512_srli_epi16(_mm512_and_si512(v0, top2), 2);
    top = _mm512_srli_epi16(_mm512_ternarylogic_epi32(top, v1, top2, 0xF8), 2);
    q[3] = _mm512_srli_epi16(_mm512_ternarylogic_epi32(top, v2, top2, 0xF8), 2);
}

// q6kx8_range's table for token t of group g: -32 sum(y) per scale group.
void q6x8_sums(const MatmulProblem &p, int64_t g, int t, int64_t s0, int64_t s1, int32_t *out) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    for (int64_t sb = s0; sb < s1; ++sb) {
        __m256i y[2];
        group_sums16(act + 4 * sb, t, y);
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const __m256i v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(y[i], 5));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + 16 * (sb - s0) + 8 * i), v);
        }
    }
}

// Over super-blocks [s0, s1), with q6kx8_range's sums (token t0 + t's at sums + t *
// kQ6Kx8SliceSums).
template <int kTokens, bool kPair>
void q6kx8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t s0, int64_t s1, const int32_t *sums) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t stride = (p.cols / 256) * kQ6Kx8Bytes;
    const uint8_t *w = p.w + rg * stride;
    __m512 acc[kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = s0; sb < s1; ++sb) {
        const uint8_t *blk = w + sb * kQ6Kx8Bytes;
        const __m512 d = halves_of_groups<kPair>(blk + kQ6Kx8D, stride);
        const int32_t *ys = sums + 16 * (sb - s0);
        for (int j = 0; j < 8; ++j) {
            if constexpr (kTokens == 1) prefetch_groups<kPair>(blk, stride, kQ6Kx8Bytes, j, 8);
            // Block 8 sb + j is half h of activation pair k: scale groups 4k + 2h (in a.lo) and
            // 4k + 2h + 1 (in a.hi), bytes 16 h on.
            const int k = j / 2, h = j % 2;
            const ActBlockPair &a = act[4 * sb + k];
            __m512i bsum[kTokens];
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) bsum[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int m = 2 * h; m < 2 * h + 2; ++m) {
                const int gi = 4 * k + m;
                __m512i q[4];
                q6x8_group_quants<kPair>(blk + 96 * gi, stride, q);
                const uint8_t *scales = blk + kQ6Kx8Scales + 8 * gi;
                const __m128i sc8 = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(scales));
                const __m512i sc = _mm512_cvtepi8_epi32(
                    kPair ? _mm_unpacklo_epi64(sc8, _mm_loadl_epi64(reinterpret_cast<const __m128i *>(scales + stride))) : sc8);
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) {
                    const int8_t *y = (m & 1 ? a.hi[t0 + t] : a.lo[t0 + t]) + 16 * h;
                    __m512i s = _mm512_set1_epi32(ys[t * kQ6Kx8SliceSums + gi]);
#pragma GCC unroll 4
                    for (int c = 0; c < 4; ++c) s = _mm512_dpbusd_epi32(s, q[c], broadcast4(y + 4 * c));
                    s = _mm512_mullo_epi32(s, sc);
                    bsum[t] = _mm512_add_epi32(bsum[t], s);
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                const __m512 ad = _mm512_set1_ps(a.d[h * kGroupTokens + t0 + t]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(bsum[t]), _mm512_mul_ps(d, ad), acc[t]);
            }
        }
    }
    store_groups<kTokens, kPair>(p, rg, g, t0, s0 == 0, acc);
}

// The pair kernels as interleaved_range and q6kx8_range call them (n_tok: 1 or kGroupTokens).
void q4x8_pair_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int n_tok, int64_t b0, int64_t b1) {
    (n_tok == 1 ? q4x8_rows<1, true> : q4x8_rows<kGroupTokens, true>)(p, rg, g, t0, b0, b1);
}
void q8x8_pair_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int n_tok, int64_t b0, int64_t b1) {
    (n_tok == 1 ? q8x8_rows<1, true> : q8x8_rows<kGroupTokens, true>)(p, rg, g, t0, b0, b1);
}
template <TensorType kType>
void q4kx8_pair_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int n_tok, int64_t s0, int64_t s1) {
    (n_tok == 1 ? q4kx8_rows<kType, 1, true> : q4kx8_rows<kType, kGroupTokens, true>)(p, rg, g, t0, s0, s1);
}
void q6kx8_pair_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int n_tok, int64_t s0, int64_t s1, const int32_t *sums) {
    (n_tok == 1 ? q6kx8_rows<1, true> : q6kx8_rows<kGroupTokens, true>)(p, rg, g, t0, s0, s1, sums);
}

// ---- Q6_K weights against one token (decoding) ----------------------------------------------
//
// The output projection of the common Q4_0 and Q4_K_M files is Q6_K, and at 6.56 bits a weight its
// unpacking, not memory, limited the AVX2 kernel. Here a 64-byte register holds one block pair k
// of a super-block (blocks 2k, 2k+1) in the activations' order, as 16-byte chunks
//   [2k: 0..15 | 2k+1: 0..15 | 2k: 16..31 | 2k+1: 16..31]   (the layout of a.lo[t] then a.hi[t]),
// each chunk one of Q6_K's 16-element scale groups: 4k, 4k+2, 4k+1, 4k+3. In the file, blocks 2k
// and 2k+1 lie in half h = k / 2 as its blocks i0 = 2 (k & 1) and i0 + 1: their low 4 bits are
// the low (i0 = 0) or high (i0 = 2) nibbles of ql[64h + 0..31] and ql[64h + 32..63], their top 2
// bits are bits 2 i0 and 2 i0 + 2 of qh[32h + 0..31]. Products of |q| and the activation with q's
// sign (maddubs) fit int16, and vpdpwssd applies the int16 scales while adding into int32.

// Quants of pair k of a Q6_K super-block, signed (-32..31), in the chunk order above.
inline __m512i q6_pair_quants(const uint8_t *blk, int k) {
    const int h = k / 2, i0 = 2 * (k & 1);
    const __m512i ql = load512(blk + 64 * h);
    const __m512i qh = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 128 + 32 * h)));
    // ql bytes [0..15 | 32..47 | 16..31 | 48..63] and qh bytes [0..15 | 0..15 | 16..31 | 16..31].
    const __m512i low_src = _mm512_shuffle_i64x2(ql, ql, _MM_SHUFFLE(3, 1, 2, 0));
    const __m512i high_src = _mm512_shuffle_i64x2(qh, qh, _MM_SHUFFLE(1, 1, 0, 0));
    // Shifts in 16-bit lanes: the bits kept (masked below) never cross from the other byte.
    const __m512i low = _mm512_and_si512(_mm512_srli_epi16(low_src, 4 * (k & 1)), _mm512_set1_epi8(0x0F));
    // Bits 2 i0 (block 2k's chunks) and 2 i0 + 2 (block 2k+1's) of each qh byte.
    const int64_t s0 = (2 * i0) * 0x0001000100010001LL, s1 = (2 * i0 + 2) * 0x0001000100010001LL;
    const __m512i bit_shift = _mm512_setr_epi64(s0, s0, s1, s1, s0, s0, s1, s1);
    const __m512i top = _mm512_and_si512(_mm512_srlv_epi16(high_src, bit_shift), _mm512_set1_epi8(3));
    return _mm512_sub_epi8(_mm512_or_si512(low, _mm512_slli_epi16(top, 4)), _mm512_set1_epi8(32));
}

// kRows Q6_K rows x one token (token t of group g).
template <int kRows>
void q6_token_rows(const MatmulProblem &p, int64_t r, int64_t g, int t) {
    constexpr int64_t kQ6KBytes = 210;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *row[kRows];
    __m512 acc[kRows];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
        row[i] = p.w + (r + i) * p.w_row_bytes;
        acc[i] = _mm512_setzero_ps();
    }
    // int16 lanes of chunk c take scale group [4k, 4k+2, 4k+1, 4k+3][c] of the super-block.
    __m512i scale_idx[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        const int64_t c0 = 4 * k, c1 = 4 * k + 2, c2 = 4 * k + 1, c3 = 4 * k + 3;
        const int64_t q0 = c0 * 0x0001000100010001LL, q1 = c1 * 0x0001000100010001LL;
        const int64_t q2 = c2 * 0x0001000100010001LL, q3 = c3 * 0x0001000100010001LL;
        scale_idx[k] = _mm512_setr_epi64(q0, q0, q1, q1, q2, q2, q3, q3);
    }
    for (int64_t sb = 0; sb < p.cols / 256; ++sb) {
        const ActBlockPair *a = act + 4 * sb;
        __m512i y[4];
        __m512 ad[4];  // each int32 lane's activation scale: [2k x4 | 2k+1 x4 | 2k x4 | 2k+1 x4]
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            y[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[k].lo[t]))),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[k].hi[t])), 1);
            ad[k] = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(a[k].d[t]), _mm512_set1_ps(a[k].d[kGroupTokens + t]));
        }
#pragma GCC unroll 8
        for (int i = 0; i < kRows; ++i) {
            const uint8_t *blk = row[i] + sb * kQ6KBytes;
            const __m512i scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(load128(blk + 192)));
            __m512 sums = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) {
                const __m512i q = q6_pair_quants(blk, k);
                const __m512i y_signed = _mm512_mask_sub_epi8(y[k], _mm512_movepi8_mask(q), _mm512_setzero_si512(), y[k]);
                const __m512i prod = _mm512_maddubs_epi16(_mm512_abs_epi8(q), y_signed);
                const __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), prod, _mm512_permutexvar_epi16(scale_idx[k], scales));
                sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), ad[k], sums);
            }
            acc[i] = _mm512_fmadd_ps(sums, _mm512_set1_ps(p.fp16_table[load_u16(blk + 208)]), acc[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) p.y[(g * kGroupTokens + t) * p.rows + r + i] = _mm512_reduce_add_ps(acc[i]);
}

void q6_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    constexpr int kTokenRows = 4;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n_tok = p.n_tokens - g * kGroupTokens;
        if (n_tok >= kGroupTokens) {
            kAvx2Kernels.matmul_range(p, r0, r1, g, g + 1);  // prompts: the AVX2 group kernel
            continue;
        }
        for (int t = 0; t < n_tok; ++t) {
            int64_t r = r0;
            for (; r + kTokenRows <= r1; r += kTokenRows) q6_token_rows<kTokenRows>(p, r, g, t);
            for (; r < r1; ++r) q6_token_rows<1>(p, r, g, t);
        }
    }
}

// ---- Q5_K weights (the file's layout) -------------------------------------------------------
//
// Matrices whose rows are a multiple of 8 run interleaved (q4kx8_rows above); these kernels take
// the others.
//
// The AVX2 kernel unpacks a super-block one block pair at a time, into registers whose lanes hold
// two blocks in the activations' lo/hi order, so every pair needs its own integer sums and float
// work. Here the 128 quant bytes become four 64-byte registers with one lane-to-block map: 32-bit
// lane m of 16-byte quarter k holds 4 quants of block 2k + (m & 1). The four vpdpbusd of a token
// then add into one int32 register per super-block, and the float work is per super-block.
//
// In the file, byte l of nibble group k (32 bytes at 48 + 32k) holds element l of block 2k in its
// low nibble and of block 2k+1 in its high nibble; bit 2k (2k+1) of qh[l] (at 16) is that
// element's bit 4. Quarter k of register 0 takes bytes 0..15 of group k, its even lanes the low
// nibbles (lane m: elements 4m..4m+3 of block 2k) and its odd lanes the high nibbles (block 2k+1);
// register 1 takes the same bytes with their dwords swapped in pairs, so lane m holds elements
// 4 (m ^ 1).. and the two use every nibble once. Registers 2 and 3 do the same with bytes 16..31
// (elements 16..31). The activations are laid out to match (Q5KAct) once per column slice and
// token, and every row tile reads them.

constexpr int64_t kQ5KBytes = 176;

// Two quant registers from 16 bytes of each nibble group (v, quarter k from group k) and the qh
// bytes of the same elements (h, in every quarter): v as it is, and v with its dwords swapped.
inline void q5k_quant_pair(__m512i v, __m512i h, __m512i *q) {
    const __m512i mask = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(16);
    // Each byte's qh bit: bit 2k + (m & 1) in every byte of lane m of quarter k.
    const __m512i which = _mm512_setr_epi32(0x01010101, 0x02020202, 0x01010101, 0x02020202, 0x04040404, 0x08080808, 0x04040404, 0x08080808,
                                            0x10101010, 0x20202020, 0x10101010, 0x20202020, 0x40404040, static_cast<int>(0x80808080u),
                                            0x40404040, static_cast<int>(0x80808080u));
#pragma GCC unroll 2
    for (int s = 0; s < 2; ++s) {
        const __m512i vs = s == 0 ? v : _mm512_shuffle_epi32(v, _MM_PERM_CDAB);
        const __m512i hs = s == 0 ? h : _mm512_shuffle_epi32(h, _MM_PERM_CDAB);
        // Odd lanes shift their high nibbles down; the mask keeps 4 bits of every byte.
        const __m512i nib = _mm512_and_si512(_mm512_mask_srli_epi32(vs, 0xAAAA, vs, 4), mask);
        q[s] = _mm512_mask_add_epi8(nib, _mm512_test_epi8_mask(hs, which), nib, bit4);
    }
}

// The four quant registers of a Q5_K super-block (unsigned, 0..31).
inline void q5k_quants(const uint8_t *blk, __m512i q[4]) {
    const __m512i g01 = load512(blk + 48), g23 = load512(blk + 112);  // 16-byte quarters: [0a 0b 1a 1b], [2a 2b 3a 3b]
    q5k_quant_pair(_mm512_shuffle_i32x4(g01, g23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_broadcast_i32x4(load128(blk + 16)), q);
    q5k_quant_pair(_mm512_shuffle_i32x4(g01, g23, _MM_SHUFFLE(3, 1, 3, 1)), _mm512_broadcast_i32x4(load128(blk + 32)), q + 2);
}

// The activations of one super-block for kTokens tokens (1: decoding; a group's 4), in the lane
// order of q5k_quants: y[t][j] meets quant register j. A token's integer sums fold into kFolded
// registers (q5k_rows), and ad and ys hold each of their lanes' activation scale a and a * sum(y),
// the factor of the block's min.
template <int kTokens>
struct alignas(64) Q5KAct {
    static constexpr int kFolded = kTokens == 1 ? 1 : 2;
    int8_t y[kTokens][4][64];
    float ad[kFolded][16];
    float ys[kFolded][16];
};

// Q5KAct for super-blocks [s0, s1) of tokens t0.. of group g. Lane m of quarter k of register j
// holds elements 4e..4e+3 of block 2k + (m & 1), e = m (j = 0, 2) or m ^ 1 (j = 1, 3): in the lo
// (j < 2) or hi bytes of activation pair k, dword 4 (m & 1) + e of that token's 32.
template <int kTokens>
void q5k_act(const MatmulProblem &p, int64_t g, int t0, int64_t s0, int64_t s1, Q5KAct<kTokens> *out) {
    constexpr int kFolded = Q5KAct<kTokens>::kFolded;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    // Indices into the dwords of pairs [0 | 1] (0..15) and [2 | 3] (16..31): 8k + 4 (m & 1) + e.
    const __m512i idx[2] = {_mm512_setr_epi32(0, 5, 2, 7, 8, 13, 10, 15, 16, 21, 18, 23, 24, 29, 26, 31),
                            _mm512_setr_epi32(1, 4, 3, 6, 9, 12, 11, 14, 17, 20, 19, 22, 25, 28, 27, 30)};
    for (int64_t sb = s0; sb < s1; ++sb) {
        const ActBlockPair *a = act + 4 * sb;
        Q5KAct<kTokens> &o = out[sb - s0];
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) {
            const int tt = t0 + t;
#pragma GCC unroll 2
            for (int half = 0; half < 2; ++half) {
                auto bytes = [&](int k) {
                    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(half == 0 ? a[k].lo[tt] : a[k].hi[tt]));
                };
                const __m512i z01 = _mm512_inserti64x4(_mm512_castsi256_si512(bytes(0)), bytes(1), 1);
                const __m512i z23 = _mm512_inserti64x4(_mm512_castsi256_si512(bytes(2)), bytes(3), 1);
#pragma GCC unroll 2
                for (int s = 0; s < 2; ++s) _mm512_store_si512(o.y[t][2 * half + s], _mm512_permutex2var_epi32(z01, idx[s], z23));
            }
        }
        // Folded register j, lane m of quarter k: block 2k + (m & 1) of token 2j + (m >> 1), or for
        // one token, the partial sums of block 2k + (m & 1), whose min counts once (lanes 0, 1).
        for (int j = 0; j < kFolded; ++j) {
            for (int k = 0; k < 4; ++k) {
                for (int m = 0; m < 4; ++m) {
                    const int i = (m & 1) * kGroupTokens + (kTokens == 1 ? t0 : 2 * j + (m >> 1));
                    const float d = a[k].d[i];
                    o.ad[j][4 * k + m] = d;
                    o.ys[j][4 * k + m] = kTokens == 1 && m >= 2 ? 0.0f : d * static_cast<float>(a[k].offset[i] / 8);
                }
            }
        }
    }
}

// kRows rows x kTokens tokens (t0.. of group g) over super-blocks [s0, s1), with their Q5KAct
// (act[0] for s0): y is set for s0 == 0 and added to otherwise. For a group, the 4 tokens' sums
// fold into 2 registers (vpunpck{l,h}qdq and an add): lane m of quarter k holds block
// 2k + (m & 1) of token 2j + (m >> 1), so each lane is one (block, token) and one multiply-add
// scales them all.
template <int kTokens, int kRows>
void q5k_rows(const MatmulProblem &p, int64_t r, int64_t g, int t0, int64_t s0, int64_t s1, const Q5KAct<kTokens> *act) {
    constexpr int kFolded = Q5KAct<kTokens>::kFolded;
    const uint8_t *row[kRows];
    __m512 acc[kRows][kFolded];
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
        row[i] = p.w + (r + i) * p.w_row_bytes;
#pragma GCC unroll 2
        for (int j = 0; j < kFolded; ++j) acc[i][j] = _mm512_setzero_ps();
    }
    const __m128i identity = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // Each lane's block, 2k + (m & 1) for lane m of quarter k: where its scale and min come from.
    const __m512i block_of_lane = _mm512_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7);
    for (int64_t sb = s0; sb < s1; ++sb) {
        const Q5KAct<kTokens> &a = act[sb - s0];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
            const uint8_t *blk = row[i] + sb * kQ5KBytes;
            __m512i q[4];
            q5k_quants(blk, q);
            __m512i s[kTokens];
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                s[t] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], _mm512_load_si512(a.y[t][0]));
#pragma GCC unroll 3
                for (int j = 1; j < 4; ++j) s[t] = _mm512_dpbusd_epi32(s[t], q[j], _mm512_load_si512(a.y[t][j]));
            }
            __m512i f[kFolded];
            if constexpr (kTokens == 1) {
                f[0] = s[0];
            } else {
#pragma GCC unroll 2
                for (int j = 0; j < 2; ++j) {
                    f[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(s[2 * j], s[2 * j + 1]), _mm512_unpackhi_epi64(s[2 * j], s[2 * j + 1]));
                }
            }
            __m256 d8, m8;
            k_affine_scales(blk, p.fp16_table, identity, &d8, &m8);
            const __m512 wd = _mm512_permutexvar_ps(block_of_lane, _mm512_castps256_ps512(d8));
            const __m512 wm = _mm512_permutexvar_ps(block_of_lane, _mm512_castps256_ps512(m8));
#pragma GCC unroll 2
            for (int j = 0; j < kFolded; ++j) {
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(f[j]), _mm512_mul_ps(wd, _mm512_load_ps(a.ad[j])), acc[i][j]);
                acc[i][j] = _mm512_fnmadd_ps(wm, _mm512_load_ps(a.ys[j]), acc[i][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) {
            // Token 2j's lanes are 0, 1 of each quarter of register j, token 2j + 1's are 2, 3.
            const float out = kTokens == 1 ? _mm512_reduce_add_ps(acc[i][0])
                                           : _mm512_reduce_add_ps(_mm512_maskz_mov_ps(t % 2 ? 0xCCCC : 0x3333, acc[i][t / 2]));
            float &y = p.y[(g * kGroupTokens + t0 + t) * p.rows + r + i];
            y = s0 == 0 ? out : y + out;
        }
    }
}

// Tokens t0.. of group g (kTokens of them) x rows [r0, r1), over column slices of 16
// super-blocks (4096 columns, as in quant_range): a group's Q5KAct for one slice is 20 KiB and
// stays in L1 while every row tile of the range reads it.
template <int kTokens, int kRows>
void q5k_tokens(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g, int t0) {
    constexpr int64_t kSliceSupers = 16;
    Q5KAct<kTokens> act[kSliceSupers];
    const int64_t n_super = p.cols / 256;
    for (int64_t s0 = 0; s0 < n_super; s0 += kSliceSupers) {
        const int64_t s1 = s0 + kSliceSupers < n_super ? s0 + kSliceSupers : n_super;
        q5k_act<kTokens>(p, g, t0, s0, s1, act);
        int64_t r = r0;
        for (; r + kRows <= r1; r += kRows) q5k_rows<kTokens, kRows>(p, r, g, t0, s0, s1, act);
        for (; r < r1; ++r) q5k_rows<kTokens, 1>(p, r, g, t0, s0, s1, act);
    }
}

// Decoding takes one row at a time: tiles of 4 rows, which share the activations, decoded 20-30%
// slower on the current machines (one thread, 134M Q5_K_M model: 146-159 -> 183-198 tok/s), as
// they did for Q8_0.
void q5k_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    constexpr int kGroupRows = 2, kTokenRows = 1;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n_tok = p.n_tokens - g * kGroupTokens;
        if (n_tok >= kGroupTokens) {
            q5k_tokens<kGroupTokens, kGroupRows>(p, r0, r1, g, 0);
        } else {
            for (int t = 0; t < n_tok; ++t) q5k_tokens<1, kTokenRows>(p, r0, r1, g, t);
        }
    }
}

// ---- float weights --------------------------------------------------------------------------

// 16 weights from column c on; with a mask, only the lanes it selects (the others read as 0).
template <bool kF16>
inline __m512 load_w16(const uint8_t *row, int64_t c, __mmask16 mask) {
    if constexpr (kF16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, row + 2 * c));
    else
        return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float *>(row) + c);
}

// kRows rows x kTokens tokens starting at token tok, as kernels_avx2.cpp's float_tile does, 16
// columns at a time; the last columns are read through a mask instead of a scalar loop.
template <bool kF16, int kRows, int kTokens>
void float_tile(const MatmulProblem &p, int64_t r, int64_t tok) {
    const uint8_t *row[kRows];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) row[i] = p.w + (r + i) * p.w_row_bytes;
    const float *x = p.x + tok * p.cols;
    __m512 acc[kRows][kTokens];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) acc[i][t] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < p.cols; c += 16) {
        const int64_t left = p.cols - c;
        const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
        __m512 w[kRows];
#pragma GCC unroll 16
        for (int i = 0; i < kRows; ++i) w[i] = load_w16<kF16>(row[i], c, mask);
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) {
            const __m512 xv = _mm512_maskz_loadu_ps(mask, x + t * p.cols + c);
#pragma GCC unroll 16
            for (int i = 0; i < kRows; ++i) acc[i][t] = _mm512_fmadd_ps(w[i], xv, acc[i][t]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) p.y[(tok + t) * p.rows + r + i] = _mm512_reduce_add_ps(acc[i][t]);
    }
}

// One token against kRows rows: decoding, which streams the weights once and is bound by memory.
// Each step takes 32 columns of every row (a 64-byte line of halves, two of floats) into two
// accumulators per row so that the additions do not wait on each other.
template <bool kF16, int kRows>
void float_token_rows(const MatmulProblem &p, int64_t r, int64_t tok) {
    constexpr int64_t kStep = 32;
    const uint8_t *row[kRows];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) row[i] = p.w + (r + i) * p.w_row_bytes;
    const float *x = p.x + tok * p.cols;
    __m512 acc[kRows][2];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + kStep <= p.cols; c += kStep) {
        const __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
#pragma GCC unroll 16
        for (int i = 0; i < kRows; ++i) {
            __m512 w0, w1;
            if constexpr (kF16) {
                const __m512i h = load512(row[i] + 2 * c);
                w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
                w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
            } else {
                w0 = _mm512_loadu_ps(reinterpret_cast<const float *>(row[i]) + c);
                w1 = _mm512_loadu_ps(reinterpret_cast<const float *>(row[i]) + c + 16);
            }
            acc[i][0] = _mm512_fmadd_ps(w0, x0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(w1, x1, acc[i][1]);
        }
    }
    for (; c < p.cols; c += 16) {  // the last columns, through a mask
        const int64_t left = p.cols - c;
        const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
        const __m512 xv = _mm512_maskz_loadu_ps(mask, x + c);
#pragma GCC unroll 16
        for (int i = 0; i < kRows; ++i) acc[i][0] = _mm512_fmadd_ps(load_w16<kF16>(row[i], c, mask), xv, acc[i][0]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) p.y[tok * p.rows + r + i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
}

template <bool kF16>
void float_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    constexpr int kGroupRows = 4, kTokenRows = 1;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t tok = g * kGroupTokens;
        if (p.n_tokens - tok < kGroupTokens) {
            for (int64_t t = tok; t < p.n_tokens; ++t) {
                int64_t r = r0;
                for (; r + kTokenRows <= r1; r += kTokenRows) float_token_rows<kF16, kTokenRows>(p, r, t);
                for (; r < r1; ++r) float_token_rows<kF16, 1>(p, r, t);
            }
            continue;
        }
        int64_t r = r0;
        for (; r + kGroupRows <= r1; r += kGroupRows) float_tile<kF16, kGroupRows, kGroupTokens>(p, r, tok);
        for (; r < r1; ++r) float_tile<kF16, 1, kGroupTokens>(p, r, tok);
    }
}

void matmul_range_avx512(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    switch (p.wtype) {
        case TensorType::Q4_0:
            if (p.interleaved)
                interleaved_range<32, q4x8_rows<kGroupTokens, false>, q4x8_rows<1, false>, q4x8_pair_rows>(p, r0, r1, g0, g1);
            else
                quant_range<TensorType::Q4_0>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q8_0:
            if (p.interleaved)
                interleaved_range<32, q8x8_rows<kGroupTokens, false>, q8x8_rows<1, false>, q8x8_pair_rows>(p, r0, r1, g0, g1);
            else
                quant_range<TensorType::Q8_0>(p, r0, r1, g0, g1);
            break;
        case TensorType::F16:
            float_range<true>(p, r0, r1, g0, g1);
            break;
        case TensorType::F32:
            float_range<false>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q6_K:
            if (p.interleaved)
                q6kx8_range<q6x8_sums, q6kx8_rows<kGroupTokens, false>, q6kx8_rows<1, false>, q6kx8_pair_rows>(p, r0, r1, g0, g1);
            else
                q6_range(p, r0, r1, g0, g1);
            break;
        case TensorType::Q4_K:
            if (p.interleaved)
                interleaved_range<256, q4kx8_rows<TensorType::Q4_K, kGroupTokens, false>, q4kx8_rows<TensorType::Q4_K, 1, false>,
                                  q4kx8_pair_rows<TensorType::Q4_K>>(p, r0, r1, g0, g1);
            else
                kAvx2Kernels.matmul_range(p, r0, r1, g0, g1);
            break;
        case TensorType::Q5_K:
            if (p.interleaved)
                interleaved_range<256, q4kx8_rows<TensorType::Q5_K, kGroupTokens, false>, q4kx8_rows<TensorType::Q5_K, 1, false>,
                                  q4kx8_pair_rows<TensorType::Q5_K>>(p, r0, r1, g0, g1);
            else
                q5k_range(p, r0, r1, g0, g1);
            break;
        default:
            kAvx2Kernels.matmul_range(p, r0, r1, g0, g1);
            break;
    }
}

// ---- attention over cached rows ---------------------------------------------------------------
//
// A prompt's attention scores every cached key and sums every cached value once per (query, head):
// many short rows (the head size, 64 or 128 floats). Called per row, dot_f32 and axpy spend most
// of their time on the call, on loading and storing the output for every value row, and on the
// dependency through memory that makes. Here a loop runs over all rows with the outputs in
// registers (measured per row of 64: scores 3.9 -> 1.6 ns, values 5.0 -> 1.5 ns), and a prompt's
// queries of one kv head share each row: it is loaded and widened once for all of them.

// Head sizes that are whole registers get a fully unrolled loop; kChunks = len / 16. load16 gives
// chunk k (elements 16k..16k+15) of a row of each KV format as floats: floats, IEEE halves widened
// by vcvtph2ps, Q8 codes times the row's scale, Q4 codes scaled and offset by one fused
// multiply-add (as the AVX2 level reads them).
inline __m512 load16(const float *row, int64_t k) { return _mm512_loadu_ps(row + 16 * k); }
inline __m512 load16(const uint16_t *row, int64_t k) { return _mm512_cvtph_ps(load256(row + 16 * k)); }
inline __m512 load16(const KvQ8Byte *row, int64_t k) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    return _mm512_mul_ps(_mm512_set1_ps(load_f32(p)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load128(p + 4 + 16 * k))));
}
inline __m512 load16(const KvQ4Byte *row, int64_t k) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + 4 + 8 * k));
    const __m512 codes = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4_codes(packed)));
    return _mm512_fmadd_ps(codes, _mm512_set1_ps(float_of(load_u16(p))), _mm512_set1_ps(float_of(load_u16(p + 2))));
}

// A score's 16 lanes summed by halves: lanes i and i + 8, then i and i + 4, then i and i + 2, then
// 0 and 1 (the order GCC's _mm512_reduce_add_ps takes). Spelt out so that sum16_rows, which sums
// 16 rows' vectors together in this same order, gives each row the bits this gives it alone.
inline float sum16(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)), _mm512_castps512_ps256(v));
    const __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
    const __m128 c = _mm_add_ps(b, _mm_shuffle_ps(b, b, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

// sum16 of 16 vectors at once, into out[0..15]: each step adds two halves of every vector and
// packs two vectors' results into one register, so 16 sums cost 15 additions instead of 64
// (a row's score was mostly its reduction).
inline void sum16_rows(const __m512 v[16], float *out) {
    __m512 a[8], b[4], c[2];
    for (int p = 0; p < 8; ++p) {  // lanes i + 8 and i: 8 lanes each of rows 2p, 2p + 1
        a[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)));
    }
    for (int p = 0; p < 4; ++p) {  // i + 4 and i: 128-bit lane k holds row 4p + k
        b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)));
    }
    for (int p = 0; p < 2; ++p) {  // i and i + 2: lane k holds rows 8p + k and 8p + 4 + k, 2 each
        c[p] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * p], b[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * p], b[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // 0 and 1: element 4k + j holds row 4j + k; the permutation puts row r at element r.
    const __m512 sums =
        _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, sums));
}

// The score of query q (kChunks registers) against one row: two accumulators, chunk k into
// acc[k & 1].
template <int kChunks, typename Element>
inline __m512 score_vector(const __m512 qv[kChunks], const Element *row) {
    __m512 acc[2] = {_mm512_mul_ps(qv[0], load16(row, 0)), _mm512_setzero_ps()};
#pragma GCC unroll 8
    for (int k = 1; k < kChunks; ++k) acc[k & 1] = _mm512_fmadd_ps(qv[k], load16(row, k), acc[k & 1]);
    return _mm512_add_ps(acc[0], acc[1]);
}

// Query q against 16 rows, row r at rows + r * stride, into out[0..15].
template <int kChunks, typename Element>
void score16(const float *q, const Element *rows, int64_t stride, float *out) {
    __m512 qv[kChunks];
#pragma GCC unroll 8
    for (int k = 0; k < kChunks; ++k) qv[k] = _mm512_loadu_ps(q + 16 * k);
    __m512 v[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) v[r] = score_vector<kChunks>(qv, rows + r * stride);
    sum16_rows(v, out);
}

// Several queries read a block of 16 rows of halves or codes widened once, into `wide` (rows of
// 16 * kChunks floats); float rows, or one query, read the rows in place (nullptr).
template <int kChunks, typename Element>
const float *widen_block(const Element *rows, int64_t stride, int m, float *wide) {
    if (m == 1) return nullptr;
    for (int r = 0; r < 16; ++r) {
#pragma GCC unroll 8
        for (int k = 0; k < kChunks; ++k) _mm512_storeu_ps(wide + (kChunks * r + k) * 16, load16(rows + r * stride, k));
    }
    return wide;
}
template <int kChunks>
const float *widen_block(const float *, int64_t, int, float *) {
    return nullptr;
}

// Rows go in blocks of 16: every query of the block sums its 16 scores together (sum16_rows),
// with the block in L1; the last rows one by one. Each score has the same bits either way and
// whatever m is.
template <int kChunks, typename Element>
void dot_rows_fixed(const float *const *queries, int m, const Element *rows, int64_t stride, int64_t n, float *scores,
                    int64_t scores_stride) {
    alignas(64) float wide[16 * 16 * kChunks];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const Element *block = rows + i * stride;
        const float *widened = widen_block<kChunks>(block, stride, m, wide);
        for (int j = 0; j < m; ++j) {
            float *out = scores + j * scores_stride + i;
            if (widened)
                score16<kChunks>(queries[j], widened, 16 * kChunks, out);
            else
                score16<kChunks>(queries[j], block, stride, out);
        }
    }
    for (; i < n; ++i) {
        for (int j = 0; j < m; ++j) {
            __m512 qv[kChunks];
#pragma GCC unroll 8
            for (int k = 0; k < kChunks; ++k) qv[k] = _mm512_loadu_ps(queries[j] + 16 * k);
            scores[j * scores_stride + i] = sum16(score_vector<kChunks>(qv, rows + i * stride));
        }
    }
}

// kQueries outputs of kChunks registers each stay in registers over all rows, each row's chunks
// loaded once for them; every output still adds its terms in row order, one fused multiply-add
// each, as with one query. Queries left over take passes of one.
template <int kChunks, int kQueries, typename Element>
void weighted_rows_pass(float *const *outs, const float *weights, int64_t weights_stride, const Element *rows, int64_t stride, int64_t n) {
    __m512 acc[kQueries][kChunks];
#pragma GCC unroll 8
    for (int j = 0; j < kQueries; ++j) {
#pragma GCC unroll 8
        for (int k = 0; k < kChunks; ++k) acc[j][k] = _mm512_loadu_ps(outs[j] + 16 * k);
    }
    for (int64_t i = 0; i < n; ++i) {
        const Element *row = rows + i * stride;
        __m512 rv[kChunks];
#pragma GCC unroll 8
        for (int k = 0; k < kChunks; ++k) rv[k] = load16(row, k);
#pragma GCC unroll 8
        for (int j = 0; j < kQueries; ++j) {
            const float w = weights[j * weights_stride + i];
            if (w == 0.0f) continue;
            const __m512 wv = _mm512_set1_ps(w);
#pragma GCC unroll 8
            for (int k = 0; k < kChunks; ++k) acc[j][k] = _mm512_fmadd_ps(wv, rv[k], acc[j][k]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < kQueries; ++j) {
#pragma GCC unroll 8
        for (int k = 0; k < kChunks; ++k) _mm512_storeu_ps(outs[j] + 16 * k, acc[j][k]);
    }
}

template <int kChunks, typename Element>
void weighted_row_sum_fixed(float *const *outs, int m, const float *weights, int64_t weights_stride, const Element *rows, int64_t stride,
                            int64_t n) {
    constexpr int kQueries = 16 / kChunks;  // 16 of the 32 registers hold outputs
    int j = 0;
    for (; j + kQueries <= m; j += kQueries) {
        weighted_rows_pass<kChunks, kQueries>(outs + j, weights + j * weights_stride, weights_stride, rows, stride, n);
    }
    for (; j < m; ++j) weighted_rows_pass<kChunks, 1>(outs + j, weights + j * weights_stride, weights_stride, rows, stride, n);
}

// The table's entries: rows row_bytes apart, in units of the format's Element. Other head sizes go
// to the AVX2 level's kernels of the same format.
template <KvRowFormat kFormat, typename Element>
void dot_kv_rows_avx512(const float *const *queries, int m, const uint8_t *rows, int64_t row_bytes, int64_t n, int64_t len, float *scores,
                        int64_t scores_stride) {
    const auto *first = reinterpret_cast<const Element *>(rows);
    const int64_t stride = row_bytes / static_cast<int64_t>(sizeof(Element));
    switch (len) {
        case 64:
            return dot_rows_fixed<4>(queries, m, first, stride, n, scores, scores_stride);
        case 128:
            return dot_rows_fixed<8>(queries, m, first, stride, n, scores, scores_stride);
        default:
            return kAvx2Kernels.dot_kv_rows[static_cast<uint32_t>(kFormat)](queries, m, rows, row_bytes, n, len, scores, scores_stride);
    }
}

template <KvRowFormat kFormat, typename Element>
void weighted_kv_row_sum_avx512(float *const *outs, int m, const float *weights, int64_t weights_stride, const uint8_t *rows,
                                int64_t row_bytes, int64_t n, int64_t len) {
    const auto *first = reinterpret_cast<const Element *>(rows);
    const int64_t stride = row_bytes / static_cast<int64_t>(sizeof(Element));
    switch (len) {
        case 64:
            return weighted_row_sum_fixed<4>(outs, m, weights, weights_stride, first, stride, n);
        case 128:
            return weighted_row_sum_fixed<8>(outs, m, weights, weights_stride, first, stride, n);
        default:
            return kAvx2Kernels.weighted_kv_row_sum[static_cast<uint32_t>(kFormat)](outs, m, weights, weights_stride, rows, row_bytes, n,
                                                                                    len);
    }
}

// The AVX2 kernels, called through their table: this file's flags must not touch their code.
void dequantize_avx512(TensorType type, const void *src, float *dst, int64_t n, const float *fp16_table) {
    kAvx2Kernels.dequantize(type, src, dst, n, fp16_table);
}
float dot_f32_avx512(const float *a, const float *b, int64_t n) { return kAvx2Kernels.dot_f32(a, b, n); }
void axpy_avx512(float *y, float a, const float *x, int64_t n) { kAvx2Kernels.axpy(y, a, x, n); }
float exp_sub_sum_avx512(float *x, float max, int64_t n) { return kAvx2Kernels.exp_sub_sum(x, max, n); }
float max_value_avx512(const float *x, int64_t n) { return kAvx2Kernels.max_value(x, n); }
void rotate_pairs_avx512(float *x, const float *cos_sin, int64_t n_pairs) { kAvx2Kernels.rotate_pairs(x, cos_sin, n_pairs); }
void rotate_half_pairs_avx512(uint16_t *row, const float *cos_sin, int64_t n_pairs) {
    kAvx2Kernels.rotate_half_pairs(row, cos_sin, n_pairs);
}
void silu_mul_avx512(float *out, const float *gate, const float *up, int64_t n) { kAvx2Kernels.silu_mul(out, gate, up, n); }
void add_query_stats_avx512(const QueryStats &stats, const float *w, const int32_t *first_seer, const int32_t *last_seer, int64_t n,
                            int32_t query, float threshold, float persistence_weight, bool proxy) {
    kAvx2Kernels.add_query_stats(stats, w, first_seer, last_seer, n, query, threshold, persistence_weight, proxy);
}
void gelu_mul_avx512(float *out, const float *gate, const float *up, int64_t n) { kAvx2Kernels.gelu_mul(out, gate, up, n); }

}  // namespace

const KernelTable kAvx512Kernels = {
    quantize_activations_avx512,
    matmul_range_avx512,
    dequantize_avx512,
    dot_f32_avx512,
    axpy_avx512,
    exp_sub_sum_avx512,
    silu_mul_avx512,
    gelu_mul_avx512,
    {dot_kv_rows_avx512<KvRowFormat::F32, float>, dot_kv_rows_avx512<KvRowFormat::F16, uint16_t>,
     dot_kv_rows_avx512<KvRowFormat::Q8, KvQ8Byte>, dot_kv_rows_avx512<KvRowFormat::Q4, KvQ4Byte>},
    {weighted_kv_row_sum_avx512<KvRowFormat::F32, float>, weighted_kv_row_sum_avx512<KvRowFormat::F16, uint16_t>,
     weighted_kv_row_sum_avx512<KvRowFormat::Q8, KvQ8Byte>, weighted_kv_row_sum_avx512<KvRowFormat::Q4, KvQ4Byte>},
    floats_to_halves_f16c,
    halves_to_floats_f16c,
    max_value_avx512,
    rotate_pairs_avx512,
    rotate_half_pairs_avx512,
    add_query_stats_avx512,
    2,  // interleaved Q4_0, Q8_0, Q4_K and Q6_K: faster than the file's layout
};

}  // namespace h2o::cpu::detail
