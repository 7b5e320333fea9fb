// AVX2 + FMA + F16C kernels. Built with -mavx2 -mfma -mf16c (CMakeLists.txt does it for every
// *_avx2.cpp) and called only after kernels.cpp has checked the CPU.
//
// This file must not instantiate standard-library templates or inline functions shared with other
// files (see kernels_internal.h): every helper here has internal linkage.
//
// Quantized weights (Q4_0, Q8_0) are multiplied with the activations quantized to 8 bits, on
// integers, two weight blocks at a time:
//   - _mm256_maddubs_epi16 multiplies unsigned by signed bytes and adds neighbours into int16.
//     Q4_0 nibbles are used as they are (0..15, unsigned); their -8 offset is applied afterwards by
//     subtracting 8 * sum(activation quants), precomputed per block. Q8_0 weights are signed, so
//     the usual sign trick moves their sign onto the activations.
//   - For a group of 4 tokens, the int16 sums of the 4 tokens are folded together with horizontal
//     adds until each int32 lane holds the whole sum of one (block, token) pair. Then one convert,
//     one multiply by the 8 scales and one FMA serve 8 such pairs of 32 products each, which is
//     what makes prompts fast.
//   - A single token (decoding) cannot fill the lanes that way and does that float work per block
//     pair instead; memory bandwidth is the limit there, and the weights are prefetched.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels_internal.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "kernels_avx2.cpp must be compiled with -mavx2 -mfma -mf16c"
#endif

namespace h2o::cpu::detail {

namespace {

constexpr int64_t kQ4Bytes = 18;  // sizeof(BlockQ4_0)
constexpr int64_t kQ8Bytes = 34;  // sizeof(BlockQ8_0)

inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// Decoding streams each weight once, from L3 or DRAM; the hardware prefetcher alone leaves one
// core short of the bandwidth it can get (measured: ~13 -> ~16 GB/s per core on a 32000x768 Q4_0
// matrix). 2 KiB ahead in each row's stream; for short rows that reaches into the next row tiles.
constexpr int64_t kPrefetchBytes = 2048;

inline void prefetch_ahead(const uint8_t *p) {
    _mm_prefetch(reinterpret_cast<const char *>(p + kPrefetchBytes), _MM_HINT_T0);
}

inline __m128i load128(const void *p) { return _mm_loadu_si128(static_cast<const __m128i *>(p)); }
inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

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
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(lo16), _mm256_castsi256_si128(p8));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(hi16), _mm256_extracti128_si256(p8, 1));
    *d_out = d;
    *offset_out = 8 * sum;
}

void quantize_activations_avx2(const float *x, int64_t cols, int64_t n_tokens, int64_t g0, int64_t g1,
                               ActBlockPair *act) {
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
                    quantize_block(x + token * cols + b * 32, &a.lo[t][16 * half], &a.hi[t][16 * half],
                                   &a.d[half * kGroupTokens + t], &a.offset[half * kGroupTokens + t]);
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
                _mm256_inserti128_si256(_mm256_castsi128_si256(hi0), load128(blk1 + 18), 1),
                pair_scales<true>(fp16_table, blk, blk1)};
    }
    return {_mm256_inserti128_si256(_mm256_setzero_si256(), lo0, 0),
            _mm256_inserti128_si256(_mm256_setzero_si256(), hi0, 0), pair_scales<false>(fp16_table, blk, blk)};
}

