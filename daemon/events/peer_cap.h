// PeerCap: at most `max_peers` peers connected to each of the events
// sockets (the PUB socket's subscribers, the ROUTER socket's requesters),
// so that what subscribers can make the daemon hold (per peer, ZeroMQ's
// queue of at most send_hwm batches) has a bound in total.
//
// How: ZeroMQ asks a ZAP handler (RFC 27, inproc://zeromq.zap.01 in the
// publisher's own context) before it accepts any peer of a socket whose
// ZAP domain is set; this handler counts each socket's open connections
// from its monitor (accepted: one more; disconnected: one less; the
// asking peer's own included) and refuses a peer past the cap ("400": it
// is disconnected before it gets anything; its ZeroMQ socket reports
// ZMQ_EVENT_HANDSHAKE_FAILED_AUTH and, libzmq 4.3, does not reconnect by
// itself). A peer counts from its acceptance, before its handshake is
// asked about, and a refused peer counts while its connection is open: when
// peers arrive together near the cap, which are refused need not follow
// their arrival order (one accepted first but asked about after a later
// one's acceptance may be refused, and both).
//
// Thread: the publisher's thread only (Serve and Watch on each loop).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace kvtier {

class PeerCap {
 public:
  // Binds the ZAP handler in `context`; `max_peers` per socket.
  PeerCap(zmq::context_t& context, uint32_t max_peers);
  ~PeerCap();
  PeerCap(const PeerCap&) = delete;
  PeerCap& operator=(const PeerCap&) = delete;

  // Puts `socket` (not yet bound) under the cap, its peers counted under
  // `domain` (a name of its own: "pub", "replay").
  void Cover(zmq::socket_t& socket, const std::string& domain);

  // Answers the ZAP requests and reads the monitors' events waiting now.
  void Serve();

  uint64_t refused() const { return refused_; }
  // Peers connected now, over every covered socket.
  uint64_t peers() const;

 private:
  struct Covered;
  void Answer();
  void Watch(Covered& c);
  Covered* Find(const std::string& domain);

  zmq::context_t& context_;
  const uint32_t max_peers_;
  std::unique_ptr<zmq::socket_t> handler_;  // REP at inproc://zeromq.zap.01
  std::vector<std::unique_ptr<Covered>> covered_;
  uint64_t refused_ = 0;
};

}  // namespace kvtier
