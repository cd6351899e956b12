// ClusterNetworks: the IP networks in which the remote tier may connect to
// a Redis node that only another node named (a CLUSTER SLOTS entry, a
// MOVED or ASK redirect), as opposed to a node the operator configured
// (remote.nodes), which is always allowed. Connections carry the cluster's
// password, so a node's word alone must not send it anywhere on the
// network (docs/OPERATIONS.md, "Remote tier").
//
// A set of networks, each an address and a prefix length; IPv4-mapped IPv6
// addresses (::ffff:a.b.c.d) count as the IPv4 address.
//
// Not thread-safe (ClusterClient guards its copy).
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/result.h"

namespace kvtier {

class ClusterNetworks {
 public:
  // The prefixes AddAround uses: a seed's neighbours.
  static constexpr int kDefaultV4PrefixBits = 24;
  static constexpr int kDefaultV6PrefixBits = 64;

  // "10.0.0.0/8", "fd00::/64", or a bare address (that one address: /32 or
  // /128); host bits set below the prefix are ignored. InvalidArgument
  // quoting the text that is not one.
  static Result<ClusterNetworks> Parse(std::span<const std::string> texts);

  // Adds the /24 (IPv4) or /64 (IPv6) that holds `address` (AF_INET or
  // AF_INET6; anything else is ignored).
  void AddAround(const sockaddr* address);
  // Whether `address` (AF_INET or AF_INET6) lies in one of the networks.
  bool Contains(const sockaddr* address) const;
  // For a numeric `host` ("10.0.0.5", "fd00::1", "fe80::1%eth0"): whether
  // it lies in one of the networks; nullopt for a name (to be checked at
  // the addresses it resolves to).
  std::optional<bool> ContainsNumeric(const std::string& host) const;

  bool empty() const { return networks_.empty(); }
  // "10.0.0.0/8, fd00::/64" for messages.
  std::string ToString() const;

 private:
  struct Network {
    int family = AF_INET;  // AF_INET: the first 4 bytes are used
    std::array<uint8_t, 16> bytes{};
    int prefix_bits = 0;
  };
  void Add(Network network);
  static bool Normalize(const sockaddr* address, Network* out);  // prefix_bits left 0

  std::vector<Network> networks_;
};

}  // namespace kvtier
