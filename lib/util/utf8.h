// UTF-8 validation and the streaming rule "deliver only complete characters".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace h2o {

// Length of the valid UTF-8 sequence starting at text[i] (1-4), 0 when the bytes there are not a
// valid sequence, or -1 when they are a valid but incomplete prefix that runs past the end.
int utf8_sequence_length(std::string_view text, size_t i);

// The code point of the valid sequence at the start of text and its length; false when the
// bytes there are not a complete valid sequence.
bool decode_utf8(std::string_view text, uint32_t *cp, size_t *length);

// True when text is entirely valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
// Otherwise *bad_offset (if given) receives the offset of the first invalid byte.
bool is_valid_utf8(std::string_view text, size_t *bad_offset = nullptr);

// Moves the complete characters at the front of *pending to the end of *out, leaving an
// incomplete trailing sequence in *pending. Invalid bytes become U+FFFD, so *out is always valid
// UTF-8. flush: the stream has ended, so an incomplete tail also becomes U+FFFD.
void take_complete_utf8(std::string *pending, std::string *out, bool flush);

}  // namespace h2o
