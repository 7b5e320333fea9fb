// AVX2 + FMA + F16C kernels. Built with -mavx2 -mfma -mf16c (CMakeLists.txt does it for every
// *_avx2.cpp) and called only after kernels.cpp has checked the CPU. kernels_avx2_vnni*.cpp build
// this file again, with H2O_AVX2_VNNI defined, as the "avx2+vnni" level (below).
//
// This file must not instantiate standard-library templates or inline functions shared with other
// files (see kernels_internal.h): every helper here has internal linkage.
//
// Quantized weights (Q4_0, Q8_0; the K-quants further down work the same way) are multiplied with
// the activations quantized to 8 bits, on integers, two weight blocks at a time:
//   - _mm256_maddubs_epi16 multiplies unsigned by signed bytes and adds neighbours into int16.
//     Q4_0 nibbles are used as they are (0..15, unsigned); their -8 offset is applied afterwards by
//     subtracting 8 * sum(activation quants), precomputed per block. Q8_0 weights are signed, so
//     the usual sign trick moves their sign onto the activations.
//   - For a group of 4 tokens, the int16 sums of the 4 tokens are folded together with horizontal
//     adds until each int32 lane holds the whole sum of one (block, token) pair. Then one convert,
//     one multiply by the 8 scales and one FMA serve 8 such pairs of 32 products each, which is
//     what makes prompts fast.
//   - A single token (decoding) cannot fill the lanes that way and does that float work per block
//     pair instead; memory bandwidth is the limit there.
//
// The "avx2+vnni" level: CPUs with AVX2 but without AVX-512 (Intel's since Alder Lake) may have
// AVX-VNNI, whose vpdpbusd adds the four products of unsigned by signed bytes in each 32-bit lane
// into that lane in one instruction, where AVX2 needs maddubs and madd. The interleaved Q4_0 and
// Q4_K kernels and the Q8_0 ones take their integer sums through dot16_add / dot32_add, which are
// vpdpbusd at that level; the integer sums, and so every output, are the AVX2 level's exactly.
// The instruction has two encodings: VEX (AVX-VNNI, -mavxvnni: kernels_avx2_vnni.cpp) and EVEX
// (AVX-512 VNNI with VL, kernels_avx2_vnni_evex.cpp); kernels.cpp runs the first on CPUs with
// AVX-VNNI and the second on CPUs with AVX-512, where the level is tested.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels_internal.h"
#include "cpu/kernels_x86_shared.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kernels_avx2.cpp must be compiled with -mavx2 -mfma -mf16c"
#endif
// The avx2+vnni level's two builds are told apart by H2O_AVX2_VNNI_EVEX, not by the compiler's
// feature macros: flags such as -march=native may enable AVX-VNNI in both.
#if defined(H2O_AVX2_VNNI) && !defined(H2O_AVX2_VNNI_EVEX) && !defined(__AVXVNNI__)
#error "kernels_avx2_vnni.cpp must be compiled with -mavxvnni"
#endif
#if defined(H2O_AVX2_VNNI_EVEX) && !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
#error "kernels_avx2_vnni_evex.cpp must be compiled with -mavx512vnni -mavx512vl"
#endif

namespace h2o::cpu::detail {

namespace {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Sums of unsigned by signed byte products, four to each 32-bit lane, accumulated. dot16_add
// keeps them in int16 pairs at the AVX2 level (maddubs; for callers whose sums stay within int16)
// and dot16_sums widens each lane's pair into its int32 total; dot32_add accumulates int32 totals
// at once. At the avx2+vnni level all are vpdpbusd, with the same totals.
#if defined(H2O_AVX2_VNNI)
inline __m256i vpdpbusd(__m256i acc, __m256i u, __m256i s) {
#if !defined(H2O_AVX2_VNNI_EVEX)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_dpbusd_epi32(acc, u, s);
#endif
}
inline __m256i dot16_add(__m256i acc, __m256i u, __m256i s) { return vpdpbusd(acc, u, s); }
inline __m256i dot16_sums(__m256i acc) { return acc; }
inline __m256i dot32_add(__m256i acc, __m256i u, __m256i s) { return vpdpbusd(acc, u, s); }
#else
inline __m256i dot16_add(__m256i acc, __m256i u, __m256i s) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s)); }
inline __m256i dot16_sums(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
inline __m256i dot32_add(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif

inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// ---- activation quantization ----------------------------------------------------------------

// roundf() semantics (half away from zero), which _mm256_round_ps lacks: truncate, then step
// away from zero when the dropped fraction is at least one half. Exact for |v| < 2^23.
inline __m256 round_half_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
}

// The same bytes as quantize_block_q8 in kernels.cpp: same max, same scalar division for the
// scale, same x * (1/d) and rounding.
inline void quantize_block(const float *x, int8_t *lo16, int8_t *hi16, float *d_out, int32_t *offset_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f), fmax = _mm256_set1_ps(3.40282347e38f);
    __m256 v[4], amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        const __m256 a = _mm256_andnot_ps(sign, v[k]);
        amax = _mm256_max_ps(amax, a);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, fmax, _CMP_NLE_UQ));  // inf or NaN
    }
    const bool finite = _mm256_movemask_ps(bad) == 0;
    const float d = finite ? hmax(amax) / 127.0f : __builtin_nanf("");
    const float id = (finite && d != 0.0f) ? 1.0f / d : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    const __m256 qmin = _mm256_set1_ps(-127.0f), qmax = _mm256_set1_ps(127.0f);
    __m256i q[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        const __m256 r = round_half_away(_mm256_mul_ps(v[k], idv));
        // Out of range only when 1/d overflowed or an inf met a zero id; 0 then, as in scalar.
        const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(r, qmin, _CMP_GE_OQ), _mm256_cmp_ps(r, qmax, _CMP_LE_OQ));
        q[k] = _mm256_cvttps_epi32(_mm256_and_ps(r, ok));
    }
    const int32_t sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    // Packing works per 128-bit lane; the permute puts the 32 bytes back in element order.
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(lo16), _mm256_castsi256_si128(p8));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(hi16), _mm256_extracti128_si256(p8, 1));
    *d_out = d;
    *offset_out = 8 * sum;
}

void quantize_activations_avx2(const float *x, int64_t cols, int64_t n_tokens, int64_t g0, int64_t g1, ActBlockPair *act) {
    const int64_t n_blocks = cols / 32, n_pairs = (n_blocks + 1) / 2;
    for (int64_t g = g0; g < g1; ++g) {
        for (int64_t p = 0; p < n_pairs; ++p) {
            ActBlockPair &a = act[g * n_pairs + p];
            // Zero first: padding tokens and a missing odd block contribute nothing.
            auto *bytes = reinterpret_cast<__m256i *>(&a);
            for (size_t i = 0; i < sizeof(ActBlockPair) / 32; ++i) _mm256_storeu_si256(bytes + i, _mm256_setzero_si256());
            for (int t = 0; t < kGroupTokens; ++t) {
                const int64_t token = g * kGroupTokens + t;
                if (token >= n_tokens) break;
                for (int half = 0; half < 2; ++half) {
                    const int64_t b = 2 * p + half;
                    if (b >= n_blocks) break;
                    quantize_block(x + token * cols + b * 32, &a.lo[t][16 * half], &a.hi[t][16 * half], &a.d[half * kGroupTokens + t],
                                   &a.offset[half * kGroupTokens + t]);
                }
            }
        }
    }
}

// ---- quantized weights ----------------------------------------------------------------------

// Weight scales of blocks b and b+1 as [d_b x4 | d_b+1 x4] (the second zero for a lone last block).
template <bool kPair>
inline __m256 pair_scales(const float *fp16_table, const uint8_t *blk0, const uint8_t *blk1) {
    const __m256 d0 = _mm256_broadcast_ss(fp16_table + load_u16(blk0));
    const __m256 d1 = kPair ? _mm256_broadcast_ss(fp16_table + load_u16(blk1)) : _mm256_setzero_ps();
    return _mm256_blend_ps(d0, d1, 0xF0);
}

// Q4_0 blocks b, b+1 as unsigned nibbles: lo = [b 0..15 | b+1 0..15], hi = [b 16..31 | b+1 16..31].
struct Q4Pair {
    __m256i lo, hi;
    __m256 d;
};

template <bool kPair>
inline Q4Pair load_q4_pair(const uint8_t *blk, const float *fp16_table) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m128i q0 = load128(blk + 2);
    const __m256i raw = kPair ? _mm256_inserti128_si256(_mm256_castsi128_si256(q0), load128(blk + kQ4Bytes + 2), 1)
                              : _mm256_inserti128_si256(_mm256_setzero_si256(), q0, 0);
    return {_mm256_and_si256(raw, mask), _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask),
            pair_scales<kPair>(fp16_table, blk, blk + kQ4Bytes)};
}

// Q8_0 blocks b, b+1 split the same way: lo = [b 0..15 | b+1 0..15], hi = [b 16..31 | b+1 16..31].
struct Q8Pair {
    __m256i lo, hi;
    __m256 d;
};

template <bool kPair>
inline Q8Pair load_q8_pair(const uint8_t *blk, const float *fp16_table) {
    const __m128i lo0 = load128(blk + 2), hi0 = load128(blk + 18);
    if (kPair) {
        const uint8_t *blk1 = blk + kQ8Bytes;
        return {_mm256_inserti128_si256(_mm256_castsi128_si256(lo0), load128(blk1 + 2), 1),
                _mm256_inserti128_si256(_mm256_castsi128_si256(hi0), load128(blk1 + 18), 1), pair_scales<true>(fp16_table, blk, blk1)};
    }
    return {_mm256_inserti128_si256(_mm256_setzero_si256(), lo0, 0), _mm256_inserti128_si256(_mm256_setzero_si256(), hi0, 0),
            pair_scales<false>(fp16_table, blk, blk)};
}

