// Element access to a weight matrix in the layout adopt_weight() repacks it into. Exactly one of
// TYPE_F32, TYPE_F16, TYPE_Q8_0, TYPE_Q4_0, TYPE_Q4_K, TYPE_Q5_K, TYPE_Q6_K is defined; the
// including shader declares the buffer `weights` (uint words).
//
// Every row starts on a word boundary (so a window of rows is a plain byte range):
//   F32   cols words
//   F16   ceil(cols / 2) words, two halves per word, element 2i in the low half
//   Q8_0  nb = cols / 32 blocks: nb * 8 words of quants (block b's 32 int8 in order), then
//         ceil(nb / 2) words of fp16 scales (block 2i in the low half)
//   Q4_0  nb * 4 words of quants (block b's 16 bytes as in the file: element j < 16 is the low
//         nibble of byte j, element j + 16 its high nibble), then ceil(nb / 2) words of scales
//   K-quants: cols / 256 super-blocks, each the file's block (lib/math/quant.h) as it is, in
//         K_BLOCK_WORDS words: Q4_K 36, Q5_K 44, Q6_K 53 (its 210 bytes and 2 of padding)
// Dequantized values equal llama.cpp's: q * d for Q8_0, (nibble - 8) * d for Q4_0, and for the
// K-quants those of lib/math/quant.cpp's dequantize_row, rounding for rounding (see k_run_values).

#if defined(TYPE_Q8_0)
const uint QUANT_WORDS_PER_BLOCK = 8u;
#elif defined(TYPE_Q4_0)
const uint QUANT_WORDS_PER_BLOCK = 4u;
#elif defined(TYPE_Q4_K)
#define K_QUANT
const uint K_BLOCK_WORDS = 36u;
#elif defined(TYPE_Q5_K)
#define K_QUANT
const uint K_BLOCK_WORDS = 44u;
#elif defined(TYPE_Q6_K)
#define K_QUANT
const uint K_BLOCK_WORDS = 53u;
#endif

// Words of one row.
uint weight_row_words(uint cols) {
#if defined(TYPE_F32)
    return cols;
#elif defined(TYPE_F16)
    return (cols + 1u) / 2u;
#elif defined(K_QUANT)
    return (cols / 256u) * K_BLOCK_WORDS;
#else
    const uint nb = cols / 32u;
    return nb * QUANT_WORDS_PER_BLOCK + (nb + 1u) / 2u;
#endif
}

#if defined(TYPE_Q8_0) || defined(TYPE_Q4_0)
// Scale of block b of the row starting at word `row`.
float block_scale(uint row, uint cols, uint b) {
    const uint word = weights[row + (cols / 32u) * QUANT_WORDS_PER_BLOCK + b / 2u];
    return unpackHalf2x16(word)[b & 1u];
}
#endif

#if !defined(K_QUANT)
// Element c of the row starting at word `row`.
float weight_at(uint row, uint cols, uint c) {
#if defined(TYPE_F32)
    return uintBitsToFloat(weights[row + c]);
#elif defined(TYPE_F16)
    return unpackHalf2x16(weights[row + c / 2u])[c & 1u];
#elif defined(TYPE_Q8_0)
    const uint b = c / 32u, j = c % 32u;
    const uint word = weights[row + b * 8u + j / 4u];
    return float(bitfieldExtract(int(word), int(8u * (j % 4u)), 8)) * block_scale(row, cols, b);
#else
    const uint b = c / 32u, j = c % 32u, byte_index = j % 16u;
    const uint word = weights[row + b * 4u + byte_index / 4u];
    const uint byte_value = (word >> (8u * (byte_index % 4u))) & 0xFFu;
    const uint nibble = j < 16u ? (byte_value & 0xFu) : (byte_value >> 4u);
    return (float(nibble) - 8.0) * block_scale(row, cols, b);
#endif
}
#endif  // !K_QUANT

