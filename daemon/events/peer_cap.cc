#include "daemon/events/peer_cap.h"

#include <cstring>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace kvtier {
namespace {

constexpr int kMaxPerServe = 64;  // ZAP requests or monitor events per Serve and source

}  // namespace

struct PeerCap::Covered {
  std::string domain;
  std::unique_ptr<zmq::socket_t> monitor;  // PAIR, reading the socket's monitor events
  std::set<uint32_t> peers;                // descriptors of the connections open now
};

PeerCap::PeerCap(zmq::context_t& context, uint32_t max_peers) : context_(context), max_peers_(max_peers) {
  handler_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::rep);
  handler_->set(zmq::sockopt::linger, 0);
  handler_->bind("inproc://zeromq.zap.01");
}

PeerCap::~PeerCap() = default;

void PeerCap::Cover(zmq::socket_t& socket, const std::string& domain) {
  auto c = std::make_unique<Covered>();
  c->domain = domain;
  const std::string address = "inproc://kvtier-events-monitor-" + domain;
  if (zmq_socket_monitor(socket.handle(), address.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    throw zmq::error_t();
  }
  c->monitor = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
  c->monitor->set(zmq::sockopt::linger, 0);
  c->monitor->connect(address);
  socket.set(zmq::sockopt::zap_domain, domain);
  covered_.push_back(std::move(c));
}

PeerCap::Covered* PeerCap::Find(const std::string& domain) {
  for (auto& c : covered_) {
    if (c->domain == domain) return c.get();
  }
  return nullptr;
}

uint64_t PeerCap::peers() const {
  uint64_t n = 0;
  for (const auto& c : covered_) n += c->peers.size();
  return n;
}

void PeerCap::Serve() {
  for (auto& c : covered_) Watch(*c);  // disconnections first: their room is free again
  Answer();
}

void PeerCap::Watch(Covered& c) {
  for (int i = 0; i < kMaxPerServe; ++i) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(*c.monitor, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
    if (frames.empty() || frames[0].size() < 6) continue;
    uint16_t event = 0;
    uint32_t fd = 0;
    std::memcpy(&event, frames[0].data(), sizeof event);
    std::memcpy(&fd, static_cast<const char*>(frames[0].data()) + 2, sizeof fd);
    if (event == ZMQ_EVENT_ACCEPTED) {
      c.peers.insert(fd);
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      c.peers.erase(fd);
    }
  }
}

void PeerCap::Answer() {
  for (int i = 0; i < kMaxPerServe; ++i) {
    std::vector<zmq::message_t> request;
    if (!zmq::recv_multipart(*handler_, std::back_inserter(request), zmq::recv_flags::dontwait)) return;
    // RFC 27: version, request id, domain, address, routing id, mechanism, credentials...
    const std::string request_id = request.size() > 1 ? request[1].to_string() : "";
    Covered* c = request.size() > 2 ? Find(request[2].to_string()) : nullptr;
    bool allow = c == nullptr;  // a socket not covered is not ours to refuse
    // The asking peer's connection is among the open ones: its ACCEPTED
    // event comes before its handshake, and Serve reads the monitors first.
    if (c != nullptr) allow = c->peers.size() <= max_peers_;
    if (!allow) ++refused_;
    zmq::multipart_t reply;
    reply.addstr("1.0");
    reply.addstr(request_id);
    reply.addstr(allow ? "200" : "400");
    reply.addstr(allow ? "OK" : "too many peers (events.max_subscribers)");
    reply.addstr("");
    reply.addstr("");
    reply.send(*handler_);
  }
}

}  // namespace kvtier
