#include "tiers/remote/remote_tier.h"

#include <cstring>

#include <spdlog/spdlog.h>

#include "common/checksum.h"
#include "tiers/remote/remote_value.h"

namespace kvtier {
namespace {

Status ReplyError(const RespReply& reply, const std::string& what) {
  // A store at its maxmemory under `noeviction` refuses writes with OOM:
  // the tier is full (for this write), not failing.
  if (reply.text.rfind("OOM", 0) == 0) {
    return NoSpace(what + ": the store is full and evicts nothing (maxmemory-policy noeviction): redis answered '" +
                   reply.text + "'");
  }
  return IoError(what + ": redis answered '" + reply.text + "'");
}

}  // namespace

Result<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteTierOptions& options, const Clock& clock) {
  if (options.threads == 0) return InvalidArgument("remote tier: threads must be at least 1");
  if (options.staging_bytes == 0) return InvalidArgument("remote tier: staging_bytes must be positive");
  if (options.directory_entries == 0) return InvalidArgument("remote tier: directory_entries must be positive");
  auto mac = ValueMac::Create(options.cluster_secret);
  if (!mac.ok()) return Status(mac.status().code(), "remote tier: " + mac.status().message());
  auto client = ClusterClient::Create(options.cluster, clock);
  if (!client.ok()) return client.status();
  std::unique_ptr<RemoteTier> tier(new RemoteTier(options, clock, std::move(*client), std::move(*mac)));
  Status first = tier->client_->Refresh(tier->DeadlineIn(options.timeout));
  // A refused password is a configuration error, not an outage.
  if (first.code() == StatusCode::kPermissionDenied) return first;
  tier->Observe(first);
  return tier;
}

RemoteTier::RemoteTier(const RemoteTierOptions& options, const Clock& clock, std::unique_ptr<ClusterClient> client,
                       std::unique_ptr<ValueMac> mac)
    : options_(options), clock_(clock), client_(std::move(client)), mac_(std::move(mac)), workers_(options.threads) {}

uint64_t RemoteTier::RetryIntervalUs() const {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(options_.retry_interval).count());
}

RemoteTier::~RemoteTier() = default;

// --- availability -----------------------------------------------------------

bool RemoteTier::MayTry() {
  if (available_.load(std::memory_order_relaxed)) return true;
  uint64_t due = next_try_us_.load(std::memory_order_relaxed);
  const uint64_t now = clock_.NowUs();
  if (now < due) return false;
  return next_try_us_.compare_exchange_strong(due, now + RetryIntervalUs(), std::memory_order_relaxed);  // one tries
}

void RemoteTier::Observe(const Status& status) {
  if (status.code() == StatusCode::kTimedOut) timeouts_.fetch_add(1, std::memory_order_relaxed);
  // One node failing (its keys miss until a replica takes over) is not the
  // tier failing: only no node answering at all is.
  const bool failed = status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kTimedOut;
  const bool unreachable = failed && !client_->reachable();
  if (!unreachable) {
    available_.store(true, std::memory_order_relaxed);
    return;
  }
  if (available_.exchange(false, std::memory_order_relaxed)) {
    unavailable_.fetch_add(1, std::memory_order_relaxed);
    next_try_us_.store(clock_.NowUs() + RetryIntervalUs(), std::memory_order_relaxed);
  }
}

// --- directory --------------------------------------------------------------

void RemoteTier::Remember(const BlockKey& key, const BlockInfo& info) {
  MutexLock lock(mu_);
  auto it = known_.find(key);
  if (it != known_.end()) {
    known_payload_bytes_ -= it->second.info.payload_bytes;
    it->second.info = info;
    known_payload_bytes_ += info.payload_bytes;
    order_.splice(order_.end(), order_, it->second.age);
    return;
  }
  if (known_.size() >= options_.directory_entries) {
    auto oldest = known_.find(order_.front());
    known_payload_bytes_ -= oldest->second.info.payload_bytes;
    known_.erase(oldest);
    order_.pop_front();
  }
  order_.push_back(key);
  known_.emplace(key, Known{info, std::prev(order_.end())});
  known_payload_bytes_ += info.payload_bytes;
}

void RemoteTier::Forget(const BlockKey& key) {
  MutexLock lock(mu_);
  auto it = known_.find(key);
  if (it == known_.end()) return;
  known_payload_bytes_ -= it->second.info.payload_bytes;
  order_.erase(it->second.age);
  known_.erase(it);
}