// One block pair against the 4 tokens of a group; acc lanes are [b: tokens 0..3 | b+1: tokens 0..3].
inline __m256 group_step(const Q4Pair &w, const ActBlockPair &a, __m256 acc) {
    __m256i h[kGroupTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kGroupTokens; ++t) {
        // int16 lanes: 4 products of at most 15 * 127 each.
        h[t] = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, load256(a.lo[t])),
                                _mm256_maddubs_epi16(w.hi, load256(a.hi[t])));
    }
    // Two rounds of pairwise adds: each int16 lane now sums 16 products (<= 30480, no overflow) and
    // the lanes are ordered [t0 t0 t1 t1 t2 t2 t3 t3] per block; madd finishes the block sums.
    const __m256i h4 = _mm256_hadd_epi16(_mm256_hadd_epi16(h[0], h[1]), _mm256_hadd_epi16(h[2], h[3]));
    const __m256i sums = _mm256_sub_epi32(_mm256_madd_epi16(h4, _mm256_set1_epi16(1)), load256(a.offset));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(w.d, _mm256_loadu_ps(a.d)), acc);
}

inline __m256 group_step(const Q8Pair &w, const ActBlockPair &a, __m256 acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i alo = _mm256_sign_epi8(w.lo, w.lo), ahi = _mm256_sign_epi8(w.hi, w.hi);
    __m256i s[kGroupTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kGroupTokens; ++t) {
        // |w| * (y with w's sign): int16 pairs reach 2 * 128 * 127, so widen to int32 at once.
        const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(alo, _mm256_sign_epi8(load256(a.lo[t]), w.lo)), ones);
        const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(ahi, _mm256_sign_epi8(load256(a.hi[t]), w.hi)), ones);
        s[t] = _mm256_add_epi32(plo, phi);
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
    return {load256(a.lo[t]), load256(a.hi[t]),
            _mm256_setr_epi32(a.offset[t], 0, 0, 0, a.offset[kGroupTokens + t], 0, 0, 0),
            _mm256_blend_ps(_mm256_broadcast_ss(&a.d[t]), _mm256_broadcast_ss(&a.d[kGroupTokens + t]), 0xF0)};
}

inline __m256 token_step(const Q4Pair &w, const TokenAct &y, __m256 acc) {
    const __m256i h = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, y.lo), _mm256_maddubs_epi16(w.hi, y.hi));
    const __m256i sums = _mm256_sub_epi32(_mm256_madd_epi16(h, _mm256_set1_epi16(1)), y.offset);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(w.d, y.d), acc);
}

inline __m256 token_step(const Q8Pair &w, const TokenAct &y, __m256 acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i plo = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_sign_epi8(w.lo, w.lo), _mm256_sign_epi8(y.lo, w.lo)), ones);
    const __m256i phi = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_sign_epi8(w.hi, w.hi), _mm256_sign_epi8(y.hi, w.hi)), ones);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(plo, phi)), _mm256_mul_ps(w.d, y.d), acc);
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

