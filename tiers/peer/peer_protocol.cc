#include "tiers/peer/peer_protocol.h"

#include <algorithm>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>
#include <string_view>

#include "common/little_endian.h"

namespace kvtier {
namespace {

// Appends fields to a message.
class Out {
 public:
  Out(PeerMessage type, uint64_t request) {
    U8(kPeerProtocolVersion);
    U8(static_cast<uint8_t>(type));
    U64(request);
  }
  void U8(uint8_t v) { bytes_.push_back(static_cast<std::byte>(v)); }
  void U32(uint32_t v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + 4);
    StoreLe32(bytes_.data() + at, v);
  }
  void U64(uint64_t v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + 8);
    StoreLe64(bytes_.data() + at, v);
  }
  void Raw(std::span<const std::byte> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  void Key(const BlockKey& k) {
    U64(k.hi);
    U64(k.lo);
  }
  void Text(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(std::as_bytes(std::span(s.data(), s.size())));
  }
  std::vector<std::byte> Take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// Reads fields of a body; the first short read makes it bad for good.
class In {
 public:
  explicit In(std::span<const std::byte> b) : b_(b) {}
  uint8_t U8() {
    if (!Need(1)) return 0;
    return static_cast<uint8_t>(b_[at_++]);
  }
  uint32_t U32() {
    if (!Need(4)) return 0;
    const uint32_t v = LoadLe32(b_.data() + at_);
    at_ += 4;
    return v;
  }
  uint64_t U64() {
    if (!Need(8)) return 0;
    const uint64_t v = LoadLe64(b_.data() + at_);
    at_ += 8;
    return v;
  }
  template <size_t N>
  void Raw(std::array<std::byte, N>& out) {
    if (!Need(N)) return;
    std::memcpy(out.data(), b_.data() + at_, N);
    at_ += N;
  }
  BlockKey Key() {
    BlockKey k;
    k.hi = U64();
    k.lo = U64();
    return k;
  }
  std::string Text(size_t max) {
    const uint32_t n = U32();
    if (n > max || !Need(n)) {
      bad_ = true;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + at_), n);
    at_ += n;
    return s;
  }
  // A count of items of at least `item_bytes` each, at most `max`.
  uint32_t Count(uint32_t max, size_t item_bytes) {
    const uint32_t n = U32();
    if (n > max || (item_bytes > 0 && n > (b_.size() - std::min(at_, b_.size())) / item_bytes)) {
      bad_ = true;
      return 0;
    }
    return n;
  }
  // Whether bytes are left (an optional field follows).
  bool More() const { return !bad_ && at_ < b_.size(); }
  // Ok when every field was there and nothing is left over.
  Status End(std::string_view what) const {
    if (bad_ || at_ != b_.size()) return InvalidArgument("peer " + std::string(what) + ": malformed");
    return Status::Ok();
  }

 private:
  bool Need(size_t n) {
    if (bad_ || b_.size() - at_ < n) {
      bad_ = true;
      return false;
    }
    return true;
  }
  std::span<const std::byte> b_;
  size_t at_ = 0;
  bool bad_ = false;
};

constexpr size_t kMaxRkeyBytes = 64 * 1024;
constexpr size_t kMaxRefusalBytes = 4096;
constexpr size_t kMaxEndpointBytes = 1024;

PeerProof Hmac(std::span<const std::byte> secret, std::string_view label, const PeerNonce& a, const PeerNonce& b) {
  std::vector<unsigned char> message(label.begin(), label.end());
  for (const PeerNonce* n : {&a, &b}) {
    const auto* p = reinterpret_cast<const unsigned char*>(n->data());
    message.insert(message.end(), p, p + n->size());
  }
  PeerProof out{};
  unsigned int written = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message.data(), message.size(),
       reinterpret_cast<unsigned char*>(out.data()), &written);
  return out;
}

}  // namespace