void RemoteTier::Drop(const BlockKey& key, const Status& why) {
  Forget(key);
  switch (why.code()) {
    case StatusCode::kNotFound:
      lost_.fetch_add(1, std::memory_order_relaxed);
      break;
    case StatusCode::kFailedPrecondition:
      foreign_.fetch_add(1, std::memory_order_relaxed);
      break;
    case StatusCode::kPermissionDenied:
      CountAuthFailure(key, why);
      break;
    default:
      corrupt_.fetch_add(1, std::memory_order_relaxed);
      break;
  }
}

void RemoteTier::CountAuthFailure(const BlockKey& key, const Status& why) {
  auth_failures_.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  if (!auth_log_limiter_.Allow(suppressed)) return;
  spdlog::warn(
      "remote tier: block {}: {} (a miss; written by a node with another remote.key_file, by an older "
      "kvtierd, or forged){}",
      key.ToHex(), why.message(),
      suppressed == 0 ? std::string() : "; " + std::to_string(suppressed) + " such lines suppressed");
}

uint64_t RemoteTier::used_bytes() const {
  MutexLock lock(mu_);
  return known_payload_bytes_;
}

std::optional<BlockTier::BlockInfo> RemoteTier::Find(const BlockKey& key) const {
  if (!available_.load(std::memory_order_relaxed)) return std::nullopt;
  MutexLock lock(mu_);
  auto it = known_.find(key);
  if (it == known_.end()) return std::nullopt;
  return it->second.info;
}

void RemoteTier::ForEachBlock(const BlockVisitor& visit) const {
  MutexLock lock(mu_);
  for (const auto& [key, known] : known_) visit(key, known.info);
}

// --- probe ------------------------------------------------------------------

void RemoteTier::Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  std::vector<BlockKey> asked;
  {
    MutexLock lock(mu_);
    for (const BlockKey& key : keys) {
      if (known_.count(key) == 0) asked.push_back(key);
    }
  }
  if (asked.empty() || !MayTry()) return;
  probes_.fetch_add(1, std::memory_order_relaxed);
  probe_keys_.fetch_add(static_cast<int64_t>(asked.size()), std::memory_order_relaxed);
  std::vector<std::string> names;
  names.reserve(asked.size());
  for (const BlockKey& key : asked) names.push_back(RemoteKeyName(ns, key));
  static const std::string kLastHeaderByte = std::to_string(kRemoteHeaderBytes - 1);  // GETRANGE's end is inclusive
  const RedisDeadline deadline = DeadlineIn(options_.probe_timeout);
  auto results = client_->RunPipelined(
      names,
      [&](size_t i, RedisConnection& c) {
        const RespArg args[] = {{"GETRANGE"}, {names[i]}, {"0"}, {kLastHeaderByte}};
        c.Append(args);
      },
      [deadline](size_t, RedisConnection& c) { return c.ReadReply(deadline); }, deadline);
  Status seen = Status::Ok();
  for (size_t i = 0; i < asked.size(); ++i) {
    if (!results[i].ok()) {
      seen = results[i].status();
      probe_failures_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const RespReply& reply = *results[i];
    if (reply.type != RespReply::Type::kBulk || reply.text.empty()) continue;  // not there
    auto header = DecodeRemoteHeader(std::as_bytes(std::span(reply.text)), ns, asked[i]);
    if (!header.ok()) {
      if (header.status().code() == StatusCode::kPermissionDenied) {
        CountAuthFailure(asked[i], header.status());
      } else {
        (header.status().code() == StatusCode::kFailedPrecondition ? foreign_ : corrupt_)
            .fetch_add(1, std::memory_order_relaxed);
      }
      continue;
    }
    probe_hits_.fetch_add(1, std::memory_order_relaxed);
    Remember(asked[i], BlockInfo{ns, header->payload_bytes, header->layer_count, header->payload_checksum});
  }
  Observe(seen);
}

// --- write ------------------------------------------------------------------