// kRows rows x one token (token t of group g): the decode case.
template <TensorType kType, int kRows>
void quant_token_rows(const MatmulProblem &p, int64_t r, int64_t g, int t) {
    const ActBlockPair *act = p.act + g * p.n_pairs;
    const int64_t n_blocks = p.cols / 32, n_full = n_blocks / 2;
    const uint8_t *row[kRows];
    __m256 acc[kRows];
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) {
        row[i] = p.w + (r + i) * p.w_row_bytes;
        acc[i] = _mm256_setzero_ps();
    }
    constexpr int64_t kPairBytes = 2 * (kType == TensorType::Q4_0 ? kQ4Bytes : kQ8Bytes);
    for (int64_t q = 0; q < n_full; ++q) {
        const TokenAct y = token_act(act[q], t);
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) prefetch_ahead(row[i] + q * kPairBytes);
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) acc[i] = token_step(load_pair<kType, true>(row[i], q, p.fp16_table), y, acc[i]);
    }
    if (n_blocks & 1) {
        const TokenAct y = token_act(act[n_full], t);
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
            acc[i] = token_step(load_pair<kType, false>(row[i], n_full, p.fp16_table), y, acc[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kRows; ++i) p.y[(g * kGroupTokens + t) * p.rows + r + i] = hsum(acc[i]);
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
#pragma GCC unroll 8
        for (int i = 0; i < kRows; ++i) prefetch_ahead(row[i] + q * 2 * kQ4Bytes);
#pragma GCC unroll 4
        for (int i = 0; i < kRowPairs; ++i) {
            acc[i] = token_step2(load_q4_pair<true>(row[2 * i] + q * 2 * kQ4Bytes, p.fp16_table),
                                 load_q4_pair<true>(row[2 * i + 1] + q * 2 * kQ4Bytes, p.fp16_table), y, offset2,
                                 acc[i]);
        }
    }
    if (n_blocks & 1) {
        const TokenAct y = token_act(act[n_full], t);
        const __m256i offset2 = _mm256_shuffle_epi32(y.offset, _MM_SHUFFLE(1, 0, 1, 0));
#pragma GCC unroll 4
        for (int i = 0; i < kRowPairs; ++i) {
            acc[i] = token_step2(load_q4_pair<false>(row[2 * i] + n_full * 2 * kQ4Bytes, p.fp16_table),
                                 load_q4_pair<false>(row[2 * i + 1] + n_full * 2 * kQ4Bytes, p.fp16_table), y,
                                 offset2, acc[i]);
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
            // Single tokens (decoding, and the tail of a prompt): row tiles share each activation
            // load; 8 rows for Q4_0 and 4 for Q8_0 measured best.
            for (int t = 0; t < n_tok; ++t) {
                int64_t r = r0;
                if constexpr (kType == TensorType::Q4_0) {
                    for (; r + 8 <= r1; r += 8) q4_token_row_pairs<4>(p, r, g, t);
                    for (; r + 2 <= r1; r += 2) q4_token_row_pairs<1>(p, r, g, t);
                } else {
                    for (; r + 4 <= r1; r += 4) quant_token_rows<kType, 4>(p, r, g, t);
                }
                for (; r < r1; ++r) quant_token_rows<kType, 1>(p, r, g, t);
            }
        }
    }
}

// ---- float weights --------------------------------------------------------------------------

template <bool kF16>
inline __m256 load_w8(const uint8_t *row, int64_t c) {
    if constexpr (kF16) return _mm256_cvtph_ps(load128(row + 2 * c));
    else return _mm256_loadu_ps(reinterpret_cast<const float *>(row) + c);
}

template <bool kF16>
inline float load_w1(const uint8_t *row, int64_t c, const float *fp16_table) {
    if constexpr (kF16) return fp16_table[load_u16(row + 2 * c)];
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
        if constexpr (kTokens == 1) {  // decoding: the weights are streamed once (see prefetch_ahead)
#pragma GCC unroll 16
            for (int i = 0; i < kRows; ++i) prefetch_ahead(row[i] + c * (kF16 ? 2 : 4));
        }
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
        case TensorType::Q4_0: quant_range<TensorType::Q4_0>(p, r0, r1, g0, g1); break;
        case TensorType::Q8_0: quant_range<TensorType::Q8_0>(p, r0, r1, g0, g1); break;
        case TensorType::F16: float_range<true>(p, r0, r1, g0, g1); break;
        default: float_range<false>(p, r0, r1, g0, g1); break;
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
                const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);                       // elements 0..15
                const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);  // 16..31
                const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
                for (int k = 0; k < 4; ++k) {
                    _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), d));
                }
            }
            break;
        default: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
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
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
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

inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp_ps(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

void silu_mul_avx2(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        const __m256i mask = tail_mask(n - i);
        _mm256_maskstore_ps(out + i, mask, silu_mul8(_mm256_maskload_ps(gate + i, mask), _mm256_maskload_ps(up + i, mask)));
    }
}

}  // namespace

const KernelTable kAvx2Kernels = {
    quantize_activations_avx2, matmul_range_avx2, dequantize_avx2, dot_f32_avx2,
    axpy_avx2,                 exp_sub_sum_avx2,  silu_mul_avx2,
};

}  // namespace h2o::cpu::detail