// One block pair against the 4 tokens of a group; acc lanes are [b: tokens 0..3 | b+1: tokens 0..3].
inline __m256 group_step(const Q4Pair &w, const ActBlockPair &a, __m256 acc) {
    __m256i h[kGroupTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kGroupTokens; ++t) {
        // int16 lanes: 4 products of at most 15 * 127 each.
        h[t] = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, load256(a.lo[t])), _mm256_maddubs_epi16(w.hi, load256(a.hi[t])));
    }
    // Two rounds of pairwise adds: each int16 lane now sums 16 products (<= 30480, no overflow) and
    // the lanes are ordered [t0 t0 t1 t1 t2 t2 t3 t3] per block; madd finishes the block sums.
    const __m256i h4 = _mm256_hadd_epi16(_mm256_hadd_epi16(h[0], h[1]), _mm256_hadd_epi16(h[2], h[3]));
    const __m256i sums = _mm256_sub_epi32(_mm256_madd_epi16(h4, _mm256_set1_epi16(1)), load256(a.offset));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(w.d, _mm256_loadu_ps(a.d)), acc);
}

inline __m256 group_step(const Q8Pair &w, const ActBlockPair &a, __m256 acc) {
    const __m256i alo = _mm256_sign_epi8(w.lo, w.lo), ahi = _mm256_sign_epi8(w.hi, w.hi);
    __m256i s[kGroupTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kGroupTokens; ++t) {
        // |w| * (y with w's sign): int16 pairs reach 2 * 128 * 127, so into int32 at once.
        s[t] = dot32_add(dot32_add(_mm256_setzero_si256(), alo, _mm256_sign_epi8(load256(a.lo[t]), w.lo)), ahi,
                         _mm256_sign_epi8(load256(a.hi[t]), w.hi));
    }
    const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(w.d, _mm256_loadu_ps(a.d)), acc);
}

// One block pair against a single token t; activation operands prepared once per pair.
struct TokenAct {
    __m256i lo, hi, offset;  // offset: [8*sum_b 0 0 0 | 8*sum_b+1 0 0 0]
    __m256 d;                // [d_b x4 | d_b+1 x4]
};

inline TokenAct token_act(const ActBlockPair &a, int t) {
    return {load256(a.lo[t]), load256(a.hi[t]), _mm256_setr_epi32(a.offset[t], 0, 0, 0, a.offset[kGroupTokens + t], 0, 0, 0),
            _mm256_blend_ps(_mm256_broadcast_ss(&a.d[t]), _mm256_broadcast_ss(&a.d[kGroupTokens + t]), 0xF0)};
}

inline __m256 token_step(const Q4Pair &w, const TokenAct &y, __m256 acc) {
    const __m256i h = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, y.lo), _mm256_maddubs_epi16(w.hi, y.hi));
    const __m256i sums = _mm256_sub_epi32(_mm256_madd_epi16(h, _mm256_set1_epi16(1)), y.offset);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(w.d, y.d), acc);
}

inline __m256 token_step(const Q8Pair &w, const TokenAct &y, __m256 acc) {
    const __m256i sums = dot32_add(dot32_add(_mm256_setzero_si256(), _mm256_sign_epi8(w.lo, w.lo), _mm256_sign_epi8(y.lo, w.lo)),
                                   _mm256_sign_epi8(w.hi, w.hi), _mm256_sign_epi8(y.hi, w.hi));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(w.d, y.d), acc);
}

// Two Q4_0 rows against one token. Folding the rows' int16 sums together with one horizontal add
// halves the madd, subtract, convert and FMA work: lanes [r0 r0 r1 r1] per block.
inline __m256 token_step2(const Q4Pair &w0, const Q4Pair &w1, const TokenAct &y, __m256i offset2, __m256 acc) {
    const __m256i h0 = _mm256_add_epi16(_mm256_maddubs_epi16(w0.lo, y.lo), _mm256_maddubs_epi16(w0.hi, y.hi));
    const __m256i h1 = _mm256_add_epi16(_mm256_maddubs_epi16(w1.lo, y.lo), _mm256_maddubs_epi16(w1.hi, y.hi));
    const __m256i sums = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_hadd_epi16(h0, h1), _mm256_set1_epi16(1)), offset2);
    const __m256 d = _mm256_blend_ps(w0.d, w1.d, 0xCC);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d, y.d), acc);
}

template <TensorType kType, bool kPair>
inline auto load_pair(const uint8_t *row, int64_t pair, const float *fp16_table) {
    if constexpr (kType == TensorType::Q4_0) {
        return load_q4_pair<kPair>(row + 2 * pair * kQ4Bytes, fp16_table);
    } else {
        return load_q8_pair<kPair>(row + 2 * pair * kQ8Bytes, fp16_table);
    }
}

// kRows rows x the 4 tokens of group g, over the block pairs [q0, q1) (a column slice): y is set
// for the first slice and added to for the others. Two rows at a time halve the activation loads.
template <TensorType kType, int kRows>
void quant_group_rows(const MatmulProblem &p, int64_t r, int64_t g, int64_t q0, int64_t q1) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t n_blocks = p.cols / 32, n_full = n_blocks / 2;
    const uint8_t *row[kRows];
    __m256 acc[kRows];
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
        row[i] = p.w + (r + i) * p.w_row_bytes;
        acc[i] = _mm256_setzero_ps();
    }
    const int64_t q_full_end = q1 < n_full ? q1 : n_full;
    for (int64_t q = q0; q < q_full_end; ++q) {
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) acc[i] = group_step(load_pair<kType, true>(row[i], q, p.fp16_table), act[q], acc[i]);
    }
    if ((n_blocks & 1) && q1 > n_full) {  // the lone last block
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
            acc[i] = group_step(load_pair<kType, false>(row[i], n_full, p.fp16_table), act[n_full], acc[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
        // Lanes t and t+4 hold the two blocks' shares of token t.
        alignas(16) float out[4];
        _mm_store_ps(out, _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1)));
        for (int t = 0; t < kGroupTokens; ++t) {
            float &y = p.y[(g * kGroupTokens + t) * p.rows + r + i];
            y = q0 == 0 ? out[t] : y + out[t];
        }
    }
}

// Row r x one token (token t of group g): the decode case, one row at a time (see quant_range).
template <TensorType kType>
void quant_token_row(const MatmulProblem &p, int64_t r, int64_t g, int t) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t n_blocks = p.cols / 32, n_full = n_blocks / 2;
    const uint8_t *row = p.w + r * p.w_row_bytes;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t q = 0; q < n_full; ++q) acc = token_step(load_pair<kType, true>(row, q, p.fp16_table), token_act(act[q], t), acc);
    if (n_blocks & 1) acc = token_step(load_pair<kType, false>(row, n_full, p.fp16_table), token_act(act[n_full], t), acc);
    p.y[(g * kGroupTokens + t) * p.rows + r] = hsum(acc);
}

// Q4_0 decode: 2 * kRowPairs rows x one token, two rows folded per vector (see token_step2).
template <int kRowPairs>
void q4_token_row_pairs(const MatmulProblem &p, int64_t r, int64_t g, int t) {
    constexpr int kRows = 2 * kRowPairs;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t n_blocks = p.cols / 32, n_full = n_blocks / 2;
    const uint8_t *row[kRows];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) row[i] = p.w + (r + i) * p.w_row_bytes;
    __m256 acc[kRowPairs];
#pragma GCC unroll 4
    for (int i = 0; i < kRowPairs; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t q = 0; q < n_full; ++q) {
        const TokenAct y = token_act(act[q], t);
        // [off_b 0 off_b 0 | off_b+1 0 off_b+1 0]: one share per (row, block) pair of lanes.
        const __m256i offset2 = _mm256_shuffle_epi32(y.offset, _MM_SHUFFLE(1, 0, 1, 0));
#pragma GCC unroll 4
        for (int i = 0; i < kRowPairs; ++i) {
            acc[i] = token_step2(load_q4_pair<true>(row[2 * i] + q * 2 * kQ4Bytes, p.fp16_table),
                                 load_q4_pair<true>(row[2 * i + 1] + q * 2 * kQ4Bytes, p.fp16_table), y, offset2, acc[i]);
        }
    }
    if (n_blocks & 1) {
        const TokenAct y = token_act(act[n_full], t);
        const __m256i offset2 = _mm256_shuffle_epi32(y.offset, _MM_SHUFFLE(1, 0, 1, 0));
#pragma GCC unroll 4
        for (int i = 0; i < kRowPairs; ++i) {
            acc[i] = token_step2(load_q4_pair<false>(row[2 * i] + n_full * 2 * kQ4Bytes, p.fp16_table),
                                 load_q4_pair<false>(row[2 * i + 1] + n_full * 2 * kQ4Bytes, p.fp16_table), y, offset2, acc[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kRowPairs; ++i) {
        const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
        const __m128 sums = _mm_hadd_ps(s, s);  // [r0, r1, r0, r1]
        float *y = p.y + (g * kGroupTokens + t) * p.rows + r + 2 * i;
        y[0] = _mm_cvtss_f32(sums);
        y[1] = _mm_cvtss_f32(_mm_movehdup_ps(sums));
    }
}

// ---- Q4_0x8 weights (8 rows interleaved; layout in kernels.h) --------------------------------
//
// Chunk c of a block holds bytes 4c..4c+3 of the 8 rows' quants, one row per 32-bit lane: its low
// nibbles are elements 4c..4c+3 of each row's block, its high nibbles elements 16+4c..16+4c+3. The
// activation operand is those 4 activation bytes broadcast to every lane, and maddubs then madd
// leave each row's sum in its own lane, so nothing is ever reduced across lanes. The 8 maddubs of
// a block add up in int16 (at most 8 * 2 * 15 * 127 = 30480; dot16_add); the -8 offset is
// subtracted after.

// The 4 activation bytes at p, in every 32-bit lane.
inline __m256i broadcast4(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

// Writes (first) or adds the 8 rows' results of tokens t0.. of group g, one register per token.
template <int kTokens>
inline void store_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, bool first, const __m256 *acc) {
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) {
        float *y = p.y + (g * kGroupTokens + t0 + t) * p.rows + 8 * rg;
        _mm256_storeu_ps(y, first ? acc[t] : _mm256_add_ps(_mm256_loadu_ps(y), acc[t]));
    }
}

// kTokens tokens (t0.. of group g) x the 8 rows of group rg (rows 8 rg ..) over blocks [b0, b1):
// y is set for b0 == 0 and added to otherwise. kTokens = 1 decodes; 4 unpacks each chunk once for
// the group's tokens.
template <int kTokens>
void q4x8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t b0, int64_t b1) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *w = p.w + rg * (p.cols / 32) * kQ4x8Bytes;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256 acc[kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = b0; b < b1; ++b) {
        const uint8_t *blk = w + b * kQ4x8Bytes;
        if constexpr (kTokens == 1) prefetch_block_ahead(blk, kQ4x8Bytes);
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        __m256i dots[kTokens];
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) dots[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
            const __m256i v = load256(blk + 16 + 32 * c);
            const __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                dots[t] = dot16_add(dots[t], lo, broadcast4(&a.lo[t0 + t][16 * half + 4 * c]));
                dots[t] = dot16_add(dots[t], hi, broadcast4(&a.hi[t0 + t][16 * half + 4 * c]));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(load128(blk));
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) {
            const int k = half * kGroupTokens + t0 + t;
            const __m256i exact = _mm256_sub_epi32(dot16_sums(dots[t]), _mm256_set1_epi32(a.offset[k]));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), _mm256_mul_ps(dw, _mm256_set1_ps(a.d[k])), acc[t]);
        }
    }
    store_rows<kTokens>(p, rg, g, t0, b0 == 0, acc);
}