Status RemoteTier::Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                         std::span<const std::byte> payload, WriteDone done, std::optional<uint64_t> payload_checksum) {
  if (payload.empty()) return InvalidArgument("remote tier: empty block");
  if (layer_count == 0 || payload.size() % layer_count != 0) {
    return InvalidArgument("remote tier: " + std::to_string(payload.size()) + " bytes do not split into " +
                           std::to_string(layer_count) + " equal layers");
  }
  const uint64_t value_bytes = payload.size() + kRemoteHeaderBytes;
  if (value_bytes > options_.max_value_bytes) {
    return InvalidArgument("remote tier: a " + std::to_string(value_bytes) + "-byte value exceeds " +
                           std::to_string(options_.max_value_bytes) + " bytes");
  }
  if (!MayTry())
    return Unavailable("remote tier: the cluster did not answer; retrying every " +
                       std::to_string(options_.retry_interval.count()) + " ms");
  {
    MutexLock lock(mu_);
    if (known_.count(key) != 0 || writing_.count(key) != 0) {
      return AlreadyExists("block " + key.ToHex() + " is in the remote tier or being written");
    }
    uint64_t staged = staged_bytes_.load(std::memory_order_relaxed);
    if (staged != 0 && staged + value_bytes > options_.staging_bytes) {
      writes_refused_busy_.fetch_add(1, std::memory_order_relaxed);
      return Busy("remote tier: " + std::to_string(staged) + " bytes of writes in flight (remote.staging_bytes)");
    }
    staged_bytes_.fetch_add(value_bytes, std::memory_order_relaxed);
    writing_.insert(key);
  }
  Staged value = TakeStaging(value_bytes);
  const uint64_t checksum =
      CopyWithChecksum(std::span(value.bytes.get() + kRemoteHeaderBytes, payload.size()), payload);
  if (payload_checksum && *payload_checksum != checksum) {
    ReturnStaging(std::move(value));
    MutexLock lock(mu_);
    writing_.erase(key);
    staged_bytes_.fetch_sub(value_bytes, std::memory_order_relaxed);
    return Corruption("remote tier: block " + key.ToHex() + " does not match its checksum");
  }
  // The MAC right after the copy, over the staged payload (no second copy).
  EncodeRemoteHeader(*mac_, RemoteBlock{ns, key, layer_count, checksum},
                     std::span<const std::byte>(value.bytes.get() + kRemoteHeaderBytes, payload.size()),
                     std::span<std::byte, kRemoteHeaderBytes>(value.bytes.get(), kRemoteHeaderBytes));
  auto job = std::make_shared<Staged>(std::move(value));
  const BlockInfo info{ns, payload.size(), layer_count, checksum};
  workers_.Post([this, key, info, job, done = std::move(done)] { RunWrite(key, info, std::move(*job), done); });
  return Status::Ok();
}

RemoteTier::Staged RemoteTier::TakeStaging(uint64_t bytes) {
  {
    MutexLock lock(spare_mu_);
    size_t best = spare_.size();
    for (size_t i = 0; i < spare_.size(); ++i) {
      if (spare_[i].capacity >= bytes && (best == spare_.size() || spare_[i].capacity < spare_[best].capacity))
        best = i;
    }
    if (best != spare_.size()) {
      Staged out = std::move(spare_[best]);
      spare_[best] = std::move(spare_.back());
      spare_.pop_back();
      spare_bytes_ -= out.capacity;
      return out;
    }
  }
  return Staged{std::unique_ptr<std::byte[]>(new std::byte[bytes]), bytes};
}

void RemoteTier::ReturnStaging(Staged staged) {
  MutexLock lock(spare_mu_);
  if (spare_bytes_ + staged.capacity > options_.staging_bytes) return;  // freed
  spare_bytes_ += staged.capacity;
  spare_.push_back(std::move(staged));
}

