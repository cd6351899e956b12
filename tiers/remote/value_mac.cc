#include "tiers/remote/value_mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <cstring>

#include "common/check.h"

namespace kvtier {
namespace {

constexpr std::string_view kMacKeyLabel = "kvtier remote value mac v2";

// A fresh HMAC-SHA256 context keyed with `key`, or null.
EVP_MAC_CTX* KeyedHmac(const unsigned char* key, size_t key_bytes) {
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (hmac == nullptr) return nullptr;
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac);
  EVP_MAC_free(hmac);  // the context holds its own reference
  if (ctx == nullptr) return nullptr;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx, key, key_bytes, params) != 1) {
    EVP_MAC_CTX_free(ctx);
    return nullptr;
  }
  return ctx;
}

// Feeds `first` then `second` into a copy of `keyed` and returns the tag.
ValueMacTag Run(const EVP_MAC_CTX* keyed, std::span<const std::byte> first, std::span<const std::byte> second) {
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_dup(keyed);
  KVTIER_CHECK(ctx != nullptr, "EVP_MAC_CTX_dup failed (out of memory)");
  ValueMacTag tag{};
  size_t written = 0;
  const bool ok = EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(first.data()), first.size()) == 1 &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(second.data()), second.size()) == 1 &&
                  EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(tag.data()), &written, tag.size()) == 1;
  EVP_MAC_CTX_free(ctx);
  KVTIER_CHECK(ok && written == tag.size(), "HMAC-SHA256 failed on a keyed context");
  return tag;
}

}  // namespace

Result<std::unique_ptr<ValueMac>> ValueMac::Create(std::string_view secret) {
  if (secret.size() != kClusterSecretBytes) {
    return InvalidArgument("the cluster secret is " + std::to_string(secret.size()) + " bytes, not " +
                           std::to_string(kClusterSecretBytes));
  }
  EVP_MAC_CTX* from_secret = KeyedHmac(reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  if (from_secret == nullptr) return Internal("OpenSSL provides no HMAC-SHA256");
  const ValueMacTag mac_key = Run(from_secret, std::as_bytes(std::span(kMacKeyLabel)), {});
  EVP_MAC_CTX_free(from_secret);
  EVP_MAC_CTX* keyed = KeyedHmac(reinterpret_cast<const unsigned char*>(mac_key.data()), mac_key.size());
  if (keyed == nullptr) return Internal("OpenSSL provides no HMAC-SHA256");
  EVP_MAC* poly1305 = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
  if (poly1305 == nullptr) {
    EVP_MAC_CTX_free(keyed);
    return Internal("OpenSSL provides no Poly1305");
  }
  return std::unique_ptr<ValueMac>(new ValueMac(keyed, poly1305));
}

ValueMac::~ValueMac() {
  EVP_MAC_CTX_free(keyed_);
  EVP_MAC_free(poly1305_);
}

std::array<std::byte, 16> ValueMac::Poly1305Tag(std::span<const std::byte, 16> nonce, std::span<const std::byte> first,
                                                std::span<const std::byte> second) const {
  const ValueMacTag one_time_key = Run(keyed_, nonce, {});  // 32 bytes: Poly1305's r and s
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(poly1305_);
  KVTIER_CHECK(ctx != nullptr, "EVP_MAC_CTX_new failed (out of memory)");
  std::array<std::byte, 16> tag{};
  size_t written = 0;
  const bool ok = EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(one_time_key.data()), one_time_key.size(),
                               nullptr) == 1 &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(first.data()), first.size()) == 1 &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(second.data()), second.size()) == 1 &&
                  EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(tag.data()), &written, tag.size()) == 1;
  EVP_MAC_CTX_free(ctx);
  KVTIER_CHECK(ok && written == tag.size(), "Poly1305 failed on a one-time key");
  return tag;
}

ValueMacTag ValueMac::Compute(std::span<const std::byte> first, std::span<const std::byte> second) const {
  ValueMacTag tag{};
  KVTIER_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(tag.data()), 16) == 1, "OpenSSL's random generator failed");
  const auto nonce = std::span<const std::byte, 16>(tag.data(), 16);
  const std::array<std::byte, 16> poly = Poly1305Tag(nonce, first, second);
  std::memcpy(tag.data() + 16, poly.data(), poly.size());
  return tag;
}

bool ValueMac::Verify(std::span<const std::byte> first, std::span<const std::byte> second,
                      std::span<const std::byte, kValueMacBytes> tag) const {
  const std::array<std::byte, 16> expected = Poly1305Tag(tag.first<16>(), first, second);
  return CRYPTO_memcmp(expected.data(), tag.data() + 16, expected.size()) == 0;
}

}  // namespace kvtier
