#include "daemon/engine/measured_tier.h"

#include <chrono>

namespace kvtier {
namespace {

using SteadyClock = std::chrono::steady_clock;

}  // namespace

MeasuredTier::MeasuredTier(BlockTier& inner, const EventTap* events, Tier reported)
    : ForwardingTier(inner),
      events_(events != nullptr && events->on() ? events : nullptr),
      reported_(reported),
      label_("{tier=\"" + std::string(inner.name()) + "\"}"),
      quarantine_(Quarantine::kMaxKeys, reported == Tier::kRemote ? kSharedTierQuarantineUs : 0, [] {
        return static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now().time_since_epoch()).count());
      }) {}

std::optional<NamespaceFingerprint> MeasuredTier::NamespaceForEvents(const BlockKey& key) const {
  if (events_ == nullptr) return std::nullopt;
  std::optional<BlockInfo> info = inner().Find(key);
  if (!info) return std::nullopt;
  return info->ns;
}

void MeasuredTier::ReadEnded(const BlockKey& key, const std::optional<NamespaceFingerprint>& ns, const Status& status,
                             uint64_t writes) const {
  if (status.code() == StatusCode::kCorruption) quarantine_.AddUnlessWrittenSince(key, writes);
  if (!ns || (status.code() != StatusCode::kNotFound && status.code() != StatusCode::kCorruption)) return;
  events_->Removed(reported_, *ns, key);
}

std::optional<BlockTier::BlockInfo> MeasuredTier::Find(const BlockKey& key) const {
  if (quarantine_.Contains(key)) return std::nullopt;
  return inner().Find(key);
}

void MeasuredTier::ForEachBlock(const BlockVisitor& visit) const {
  if (quarantine_.size() == 0) return inner().ForEachBlock(visit);
  inner().ForEachBlock([this, &visit](const BlockKey& key, const BlockInfo& info) {
    if (!quarantine_.Contains(key)) visit(key, info);
  });
}

Status MeasuredTier::Erase(const BlockKey& key) {
  const std::optional<NamespaceFingerprint> ns = NamespaceForEvents(key);
  Status s = inner().Erase(key);
  if (s.ok() && ns) events_->Removed(reported_, *ns, key);
  return s;
}

Status MeasuredTier::Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                           std::span<const std::byte> payload, WriteDone done,
                           std::optional<uint64_t> payload_checksum) {
  const auto start = SteadyClock::now();
  const auto bytes = static_cast<int64_t>(payload.size());
  WriteDone measured = [this, start, bytes, ns, key, done = std::move(done)](Status status) {
    write_latency_.Record(SteadyClock::now() - start);
    if (status.ok() && events_ != nullptr) events_->Stored(reported_, ns, key);
    if (status.ok()) {
      quarantine_.NoteWritten(key);  // a fresh copy: released, and no read that started before quarantines it
      writes_.fetch_add(1, std::memory_order_relaxed);
      written_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    } else {
      write_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    done(std::move(status));
  };
  // The quarantined copy goes first: the new one replaces it (a tier that
  // still held it would refuse the write as a duplicate).
  if (quarantine_.Contains(key) && !inner().asynchronous()) inner().Erase(key).IgnoreError();
  return inner().Write(ns, key, layer_count, payload, std::move(measured), payload_checksum);
}

Status MeasuredTier::Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                          ReadDone done) {
  const auto start = SteadyClock::now();
  const uint64_t writes = quarantine_.WriteSequence();
  ReadDone measured = [this, start, key, writes, ns = NamespaceForEvents(key),
                       done = std::move(done)](Result<size_t> read) {
    read_latency_.Record(SteadyClock::now() - start);
    ReadEnded(key, ns, read.status(), writes);
    if (read.ok()) {
      reads_.fetch_add(1, std::memory_order_relaxed);
      read_bytes_.fetch_add(static_cast<int64_t>(*read), std::memory_order_relaxed);
    } else {
      read_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    done(std::move(read));
  };
  return inner().Read(key, first_layer, last_layer, dst, std::move(measured));
}

Status MeasuredTier::ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                            std::span<std::byte> dst, LayerReadDone done) {
  const auto start = SteadyClock::now();
  const uint64_t writes = quarantine_.WriteSequence();
  LayerReadDone measured = [this, start, key, writes, ns = NamespaceForEvents(key),
                            done = std::move(done)](Result<LayerRead> read) {
    read_latency_.Record(SteadyClock::now() - start);
    ReadEnded(key, ns, read.status(), writes);
    if (read.ok()) {
      reads_.fetch_add(1, std::memory_order_relaxed);
      read_bytes_.fetch_add(static_cast<int64_t>(read->bytes), std::memory_order_relaxed);
    } else {
      read_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    done(std::move(read));
  };
  return inner().ReadWithLayerChecksums(key, first_layer, last_layer, dst, std::move(measured));
}

void MeasuredTier::VisitCounters(CounterVisitor& v) const {
  const auto load = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  v.VisitGauge("tier.capacity_bytes" + label_, static_cast<int64_t>(inner().capacity_bytes()));
  v.VisitGauge("tier.used_bytes" + label_, static_cast<int64_t>(inner().used_bytes()));
  v.Visit("tier.reads" + label_, load(reads_));
  v.Visit("tier.read_errors" + label_, load(read_errors_));
  v.Visit("tier.read_bytes" + label_, load(read_bytes_));
  v.Visit("tier.writes" + label_, load(writes_));
  v.Visit("tier.write_errors" + label_, load(write_errors_));
  v.Visit("tier.written_bytes" + label_, load(written_bytes_));
  v.VisitHistogram("tier.read_seconds" + label_, read_latency_.Snapshot());
  v.VisitHistogram("tier.write_seconds" + label_, write_latency_.Snapshot());
  quarantine_.VisitCounters(v, label_);
  inner().VisitCounters(v);
}

}  // namespace kvtier