// ---- Q8_0x8 weights (8 rows interleaved; layout in kernels.h) --------------------------------
//
// As Q4_0x8, with 8 chunks of signed quants. maddubs takes unsigned by signed bytes, so each chunk
// goes in as |q|, and the activations as sign(y, q): products q * y, a pair of them at most
// 2 * 128 * 127 in int16. The block's sum widens to int32 at once (dot32_add).
template <int kTokens>
void q8x8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t b0, int64_t b1) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *w = p.w + rg * (p.cols / 32) * kQ8x8Bytes;
    __m256 acc[kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = b0; b < b1; ++b) {
        const uint8_t *blk = w + b * kQ8x8Bytes;
        if constexpr (kTokens == 1) {
            prefetch_block_ahead(blk, kQ8x8Bytes);
        }
        const ActBlockPair &a = act[b / 2];
        const int half = static_cast<int>(b & 1);
        __m256i sums[kTokens];
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) sums[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
            const __m256i q = load256(blk + 16 + 32 * c), magnitude = _mm256_abs_epi8(q);
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                const int8_t *y = (c < 4 ? a.lo[t0 + t] : a.hi[t0 + t]) + 16 * half + 4 * (c % 4);
                sums[t] = dot32_add(sums[t], magnitude, _mm256_sign_epi8(broadcast4(y), q));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(load128(blk));
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) {
            const int k = half * kGroupTokens + t0 + t;
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), _mm256_mul_ps(dw, _mm256_set1_ps(a.d[k])), acc[t]);
        }
    }
    store_rows<kTokens>(p, rg, g, t0, b0 == 0, acc);
}

// ---- Q4_Kx8 weights (8 rows interleaved; layout in kernels.h) --------------------------------
//
// Quant chunk 8j + c of a super-block holds bytes 4c..4c+3 of each row's qs group j: low nibbles
// are elements 4c..4c+3 of sub-block 2j, high nibbles those of sub-block 2j+1. The two sub-blocks
// are the two blocks of activation pair 4 sb + j, so each meets one activation scale:
//   row's share = a_d * (d * sc * sum(q * y) - dmin * m * sum(y)),  sum(y) = offset / 8.
// sc, m and d, dmin come one per lane (row) from the group block; the integer sums as in Q4_0x8.
//
// Q5_Kx8 is the same with a fifth bit: qh chunk c holds, for quant chunk 8j + c, bit 4 of the low
// nibbles' elements in bit 2j and of the high nibbles' in bit 2j + 1. Quants up to 31 make a
// maddubs pair up to 2 * 31 * 127, so the sums widen to int32 at once (dot32_add).

// Bit 4 of each byte of Q5_Kx8's low (kHigh false) or high nibbles of quant chunk 8j + c, from
// its qh chunk h: bit 2j (2j + 1) of each byte moved to bit 4. The 16-bit shifts carry bits across
// bytes, but never into the bit kept.
template <bool kHigh>
inline __m256i q5_bit4(__m256i h, int j) {
    const __m256i down = _mm256_srli_epi16(h, 2 * j);
    return _mm256_and_si256(kHigh ? _mm256_slli_epi16(down, 3) : _mm256_slli_epi16(down, 4), _mm256_set1_epi8(0x10));
}

// One lane per row: the 8 unsigned bytes at p as floats.
inline __m256 bytes_to_floats(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))));
}

// kTokens tokens (t0.. of group g) x the 8 rows of group rg over super-blocks [s0, s1) of Q4_Kx8
// or Q5_Kx8 (kType): y is set for s0 == 0 and added to otherwise. kTokens = 1 decodes; 4 unpacks
// each chunk once for a group.
template <TensorType kType, int kTokens>
void q4kx8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t s0, int64_t s1) {
    constexpr bool kQ5 = kType == TensorType::Q5_K;
    constexpr int64_t kBlockBytes = kQ5 ? kQ5Kx8Bytes : kQ4Kx8Bytes;
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t n_super = p.cols / 256;
    const uint8_t *w = p.w + rg * n_super * kBlockBytes;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256 acc[kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t sb = s0; sb < s1; ++sb) {
        const uint8_t *blk = w + sb * kBlockBytes;
        const __m256 d = _mm256_cvtph_ps(load128(blk)), dmin = _mm256_cvtph_ps(load128(blk + 16));
        for (int j = 0; j < 4; ++j) {
            if constexpr (kTokens == 1) prefetch_block_ahead(blk, kBlockBytes, j, 4);
            const ActBlockPair &a = act[4 * sb + j];
            float min_scale[2 * kGroupTokens];
            q4k_min_scales(a, min_scale);
            __m256i dots[2][kTokens];  // [sub-block 2j, 2j+1][token]
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) dots[0][t] = dots[1][t] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c) {
                const __m256i v = load256(blk + 160 + 32 * (8 * j + c));
                __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                if constexpr (kQ5) {
                    const __m256i h = load256(blk + kQ4Kx8Bytes + 32 * c);
                    lo = _mm256_or_si256(lo, q5_bit4<false>(h, j));
                    hi = _mm256_or_si256(hi, q5_bit4<true>(h, j));
                }
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) {
                    // Elements 4c..4c+3 of each block: in a.lo for c < 4, a.hi after; block 2j+1 16 on.
                    const int8_t *x = (c < 4 ? a.lo[t0 + t] : a.hi[t0 + t]) + 4 * (c % 4);
                    if constexpr (kQ5) {
                        dots[0][t] = dot32_add(dots[0][t], lo, broadcast4(x));
                        dots[1][t] = dot32_add(dots[1][t], hi, broadcast4(x + 16));
                    } else {
                        dots[0][t] = dot16_add(dots[0][t], lo, broadcast4(x));
                        dots[1][t] = dot16_add(dots[1][t], hi, broadcast4(x + 16));
                    }
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const __m256 step = _mm256_mul_ps(d, bytes_to_floats(blk + 32 + 8 * (2 * j + h)));
                const __m256 off = _mm256_mul_ps(dmin, bytes_to_floats(blk + 96 + 8 * (2 * j + h)));
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) {
                    const int k = h * kGroupTokens + t0 + t;
                    const __m256 sums = _mm256_cvtepi32_ps(kQ5 ? dots[h][t] : dot16_sums(dots[h][t]));
                    const __m256 ad = _mm256_set1_ps(a.d[k]);
                    acc[t] = _mm256_fmadd_ps(sums, _mm256_mul_ps(step, ad), acc[t]);
                    acc[t] = _mm256_fnmadd_ps(off, _mm256_set1_ps(min_scale[k]), acc[t]);
                }
            }
        }
    }
    store_rows<kTokens>(p, rg, g, t0, s0 == 0, acc);
}

// ---- Q6_Kx8 weights (8 rows interleaved; layout in kernels.h) --------------------------------
//
// Masking a scale group's 3 vectors gives its chunks 0..2 (columns 16s + 4c + 0..3, one row per
// lane as in Q4_0x8), and their top bits, shifted into place, chunk 3. The quants stay unsigned
// (q + 32, 0..63) for maddubs; two chunks add up in int16 (at most 2 * 2 * 63 * 127 = 32004), and
// madd with the row's scale in both int16 halves of its lane makes sc * sum(q * y) in int32. The
// +32 is taken back by one more madd: sc times the token's (-16 sum(y), -16 sum(y)) from
// q6kx8_range's table (|16 sum(y)| <= 16 * 16 * 127 = 32512 fits int16). A block's two groups
// then sum below 2^24 (exact in float), and
//   row's share of block b = a_d * d * sum over b's 2 groups of sc * sum((q - 32) * y).

// Chunks 0..3 of the scale group at p, unsigned (0..63).
inline void q6x8_group_quants(const uint8_t *p, __m256i q[4]) {
    const __m256i low6 = _mm256_set1_epi8(0x3F), top2 = _mm256_set1_epi8(static_cast<char>(0xC0));
    const __m256i v0 = load256(p), v1 = load256(p + 32), v2 = load256(p + 64);
    q[0] = _mm256_and_si256(v0, low6);
    q[1] = _mm256_and_si256(v1, low6);
    q[2] = _mm256_and_si256(v2, low6);
    // Chunk 3's bits 0-1, 2-3 and 4-5 are bits 6-7 of v0, v1 and v2: gathered from the top down,
    // two bits at a time. Before each 16-bit shift, bits 0-1 of every byte are clear, so no bit
    // crosses into the byte below.
    __m256i top = _mm256_srli_epi16(_mm256_and_si256(v0, top2), 2);
    top = _mm256_srli_epi16(_mm256_or_si256(top, _mm256_and_si256(v1, top2)), 2);
    q[3] = _mm256_srli_epi16(_mm256_or_si256(top, _mm256_and_si256(v2, top2)), 2);
}

// A scale group's 8 int8 scales (at p) as int16, row i's in both halves of lane i: each byte goes
// to the high byte of its int16 (index -128 zeroes the low byte), and a shift brings it down with
// its sign. Each 128-bit half shuffles its own copy of the 8 bytes: rows 0..3, then 4..7.
inline __m256i q6x8_scales16(const uint8_t *p) {
    int64_t v;
    std::memcpy(&v, p, sizeof v);
    const __m256i idx = _mm256_setr_epi8(-128, 0, -128, 0, -128, 1, -128, 1, -128, 2, -128, 2, -128, 3, -128, 3,  //
                                         -128, 4, -128, 4, -128, 5, -128, 5, -128, 6, -128, 6, -128, 7, -128, 7);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(_mm256_set1_epi64x(v), idx), 8);
}

