// PeerSource: what a PeerServer (peer_server.h) serves to other nodes: the
// blocks this node holds in memory it registered with UCX, pinned for a
// reader while the reader gets their bytes. The daemon implements it over
// its engine (daemon/setup/peer_setup.h); tests over plain memory.
//
// Thread-safety: every method may be called from any thread (the server
// calls them on its node's thread); `done` may run on any thread, inline or
// later, exactly once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kvtier/block_key.h"
#include "tiers/peer/peer_protocol.h"

namespace kvtier {

class PeerSource {
 public:
  virtual ~PeerSource() = default;

  struct Region {
    uint32_t id = 0;
    std::byte* base = nullptr;
    uint64_t bytes = 0;
  };
  // The memory a pinned block can lie in, registered with UCX once when
  // the server starts. The same for the source's whole life.
  virtual std::vector<Region> Regions() const = 0;

  // Which of `keys`, blocks of `ns`, this node can pin from its own
  // memory now, as far as it knows without I/O. One answer per key.
  virtual std::vector<PeerHeld> Find(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) = 0;

  // Pins `key` for `reader` (an id the server gives each connection): its
  // bytes stay where the answer says, unchanged, until Release or
  // EndReader. The answer carries the checksum of each layer (what the
  // reader verifies) and a lease; NotFound for a miss, Busy when the reader
  // holds too much, another code on failure.
  using PinDone = std::function<void(PeerPinned)>;
  virtual void Pin(uint64_t reader, const NamespaceFingerprint& ns, const BlockKey& key, PinDone done) = 0;
  // Ends leases `reader` holds (others it does not hold are ignored).
  virtual void Release(uint64_t reader, std::span<const uint64_t> leases) = 0;
  // Ends every lease of `reader`: it went away.
  virtual void EndReader(uint64_t reader) = 0;

  // `reader` now holds `keys` of `ns` whole, every layer verified (a
  // Taken message): a block its writer handed off may leave this node.
  // Returns how many blocks went now. The default keeps everything.
  virtual size_t Taken(uint64_t reader, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) { return 0; }

  // A block still being written may be pinned with fewer layers ready
  // than it has (PeerPinned::layers_ready, lease 0). Installs who hears
  // that more layers of such a block are ready: called on any thread with
  // no lock of the source's held, possibly after it was cleared for a call
  // already under way (the caller guards against that). Empty clears it.
  // A source whose blocks are all whole keeps the default.
  using PublishedListener = std::function<void(const BlockKey& key)>;
  virtual void SetPublishedListener(PublishedListener listener) {}
};

}  // namespace kvtier
