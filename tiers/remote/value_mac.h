// ValueMac: the keyed MAC that makes a remote value authentic, not just
// intact. The remote store is writable by every node of the cluster and by
// anyone holding its password; a checksum anyone can recompute (XXH3) only
// catches accidents. A value carries HMAC-SHA256 (OpenSSL) under a key
// derived from the cluster secret (the file every node shares,
// daemon/remote_key_file.h), so a party without the secret cannot make a
// value that verifies: not a new one, and not an old one moved to another
// key or namespace (the MAC covers the header that names them).
//
// The MAC key is HMAC-SHA256(secret, "kvtier remote value mac v2"), so the
// secret itself never keys anything else's MAC directly.
//
// Immutable after Create; thread-safe (each call works on its own copy of
// the keyed state).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "kvtier/result.h"

struct evp_mac_ctx_st;  // OpenSSL's EVP_MAC_CTX, kept out of this header

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

  // The MAC of `first` followed by `second` (no copy: both are fed in turn).
  ValueMacTag Compute(std::span<const std::byte> first, std::span<const std::byte> second) const;

  // Whether `tag` is the MAC of `first` followed by `second` (compared in
  // constant time).
  bool Verify(std::span<const std::byte> first, std::span<const std::byte> second,
              std::span<const std::byte, kValueMacBytes> tag) const;

 private:
  explicit ValueMac(evp_mac_ctx_st* keyed) : keyed_(keyed) {}

  evp_mac_ctx_st* keyed_;  // owned: initialised with the MAC key, duplicated per call, never updated
};

}  // namespace kvtier