#if defined(K_QUANT)
// A K-quant row is read in runs of 32 elements, each decoded whole by one invocation, its scales
// read once: run r is elements 32r .. 32r + 31 of the row, i.e. sub-block r % 8 of super-block
// r / 8 (Q4_K, Q5_K), or the 16-element sub-blocks 2 (r % 8) and 2 (r % 8) + 1 (Q6_K). Within a
// run, the 4 elements 4i .. 4i + 3 lie in the 4 bytes of one word (of the low bits, and of the
// high bits), for every type:
//   Q4_K  qs byte 32 (j / 2) + l holds element l of sub-block j, in its low (j even) or high nibble
//   Q5_K  as Q4_K, plus the fifth bit: bit j of qh byte l
//   Q6_K  element 128h + 32k + l (run 4h + k): the low or high (k >= 2) nibble of ql byte
//         64h + 32 (k & 1) + l, and bits 2k, 2k + 1 of qh byte 32h + l
// value = step * q - off, step the run's first or second 16 elements' (Q4_K, Q5_K: the same).
struct KRun {
    uint low_word;   // word of elements 0..3's low 4 bits; elements 4i.. are at low_word + i
    uint low_shift;  // 0 or 4: the nibble of each byte
    uint high_word;  // Q5_K, Q6_K: word of elements 0..3's high bits, likewise
    uint high_shift;
    vec2 step;       // scale of elements 0..15, of elements 16..31
    float off;       // Q4_K, Q5_K: the sub-block's min; Q6_K: 0 (unused)
};

// Run r of the row starting at word `row`.
KRun k_run(uint row, uint r) {
    const uint block = row + (r / 8u) * K_BLOCK_WORDS, j = r % 8u;
    KRun run;
#if defined(TYPE_Q6_K)
    const uint h = j / 4u, k = j % 4u;
    run.low_word = block + 16u * h + 8u * (k & 1u);
    run.low_shift = 4u * (k / 2u);
    run.high_word = block + 32u + 8u * h;
    run.high_shift = 2u * k;
    // (d * scale) * q, in this order, as the reference computes it.
    const float d = unpackHalf2x16(weights[block + 52u]).x;
    const int scales = int(weights[block + 48u + j / 2u]);  // int8 scales 2j and 2j + 1
    const int first = int(16u * (j & 1u));
    run.step = vec2(d * float(bitfieldExtract(scales, first, 8)), d * float(bitfieldExtract(scales, first + 8, 8)));
    run.off = 0.0;
#else
    // Bytes 0-3 of the packed scales: sc[0..3] in their low 6 bits, bytes 4-7 m[0..3]; bytes 8-11
    // the low 4 bits of sc[4..7] (low nibble) and m[4..7] (high nibble), whose top 2 bits are the
    // top 2 bits of bytes 0-3 and 4-7 (lib/math/weight_element.h's k_scale_min).
    const vec2 d = unpackHalf2x16(weights[block]);  // d, dmin
    const uint sc_low = weights[block + 1u], m_low = weights[block + 2u], high = weights[block + 3u];
    const uint at = 8u * (j % 4u);
    uint sc, m;
    if (j < 4u) {
        sc = bitfieldExtract(sc_low, int(at), 6);
        m = bitfieldExtract(m_low, int(at), 6);
    } else {
        sc = bitfieldExtract(high, int(at), 4) | (bitfieldExtract(sc_low, int(at) + 6, 2) << 4u);
        m = bitfieldExtract(high, int(at) + 4, 4) | (bitfieldExtract(m_low, int(at) + 6, 2) << 4u);
    }
    run.step = vec2(d.x * float(sc));
    run.off = d.y * float(m);
#if defined(TYPE_Q5_K)
    const uint qs = block + 12u;
    run.high_word = block + 4u;
    run.high_shift = j;
#else
    const uint qs = block + 4u;
    run.high_word = 0u;
    run.high_shift = 0u;
#endif
    run.low_word = qs + 8u * (j / 2u);
    run.low_shift = 4u * (j & 1u);
#endif
    return run;
}

// Quants of elements 4i .. 4i + 3 of a run (i < 8): Q4_K 0..15, Q5_K 0..31, Q6_K -32..31.
vec4 k_run_quants(KRun run, uint i) {
    uint q = (weights[run.low_word + i] >> run.low_shift) & 0x0F0F0F0Fu;
#if defined(TYPE_Q5_K)
    q |= ((weights[run.high_word + i] >> run.high_shift) & 0x01010101u) << 4u;
#elif defined(TYPE_Q6_K)
    q |= ((weights[run.high_word + i] >> run.high_shift) & 0x03030303u) << 4u;
#endif
    const vec4 v = vec4(uvec4(q, q >> 8u, q >> 16u, q >> 24u) & 0xFFu);
#if defined(TYPE_Q6_K)
    return v - 32.0;
#else
    return v;
#endif
}

// Values of elements 4i .. 4i + 3 of a run, exactly as dequantize_row computes them: `precise`
// keeps step * q - off two roundings (no fused multiply-add).
vec4 k_run_values(KRun run, uint i) {
    const float step = i < 4u ? run.step.x : run.step.y;
#if defined(TYPE_Q6_K)
    return step * k_run_quants(run, i);
#else
    precise vec4 v = step * k_run_quants(run, i) - run.off;
    return v;
#endif
}
#endif  // K_QUANT
