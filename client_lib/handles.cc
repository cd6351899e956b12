// BlockView and Reservation: RAII handles over a pin or a reservation.
#include "client_lib/connection.h"
#include "proto/wire.h"

namespace kvtier {

BlockView::BlockView(BlockView&& other) noexcept { *this = std::move(other); }

BlockView& BlockView::operator=(BlockView&& other) noexcept {
  if (this != &other) {
    Release().IgnoreError();  // dropping a view releases it; errors mean the lease is gone
    conn_ = std::move(other.conn_);
    data_ = other.data_;
    key_ = other.key_;
    lease_ = other.lease_;
    checksum_ = other.checksum_;
    other.conn_ = nullptr;
    other.data_ = {};
  }
  return *this;
}

BlockView::~BlockView() {
  if (conn_ == nullptr) return;
  // Not waited for: the destructor must not block on the daemon.
  v1::Request request;
  request.mutable_release()->add_leases(lease_);
  conn_->Call(std::move(request), [](Result<v1::Response>) {});
}

Status BlockView::Release() {
  if (conn_ == nullptr) return Status::Ok();
  std::shared_ptr<internal::Connection> conn = std::move(conn_);
  conn_ = nullptr;
  data_ = {};
  v1::Request request;
  request.mutable_release()->add_leases(lease_);
  auto r = conn->CallSync(std::move(request));
  if (!r.ok()) return r.status();
  if (r->release().statuses_size() != 1) return ProtocolError("Release response has no status");
  return wire::FromProto(r->release().statuses(0));
}

Reservation::Reservation(Reservation&& other) noexcept { *this = std::move(other); }

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (!done_ && conn_ != nullptr) Abort().IgnoreError();  // replaced: return the space
    conn_ = std::move(other.conn_);
    ns_ = other.ns_;
    blocks_ = std::move(other.blocks_);
    done_ = other.done_;
    other.conn_ = nullptr;
    other.done_ = true;
  }
  return *this;
}

Reservation::~Reservation() {
  if (done_ || conn_ == nullptr) return;
  v1::Request request;
  request.mutable_abort()->set_ns(ns_);
  for (const auto& b : blocks_) {
    if (b.status.ok()) wire::ToProto(b.key, request.mutable_abort()->add_keys());
  }
  conn_->Call(std::move(request), [](Result<v1::Response>) {});  // not waited for
}

std::vector<Status> Reservation::Commit() {
  std::vector<Status> out;
  if (done_ || conn_ == nullptr) {
    out.assign(blocks_.size(), FailedPrecondition("reservation already committed or aborted"));
    return out;
  }
  done_ = true;
  v1::Request request;
  auto* body = request.mutable_commit();
  body->set_ns(ns_);
  for (const auto& b : blocks_) {
    if (!b.status.ok()) continue;
    wire::ToProto(b.key, body->add_keys());
    body->add_sizes(b.data.size());
  }
  Result<v1::Response> r = body->keys_size() > 0 ? conn_->CallSync(std::move(request))
                                                  : Result<v1::Response>(v1::Response());
  int next = 0;
  for (const auto& b : blocks_) {
    if (!b.status.ok()) {
      out.push_back(b.status);
    } else if (!r.ok()) {
      out.push_back(r.status());
    } else if (next < r->commit().statuses_size()) {
      out.push_back(wire::FromProto(r->commit().statuses(next++)));
    } else {
      out.push_back(ProtocolError("Commit response has fewer statuses than blocks"));
    }
  }
  return out;
}

Status Reservation::Abort() {
  if (done_ || conn_ == nullptr) return Status::Ok();
  done_ = true;
  v1::Request request;
  request.mutable_abort()->set_ns(ns_);
  for (const auto& b : blocks_) {
    if (b.status.ok()) wire::ToProto(b.key, request.mutable_abort()->add_keys());
  }
  auto r = conn_->CallSync(std::move(request));
  return r.ok() ? Status::Ok() : r.status();
}

}  // namespace kvtier
