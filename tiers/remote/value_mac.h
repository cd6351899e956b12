// ValueMac: the keyed MAC that makes a remote value authentic, not just
// intact. The remote store is writable by every node of the cluster and by
// anyone holding its password; a checksum anyone can recompute (XXH3) only
// catches accidents. A value carries a tag under a key derived from the
// cluster secret (the file every node shares, daemon/setup/remote_key_file.h), so
// a party without the secret cannot make a value that verifies: not a new
// one, and not an old one moved to another key or namespace (the MAC covers
// the header that names them).
//
// The tag (kValueMacBytes) is a fresh 16-byte random nonce followed by
// Poly1305 (OpenSSL) of the message under the one-time key
// HMAC-SHA256(mac_key, nonce), where mac_key = HMAC-SHA256(secret,
// "kvtier remote value mac v2"). Poly1305 runs at several times SHA-256's
// speed (one pass over a 2 MiB payload costs a fraction of the copy to
// Redis); a one-time key per value, from a nonce never reused in practice
// (2^-64 after 2^32 values), is what Poly1305 requires, and only the
// short HMAC sees the long-term key.
//
// Immutable after Create; thread-safe (each call works on its own copies of
// the keyed state).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "kvtier/result.h"

struct evp_mac_ctx_st;  // OpenSSL's EVP_MAC_CTX and EVP_MAC, kept out of this header
struct evp_mac_st;

namespace kvtier {

inline constexpr size_t kClusterSecretBytes = 32;
inline constexpr size_t kValueMacBytes = 32;
using ValueMacTag = std::array<std::byte, kValueMacBytes>;

class ValueMac {
 public:
  // InvalidArgument when `secret` is not kClusterSecretBytes long; Internal
  // when OpenSSL cannot provide HMAC-SHA256.
  static Result<std::unique_ptr<ValueMac>> Create(std::string_view secret);
  ~ValueMac();
  ValueMac(const ValueMac&) = delete;
  ValueMac& operator=(const ValueMac&) = delete;

  // A tag of `first` followed by `second` (no copy: both are fed in turn),
  // with a fresh nonce: two calls on the same bytes give different tags,
  // each of which verifies.
  ValueMacTag Compute(std::span<const std::byte> first, std::span<const std::byte> second) const;

  // Whether `tag` (its nonce and Poly1305 part) is a tag of `first`
  // followed by `second` (compared in constant time).
  bool Verify(std::span<const std::byte> first, std::span<const std::byte> second,
              std::span<const std::byte, kValueMacBytes> tag) const;

 private:
  ValueMac(evp_mac_ctx_st* keyed, evp_mac_st* poly1305) : keyed_(keyed), poly1305_(poly1305) {}

  // The Poly1305 part of the tag for `nonce`.
  std::array<std::byte, 16> Poly1305Tag(std::span<const std::byte, 16> nonce, std::span<const std::byte> first,
                                        std::span<const std::byte> second) const;

  evp_mac_ctx_st* keyed_;  // owned: HMAC-SHA256 keyed with mac_key, duplicated per call, never updated
  evp_mac_st* poly1305_;   // owned: the fetched algorithm
};

}  // namespace kvtier
