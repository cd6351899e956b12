// BlockView and Reservation: RAII handles over a pin or a reservation.
#include "client_lib/connection.h"
#include "client_lib/put_path.h"
#include "client_lib/release.h"
#include "proto/wire.h"

namespace kvtier {

BlockView::BlockView(BlockView&& other) noexcept { *this = std::move(other); }

BlockView& BlockView::operator=(BlockView&& other) noexcept {
  if (this != &other) {
    if (conn_ != nullptr) conn_->ReleaseLater(std::span<const uint64_t>(&lease_, 1));
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
  if (conn_ != nullptr) conn_->ReleaseLater(std::span<const uint64_t>(&lease_, 1));
}

Status BlockView::Release() {
  if (conn_ == nullptr) return Status::Ok();
  std::shared_ptr<internal::Connection> conn = std::move(conn_);
  conn_ = nullptr;
  data_ = {};
  return internal::ReleaseAndWait(*conn, lease_);
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
  conn_->Call(
      internal::BuildAbort(ns_, blocks_), [](Result<v1::Response>) {},  // not waited for
      internal::Connection::Reader::kDetached);
}

std::vector<Status> Reservation::Commit() {
  if (done_ || conn_ == nullptr) {
    return std::vector<Status>(blocks_.size(), FailedPrecondition("reservation already committed or aborted"));
  }
  done_ = true;
  v1::Request request;
  const auto [layer_count, block_bytes] = conn_->layout(ns_);
  if (!internal::BuildCommit(ns_, blocks_, request, layer_count, block_bytes)) {
    return internal::MergeCommit(blocks_, v1::Response(), /*already_is_ok=*/false);
  }
  return internal::MergeCommit(blocks_, conn_->CallSync(std::move(request)), /*already_is_ok=*/false);
}

Status Reservation::Abort() {
  if (done_ || conn_ == nullptr) return Status::Ok();
  done_ = true;
  auto r = conn_->CallSync(internal::BuildAbort(ns_, blocks_));
  return r.ok() ? Status::Ok() : r.status();
}

}  // namespace kvtier