// q6kx8_range's table for token t of group g: per scale group, (-16 sum(y), -16 sum(y)) as int16.
void q6x8_sums(const MatmulProblem &p, int64_t g, int t, int64_t s0, int64_t s1, int32_t *out) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const __m256i low16 = _mm256_set1_epi32(0xFFFF);
    for (int64_t sb = s0; sb < s1; ++sb) {
        __m256i y[2];
        group_sums16(act + 4 * sb, t, y);
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const __m256i v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(y[i], 4));
            const __m256i pair = _mm256_or_si256(_mm256_and_si256(v, low16), _mm256_slli_epi32(v, 16));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + 16 * (sb - s0) + 8 * i), pair);
        }
    }
}

// kTokens tokens (t0.. of group g) x the 8 rows of group rg over super-blocks [s0, s1), with
// q6kx8_range's sums (token t0 + t's at sums + t * kQ6Kx8SliceSums). kTokens = 1 decodes; 4
// unpacks each group once for the token group.
template <int kTokens>
void q6kx8_rows(const MatmulProblem &p, int64_t rg, int64_t g, int t0, int64_t s0, int64_t s1, const int32_t *sums) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *w = p.w + rg * (p.cols / 256) * kQ6Kx8Bytes;
    __m256 acc[kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t sb = s0; sb < s1; ++sb) {
        const uint8_t *blk = w + sb * kQ6Kx8Bytes;
        const __m256 d = _mm256_cvtph_ps(load128(blk + kQ6Kx8D));
        const int32_t *ys = sums + 16 * (sb - s0);
        for (int j = 0; j < 8; ++j) {
            if constexpr (kTokens == 1) prefetch_block_ahead(blk, kQ6Kx8Bytes, j, 8);
            // Block 8 sb + j is half h of activation pair k: scale groups 4k + 2h (in a.lo) and
            // 4k + 2h + 1 (in a.hi), bytes 16 h on.
            const int k = j / 2, h = j % 2;
            const ActBlockPair &a = act[4 * sb + k];
            __m256i bsum[kTokens];
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) bsum[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int m = 2 * h; m < 2 * h + 2; ++m) {
                const int gi = 4 * k + m;
                __m256i q[4];
                q6x8_group_quants(blk + 96 * gi, q);
                const __m256i sc = q6x8_scales16(blk + kQ6Kx8Scales + 8 * gi);
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) {
                    const int8_t *y = (m & 1 ? a.hi[t0 + t] : a.lo[t0 + t]) + 16 * h;
                    const __m256i p01 =
                        _mm256_add_epi16(_mm256_maddubs_epi16(q[0], broadcast4(y)), _mm256_maddubs_epi16(q[1], broadcast4(y + 4)));
                    const __m256i p23 =
                        _mm256_add_epi16(_mm256_maddubs_epi16(q[2], broadcast4(y + 8)), _mm256_maddubs_epi16(q[3], broadcast4(y + 12)));
                    __m256i s = _mm256_add_epi32(_mm256_madd_epi16(p01, sc), _mm256_madd_epi16(p23, sc));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(sc, _mm256_set1_epi32(ys[t * kQ6Kx8SliceSums + gi])));
                    bsum[t] = _mm256_add_epi32(bsum[t], s);
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                const __m256 ad = _mm256_set1_ps(a.d[h * kGroupTokens + t0 + t]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bsum[t]), _mm256_mul_ps(d, ad), acc[t]);
            }
        }
    }
    store_rows<kTokens>(p, rg, g, t0, s0 == 0, acc);
}

template <TensorType kType>
void quant_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    constexpr int kGroupRows = 2;
    constexpr int64_t kSlicePairs = 64;  // 4096 columns: 20 KiB of activations per group
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n_tok = p.n_tokens - g * kGroupTokens;
        if (n_tok >= kGroupTokens) {
            // Column slices of kSlicePairs pairs keep the group's activations (320 bytes a pair)
            // in L1 while every row of the range passes over them.
            for (int64_t q0 = 0; q0 < p.n_pairs; q0 += kSlicePairs) {
                const int64_t q1 = q0 + kSlicePairs < p.n_pairs ? q0 + kSlicePairs : p.n_pairs;
                int64_t r = r0;
                for (; r + kGroupRows <= r1; r += kGroupRows) quant_group_rows<kType, kGroupRows>(p, r, g, q0, q1);
                for (; r < r1; ++r) quant_group_rows<kType, 1>(p, r, g, q0, q1);
            }
        } else {
            // Single tokens (decoding, and the tail of a prompt): Q4_0 in row tiles of 8, which
            // share each activation load; Q8_0 one row at a time (tiles of 4 rows decoded at half
            // the speed on the current machines: one thread, 134M Q8_0 model, 72-74 -> 153 tok/s).
            for (int t = 0; t < n_tok; ++t) {
                int64_t r = r0;
                if constexpr (kType == TensorType::Q4_0) {
                    for (; r + 8 <= r1; r += 8) q4_token_row_pairs<4>(p, r, g, t);
                    for (; r + 2 <= r1; r += 2) q4_token_row_pairs<1>(p, r, g, t);
                }
                for (; r < r1; ++r) quant_token_row<kType>(p, r, g, t);
            }
        }
    }
}

// ---- K-quant weights ------------------------------------------------------------------------
//
// Q4_K, Q5_K and Q6_K use the same activation blocks of 32 as Q4_0, so each 32-element weight
// block b meets one activation scale a_b:
//   Q4_K/Q5_K: a_b * (d * sc_b * sum(q * y) - dmin * m_b * sum(y)), q unsigned (0..15 or 0..31)
//   Q6_K:      a_b * d * (s_lo * sum_lo(q * y) + s_hi * sum_hi(q * y)), q signed (-32..31), with
//              one 8-bit scale per 16 elements, applied on integers (madd with int16 scales).
// The quants of a block pair are unpacked to bytes in the activations' lo/hi order, so the
// integer work is the Q4_0/Q8_0 work; sum(y) is the activation block's offset / 8.

constexpr int64_t kQ4KBytes = 144, kQ5KBytes = 176, kQ6KBytes = 210;

template <TensorType kType>
constexpr int64_t kblock_bytes() {
    return kType == TensorType::Q4_K ? kQ4KBytes : kType == TensorType::Q5_K ? kQ5KBytes : kQ6KBytes;
}

// Pair k (0..3) of a super-block, i.e. blocks 2k and 2k+1, as bytes:
// lo = [2k elements 0..15 | 2k+1 elements 0..15], hi = [2k 16..31 | 2k+1 16..31].
struct KPair {
    __m256i lo, hi;
};

// Q4_K/Q5_K: the 32 bytes of nibble group k hold block 2k in their low nibbles and block 2k+1 in
// their high nibbles. Broadcasting 16 bytes to both lanes and shifting the upper lane by 4 gives
// [low nibbles | high nibbles] of those bytes. Q5_K adds bit 2k / 2k+1 of qh as bit 4.
template <TensorType kType>
inline KPair load_kpair_affine(const uint8_t *blk, int k) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i nib_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const uint8_t *qs = blk + (kType == TensorType::Q5_K ? 48 : 16) + 32 * k;
    KPair w;
    w.lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(load128(qs)), nib_shift), mask);
    w.hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(load128(qs + 16)), nib_shift), mask);
    if constexpr (kType == TensorType::Q5_K) {
        const uint8_t *qh = blk + 16;
        const __m256i bit_shift = _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
        const __m256i one = _mm256_set1_epi8(1);
        // Each byte's bit becomes 0 or 1, then 0 or 16 (a shift within the byte: no carries).
        const __m256i hlo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(load128(qh)), bit_shift), one);
        const __m256i hhi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(load128(qh + 16)), bit_shift), one);
        w.lo = _mm256_or_si256(w.lo, _mm256_slli_epi16(hlo, 4));
        w.hi = _mm256_or_si256(w.hi, _mm256_slli_epi16(hhi, 4));
    }
    return w;
}

// Q6_K: pair k lies in half h = k / 2 as its blocks i, i+1 (i = 0 for even k, 2 for odd k). Their
// low 4 bits are the low (i = 0) or high (i = 2) nibbles of ql[64h + 0..31] (block i) and
// ql[64h + 32..63] (block i+1); their top 2 bits are bits 2i.. and 2i+2.. of qh[32h + 0..31].
// Returned signed: q - 32.
inline KPair load_kpair_q6(const uint8_t *blk, int k) {
    const int h = k / 2, i = 2 * (k & 1);
    const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
    const __m256i nib_shift = _mm256_set1_epi32(4 * (i / 2));
    const __m256i bit_shift = _mm256_setr_epi32(2 * i, 2 * i, 2 * i, 2 * i, 2 * i + 2, 2 * i + 2, 2 * i + 2, 2 * i + 2);
    const __m256i mask4 = _mm256_set1_epi8(0x0F), mask2 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    auto half = [&](int off) {  // off 0: elements 0..15 of both blocks; 16: elements 16..31
        const __m256i low = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(ql + off)), load128(ql + 32 + off), 1);
        const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(low, nib_shift), mask4);
        const __m256i top = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(load128(qh + off)), bit_shift), mask2);
        return _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_slli_epi16(top, 4)), m32);
    };
    return {half(0), half(16)};
}

template <TensorType kType>
inline KPair load_kpair(const uint8_t *blk, int k) {
    if constexpr (kType == TensorType::Q6_K)
        return load_kpair_q6(blk, k);
    else
        return load_kpair_affine<kType>(blk, k);
}

// Q6_K's 8-bit scales of pair k as int16 vectors matching the int16 lanes of maddubs results:
// lo = [s(4k) x8 | s(4k+2) x8], hi = [s(4k+1) x8 | s(4k+3) x8].
inline void q6_pair_scales(__m128i scales16, int k, __m256i *slo, __m256i *shi) {
    const __m128i lo_idx = _mm_setr_epi8(4 * k, 4 * k, 4 * k, 4 * k, 4 * k, 4 * k, 4 * k, 4 * k, 4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2,
                                         4 * k + 2, 4 * k + 2, 4 * k + 2, 4 * k + 2);
    const __m128i hi_idx = _mm_add_epi8(lo_idx, _mm_set1_epi8(1));
    *slo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales16, lo_idx));
    *shi = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales16, hi_idx));
}