void RemoteTier::RunWrite(const BlockKey& key, const BlockInfo& info, Staged value, const WriteDone& done) {
  const uint64_t value_bytes = kRemoteHeaderBytes + info.payload_bytes;
  const std::string name = RemoteKeyName(info.ns, key);
  const std::string ttl = std::to_string(options_.ttl_seconds);
  const std::span<const std::byte> bytes(value.bytes.get(), value_bytes);
  Result<RespReply> reply = client_->Run(
      name,
      [&](RedisConnection& c) -> Result<RespReply> {
        if (options_.ttl_seconds > 0) {
          const RespArg args[] = {{"SET"}, {name}, {"", bytes}, {"EX"}, {ttl}};
          c.Append(args);
        } else {
          const RespArg args[] = {{"SET"}, {name}, {"", bytes}};
          c.Append(args);
        }
        if (Status s = c.Flush(DeadlineIn(options_.timeout)); !s.ok()) return s;
        return c.ReadReply(DeadlineIn(options_.timeout));
      },
      DeadlineIn(options_.timeout));
  Status status = reply.ok() ? (reply->is_error() ? ReplyError(*reply, "SET " + name) : Status::Ok()) : reply.status();
  Observe(status);
  bool erased;
  {
    MutexLock lock(mu_);
    writing_.erase(key);
    erased = erased_while_writing_.erase(key) != 0;
  }
  staged_bytes_.fetch_sub(value_bytes, std::memory_order_relaxed);
  if (status.ok() && erased) {
    // Erased while it was being sent: undo it, and nothing was visible.
    RunDelete(name).status().IgnoreError();
    status = NotFound("block " + key.ToHex() + " was erased while it was written");
  }
  if (status.ok()) {
    writes_.fetch_add(1, std::memory_order_relaxed);
    write_bytes_.fetch_add(static_cast<int64_t>(value_bytes), std::memory_order_relaxed);
    device_bytes_.fetch_add(value_bytes, std::memory_order_relaxed);
    Remember(key, info);
  } else if (status.code() == StatusCode::kNoSpace) {
    store_full_.fetch_add(1, std::memory_order_relaxed);
  } else {
    write_failures_.fetch_add(1, std::memory_order_relaxed);
  }
  ReturnStaging(std::move(value));
  done(status);
}

// --- read -------------------------------------------------------------------

Status RemoteTier::Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                        ReadDone done) {
  BlockInfo info;
  {
    MutexLock lock(mu_);
    auto it = known_.find(key);
    if (it == known_.end()) return NotFound("block " + key.ToHex() + " is not known in the remote tier");
    info = it->second.info;
  }
  if (first_layer >= last_layer || last_layer > info.layer_count) {
    return InvalidArgument("remote tier: layers [" + std::to_string(first_layer) + ", " + std::to_string(last_layer) +
                           ") of a " + std::to_string(info.layer_count) + "-layer block");
  }
  const uint64_t bytes = (last_layer - first_layer) * (info.payload_bytes / info.layer_count);
  if (dst.size() < bytes) return InvalidArgument("remote tier: destination smaller than the layers read");
  if (!MayTry()) return Unavailable("remote tier: the cluster did not answer a moment ago");
  workers_.Post([this, key, info, first_layer, last_layer, dst, done = std::move(done)] {
    Result<size_t> read = RunRead(key, info, first_layer, last_layer, dst);
    if (read.ok()) {
      reads_.fetch_add(1, std::memory_order_relaxed);
      read_bytes_.fetch_add(static_cast<int64_t>(*read), std::memory_order_relaxed);
    } else {
      read_failures_.fetch_add(1, std::memory_order_relaxed);
    }
    done(std::move(read));
  });
  return Status::Ok();
}

Result<size_t> RemoteTier::RunRead(const BlockKey& key, const BlockInfo& info, uint32_t first_layer,
                                   uint32_t last_layer, std::span<std::byte> dst) {
  const std::string name = RemoteKeyName(info.ns, key);
  const bool whole = first_layer == 0 && last_layer == info.layer_count;
  std::array<std::byte, kRemoteHeaderBytes> header;
  std::vector<std::byte> scratch;  // a layer range: the whole payload, to verify it
  std::span<std::byte> payload = dst.first(info.payload_bytes <= dst.size() && whole ? info.payload_bytes : 0);
  if (!whole) {
    scratch.resize(info.payload_bytes);
    payload = scratch;
  }
  Result<RespReply> reply = client_->Run(
      name,
      [&](RedisConnection& c) -> Result<RespReply> {
        const RespArg args[] = {{"GET"}, {name}};
        c.Append(args);
        if (Status s = c.Flush(DeadlineIn(options_.timeout)); !s.ok()) return s;
        return c.ReadBulkInto(header, payload, DeadlineIn(options_.timeout));
      },
      DeadlineIn(options_.timeout));
  Observe(reply.status());
  if (!reply.ok()) return reply.status();
  if (reply->is_error()) return ReplyError(*reply, "GET " + name);
  Status miss = Status::Ok();
  if (reply->type == RespReply::Type::kNil) {
    miss = NotFound("block " + key.ToHex() + " is no longer in the remote tier");
  } else if (reply->type != RespReply::Type::kBulk) {
    miss = Corruption("GET " + name + " answered no string");
  } else if (static_cast<uint64_t>(reply->integer) != kRemoteHeaderBytes + info.payload_bytes) {
    miss = Corruption("remote value of block " + key.ToHex() + " has " + std::to_string(reply->integer) + " bytes, " +
                      std::to_string(kRemoteHeaderBytes + info.payload_bytes) + " expected");
  } else if (auto h = DecodeRemoteHeader(header, info.ns, key); !h.ok()) {
    miss = h.status();
  } else if (h->payload_bytes != info.payload_bytes || h->layer_count != info.layer_count) {
    miss = Corruption("remote value of block " + key.ToHex() + " changed shape");
  } else if (Status verified = VerifyRemotePayload(*mac_, header, payload); !verified.ok()) {
    miss = Status(verified.code(), "remote value of block " + key.ToHex() + ": " + verified.message());
  }
  if (!miss.ok()) {
    Drop(key, miss);
    // To the engine a value that does not authenticate is a corrupt one: a miss.
    if (miss.code() == StatusCode::kPermissionDenied) return Corruption(miss.message());
    return miss;
  }
  if (!whole) {
    const uint64_t layer_bytes = info.payload_bytes / info.layer_count;
    const uint64_t bytes = (last_layer - first_layer) * layer_bytes;
    std::memcpy(dst.data(), scratch.data() + first_layer * layer_bytes, bytes);
    return static_cast<size_t>(bytes);
  }
  return static_cast<size_t>(info.payload_bytes);
}

