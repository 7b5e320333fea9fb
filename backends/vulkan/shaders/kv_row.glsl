// Rows of the KV cache on the device, in the formats of lib/kv/kv_row_format.h. Each row (one head of one
// token) is the CPU's row padded to whole words, so every row starts on a word boundary:
//   F32  head_dim words
//   F16  ceil(head_dim / 2) words, element 2i in the low half of word i
//   Q8   one word: the float scale; then ceil(head_dim / 4) words of int8, element j in byte j % 4
//   Q4   one word: fp16 scale (low half), fp16 min (high half); then ceil(head_dim / 8) words of
//        nibbles, element j in bits 4 * (j % 8) (element 2i in the low nibble of byte i)
// Mirrored by kv_row_words() in vk_kv.cpp.
//
// Encoding reproduces kv_store_row() bit for bit, so the GPU stores exactly the CPU's values: the
// divisions and the float -> half conversion are done with integer arithmetic, since Vulkan only
// bounds division to 2.5 ulp and leaves the rounding of packHalf2x16 open. The other operations
// used (min/max, subtraction, multiplication, floor) are correctly rounded.

const uint KV_F32 = 0u, KV_F16 = 1u, KV_Q8 = 2u, KV_Q4 = 3u;  // KvRowFormat

// Words before the element data: the scale (and min) of the quantized formats.
uint kv_header_words(uint format) { return format >= KV_Q8 ? 1u : 0u; }

uint kv_elements_per_word(uint format) {
    switch (format) {
        case KV_F16: return 2u;
        case KV_Q8: return 4u;
        case KV_Q4: return 8u;
        default: return 1u;
    }
}

uint kv_row_words(uint format, uint n) {
    const uint per_word = kv_elements_per_word(format);
    return kv_header_words(format) + (n + per_word - 1u) / per_word;
}

// The quantized value of element j from the data word holding it.
float kv_q8(uint word, uint j) { return float(bitfieldExtract(int(word), int(8u * (j & 3u)), 8)); }
float kv_q4(uint word, uint j) { return float(bitfieldExtract(word, int(4u * (j & 7u)), 4)); }

// Element j of a row, given the row's header word and the data word holding j. Q8 and Q4 decode
// as kv_load_row does (scale * q, min + scale * q).
float kv_element(uint format, uint header, uint word, uint j) {
    switch (format) {
        case KV_F16: return unpackHalf2x16(word)[j & 1u];
        case KV_Q8: return uintBitsToFloat(header) * kv_q8(word, j);
        case KV_Q4: {
            const vec2 scale_min = unpackHalf2x16(header);
            return scale_min.y + scale_min.x * kv_q4(word, j);
        }
        default: return uintBitsToFloat(word);
    }
}

// ---- encoding ---------------------------------------------------------------------------------

// fp32_to_fp16() of lib/math/quant.cpp: round to nearest even, overflow to infinity, NaN kept quiet.
uint kv_fp32_to_fp16(float f) {
    const uint x = floatBitsToUint(f);
    const uint sign = (x >> 16) & 0x8000u;
    const uint ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7E00u | ((ax >> 13) & 0x3FFu);
    if (ax >= 0x477FF000u) return sign | 0x7C00u;
    if (ax >= 0x38800000u) {
        uint h = ax - 0x38000000u;
        h += 0x0FFFu + ((h >> 13) & 1u);
        return sign | (h >> 13);
    }
    const uint exponent = ax >> 23;
    if (exponent < 102u) return sign;
    const uint mantissa = (ax & 0x7FFFFFu) | 0x800000u;
    const uint shift = 126u - exponent;
    uint m = mantissa >> shift;
    const uint rest = mantissa & ((1u << shift) - 1u);
    const uint half_unit = 1u << (shift - 1u);
    if (rest > half_unit || (rest == half_unit && (m & 1u) != 0u)) ++m;
    return sign | m;
}

