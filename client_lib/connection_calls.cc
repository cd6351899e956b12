// Sending on internal::Connection (connection.h): calls framed and written
// under write_mu_, and what goes to the daemon unasked (releases, directory
// reads, local lookups) deferred until a request can carry it or the
// background thread sends it.
#include <algorithm>
#include <future>

#include "client_lib/connection.h"
#include "common/framing.h"
#include "proto/wire.h"

namespace kvtier::internal {
namespace {

// Appends `message` framed to `out` (reused between calls, so steady
// traffic allocates nothing here); `out` is unchanged on error.
Status AppendFrame(const google::protobuf::MessageLite& message, uint32_t max_frame_bytes, std::string& out) {
  const size_t body = message.ByteSizeLong();
  if (body > max_frame_bytes) {
    return InvalidArgument("request of " + std::to_string(body) + " bytes exceeds the frame cap of " +
                           std::to_string(max_frame_bytes) + " bytes; split the batch");
  }
  const size_t at = out.size();
  out.resize(at + kFrameHeaderBytes + body);
  EncodeFrameHeader(static_cast<uint32_t>(body), reinterpret_cast<uint8_t*>(out.data() + at));
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data() + at + kFrameHeaderBytes));
  return Status::Ok();
}

}  // namespace

void Connection::Call(v1::Request request, Done done, Reader reader) {
  uint64_t id = 0;
  Deferred deferred;  // deferred frames ride along
  {
    MutexLock lock(mu_);
    if (closed_) {
      Status reason = close_reason_;
      lock.Unlock();
      done(reason);
      return;
    }
    id = next_id_++;
    pending_.emplace(id, Pending{std::move(done), reader});
    Track(reader, +1);
    std::swap(deferred, deferred_);
  }
  request.set_id(id);
  Status s = WriteFrames(deferred, &request, DeadlineAfter(call_timeout_));
  if (s.ok()) return;
  Done failed;
  {
    MutexLock lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;  // already failed by Fail()
    failed = std::move(it->second.done);
    Track(it->second.reader, -1);
    pending_.erase(it);
  }
  failed(s);
}

std::chrono::steady_clock::time_point Connection::Deferred::Due() const {
  auto due = std::chrono::steady_clock::time_point::max();
  if (!leases.empty()) due = std::min(due, leases_since + kReleaseDelay);
  if (!uses.empty()) due = std::min(due, uses_since + kUsageDelay);
  if (lookups != 0 || lookup_keys != 0) due = std::min(due, counters_since + kCountersDelay);
  return due;
}

Status Connection::WriteFrames(const Deferred& deferred, const v1::Request* request, Deadline deadline) {
  Status framed, written;
  {
    MutexLock lock(write_mu_);
    {
      // A failed write may have left part of a frame: nothing may follow it.
      MutexLock state(mu_);
      if (closed_) return close_reason_;
    }
    write_buffer_.clear();
    // At most a few hundred leases or keys: always far below any frame cap.
    if (!deferred.leases.empty()) {
      AppendFrame(wire::MakeReleaseNoReply(deferred.leases), max_frame_bytes_, write_buffer_).IgnoreError();
    }
    if (!deferred.uses.empty() || deferred.lookups != 0 || deferred.lookup_keys != 0) {
      AppendFrame(wire::MakeUsageReport(deferred.uses, deferred.lookups, deferred.lookup_keys, deferred.lookup_hits),
                  max_frame_bytes_, write_buffer_)
          .IgnoreError();
    }
    framed = request != nullptr ? AppendFrame(*request, max_frame_bytes_, write_buffer_) : Status::Ok();
    if (!write_buffer_.empty()) written = SendAllBefore(fd_, write_buffer_.data(), write_buffer_.size(), deadline);
  }
  if (written.code() == StatusCode::kTimedOut) {
    MutexLock lock(mu_);
    return FailTimedOut("sending a request timed out: " + written.message());
  }
  if (!written.ok()) Fail(written);
  return framed.ok() ? written : framed;
}

template <typename AddFn>
void Connection::Defer(AddFn&& add) {
  MutexLock lock(mu_);
  if (closed_) return;  // the daemon released everything with the connection
  const bool was_empty = deferred_.empty();
  const auto due_before = deferred_.Due();
  deferred_last_ = std::chrono::steady_clock::now();
  const bool flush_now = add(deferred_, deferred_last_);
  // A timed wait wakes by itself, unless the new note is due sooner.
  if (background_timed_wait_ ? deferred_.Due() < due_before : was_empty) bg_cv_.NotifyOne();
  if (flush_now) FlushDeferred();
}

void Connection::ReleaseLater(std::span<const uint64_t> leases) {
  if (leases.empty()) return;
  Defer([leases](Deferred& d, std::chrono::steady_clock::time_point now) {
    if (d.leases.empty()) d.leases_since = now;
    d.leases.insert(d.leases.end(), leases.begin(), leases.end());
    return d.leases.size() >= kMaxDeferredLeases;
  });
}

void Connection::NoteDirectoryUses(uint32_t ns, std::span<const BlockKey> keys) {
  if (keys.empty()) return;
  Defer([ns, keys](Deferred& d, std::chrono::steady_clock::time_point now) {
    if (d.uses.empty()) d.uses_since = now;
    for (const BlockKey& key : keys) d.uses.emplace_back(ns, key);
    return d.uses.size() >= kMaxDeferredUses;
  });
}

void Connection::NoteLocalLookups(uint64_t lookups, uint64_t keys, uint64_t hits) {
  if (lookups == 0 && keys == 0) return;
  Defer([lookups, keys, hits](Deferred& d, std::chrono::steady_clock::time_point now) {
    if (d.lookups == 0 && d.lookup_keys == 0) d.counters_since = now;
    d.lookups += lookups;
    d.lookup_keys += keys;
    d.lookup_hits += hits;
    return false;
  });
}

void Connection::FlushDeferred() {
  Deferred deferred;
  std::swap(deferred, deferred_);
  mu_.Unlock();
  // A failed write fails the connection; the leases end with it.
  WriteFrames(deferred, nullptr, DeadlineAfter(call_timeout_)).IgnoreError();
  mu_.Lock();
}

Result<v1::Response> Connection::CallSync(v1::Request request) {
  std::promise<Result<v1::Response>> promise;
  auto future = promise.get_future();
  Call(
      std::move(request), [&promise](Result<v1::Response> r) { promise.set_value(std::move(r)); }, Reader::kCaller);
  return Await(std::move(future));
}

}  // namespace kvtier::internal