// Integer sums of a pair with one token's activations (ylo, yhi), lanes [2k: 4 partial sums |
// 2k+1: 4 partial sums]. For Q6_K the sub-block scales are already applied.
template <TensorType kType>
inline __m256i ktoken_sums(const KPair &w, __m256i ylo, __m256i yhi, __m256i slo, __m256i shi) {
    if constexpr (kType == TensorType::Q6_K) {
        // |w| * (y with w's sign): int16 pairs of at most 2 * 32 * 127, times scales <= 128.
        const __m256i plo = _mm256_maddubs_epi16(_mm256_sign_epi8(w.lo, w.lo), _mm256_sign_epi8(ylo, w.lo));
        const __m256i phi = _mm256_maddubs_epi16(_mm256_sign_epi8(w.hi, w.hi), _mm256_sign_epi8(yhi, w.hi));
        return _mm256_add_epi32(_mm256_madd_epi16(plo, slo), _mm256_madd_epi16(phi, shi));
    } else {
        // Unsigned quants times signed activations: 4 products of at most 31 * 127 per int16 lane.
        const __m256i h = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, ylo), _mm256_maddubs_epi16(w.hi, yhi));
        return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
    }
}

// The same for the 4 tokens of a group, lanes [2k: tokens 0..3 | 2k+1: tokens 0..3].
template <TensorType kType>
inline __m256i kgroup_sums(const KPair &w, const ActBlockPair &a, __m256i slo, __m256i shi) {
    if constexpr (kType == TensorType::Q4_K) {
        // As Q4_0's group_step: 16 products of at most 15 * 127 fit an int16 lane.
        __m256i h[kGroupTokens];
#pragma GCC unroll 4
        for (int t = 0; t < kGroupTokens; ++t) {
            h[t] = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, load256(a.lo[t])), _mm256_maddubs_epi16(w.hi, load256(a.hi[t])));
        }
        const __m256i h4 = _mm256_hadd_epi16(_mm256_hadd_epi16(h[0], h[1]), _mm256_hadd_epi16(h[2], h[3]));
        return _mm256_madd_epi16(h4, _mm256_set1_epi16(1));
    } else {
        // 5- and 6-bit quants: widen to int32 before folding the tokens together.
        __m256i s[kGroupTokens];
#pragma GCC unroll 4
        for (int t = 0; t < kGroupTokens; ++t) s[t] = ktoken_sums<kType>(w, load256(a.lo[t]), load256(a.hi[t]), slo, shi);
        return _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    }
}

// kRows rows x the 4 tokens of group g over the pairs [q0, q1) (whole super-blocks): y is set for
// the first column slice and added to for the others.
template <TensorType kType, int kRows>
void kquant_group_rows(const MatmulProblem &p, int64_t r, int64_t g, int64_t q0, int64_t q1) {
    constexpr int64_t kBytes = kblock_bytes<kType>();
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *row[kRows];
    __m256 acc[kRows];
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
        row[i] = p.w + (r + i) * p.w_row_bytes;
        acc[i] = _mm256_setzero_ps();
    }
    const __m128i identity = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t sb = q0 / 4; sb < q1 / 4; ++sb) {
        // Per row: the super-block's scales (and mins), in block order.
        __m256 wd[kRows], wm[kRows];
        __m128i sc16[kRows];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
            const uint8_t *blk = row[i] + sb * kBytes;
            if constexpr (kType == TensorType::Q6_K) {
                wd[i] = _mm256_broadcast_ss(p.fp16_table + load_u16(blk + 208));
                sc16[i] = load128(blk + 192);
            } else {
                k_affine_scales(blk, p.fp16_table, identity, &wd[i], &wm[i]);
            }
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            const ActBlockPair &a = act[4 * sb + k];
            const __m256 ad = _mm256_loadu_ps(a.d);
            // [b: tokens 0..3 | b+1: tokens 0..3] lane selectors and the activation sums a * sum(y).
            const __m256i sel = _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
            const __m256 ysum = _mm256_mul_ps(ad, _mm256_cvtepi32_ps(_mm256_srai_epi32(load256(a.offset), 3)));
#pragma GCC unroll 4
            for (int i = 0; i < kRows; ++i) {
                const uint8_t *blk = row[i] + sb * kBytes;
                __m256i slo = _mm256_setzero_si256(), shi = _mm256_setzero_si256();
                if constexpr (kType == TensorType::Q6_K) q6_pair_scales(sc16[i], k, &slo, &shi);
                const __m256 sums = _mm256_cvtepi32_ps(kgroup_sums<kType>(load_kpair<kType>(blk, k), a, slo, shi));
                if constexpr (kType == TensorType::Q6_K) {
                    acc[i] = _mm256_fmadd_ps(sums, _mm256_mul_ps(wd[i], ad), acc[i]);
                } else {
                    acc[i] = _mm256_fmadd_ps(sums, _mm256_mul_ps(_mm256_permutevar8x32_ps(wd[i], sel), ad), acc[i]);
                    acc[i] = _mm256_fnmadd_ps(_mm256_permutevar8x32_ps(wm[i], sel), ysum, acc[i]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
        alignas(16) float out[4];
        _mm_store_ps(out, _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1)));
        for (int t = 0; t < kGroupTokens; ++t) {
            float &y = p.y[(g * kGroupTokens + t) * p.rows + r + i];
            y = q0 == 0 ? out[t] : y + out[t];
        }
    }
}

// Q4_K/Q5_K, kRows rows x one token (token t of group g): decoding. The four pair sums of a
// super-block are folded into one vector of its 8 block sums, in the order [0 2 4 6 | 1 3 5 7],
// so the float work is two multiply-adds (quants and mins) per super-block and row. Scales and
// activation factors are arranged in that order too.
template <TensorType kType, int kRows>
void kquant_token_rows(const MatmulProblem &p, int64_t r, int64_t g, int t) {
    static_assert(kType == TensorType::Q4_K || kType == TensorType::Q5_K, "Q6_K has q6_token_rows");
    constexpr int64_t kBytes = kblock_bytes<kType>();
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *row[kRows];
    __m256 acc[kRows];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
        row[i] = p.w + (r + i) * p.w_row_bytes;
        acc[i] = _mm256_setzero_ps();
    }
    // Bytes [sc0..7 | m0..7] to [sc0 sc2 sc4 sc6 sc1 sc3 sc5 sc7 | m in the same order].
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    const __m256i none = _mm256_setzero_si256();  // ktoken_sums' Q6_K scales, unused here
    for (int64_t sb = 0; sb < p.cols / 256; ++sb) {
        const ActBlockPair *a = act + 4 * sb;
        // Block 2k is half 0 of pair k (scale d[t]), block 2k+1 half 1 (scale d[4 + t]).
        const __m256 ad =
            _mm256_setr_ps(a[0].d[t], a[1].d[t], a[2].d[t], a[3].d[t], a[0].d[4 + t], a[1].d[4 + t], a[2].d[4 + t], a[3].d[4 + t]);
        const __m256i off = _mm256_setr_epi32(a[0].offset[t], a[1].offset[t], a[2].offset[t], a[3].offset[t], a[0].offset[4 + t],
                                              a[1].offset[4 + t], a[2].offset[4 + t], a[3].offset[4 + t]);
        const __m256 ysum = _mm256_mul_ps(ad, _mm256_cvtepi32_ps(_mm256_srai_epi32(off, 3)));  // a * sum(y)
#pragma GCC unroll 8
        for (int i = 0; i < kRows; ++i) {
            const uint8_t *blk = row[i] + sb * kBytes;
            __m256i s[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) {
                s[k] = ktoken_sums<kType>(load_kpair<kType>(blk, k), load256(a[k].lo[t]), load256(a[k].hi[t]), none, none);
            }
            const __m256 sums = _mm256_cvtepi32_ps(_mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3])));
            __m256 wd, wm;
            k_affine_scales(blk, p.fp16_table, order, &wd, &wm);
            acc[i] = _mm256_fmadd_ps(sums, _mm256_mul_ps(wd, ad), acc[i]);
            acc[i] = _mm256_fnmadd_ps(wm, ysum, acc[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) p.y[(g * kGroupTokens + t) * p.rows + r + i] = hsum(acc[i]);
}

// Scale bytes i (low lane) and j (high lane) of `scales` (16 int8 scales in both lanes) as int16
// in every 16-bit lane: the shuffle puts the byte into each lane's high byte (index 0x80 zeroes
// the low byte), and an arithmetic shift sign-extends it.
inline __m256i q6_scales16(__m256i scales, int i, int j) {
    const __m128i lo = _mm_set1_epi16(static_cast<int16_t>((i << 8) | 0x80));
    const __m128i hi = _mm_set1_epi16(static_cast<int16_t>((j << 8) | 0x80));
    const __m256i idx = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(scales, idx), 8);
}

