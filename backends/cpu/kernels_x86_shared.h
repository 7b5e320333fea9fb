// Helpers that the x86 kernel files use at the AVX2 level: kernels_avx2.cpp (built three times:
// also as the avx2+vnni level's kernels_avx2_vnni*.cpp) and kernels_avx512.cpp include this file
// under their own target flags (CMakeLists.txt). Everything defined here has internal linkage, so
// each file gets its own copy compiled for its level and no AVX-512 instruction can reach the AVX2
// path (see kernels_internal.h). Included by those files only.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/kernels_internal.h"

namespace h2o::cpu::detail {

namespace {

inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// Decoding the interleaved layouts streams one run of blocks per 8 rows: 2 KiB ahead in it (the
// hardware prefetcher alone leaves a core short of its bandwidth: measured ~13 -> ~16 GB/s per core
// on a 32000x768 Q4_0 matrix). Rows in the file's layout are read one after another, or a few side
// by side, and are left to the hardware prefetcher: prefetching the same bytes of the next rows
// made decoding slower on the current machines (F16 15-25%, Q8_0 6-20%, three interleaved rounds
// at 2 threads and two at 1; Q5_K unchanged).
constexpr int64_t kPrefetchBytes = 2048;

inline void prefetch_ahead(const uint8_t *p) { _mm_prefetch(reinterpret_cast<const char *>(p + kPrefetchBytes), _MM_HINT_T0); }

// Every cache line of the block of `bytes` bytes at p, kPrefetchBytes ahead, or with parts > 1
// part `part` of its lines. Fetching one line per block left the 144-byte Q4_0x8 blocks short:
// decoding the TinyLlama shape's Q4_0 file ran at 33.5 tok/s with one per block and 41.5 with
// every line (2 threads, three interleaved rounds). The K-quant kernels spread a block's 19 to 27
// lines over its sub-blocks, a part before each: issued in one burst they waited for free fill
// buffers while no arithmetic ran (perf put 59% of Q4_Kx8 decoding on the prefetch loop). Spread
// out, they decode the TinyLlama shape's Q4_K_M file at 35.4 tok/s instead of 33.8 (medians of 4
// interleaved rounds at 2 threads; each round 1.03-1.06x).
inline void prefetch_block_ahead(const uint8_t *p, int64_t bytes, int part = 0, int parts = 1) {
    const int64_t lines = (bytes + 63) / 64;
    for (int64_t k = lines * part / parts; k < lines * (part + 1) / parts; ++k) prefetch_ahead(p + 64 * k);
}

inline float load_f32(const uint8_t *p) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// Q4 codes 2i and 2i + 1 are the low and high nibbles of byte i: the bytes' nibbles, in element
// order, in the low 2 * (bytes in `packed`) bytes.
inline __m128i q4_codes(__m128i packed) {
    const __m128i low = _mm_set1_epi8(15);
    return _mm_unpacklo_epi8(_mm_and_si128(packed, low), _mm_and_si128(_mm_srli_epi16(packed, 4), low));
}

inline __m128i load128(const void *p) { return _mm_loadu_si128(static_cast<const __m128i *>(p)); }
inline __m256i load256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

// F16C rounds to nearest even and widens exactly, as fp16.h does (NaNs made quiet, keeping their
// top payload bits): the same halves and floats. One value at a time (the tails) the same way.
inline uint16_t half_of(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
inline float float_of(uint16_t h) { return _cvtsh_ss(h); }

void floats_to_halves_f16c(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) dst[i] = half_of(src[i]);
}

void halves_to_floats_f16c(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(load128(src + i)));
    for (; i < n; ++i) dst[i] = float_of(src[i]);
}

// Scales of a Q4_K/Q5_K super-block as floats: d * sc[j] and dmin * m[j], in the block order
// given by a byte shuffle of [sc0..7 | m0..7] (identity, or [0 2 4 6 1 3 5 7] for decoding).
// The 6-bit codes are unpacked four at a time from 32-bit words (see BlockQ4_K in quant.h): the
// top 2 bits of sc[4..7] (m[4..7]) are bits 6-7 of bytes 0-3 (4-7), moved to bits 4-5.
inline void k_affine_scales(const uint8_t *blk, const float *fp16_table, __m128i order, __m256 *d8, __m256 *m8) {
    uint32_t w[3];
    std::memcpy(w, blk + 4, sizeof w);
    const uint32_t sc_lo = w[0] & 0x3F3F3F3Fu, m_lo = w[1] & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u);
    const uint32_t m_hi = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u);
    const __m128i codes = _mm_shuffle_epi8(
        _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi), static_cast<int>(m_lo), static_cast<int>(m_hi)), order);
    *d8 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), _mm256_broadcast_ss(fp16_table + load_u16(blk)));
    *m8 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))),
                        _mm256_broadcast_ss(fp16_table + load_u16(blk + 2)));
}

// The scale of each (block, token)'s mins term in a Q4_K product, a.d * sum(y) (sum(y) =
// offset / 8, exact), in a.d's order [b: tokens 0..3 | b+1: tokens 0..3]: the 8 products of an
// activation pair in one vector multiply, where each row tile had made them one scalar product at a
// time. Each row tile still makes them once per pair (sharing them across tiles would need room
// in ActBlockPair).
inline void q4k_min_scales(const ActBlockPair &a, float out[2 * kGroupTokens]) {
    const __m256i sum_y = _mm256_srai_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(a.offset)), 3);
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_loadu_ps(a.d), _mm256_cvtepi32_ps(sum_y)));
}

// Sums of the 16 activation quants of each scale group of super-block `a` (its 4 activation
// pairs), token t, in the super-block's group order: out[0] groups 0..7, out[1] 8..15. Group
// 4k + m of pair k lies in a.lo (m even) or a.hi (m odd), bytes 16 (m / 2) on.
inline void group_sums16(const ActBlockPair *a, int t, __m256i out[2]) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
        // Sums of 4 bytes: [bytes 0..15 | bytes 16..31] of pair 2 half's lo, hi, then 2 half + 1's.
        __m256i x[4];
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
            const ActBlockPair &pair = a[2 * half + i];
            x[2 * i] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load256(pair.lo[t])), ones16);
            x[2 * i + 1] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load256(pair.hi[t])), ones16);
        }
        // Two horizontal adds leave [m0 m1 of pair 2 half, m0 m1 of the next | m2 m3, m2 m3].
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(x[0], x[1]), _mm256_hadd_epi32(x[2], x[3]));
        out[half] = _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
    }
}

}  // namespace

}  // namespace h2o::cpu::detail