// --- erase ------------------------------------------------------------------

Status RemoteTier::Erase(const BlockKey& key) {
  NamespaceFingerprint ns;
  {
    MutexLock lock(mu_);
    if (writing_.count(key) != 0) {
      erased_while_writing_.insert(key);
      return Status::Ok();
    }
    auto it = known_.find(key);
    if (it == known_.end()) return NotFound("block " + key.ToHex() + " is not known in the remote tier");
    ns = it->second.info.ns;
  }
  Forget(key);
  erases_.fetch_add(1, std::memory_order_relaxed);
  workers_.Post([this, name = RemoteKeyName(ns, key)] { Observe(RunDelete(name).status()); });
  return Status::Ok();
}

Result<RespReply> RemoteTier::RunDelete(const std::string& name) {
  return client_->Run(
      name,
      [&](RedisConnection& c) -> Result<RespReply> {
        const RespArg args[] = {{"DEL"}, {name}};
        c.Append(args);
        if (Status s = c.Flush(DeadlineIn(options_.timeout)); !s.ok()) return s;
        return c.ReadReply(DeadlineIn(options_.timeout));
      },
      DeadlineIn(options_.timeout));
}

BlockTier::WriteTotals RemoteTier::write_totals() const {
  return WriteTotals{device_bytes_.load(std::memory_order_relaxed), 0};
}

void RemoteTier::VisitCounters(CounterVisitor& v) const {
  auto n = [](const std::atomic<int64_t>& a) { return a.load(std::memory_order_relaxed); };
  v.VisitGauge("remote.available", available() ? 1 : 0);
  v.Visit("remote.unavailable_periods", n(unavailable_));
  v.Visit("remote.timeouts", n(timeouts_));
  v.Visit("remote.writes", n(writes_));
  v.Visit("remote.write_bytes", n(write_bytes_));
  v.Visit("remote.write_failures", n(write_failures_));
  v.Visit("remote.store_full", n(store_full_));
  v.Visit("remote.writes_busy", n(writes_refused_busy_));
  v.Visit("remote.reads", n(reads_));
  v.Visit("remote.read_bytes", n(read_bytes_));
  v.Visit("remote.read_failures", n(read_failures_));
  v.Visit("remote.lost", n(lost_));
  v.Visit("remote.corrupt", n(corrupt_));
  v.Visit("remote.foreign", n(foreign_));
  v.Visit("remote.auth_failures", n(auth_failures_));
  v.Visit("remote.probes", n(probes_));
  v.Visit("remote.probe_keys", n(probe_keys_));
  v.Visit("remote.probe_hits", n(probe_hits_));
  v.Visit("remote.probe_failures", n(probe_failures_));
  v.Visit("remote.erases", n(erases_));
  v.VisitGauge("remote.staged_bytes", static_cast<int64_t>(staged_bytes_.load(std::memory_order_relaxed)));
  {
    MutexLock lock(mu_);
    v.VisitGauge("remote.known_blocks", static_cast<int64_t>(known_.size()));
    v.VisitGauge("remote.known_bytes", static_cast<int64_t>(known_payload_bytes_));
  }
  client_->VisitCounters(v);
}

}  // namespace kvtier
