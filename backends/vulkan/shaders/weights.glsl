// Element access to a weight matrix in the layout adopt_weight() repacks it into. Exactly one of
// TYPE_F32, TYPE_F16, TYPE_Q8_0, TYPE_Q4_0 is defined; the including shader declares the buffer
// `weights` (uint words).
//
// Every row starts on a word boundary (so a window of rows is a plain byte range):
//   F32   cols words
//   F16   ceil(cols / 2) words, two halves per word, element 2i in the low half
//   Q8_0  nb = cols / 32 blocks: nb * 8 words of quants (block b's 32 int8 in order), then
//         ceil(nb / 2) words of fp16 scales (block 2i in the low half)
//   Q4_0  nb * 4 words of quants (block b's 16 bytes as in the file: element j < 16 is the low
//         nibble of byte j, element j + 16 its high nibble), then ceil(nb / 2) words of scales
// Dequantized values equal llama.cpp's: q * d for Q8_0, (nibble - 8) * d for Q4_0.

#if defined(TYPE_Q8_0)
const uint QUANT_WORDS_PER_BLOCK = 8u;
#elif defined(TYPE_Q4_0)
const uint QUANT_WORDS_PER_BLOCK = 4u;
#endif

// Words of one row.
uint weight_row_words(uint cols) {
#if defined(TYPE_F32)
    return cols;
#elif defined(TYPE_F16)
    return (cols + 1u) / 2u;
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