// Q6_K decoding, with the blocks of each half paired differently: (i, i+2) instead of (i, i+1).
// Blocks i and i+2 (i = 0, 1) of half h share their ql bytes (low and high nibbles of
// ql[64h + 32i + l]) and their qh bytes (bits 2i.. and 2i+4.. of qh[32h + l]), so a pair unpacks
// from two broadcast loads with the Q4_K shift trick and no lane insert. The activations are
// re-paired to match once per super-block, shared by all rows of the tile.
template <int kRows>
void q6_token_rows(const MatmulProblem &p, int64_t r, int64_t g, int t) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const uint8_t *row[kRows];
    __m256 acc[kRows];
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
        row[i] = p.w + (r + i) * p.w_row_bytes;
        acc[i] = _mm256_setzero_ps();
    }
    const __m256i mask4 = _mm256_set1_epi8(0x0F), mask2 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    const __m256i nib_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    for (int64_t sb = 0; sb < p.cols / 256; ++sb) {
        const ActBlockPair *a = act + 4 * sb;
        // Pair j = (h, c): blocks 4h + c and 4h + c + 2 (super-block-local), which are half c of
        // activation pairs 2h and 2h + 1.
        __m256i ylo[4], yhi[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const int h = j / 2, c = j % 2;
            ylo[j] =
                _mm256_inserti128_si256(_mm256_castsi128_si256(load128(&a[2 * h].lo[t][16 * c])), load128(&a[2 * h + 1].lo[t][16 * c]), 1);
            yhi[j] =
                _mm256_inserti128_si256(_mm256_castsi128_si256(load128(&a[2 * h].hi[t][16 * c])), load128(&a[2 * h + 1].hi[t][16 * c]), 1);
        }
        // The folded block sums come out in the order [0 1 4 5 | 2 3 6 7] (see below).
        const __m256 ad =
            _mm256_setr_ps(a[0].d[t], a[0].d[4 + t], a[2].d[t], a[2].d[4 + t], a[1].d[t], a[1].d[4 + t], a[3].d[t], a[3].d[4 + t]);
#pragma GCC unroll 8
        for (int i = 0; i < kRows; ++i) {
            const uint8_t *blk = row[i] + sb * kQ6KBytes;
            const __m256i scales = _mm256_broadcastsi128_si256(load128(blk + 192));
            __m256i s[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) {
                const int h = j / 2, c = j % 2, b = 4 * h + c;
                const uint8_t *ql = blk + 64 * h + 32 * c, *qh = blk + 128 + 32 * h;
                const int lo_bit = 2 * c, hi_bit = 2 * c + 4;
                const __m256i bit_shift = _mm256_setr_epi32(lo_bit, lo_bit, lo_bit, lo_bit, hi_bit, hi_bit, hi_bit, hi_bit);
                auto quants = [&](int off) {  // elements off..off+15 of blocks b and b+2, minus 32
                    const __m256i low = _mm256_broadcastsi128_si256(load128(ql + off));
                    const __m256i high = _mm256_broadcastsi128_si256(load128(qh + off));
                    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(low, nib_shift), mask4);
                    const __m256i top = _mm256_and_si256(_mm256_srlv_epi32(high, bit_shift), mask2);
                    return _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_slli_epi16(top, 4)), m32);
                };
                const __m256i wlo = quants(0), whi = quants(16);
                // int16 scales [s(2b) x8 | s(2b+4) x8] and [s(2b+1) x8 | s(2b+5) x8].
                const __m256i slo = q6_scales16(scales, 2 * b, 2 * b + 4), shi = q6_scales16(scales, 2 * b + 1, 2 * b + 5);
                s[j] = ktoken_sums<TensorType::Q6_K>(KPair{wlo, whi}, ylo[j], yhi[j], slo, shi);
            }
            // s[j] lanes: [b partials x4 | b+2 partials x4] for b = 0, 1, 4, 5.
            const __m256 sums = _mm256_cvtepi32_ps(_mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3])));
            const __m256 d = _mm256_broadcast_ss(p.fp16_table + load_u16(blk + 208));
            acc[i] = _mm256_fmadd_ps(sums, _mm256_mul_ps(d, ad), acc[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) p.y[(g * kGroupTokens + t) * p.rows + r + i] = hsum(acc[i]);
}

template <TensorType kType>
void kquant_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    constexpr int kGroupRows = 2, kTokenRows = 4;
    constexpr int64_t kSlicePairs = 64;  // 4096 columns, 16 super-blocks: as in quant_range
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n_tok = p.n_tokens - g * kGroupTokens;
        if (n_tok >= kGroupTokens) {
            for (int64_t q0 = 0; q0 < p.n_pairs; q0 += kSlicePairs) {
                const int64_t q1 = q0 + kSlicePairs < p.n_pairs ? q0 + kSlicePairs : p.n_pairs;
                int64_t r = r0;
                for (; r + kGroupRows <= r1; r += kGroupRows) kquant_group_rows<kType, kGroupRows>(p, r, g, q0, q1);
                for (; r < r1; ++r) kquant_group_rows<kType, 1>(p, r, g, q0, q1);
            }
        } else {
            for (int t = 0; t < n_tok; ++t) {
                int64_t r = r0;
                if constexpr (kType == TensorType::Q6_K) {
                    for (; r + kTokenRows <= r1; r += kTokenRows) q6_token_rows<kTokenRows>(p, r, g, t);
                    for (; r < r1; ++r) q6_token_rows<1>(p, r, g, t);
                } else {
                    for (; r + kTokenRows <= r1; r += kTokenRows) kquant_token_rows<kType, kTokenRows>(p, r, g, t);
                    for (; r < r1; ++r) kquant_token_rows<kType, 1>(p, r, g, t);
                }
            }
        }
    }
}

// ---- float weights --------------------------------------------------------------------------

template <bool kF16>
inline __m256 load_w8(const uint8_t *row, int64_t c) {
    if constexpr (kF16)
        return _mm256_cvtph_ps(load128(row + 2 * c));
    else
        return _mm256_loadu_ps(reinterpret_cast<const float *>(row) + c);
}

template <bool kF16>
inline float load_w1(const uint8_t *row, int64_t c, const float *fp16_table) {
    if constexpr (kF16)
        return fp16_table[load_u16(row + 2 * c)];
    else {
        float v;
        std::memcpy(&v, row + 4 * c, sizeof v);
        return v;
    }
}

// kRows rows x kTokens tokens starting at token tok: kRows*kTokens accumulators, each weight
// vector loaded once for all tokens and each activation vector once for all rows.
template <bool kF16, int kRows, int kTokens>
void float_tile(const MatmulProblem &p, int64_t r, int64_t tok) {
    const uint8_t *row[kRows];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) row[i] = p.w + (r + i) * p.w_row_bytes;
    const float *x = p.x + tok * p.cols;
    __m256 acc[kRows][kTokens];
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) acc[i][t] = _mm256_setzero_ps();
    }
    int64_t c = 0;
    for (; c + 8 <= p.cols; c += 8) {
        __m256 w[kRows];
#pragma GCC unroll 16
        for (int i = 0; i < kRows; ++i) w[i] = load_w8<kF16>(row[i], c);
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) {
            const __m256 xv = _mm256_loadu_ps(x + t * p.cols + c);
#pragma GCC unroll 16
            for (int i = 0; i < kRows; ++i) acc[i][t] = _mm256_fmadd_ps(w[i], xv, acc[i][t]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 16
        for (int t = 0; t < kTokens; ++t) {
            float s = hsum(acc[i][t]);
            for (int64_t cc = c; cc < p.cols; ++cc) s += load_w1<kF16>(row[i], cc, p.fp16_table) * x[t * p.cols + cc];
            p.y[(tok + t) * p.rows + r + i] = s;
        }
    }
}

template <bool kF16>
void float_range(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    constexpr int kGroupRows = 3, kTokenRows = 4;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t tok = g * kGroupTokens, n_tok = p.n_tokens - tok;
        if (n_tok >= kGroupTokens) {
            int64_t r = r0;
            for (; r + kGroupRows <= r1; r += kGroupRows) float_tile<kF16, kGroupRows, kGroupTokens>(p, r, tok);
            for (; r < r1; ++r) float_tile<kF16, 1, kGroupTokens>(p, r, tok);
        } else {
            for (int64_t t = tok; t < p.n_tokens; ++t) {
                int64_t r = r0;
                for (; r + kTokenRows <= r1; r += kTokenRows) float_tile<kF16, kTokenRows, 1>(p, r, t);
                for (; r < r1; ++r) float_tile<kF16, 1, 1>(p, r, t);
            }
        }
    }
}

void matmul_range_avx2(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
    switch (p.wtype) {
        case TensorType::Q4_0:
            if (p.interleaved)
                interleaved_range<32, q4x8_rows<kGroupTokens>, q4x8_rows<1>>(p, r0, r1, g0, g1);
            else
                quant_range<TensorType::Q4_0>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q8_0:
            if (p.interleaved)
                interleaved_range<32, q8x8_rows<kGroupTokens>, q8x8_rows<1>>(p, r0, r1, g0, g1);
            else
                quant_range<TensorType::Q8_0>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q4_K:
            if (p.interleaved)
                interleaved_range<256, q4kx8_rows<TensorType::Q4_K, kGroupTokens>, q4kx8_rows<TensorType::Q4_K, 1>>(p, r0, r1, g0, g1);
            else
                kquant_range<TensorType::Q4_K>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q5_K:
            if (p.interleaved)
                interleaved_range<256, q4kx8_rows<TensorType::Q5_K, kGroupTokens>, q4kx8_rows<TensorType::Q5_K, 1>>(p, r0, r1, g0, g1);
            else
                kquant_range<TensorType::Q5_K>(p, r0, r1, g0, g1);
            break;
        case TensorType::Q6_K:
            if (p.interleaved)
                q6kx8_range<q6x8_sums, q6kx8_rows<kGroupTokens>, q6kx8_rows<1>>(p, r0, r1, g0, g1);
            else
                kquant_range<TensorType::Q6_K>(p, r0, r1, g0, g1);
            break;
        case TensorType::F16:
            float_range<true>(p, r0, r1, g0, g1);
            break;
        default:
            float_range<false>(p, r0, r1, g0, g1);
            break;
    }
}

// ---- dequantization -------------------------------------------------------------------------

void dequantize_avx2(TensorType type, const void *src, float *dst, int64_t n, const float *fp16_table) {
    const auto *in = static_cast<const uint8_t *>(src);
    switch (type) {
        case TensorType::F16: {
            int64_t i = 0;
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(load128(in + 2 * i)));
            for (; i < n; ++i) dst[i] = fp16_table[load_u16(in + 2 * i)];
            break;
        }
        case TensorType::Q8_0:
            for (int64_t b = 0; b < n / 32; ++b, in += kQ8Bytes, dst += 32) {
                const __m256 d = _mm256_broadcast_ss(fp16_table + load_u16(in));
                for (int k = 0; k < 4; ++k) {
                    const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(in + 2 + 8 * k)));
                    _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
                }
            }
            break;
        case TensorType::Q4_0:
            for (int64_t b = 0; b < n / 32; ++b, in += kQ4Bytes, dst += 32) {
                const __m256 d = _mm256_broadcast_ss(fp16_table + load_u16(in));
                const __m128i raw = load128(in + 2), mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
                const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);                     // elements 0..15
                const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);  // 16..31
                const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
                for (int k = 0; k < 4; ++k) {
                    _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), d));
                }
            }
            break;
        default:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            break;
    }
}

// ---- vector operations ----------------------------------------------------------------------

float dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; ++k) {
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
        }
    }
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

void axpy_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
}

// exp(x) to about 2 ulp: exp(x) = 2^n * exp(r) with n = round(x / ln 2) and |r| <= ln(2)/2, ln 2
// split in two parts so r is exact enough, exp(r) by a degree-7 polynomial (the Cephes expf
// coefficients). Inputs below -87 give 0 (the true values are subnormal); inputs above 88 saturate
// at exp(88), so 2^n stays a normal float. NaN stays NaN.
inline __m256 exp_ps(__m256 x) {
    const __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
    const __m256 n =
        _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 poly = _mm256_set1_ps(1.9875691500e-4f);
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.3981999507e-3f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.3334519073e-3f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.1665795894e-2f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.6666665459e-1f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(5.0000001201e-1f));
    poly = _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(poly, _mm256_castsi256_ps(pow2n));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ), e);
}

// Lanes i < n of a final partial vector; the others are masked out of loads and stores.
inline __m256i tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

float exp_sub_sum_avx2(float *x, float max, int64_t n) {
    const __m256 m = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (i < n) {
        const __m256i mask = tail_mask(n - i);
        // Masked-off lanes load 0; their exp is zeroed again before the sum.
        const __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), m)), _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(x + i, mask, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum(sum);
}

// Four independent chains of vmaxps (the first pass of a softmax over thousands of scores was a
// chain of scalar maxss). vmaxps returns its second operand when either is NaN, so a NaN score is
// passed over as std::max passes over it; the maximum of a set is the same in any order.
float max_value_avx2(const float *x, int64_t n) {
    const __m256 none = _mm256_set1_ps(-__builtin_inff());
    __m256 m[4] = {none, none, none, none};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) m[k] = _mm256_max_ps(_mm256_loadu_ps(x + i + 8 * k), m[k]);
    }
    for (; i + 8 <= n; i += 8) m[0] = _mm256_max_ps(_mm256_loadu_ps(x + i), m[0]);
    if (i < n) {
        const __m256i mask = tail_mask(n - i);
        m[1] = _mm256_max_ps(_mm256_blendv_ps(none, _mm256_maskload_ps(x + i, mask), _mm256_castsi256_ps(mask)), m[1]);
    }
    const __m256 v = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_shuffle_ps(r, r, 1));
    return _mm_cvtss_f32(r);
}

// The value of v, hidden from the compiler's optimizer: a product passed through it is rounded on
// its own and never fused into a later addition (GCC contracts mul-then-add intrinsics into FMA).
inline __m128 opaque(__m128 v) {
    __asm__("" : "+x"(v));
    return v;
}
inline __m256 opaque(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

// Four pairs a register: (x c - y s, y c + x s) is addsub of (x c, y c) and (y s, x s), each
// product rounded on its own as rotate_pair rounds it (the sum's order does not change its bits).
inline __m256 rotate4(__m256 v, const float *cos_sin) {
    const __m256 cs = _mm256_loadu_ps(cos_sin);
    const __m256 swapped = _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1));
    return _mm256_addsub_ps(opaque(_mm256_mul_ps(v, _mm256_moveldup_ps(cs))), opaque(_mm256_mul_ps(swapped, _mm256_movehdup_ps(cs))));
}

// One pair the same way (the tails).
inline void rotate1(float *a, float *b, const float *cos_sin) {
    const __m128 v = _mm_setr_ps(*a, *b, 0.0f, 0.0f), swapped = _mm_setr_ps(*b, *a, 0.0f, 0.0f);
    const __m128 r = _mm_addsub_ps(opaque(_mm_mul_ps(v, _mm_set1_ps(cos_sin[0]))), opaque(_mm_mul_ps(swapped, _mm_set1_ps(cos_sin[1]))));
    *a = _mm_cvtss_f32(r);
    *b = _mm_cvtss_f32(_mm_shuffle_ps(r, r, 1));
}

void rotate_pairs_avx2(float *x, const float *cos_sin, int64_t n_pairs) {
    int64_t i = 0;
    for (; i + 4 <= n_pairs; i += 4) _mm256_storeu_ps(x + 2 * i, rotate4(_mm256_loadu_ps(x + 2 * i), cos_sin + 2 * i));
    for (; i < n_pairs; ++i) rotate1(&x[2 * i], &x[2 * i + 1], cos_sin + 2 * i);
}

// An F16 row's pairs widened, rotated as above and rounded back to halves as floats_to_halves
// rounds them, in registers.
void rotate_half_pairs_avx2(uint16_t *row, const float *cos_sin, int64_t n_pairs) {
    int64_t i = 0;
    for (; i + 4 <= n_pairs; i += 4) {
        const __m256 v = rotate4(_mm256_cvtph_ps(load128(row + 2 * i)), cos_sin + 2 * i);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(row + 2 * i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n_pairs; ++i) {
        float a = float_of(row[2 * i]), b = float_of(row[2 * i + 1]);
        rotate1(&a, &b, cos_sin + 2 * i);
        row[2 * i] = half_of(a);
        row[2 * i + 1] = half_of(b);
    }
}

// Eight slots a register: the unseen slots' weights masked to zero, which adds nothing to any
// field (w * w and w * proxy are exact zeros); each product rounded on its own (opaque), as the
// portable loop rounds it. The tail goes one slot at a time through the low lane the same way.
void add_query_stats_avx2(const QueryStats &stats, const float *w, const int32_t *first_seer, const int32_t *last_seer, int64_t n,
                          int32_t query, float threshold, float persistence_weight, bool proxy) {
    const __m256i q = _mm256_set1_epi32(query);
    const __m256 thr = _mm256_set1_ps(threshold), pw = _mm256_set1_ps(persistence_weight), one = _mm256_set1_ps(1.0f);
    const __m256 proxy_factor = _mm256_set1_ps(proxy ? 1.0f : 0.0f);
    auto update = [&](int64_t s, __m256 unseen, auto load, auto store) {
        const __m256 weight = _mm256_andnot_ps(unseen, load(w + s));
        store(stats.accumulated + s, _mm256_add_ps(load(stats.accumulated + s), weight));
        store(stats.squared + s, _mm256_add_ps(load(stats.squared + s), opaque(_mm256_mul_ps(weight, weight))));
        store(stats.steps + s, _mm256_add_ps(load(stats.steps + s), _mm256_andnot_ps(unseen, one)));
        store(stats.persistence + s, _mm256_add_ps(load(stats.persistence + s), _mm256_and_ps(_mm256_cmp_ps(weight, thr, _CMP_GT_OQ), pw)));
        store(stats.last + s, _mm256_add_ps(load(stats.last + s), opaque(_mm256_mul_ps(weight, proxy_factor))));
    };
    int64_t s = 0;
    for (; s + 8 <= n; s += 8) {
        const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(first_seer + s));
        const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(last_seer + s));
        const __m256 unseen = _mm256_castsi256_ps(_mm256_or_si256(_mm256_cmpgt_epi32(first, q), _mm256_cmpgt_epi32(q, last)));
        update(
            s, unseen, [](const float *p) { return _mm256_loadu_ps(p); }, [](float *p, __m256 v) { _mm256_storeu_ps(p, v); });
    }
    for (; s < n; ++s) {
        const __m256 unseen =
            first_seer[s] > query || query > last_seer[s] ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : _mm256_setzero_ps();
        update(
            s, unseen, [](const float *p) { return _mm256_castps128_ps256(_mm_load_ss(p)); },
            [](float *p, __m256 v) { _mm_store_ss(p, _mm256_castps256_ps128(v)); });
    }
}

inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp_ps(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

// out[i] = op8(gate[i], up[i]) eight at a time, the tail through masked loads and stores.
template <__m256 (*op8)(__m256, __m256)>
void gated_avx2(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, op8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        const __m256i mask = tail_mask(n - i);
        _mm256_maskstore_ps(out + i, mask, op8(_mm256_maskload_ps(gate + i, mask), _mm256_maskload_ps(up + i, mask)));
    }
}

void silu_mul_avx2(float *out, const float *gate, const float *up, int64_t n) { gated_avx2<silu_mul8>(out, gate, up, n); }

// gelu_tanh(g) * u in the sigmoid form of activation.h.
inline __m256 gelu_mul8(__m256 g, __m256 u) {
    const __m256 arg = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(1.5957691216057308f), g),
                                     _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), _mm256_mul_ps(g, g), _mm256_set1_ps(1.0f)));
    const __m256 e = exp_ps(_mm256_xor_ps(arg, _mm256_set1_ps(-0.0f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void gelu_mul_avx2(float *out, const float *gate, const float *up, int64_t n) { gated_avx2<gelu_mul8>(out, gate, up, n); }

// ---- attention over cached rows ---------------------------------------------------------------
//
// As in kernels_avx512.cpp: one loop over every cached row instead of a call per row (measured per
// row of 64: scores 5.9 -> 2.2 ns), and a prompt's queries of one kv head share each row's loads.
// Head size 64 fills 8 registers; other sizes take the per-row loop.

constexpr int64_t kRowChunks = 8;  // head size 64, 8 floats a register

// Chunk k (elements 8k..8k+7) of a row of each KV format as floats: floats, IEEE halves widened by
// vcvtph2ps, Q8 codes times the row's scale, Q4 codes scaled and offset by one fused
// multiply-add. element() reads one element the same way (the tails of other head sizes).
inline __m256 load8(const float *row, int64_t k) { return _mm256_loadu_ps(row + 8 * k); }
inline __m256 load8(const uint16_t *row, int64_t k) { return _mm256_cvtph_ps(load128(row + 8 * k)); }
inline __m256 load8(const KvQ8Byte *row, int64_t k) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + 4 + 8 * k));
    return _mm256_mul_ps(_mm256_set1_ps(load_f32(p)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)));
}
inline __m256 load8(const KvQ4Byte *row, int64_t k) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    uint32_t packed;
    std::memcpy(&packed, p + 4 + 4 * k, sizeof packed);
    const __m256 codes = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q4_codes(_mm_cvtsi32_si128(static_cast<int>(packed)))));
    return _mm256_fmadd_ps(codes, _mm256_set1_ps(float_of(load_u16(p))), _mm256_set1_ps(float_of(load_u16(p + 2))));
}
inline float element(const float *row, int64_t c) { return row[c]; }
inline float element(const uint16_t *row, int64_t c) { return float_of(row[c]); }
inline float element(const KvQ8Byte *row, int64_t c) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    return load_f32(p) * static_cast<float>(static_cast<int8_t>(p[4 + c]));
}
inline float element(const KvQ4Byte *row, int64_t c) {
    const auto *p = reinterpret_cast<const uint8_t *>(row);
    const float code = static_cast<float>((p[4 + c / 2] >> (4 * (c & 1))) & 15);
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(code), _mm_set_ss(float_of(load_u16(p))), _mm_set_ss(float_of(load_u16(p + 2)))));
}

