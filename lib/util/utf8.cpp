#include "utf8.h"

namespace h2o {

int utf8_sequence_length(std::string_view text, size_t i) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char lead = byte(i);
    if (lead < 0x80) return 1;
    int length;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (lead >= 0xC2 && lead <= 0xDF) {
        length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        length = 3;
        if (lead == 0xE0) lo = 0xA0;  // no overlong encodings
        if (lead == 0xED) hi = 0x9F;  // no UTF-16 surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        length = 4;
        if (lead == 0xF0) lo = 0x90;  // no overlong encodings
        if (lead == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    } else {
        return 0;
    }
    for (int k = 1; k < length; ++k) {
        if (i + k >= text.size()) return -1;
        const unsigned char c = byte(i + k);
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
    }
    return length;
}

bool is_valid_utf8(std::string_view text, size_t *bad_offset) {
    for (size_t i = 0; i < text.size();) {
        const int n = utf8_sequence_length(text, i);
        if (n <= 0) {
            if (bad_offset) *bad_offset = i;
            return false;
        }
        i += static_cast<size_t>(n);
    }
    return true;
}

void take_complete_utf8(std::string *pending, std::string *out, bool flush) {
    static const char kReplacement[] = "\xEF\xBF\xBD";
    size_t i = 0;
    while (i < pending->size()) {
        const int n = utf8_sequence_length(*pending, i);
        if (n > 0) {
            out->append(*pending, i, static_cast<size_t>(n));
            i += static_cast<size_t>(n);
        } else if (n == 0) {
            out->append(kReplacement);
            ++i;
        } else if (flush) {
            out->append(kReplacement);
            i = pending->size();
        } else {
            break;  // an incomplete character: wait for the next token
        }
    }
    pending->erase(0, i);
}

bool decode_utf8(std::string_view text, uint32_t *cp, size_t *length) {
    const int n = text.empty() ? 0 : utf8_sequence_length(text, 0);
    if (n <= 0) return false;
    const auto byte = [&](int i) { return static_cast<uint32_t>(static_cast<unsigned char>(text[static_cast<size_t>(i)])); };
    uint32_t v = n == 1 ? byte(0) : n == 2 ? byte(0) & 0x1F : n == 3 ? byte(0) & 0x0F : byte(0) & 0x07;
    for (int i = 1; i < n; ++i) v = (v << 6) | (byte(i) & 0x3F);
    *cp = v;
    *length = static_cast<size_t>(n);
    return true;
}

}  // namespace h2o