std::vector<std::byte> EncodePeer(uint64_t request, const PeerHello& m) {
  Out o(PeerMessage::kHello, request);
  o.U64(m.node);
  o.Raw(m.nonce);
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerChallenge& m) {
  Out o(PeerMessage::kChallenge, request);
  o.U64(m.node);
  o.Raw(m.nonce);
  o.Raw(m.proof);
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerProof& m) {
  Out o(PeerMessage::kProof, request);
  o.Raw(m);
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerWelcome& m) {
  Out o(PeerMessage::kWelcome, request);
  o.U32(static_cast<uint32_t>(m.regions.size()));
  for (const PeerRegion& r : m.regions) {
    o.U32(r.id);
    o.U64(r.base);
    o.U64(r.bytes);
    o.Text(r.rkey);
  }
  if (!m.events_endpoint.empty()) {
    o.Text(m.events_endpoint);
    o.Text(m.events_replay_endpoint);
  }
  return o.Take();
}
// Query and Taken: a namespace and its keys.
static std::vector<std::byte> EncodeKeys(PeerMessage type, uint64_t request, const NamespaceFingerprint& ns,
                                         std::span<const BlockKey> keys) {
  Out o(type, request);
  o.Key(ns);
  o.U32(static_cast<uint32_t>(keys.size()));
  for (const BlockKey& k : keys) o.Key(k);
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerQuery& m) {
  return EncodeKeys(PeerMessage::kQuery, request, m.ns, m.keys);
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerTaken& m) {
  return EncodeKeys(PeerMessage::kTaken, request, m.ns, m.keys);
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerFound& m) {
  Out o(PeerMessage::kFound, request);
  o.U32(static_cast<uint32_t>(m.keys.size()));
  for (const PeerHeld& h : m.keys) {
    o.U8(h.held ? 1 : 0);
    o.U64(h.payload_bytes);
    o.U32(h.layer_count);
    o.U32(h.layers_ready);
    o.U64(h.payload_checksum);
  }
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerPin& m) {
  Out o(PeerMessage::kPin, request);
  o.Key(m.ns);
  o.Key(m.key);
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerPinned& m) {
  Out o(PeerMessage::kPinned, request);
  o.U32(static_cast<uint32_t>(m.code));
  o.U64(m.lease);
  o.U32(m.region);
  o.U64(m.offset);
  o.U64(m.payload_bytes);
  o.U32(m.layer_count);
  o.U32(m.layers_ready);
  o.U64(m.payload_checksum);
  o.U32(static_cast<uint32_t>(m.layer_checksums.size()));
  for (uint64_t c : m.layer_checksums) o.U64(c);
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerRelease& m) {
  Out o(PeerMessage::kRelease, request);
  o.U32(static_cast<uint32_t>(m.leases.size()));
  for (uint64_t l : m.leases) o.U64(l);
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerWatch& m) {
  Out o(PeerMessage::kWatch, request);
  o.Key(m.ns);
  o.Key(m.key);
  o.U32(m.have);
  o.U32(m.wait_ms);
  return o.Take();
}
std::vector<std::byte> EncodePeer(uint64_t request, const PeerRefused& m) {
  Out o(PeerMessage::kRefused, request);
  o.U32(static_cast<uint32_t>(m.code));
  o.Text(m.message.substr(0, kMaxRefusalBytes));
  return o.Take();
}

Result<PeerEnvelope> OpenPeer(std::span<const std::byte> message) {
  In in(message);
  const uint8_t version = in.U8();
  const uint8_t type = in.U8();
  const uint64_t request = in.U64();
  if (message.size() < 10) return InvalidArgument("peer message: shorter than its header");
  if (version != kPeerProtocolVersion) {
    return InvalidArgument("peer message: protocol version " + std::to_string(version) + ", this node speaks " +
                           std::to_string(kPeerProtocolVersion));
  }
  if (type < static_cast<uint8_t>(PeerMessage::kHello) || type > static_cast<uint8_t>(PeerMessage::kTaken)) {
    return InvalidArgument("peer message: unknown type " + std::to_string(type));
  }
  return PeerEnvelope{static_cast<PeerMessage>(type), request, message.subspan(10)};
}

