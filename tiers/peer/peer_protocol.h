// The peer protocol: the control messages between a node that reads
// (PeerTier, the reader) and a node that serves its memory (PeerServer),
// sent as UCX active messages; the bytes themselves move by one-sided UCX
// gets the reader makes into its own memory (docs/INTERNALS.md, "Peer
// tier").
//
// Every message: version (u8), type (u8), request id (u64), then its body,
// little-endian, lengths before lists. A message that does not parse is a
// protocol error: the connection is closed.
//
// The handshake proves that both ends hold the cluster secret
// (remote.key_file) without sending it:
//   reader -> Hello     {node id, nonce_r}
//   server -> Challenge {node id, nonce_s, HMAC(secret, "server" | nonce_r | nonce_s)}
//   reader -> Proof     {HMAC(secret, "client" | nonce_s | nonce_r)}
//   server -> Welcome   {the memory regions the reader may get from: id, base, bytes, packed remote key;
//                        then, only when the server publishes KV events where peers reach them, the
//                        events' stream and replay endpoints (a reader follows them to learn what
//                        the server holds, subscriber/held_directory.h)}
// A server answers nothing else before a good Proof; a reader trusts no
// answer of a server whose Challenge did not verify. Fresh nonces on both
// sides: an old exchange replayed proves nothing.
//
// Then:
//   Query   {ns, keys}          -> Found   {per key: held?, payload bytes, layers, layers ready, payload checksum}
//   Pin     {ns, key}           -> Pinned  {status, lease, region, offset, bytes, layers, layers ready, checksum,
//                                           the ready layers' checksums}
//   Watch   {ns, key, have, wait_ms}
//                               -> Pinned  once more than `have` layers are ready (or the block is gone),
//                                          or as it is after wait_ms
//   Release {leases}            (no answer)
//   Taken   {ns, keys}          (no answer) the reader holds these blocks whole, every layer verified: a
//                               block its writer handed off (LayerSave::PublishToPeers with
//                               free_when_taken) may now leave the server's node
// A block still being written on the server (a layer-wise save that
// publishes its layers) is held with fewer layers ready than it has: its
// Pinned carries no lease (lease 0) and the checksums of the ready layers
// only; the reader reads those and watches for the rest.
//   any request                 -> Refused {status, message} when it cannot be answered
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

inline constexpr uint8_t kPeerProtocolVersion = 1;
// Active message ids: requests to the server, answers to the reader.
inline constexpr unsigned kPeerRequestAm = 0x6b76;  // "kv"
inline constexpr unsigned kPeerAnswerAm = 0x6b77;
inline constexpr size_t kPeerNonceBytes = 32;
inline constexpr size_t kPeerProofBytes = 32;  // HMAC-SHA256
// Bounds a server holds a request to (a Query's keys; a Pin's layers).
inline constexpr uint32_t kMaxPeerQueryKeys = 4096;
inline constexpr uint32_t kMaxPeerLayers = 4096;
inline constexpr uint32_t kMaxPeerRegions = 1024;
inline constexpr uint32_t kMaxPeerReleases = 4096;

enum class PeerMessage : uint8_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kWelcome = 4,
  kQuery = 5,
  kFound = 6,
  kPin = 7,
  kPinned = 8,
  kRelease = 9,
  kRefused = 10,
  kWatch = 11,
  kTaken = 12,
};

using PeerNonce = std::array<std::byte, kPeerNonceBytes>;
using PeerProof = std::array<std::byte, kPeerProofBytes>;

