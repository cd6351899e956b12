// MemberRegistry: the nodes of one cluster that announce an address
// through the remote tier's Redis (peer discovery, docs/OPERATIONS.md
// "Peer tier"), so that no node needs the list of the others.
//
// The registry is one Redis hash (`hash_key`, one slot): a field per node,
// its id, whose value is this node's address and the wall-clock time its
// entry lapses, tagged with the cluster secret's MAC (value_mac.h) over
// a domain string, the field and the value (so no other message under the
// secret, such as a remote value, verifies as an entry). Refresh writes
// this node's entry (lapsing `ttl` from now) and reads the whole hash: the
// addresses of the other nodes whose entries verify and have not lapsed.
// A node that stops refreshing drops out `ttl` after its last refresh;
// Leave removes its entry at once. An entry that lapses more than 2 `ttl`
// ahead is refused (none lives forever, whatever its writer chose).
//
// Trust: an entry that does not verify (another cluster's, with another
// secret, sharing the Redis; or forged) is ignored and counted, never
// deleted. A lapsed entry that verifies is deleted by whoever reads it
// more than `ttl` after it lapsed. Anyone who can write to the Redis can
// delete entries or replay an old one until it lapses: discovery then
// misses nodes or tries an address whose server must still prove the
// cluster secret (peer_protocol.h); it never trusts a node without it.
// Clocks: lapse times are wall-clock, so nodes' clocks must agree to well
// within `ttl`.
//
// Bounds: a hash of more than `max_entries` fields, or a value longer than
// an entry can be (ids of at most 64 bytes, addresses of at most 300), is
// refused whole (ProtocolError; the previous answer stands with the
// caller): a read costs at most about 3 MB at the default bound. A lapsed
// entry deleted by a reader just as its node wrote it again costs that
// node one interval's absence (it writes again on its next refresh).
//
// Thread-safe: calls may come from any thread (the ClusterClient's).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/result.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/value_mac.h"

namespace kvtier {

struct MemberRegistryOptions {
  std::string hash_key = "kvtier:peer-members";
  std::string self_id;       // this node's field: unique per running node
  std::string self_address;  // what the others connect to
  std::chrono::milliseconds ttl{20000};
  std::chrono::milliseconds timeout{1000};  // one Redis command
  size_t max_entries = 4096;
  // Wall-clock milliseconds since the epoch (tests move it).
  std::function<int64_t()> now_ms;
};

struct RegistryMembers {
  std::vector<std::string> addresses;  // the other live nodes', sorted, each once
  size_t refused = 0;                  // entries that did not verify or decode
  size_t lapsed = 0;                   // verified entries past their time (deleted when long past)
  Status announce_failure;             // this node's entry could not be written (the others were read)
};

class MemberRegistry {
 public:
  // InvalidArgument for an empty id or address, or a secret ValueMac
  // refuses. `client` is the registry's own (not the remote tier's).
  static Result<std::unique_ptr<MemberRegistry>> Create(std::unique_ptr<ClusterClient> client, std::string_view secret,
                                                        MemberRegistryOptions options);
  ~MemberRegistry();

  // Writes this node's entry, then reads the others'. Errors: the
  // ClusterClient's (Unavailable, TimedOut, ...), ProtocolError for a
  // reply that is not a hash or one past max_entries.
  Result<RegistryMembers> Refresh();
  // Removes this node's entry.
  Status Leave();

  // The value this node writes for `address`, lapsing at `lapses_ms`; and
  // the address a value names, if `field`'s value verifies and has not
  // lapsed at `now_ms` (NotFound when lapsed, Corruption when it does not
  // verify or decode). Exposed for tests.
  std::string Encode(const std::string& field, const std::string& address, int64_t lapses_ms) const;
  Result<std::string> Decode(const std::string& field, const std::string& value, int64_t now_ms,
                             int64_t* lapses_ms = nullptr) const;

 private:
  MemberRegistry(std::unique_ptr<ClusterClient> client, std::unique_ptr<ValueMac> mac, MemberRegistryOptions options);
  Result<RespReply> Command(std::vector<std::string> args);

  std::unique_ptr<ClusterClient> client_;
  std::unique_ptr<ValueMac> mac_;
  const MemberRegistryOptions options_;
};

}  // namespace kvtier