// hsum of 8 vectors at once, into out[0..7], in hsum's order (lanes i and i + 4, then i and i + 2,
// then 0 and 1): each step adds two halves of every vector and packs two vectors' results into one
// register, so 8 sums cost 7 additions instead of 24, with each row's bits.
inline void hsum8_rows(const __m256 v[8], float *out) {
    __m256 a[4], b[2];
    for (int p = 0; p < 4; ++p) {  // 128-bit lane k holds row 2p + k
        a[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20), _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
    }
    for (int p = 0; p < 2; ++p) {  // lane k holds rows 4p + k and 4p + 2 + k, 2 each
        b[p] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // Element 4k + j holds row 2j + k; the permutation puts row r at element r.
    const __m256 sums =
        _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// The score vector of query q against one row of head size 64: two accumulators, chunk k into
// acc[k & 1]. The query is read from L1 (its 8 registers are needed for rows).
template <typename Element>
inline __m256 score_vector(const float *q, const Element *row) {
    __m256 acc[2] = {_mm256_mul_ps(_mm256_loadu_ps(q), load8(row, 0)), _mm256_mul_ps(_mm256_loadu_ps(q + 8), load8(row, 1))};
#pragma GCC unroll 8
    for (int k = 2; k < kRowChunks; ++k) acc[k & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * k), load8(row, k), acc[k & 1]);
    return _mm256_add_ps(acc[0], acc[1]);
}

// Query q against 8 rows of head size 64, row r at rows + r * stride, into out[0..7].
template <typename Element>
void score8(const float *q, const Element *rows, int64_t stride, float *out) {
    __m256 v[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) v[r] = score_vector(q, rows + r * stride);
    hsum8_rows(v, out);
}

// Several queries read a block of 8 rows of halves or codes widened once, into `wide` (8 rows of 64
// floats); float rows, or one query, read the rows in place (nullptr).
template <typename Element>
const float *widen_block(const Element *rows, int64_t stride, int m, float *wide) {
    if (m == 1) return nullptr;
    for (int r = 0; r < 8; ++r) {
#pragma GCC unroll 8
        for (int k = 0; k < kRowChunks; ++k) _mm256_storeu_ps(wide + (kRowChunks * r + k) * 8, load8(rows + r * stride, k));
    }
    return wide;
}
const float *widen_block(const float *, int64_t, int, float *) { return nullptr; }

// Head size 64: rows in blocks of 8, each query summing its 8 scores together (hsum8_rows) with
// the block in L1, the last rows one by one; every score has the bits hsum gives it alone, whatever
// m is. Other head sizes take each row per query.
template <typename Element>
void dot_rows_avx2(const float *const *queries, int m, const Element *rows, int64_t stride, int64_t n, int64_t len, float *scores,
                   int64_t scores_stride) {
    if (len == 8 * kRowChunks) {
        alignas(32) float wide[8 * 8 * kRowChunks];
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const Element *block = rows + i * stride;
            const float *widened = widen_block(block, stride, m, wide);
            for (int j = 0; j < m; ++j) {
                float *out = scores + j * scores_stride + i;
                if (widened)
                    score8(queries[j], widened, 8 * kRowChunks, out);
                else
                    score8(queries[j], block, stride, out);
            }
        }
        for (; i < n; ++i) {
            for (int j = 0; j < m; ++j) scores[j * scores_stride + i] = hsum(score_vector(queries[j], rows + i * stride));
        }
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        const Element *row = rows + i * stride;
        for (int j = 0; j < m; ++j) {
            const float *q = queries[j];
            __m256 acc = _mm256_setzero_ps();
            int64_t c = 0;
            for (; c + 8 <= len; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load8(row, c / 8), acc);
            float sum = hsum(acc);
            for (; c < len; ++c) sum += q[c] * element(row, c);
            scores[j * scores_stride + i] = sum;
        }
    }
}

// For head size 64, kQueries outputs of kChunks of its 8 registers (columns 8 * c0 on) stay in
// registers over all rows, each row's chunks loaded once for them; every output still adds its
// terms in row order, one fused multiply-add each, as with one query.
template <int kChunks, int kQueries, typename Element>
void weighted_rows_pass(float *const *outs, const float *weights, int64_t weights_stride, const Element *rows, int64_t stride, int64_t n,
                        int c0) {
    __m256 acc[kQueries][kChunks];
#pragma GCC unroll 8
    for (int j = 0; j < kQueries; ++j) {
#pragma GCC unroll 8
        for (int k = 0; k < kChunks; ++k) acc[j][k] = _mm256_loadu_ps(outs[j] + 8 * (c0 + k));
    }
    for (int64_t i = 0; i < n; ++i) {
        const Element *row = rows + i * stride;
        __m256 rv[kChunks];
#pragma GCC unroll 8
        for (int k = 0; k < kChunks; ++k) rv[k] = load8(row, c0 + k);
#pragma GCC unroll 8
        for (int j = 0; j < kQueries; ++j) {
            const float w = weights[j * weights_stride + i];
            if (w == 0.0f) continue;
            const __m256 wv = _mm256_set1_ps(w);
#pragma GCC unroll 8
            for (int k = 0; k < kChunks; ++k) acc[j][k] = _mm256_fmadd_ps(wv, rv[k], acc[j][k]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < kQueries; ++j) {
#pragma GCC unroll 8
        for (int k = 0; k < kChunks; ++k) _mm256_storeu_ps(outs[j] + 8 * (c0 + k), acc[j][k]);
    }
}

template <typename Element>
void weighted_row_sum_avx2(float *const *outs, int m, const float *weights, int64_t weights_stride, const Element *rows, int64_t stride,
                           int64_t n, int64_t len) {
    if (len == 8 * kRowChunks) {
        // One query: its whole output in 8 registers. Several: 4 queries x 2 chunks a pass (8
        // accumulators, 2 row registers), four passes over the rows' columns.
        constexpr int kQueries = 4, kChunks = 2;
        int j = 0;
        for (; j + kQueries <= m; j += kQueries) {
            for (int c0 = 0; c0 < kRowChunks; c0 += kChunks) {
                weighted_rows_pass<kChunks, kQueries>(outs + j, weights + j * weights_stride, weights_stride, rows, stride, n, c0);
            }
        }
        for (; j < m; ++j) weighted_rows_pass<kRowChunks, 1>(outs + j, weights + j * weights_stride, weights_stride, rows, stride, n, 0);
        return;
    }
    for (int j = 0; j < m; ++j) {
        float *out = outs[j];
        const float *w = weights + j * weights_stride;
        for (int64_t i = 0; i < n; ++i) {
            if (w[i] == 0.0f) continue;
            const Element *row = rows + i * stride;
            const __m256 wv = _mm256_set1_ps(w[i]);
            int64_t c = 0;
            for (; c + 8 <= len; c += 8) _mm256_storeu_ps(out + c, _mm256_fmadd_ps(wv, load8(row, c / 8), _mm256_loadu_ps(out + c)));
            for (; c < len; ++c) out[c] += w[i] * element(row, c);
        }
    }
}

// The table's entries: rows row_bytes apart, in units of the format's Element.
template <typename Element>
void dot_kv_rows_avx2(const float *const *queries, int m, const uint8_t *rows, int64_t row_bytes, int64_t n, int64_t len, float *scores,
                      int64_t scores_stride) {
    dot_rows_avx2(queries, m, reinterpret_cast<const Element *>(rows), row_bytes / static_cast<int64_t>(sizeof(Element)), n, len, scores,
                  scores_stride);
}
template <typename Element>
void weighted_kv_row_sum_avx2(float *const *outs, int m, const float *weights, int64_t weights_stride, const uint8_t *rows,
                              int64_t row_bytes, int64_t n, int64_t len) {
    weighted_row_sum_avx2(outs, m, weights, weights_stride, reinterpret_cast<const Element *>(rows),
                          row_bytes / static_cast<int64_t>(sizeof(Element)), n, len);
}

}  // namespace

#if defined(H2O_AVX2_VNNI)
// The level's own entry; kernels.cpp takes the others from the AVX2 level. Float weights have no
// use for vpdpbusd and go to the AVX2 level's kernels, so the level differs from it in the
// integer sums alone.
#if !defined(H2O_AVX2_VNNI_EVEX)
void matmul_range_avx2_vnni(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
#else
void matmul_range_avx2_vnni_evex(const MatmulProblem &p, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
#endif
    if (p.wtype == TensorType::F32 || p.wtype == TensorType::F16) return kAvx2Kernels.matmul_range(p, r0, r1, g0, g1);
    matmul_range_avx2(p, r0, r1, g0, g1);
}
#else
const KernelTable kAvx2Kernels = {
    quantize_activations_avx2,
    matmul_range_avx2,
    dequantize_avx2,
    dot_f32_avx2,
    axpy_avx2,
    exp_sub_sum_avx2,
    silu_mul_avx2,
    gelu_mul_avx2,
    {dot_kv_rows_avx2<float>, dot_kv_rows_avx2<uint16_t>, dot_kv_rows_avx2<KvQ8Byte>, dot_kv_rows_avx2<KvQ4Byte>},
    {weighted_kv_row_sum_avx2<float>, weighted_kv_row_sum_avx2<uint16_t>, weighted_kv_row_sum_avx2<KvQ8Byte>,
     weighted_kv_row_sum_avx2<KvQ4Byte>},
    floats_to_halves_f16c,
    halves_to_floats_f16c,
    max_value_avx2,
    rotate_pairs_avx2,
    rotate_half_pairs_avx2,
    add_query_stats_avx2,
    2,  // interleaved Q4_0, Q8_0, Q4_K and Q6_K: faster than the file's layout
};
#endif

}  // namespace h2o::cpu::detail
