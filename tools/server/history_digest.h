// A conversation's identity by content: the SHA-256 chain of its messages. digest(k+1) hashes
// digest(k) with message k's role and content, so the digests of every prefix of a request come
// in one pass, and a conversation held by the server is found from the messages a client sends
// back (a cryptographic hash: a client cannot make its messages collide with another's).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace h2o_server {

using Digest = std::array<uint8_t, 32>;

// SHA-256 of bytes (FIPS 180-4).
Digest sha256(std::string_view bytes);

// The digest of no messages.
Digest empty_history();
// The digest of the messages of `before` followed by one message.
Digest extend_history(const Digest &before, std::string_view role, std::string_view content);

std::string to_hex(const Digest &digest);
// false when hex is not 64 hexadecimal digits.
bool from_hex(std::string_view hex, Digest *out);

}  // namespace h2o_server