// a / b correctly rounded (to nearest even) for a >= 0 and b > 0, by long division of the
// mantissas. Operands or a quotient outside the normal range (not met with the values of a KV
// row, whose scales are far from both ends) fall back to the device's division.
float kv_divide(float a, float b) {
    if (a == 0.0) return 0.0;
    const uint ua = floatBitsToUint(a), ub = floatBitsToUint(b);
    const int ea = int(ua >> 23), eb = int(ub >> 23);
    if (ea == 0 || eb == 0 || ea == 255 || eb == 255) return a / b;
    uint ma = (ua & 0x7FFFFFu) | 0x800000u;
    const uint mb = (ub & 0x7FFFFFu) | 0x800000u;
    int e = ea - eb;  // a / b = (ma / mb) * 2^e
    if (ma < mb) {
        ma <<= 1;
        e -= 1;
    }
    // ma / mb is in [1, 2): 24 quotient bits, then one more to round with (the remainder is sticky).
    uint r = ma, q = 0u;
    for (int i = 0; i < 25; ++i) {
        q <<= 1;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1;
    }
    uint mantissa = q >> 1;
    if ((q & 1u) != 0u && (r != 0u || (mantissa & 1u) != 0u)) mantissa += 1u;
    if (mantissa == 0x1000000u) {
        mantissa >>= 1;
        e += 1;
    }
    const int biased = e + 127;
    if (biased <= 0 || biased >= 255) return a / b;
    return uintBitsToFloat((uint(biased) << 23) | (mantissa & 0x7FFFFFu));
}

// std::lround: to nearest, halves away from zero (a - floor(a) is exact).
int kv_lround(float x) {
    const float a = abs(x);
    float r = floor(a);
    if (a - r >= 0.5) r += 1.0;
    return int(x < 0.0 ? -r : r);
}

// The row being encoded (or re-rotated): one invocation's private copy of head_dim floats.
float kv_row[MAX_HEAD_DIM];

// Per-row encoding parameters, from kv_encode_header.
float kv_inv, kv_min;

// Analyses kv_row[0, n) and returns the header word (quantized formats; 0 otherwise).
uint kv_encode_header(uint format, uint n) {
    if (format == KV_Q8) {
        float amax = 0.0;
        for (uint i = 0u; i < n; ++i) amax = max(amax, abs(kv_row[i]));
        const float scale = kv_divide(amax, 127.0);
        kv_inv = scale > 0.0 ? kv_divide(1.0, scale) : 0.0;
        return floatBitsToUint(scale);
    }
    if (format == KV_Q4) {
        float lo = kv_row[0], hi = kv_row[0];
        for (uint i = 1u; i < n; ++i) {
            lo = min(lo, kv_row[i]);
            hi = max(hi, kv_row[i]);
        }
        // Quantize against the stored (half-precision) scale and minimum, as the CPU does.
        const uint header = kv_fp32_to_fp16(kv_divide(hi - lo, 15.0)) | (kv_fp32_to_fp16(lo) << 16);
        const vec2 scale_min = unpackHalf2x16(header);
        kv_inv = scale_min.x > 0.0 ? kv_divide(1.0, scale_min.x) : 0.0;
        kv_min = scale_min.y;
        return header;
    }
    return 0u;
}

// Data word w of the encoded row (after kv_encode_header).
uint kv_encode_word(uint format, uint n, uint w) {
    const uint per_word = kv_elements_per_word(format), first = w * per_word;
    uint word = 0u;
    for (uint k = 0u; k < per_word && first + k < n; ++k) {
        const float x = kv_row[first + k];
        switch (format) {
            case KV_F16: word |= kv_fp32_to_fp16(x) << (16u * k); break;
            case KV_Q8: word |= (uint(kv_lround(x * kv_inv)) & 0xFFu) << (8u * k); break;
            case KV_Q4: word |= uint(clamp(kv_lround((x - kv_min) * kv_inv), 0, 15)) << (4u * k); break;
            default: word = floatBitsToUint(x); break;
        }
    }
    return word;
}