Result<PeerHello> DecodeHello(std::span<const std::byte> body) {
  In in(body);
  PeerHello m;
  m.node = in.U64();
  in.Raw(m.nonce);
  if (Status s = in.End("hello"); !s.ok()) return s;
  return m;
}
Result<PeerChallenge> DecodeChallenge(std::span<const std::byte> body) {
  In in(body);
  PeerChallenge m;
  m.node = in.U64();
  in.Raw(m.nonce);
  in.Raw(m.proof);
  if (Status s = in.End("challenge"); !s.ok()) return s;
  return m;
}
Result<PeerProof> DecodeProof(std::span<const std::byte> body) {
  In in(body);
  PeerProof m{};
  in.Raw(m);
  if (Status s = in.End("proof"); !s.ok()) return s;
  return m;
}
Result<PeerWelcome> DecodeWelcome(std::span<const std::byte> body) {
  In in(body);
  PeerWelcome m;
  const uint32_t n = in.Count(kMaxPeerRegions, 24);
  for (uint32_t i = 0; i < n; ++i) {
    PeerRegion r;
    r.id = in.U32();
    r.base = in.U64();
    r.bytes = in.U64();
    r.rkey = in.Text(kMaxRkeyBytes);
    m.regions.push_back(std::move(r));
  }
  if (in.More()) {  // a server without events leaves them out
    m.events_endpoint = in.Text(kMaxEndpointBytes);
    m.events_replay_endpoint = in.Text(kMaxEndpointBytes);
    if (m.events_endpoint.empty() || m.events_replay_endpoint.empty()) {
      return InvalidArgument("peer welcome: an events endpoint is empty");
    }
  }
  if (Status s = in.End("welcome"); !s.ok()) return s;
  std::vector<uint32_t> ids;
  for (const PeerRegion& r : m.regions) ids.push_back(r.id);
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) {
    return InvalidArgument("peer welcome: region " + std::to_string(*std::adjacent_find(ids.begin(), ids.end())) +
                           " named twice");
  }
  return m;
}
// Query's and Taken's body: a namespace and at most kMaxPeerQueryKeys keys.
template <typename M>
static Result<M> DecodeKeys(std::span<const std::byte> body, const char* what) {
  In in(body);
  M m;
  m.ns = in.Key();
  const uint32_t n = in.Count(kMaxPeerQueryKeys, 16);
  m.keys.reserve(n);
  for (uint32_t i = 0; i < n; ++i) m.keys.push_back(in.Key());
  if (Status s = in.End(what); !s.ok()) return s;
  return m;
}
Result<PeerQuery> DecodeQuery(std::span<const std::byte> body) { return DecodeKeys<PeerQuery>(body, "query"); }
Result<PeerTaken> DecodeTaken(std::span<const std::byte> body) { return DecodeKeys<PeerTaken>(body, "taken"); }
Result<PeerFound> DecodeFound(std::span<const std::byte> body) {
  In in(body);
  PeerFound m;
  const uint32_t n = in.Count(kMaxPeerQueryKeys, 25);
  m.keys.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    PeerHeld h;
    h.held = in.U8() != 0;
    h.payload_bytes = in.U64();
    h.layer_count = in.U32();
    h.layers_ready = in.U32();
    h.payload_checksum = in.U64();
    if (h.held && h.layers_ready > h.layer_count) return InvalidArgument("peer found: more layers ready than held");
    m.keys.push_back(h);
  }
  if (Status s = in.End("found"); !s.ok()) return s;
  return m;
}
Result<PeerPin> DecodePin(std::span<const std::byte> body) {
  In in(body);
  PeerPin m;
  m.ns = in.Key();
  m.key = in.Key();
  if (Status s = in.End("pin"); !s.ok()) return s;
  return m;
}
Result<PeerPinned> DecodePinned(std::span<const std::byte> body) {
  In in(body);
  PeerPinned m;
  m.code = static_cast<StatusCode>(in.U32());
  m.lease = in.U64();
  m.region = in.U32();
  m.offset = in.U64();
  m.payload_bytes = in.U64();
  m.layer_count = in.U32();
  m.layers_ready = in.U32();
  m.payload_checksum = in.U64();
  const uint32_t n = in.Count(kMaxPeerLayers, 8);
  m.layer_checksums.reserve(n);
  for (uint32_t i = 0; i < n; ++i) m.layer_checksums.push_back(in.U64());
  if (Status s = in.End("pinned"); !s.ok()) return s;
  if (m.code == StatusCode::kOk &&
      (m.layer_count == 0 || m.layers_ready > m.layer_count || m.layer_checksums.size() != m.layers_ready ||
       (m.layers_ready < m.layer_count && m.lease != 0))) {
    return InvalidArgument("peer pinned: " + std::to_string(m.layer_checksums.size()) + " layer checksums, " +
                           std::to_string(m.layers_ready) + " of " + std::to_string(m.layer_count) +
                           " layers ready, lease " + std::to_string(m.lease));
  }
  return m;
}
Result<PeerRelease> DecodeRelease(std::span<const std::byte> body) {
  In in(body);
  PeerRelease m;
  const uint32_t n = in.Count(kMaxPeerReleases, 8);
  m.leases.reserve(n);
  for (uint32_t i = 0; i < n; ++i) m.leases.push_back(in.U64());
  if (Status s = in.End("release"); !s.ok()) return s;
  return m;
}
Result<PeerWatch> DecodeWatch(std::span<const std::byte> body) {
  In in(body);
  PeerWatch m;
  m.ns = in.Key();
  m.key = in.Key();
  m.have = in.U32();
  m.wait_ms = in.U32();
  if (Status s = in.End("watch"); !s.ok()) return s;
  return m;
}
Result<PeerRefused> DecodeRefused(std::span<const std::byte> body) {
  In in(body);
  PeerRefused m;
  m.code = static_cast<StatusCode>(in.U32());
  m.message = in.Text(kMaxRefusalBytes);
  if (Status s = in.End("refused"); !s.ok()) return s;
  return m;
}

PeerProof ServerProof(std::span<const std::byte> secret, const PeerNonce& reader, const PeerNonce& server) {
  return Hmac(secret, "kvtier peer server v1", reader, server);
}
PeerProof ReaderProof(std::span<const std::byte> secret, const PeerNonce& server, const PeerNonce& reader) {
  return Hmac(secret, "kvtier peer reader v1", server, reader);
}
bool SameProof(const PeerProof& a, const PeerProof& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

Result<PeerNonce> FreshNonce() {
  PeerNonce n{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    return Unavailable("peer: no random bytes for a nonce");
  }
  return n;
}

uint64_t FreshNodeId() {
  for (;;) {
    uint64_t id = 0;
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof(id)) == 1 && id != 0) return id;
  }
}

}  // namespace kvtier