struct PeerHello {
  uint64_t node = 0;  // the reader's node id (random per start)
  PeerNonce nonce{};
};
struct PeerChallenge {
  uint64_t node = 0;  // the server's node id
  PeerNonce nonce{};
  PeerProof proof{};
};
struct PeerRegion {
  uint32_t id = 0;
  uint64_t base = 0;  // the address the server registered, for gets
  uint64_t bytes = 0;
  std::string rkey;  // ucp_rkey_pack's bytes
};
struct PeerWelcome {
  std::vector<PeerRegion> regions;
  // Both or neither (at most 1,024 bytes each): "tcp://host:port".
  std::string events_endpoint;
  std::string events_replay_endpoint;
};
struct PeerQuery {
  NamespaceFingerprint ns;
  std::vector<BlockKey> keys;
};
struct PeerHeld {
  bool held = false;
  uint64_t payload_bytes = 0;
  uint32_t layer_count = 0;
  uint32_t layers_ready = 0;  // layer_count unless the block is still being written
  uint64_t payload_checksum = 0;
};
struct PeerFound {
  std::vector<PeerHeld> keys;  // one per queried key
};
struct PeerPin {
  NamespaceFingerprint ns;
  BlockKey key;
};
struct PeerPinned {
  StatusCode code = StatusCode::kOk;
  uint64_t lease = 0;  // 0 for a block still being written (nothing to release)
  uint32_t region = 0;
  uint64_t offset = 0;  // of the payload within the region
  uint64_t payload_bytes = 0;
  uint32_t layer_count = 0;
  uint32_t layers_ready = 0;  // layers [0, layers_ready) may be read
  uint64_t payload_checksum = 0;
  std::vector<uint64_t> layer_checksums;  // of the ready layers
};
struct PeerWatch {
  NamespaceFingerprint ns;
  BlockKey key;
  uint32_t have = 0;     // layers ready in the reader's last answer
  uint32_t wait_ms = 0;  // how long the reader waits: the server answers by then at the latest
};
struct PeerRelease {
  std::vector<uint64_t> leases;
};
struct PeerTaken {
  NamespaceFingerprint ns;
  std::vector<BlockKey> keys;  // at most kMaxPeerQueryKeys
};
struct PeerRefused {
  StatusCode code = StatusCode::kUnavailable;
  std::string message;
};

// A decoded message: its type, request id and the body of that type.
struct PeerEnvelope {
  PeerMessage type{};
  uint64_t request = 0;
  std::span<const std::byte> body;
};

// Encoders: the whole message, header included.
std::vector<std::byte> EncodePeer(uint64_t request, const PeerHello& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerChallenge& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerProof& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerWelcome& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerQuery& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerFound& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerPin& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerPinned& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerRelease& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerRefused& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerWatch& m);
std::vector<std::byte> EncodePeer(uint64_t request, const PeerTaken& m);

// The header; InvalidArgument for a short message, another version or an
// unknown type.
Result<PeerEnvelope> OpenPeer(std::span<const std::byte> message);
// Bodies; InvalidArgument when short, long, or past a bound above (and a
// Welcome that names a region twice).
Result<PeerHello> DecodeHello(std::span<const std::byte> body);
Result<PeerChallenge> DecodeChallenge(std::span<const std::byte> body);
Result<PeerProof> DecodeProof(std::span<const std::byte> body);
Result<PeerWelcome> DecodeWelcome(std::span<const std::byte> body);
Result<PeerQuery> DecodeQuery(std::span<const std::byte> body);
Result<PeerFound> DecodeFound(std::span<const std::byte> body);
Result<PeerPin> DecodePin(std::span<const std::byte> body);
Result<PeerPinned> DecodePinned(std::span<const std::byte> body);
Result<PeerRelease> DecodeRelease(std::span<const std::byte> body);
Result<PeerRefused> DecodeRefused(std::span<const std::byte> body);
Result<PeerWatch> DecodeWatch(std::span<const std::byte> body);
Result<PeerTaken> DecodeTaken(std::span<const std::byte> body);

// The handshake's proofs, HMAC-SHA256 under `secret` (the cluster secret):
// the server's over (nonce_r, nonce_s), the reader's over (nonce_s, nonce_r),
// each with its own label so that neither can stand for the other.
PeerProof ServerProof(std::span<const std::byte> secret, const PeerNonce& reader, const PeerNonce& server);
PeerProof ReaderProof(std::span<const std::byte> secret, const PeerNonce& server, const PeerNonce& reader);
// Compares in time independent of where they differ.
bool SameProof(const PeerProof& a, const PeerProof& b);
// Fresh random bytes (the OS's generator). Unavailable if it fails.
Result<PeerNonce> FreshNonce();
// A random node id (never 0).
uint64_t FreshNodeId();

}  // namespace kvtier
