// RemoteTier: the bottom tier, blocks stored in a Redis Cluster (or one
// Redis) that every kvtier node of a deployment shares, through
// ClusterClient. Values are remote_value.h's self-verifying form.
//
// What it knows without I/O (Find): a bounded directory of blocks known to
// be there, learned from its own writes, from Probe (one pipelined
// GETRANGE of each value's header: blocks other nodes wrote) and from
// reads. The store is lossy by design (its maxmemory policy evicts at
// will) and shared, so the directory can be stale: a read that finds
// nothing, a foreign value or a value that does not verify is a miss
// (NotFound / Corruption to the engine), counted, and the entry is
// forgotten. Never are bytes served that did not verify.
//
// Data path: Write copies the block into a staging buffer (its header and
// payload, bounded by `staging_bytes`; Busy past it) and a worker SETs it
// with one writev; a whole-block Read GETs the value with its header into
// a small buffer and its payload straight into the caller's buffer, then
// verifies both; a layer-range Read reads the value into scratch memory
// (to verify it whole) and copies the range out.
//
// Authentication: every value carries a MAC (Poly1305 under a per-value
// key derived from the cluster secret; value_mac.h) under the cluster
// secret (`cluster_secret`, the same on every node; remote_value.h). Write
// computes it right after the staging copy, over the staged bytes; Read
// checks it over the bytes received before anything is served. A value
// that does not authenticate (a forgery, an old-format value, another
// cluster secret) is a miss like a corrupt one, counted in
// `remote.auth_failures` and logged (rate-limited).
//
// Availability: each command has a deadline (`timeout`; `probe_timeout`
// for Probe). Errors map to Unavailable (no node reachable, cluster down)
// and TimedOut (deadline). While the cluster cannot be reached the tier
// says so (`remote.available` 0, Writes refused with Unavailable), Find
// answers nothing, and the engine keeps serving from the tiers above;
// every `retry_interval` (on the injected Clock) one command tries again.
// Command deadlines are socket timeouts, on the steady clock.
//
// Erase and `kvtier drop` delete the value in the store (other nodes then
// miss it too). ForEachBlock lists the directory: the blocks this node
// knows of, not the whole store. capacity_bytes is the configured share.
//
// Thread-safe; completions run on the tier's worker threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/log_rate_limiter.h"
#include "common/mutex.h"
#include "common/worker_pool.h"
#include "policy/option_defaults.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/remote_value.h"
#include "tiers/remote/value_mac.h"
#include "tiers/tier.h"

namespace kvtier {

struct RemoteTierOptions {
  ClusterOptions cluster;
  uint64_t capacity_bytes = defaults::kRemoteCapacityBytes;  // what this node may count on (reported; the store evicts)
  std::chrono::milliseconds timeout{defaults::kRemoteTimeoutMs};             // one read, write or erase
  std::chrono::milliseconds probe_timeout{defaults::kRemoteProbeTimeoutMs};  // one Probe, all its keys
  std::chrono::milliseconds retry_interval{defaults::kRemoteRetryMs};        // while unavailable, between tries
  unsigned threads = defaults::kRemoteThreads;                               // workers (each uses its own connections)
  uint64_t staging_bytes = defaults::kRemoteStagingBytes;                    // writes accepted and not yet sent
  size_t directory_entries = size_t{1} << 20;                                // blocks known without asking
  uint64_t max_value_bytes = uint64_t{512} << 20;                            // Redis' proto-max-bulk-len
  uint32_t ttl_seconds = defaults::kRemoteTtlSeconds;  // EX on each value; 0: none (the store's eviction decides)
  std::string cluster_secret;  // kClusterSecretBytes shared by every node (daemon/setup/remote_key_file.h); required
};

class RemoteTier final : public BlockTier, public Prober {
 public:
  // Checks the options and reads the slot map once. A cluster that does
  // not answer is not an error: the tier starts unavailable (logged by the
  // caller from `available()`) and tries again later. A node that refuses
  // the password (or wants one) is PermissionDenied; a cluster secret of
  // the wrong size InvalidArgument. `clock` (the retry_interval while
  // unavailable, ClusterClient's pauses and node skips) is borrowed and
  // must outlive the tier.
  static Result<std::unique_ptr<RemoteTier>> Open(const RemoteTierOptions& options, const Clock& clock);
  ~RemoteTier() override;  // finishes queued work, then joins

  std::string_view name() const override { return "remote"; }
  bool asynchronous() const override { return true; }
  uint64_t capacity_bytes() const override { return options_.capacity_bytes; }
  uint64_t used_bytes() const override;
  uint64_t StoredBytes(uint64_t payload_bytes) const override { return payload_bytes + kRemoteHeaderBytes; }
  std::optional<BlockInfo> Find(const BlockKey& key) const override;
  Prober* prober() override { return this; }
  void Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override;
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override;
  void ForEachBlock(const BlockVisitor& visit) const override;
  Status Erase(const BlockKey& key) override;
  WriteTotals write_totals() const override;
  void VisitCounters(CounterVisitor& visitor) const override;

  // Whether the store answered the last command (or the open).
  bool available() const { return available_.load(std::memory_order_relaxed); }

 private:
  RemoteTier(const RemoteTierOptions& options, const Clock& clock, std::unique_ptr<ClusterClient> client,
             std::unique_ptr<ValueMac> mac);

  struct Known {
    BlockInfo info;
    std::list<BlockKey>::iterator age;  // in order_, oldest first
  };
  // Directory (mu_): adds or refreshes, evicting the oldest past the bound.
  void Remember(const BlockKey& key, const BlockInfo& info);
  void Forget(const BlockKey& key);
  // Whether a command may go out now: always while available; once per
  // retry_interval otherwise (that one finds out).
  bool MayTry();
  // Records a command's outcome for availability.
  void Observe(const Status& status);
  uint64_t RetryIntervalUs() const;
  RedisDeadline DeadlineIn(std::chrono::milliseconds d) const { return std::chrono::steady_clock::now() + d; }

  // A staging buffer. Recycled (spare_): a fresh multi-MiB allocation is
  // an mmap whose every page faults on first touch, which costs more than
  // sending it.
  struct Staged {
    std::unique_ptr<std::byte[]> bytes;
    uint64_t capacity = 0;
  };
  Staged TakeStaging(uint64_t bytes);
  void ReturnStaging(Staged staged);
  // Sends a staged value: header and payload of the block `info` describes.
  void RunWrite(const BlockKey& key, const BlockInfo& info, Staged value, const WriteDone& done);
  Result<size_t> RunRead(const BlockKey& key, const BlockInfo& info, uint32_t first_layer, uint32_t last_layer,
                         std::span<std::byte> dst);
  // DEL of the value `name`, on the caller's thread (a worker's): the
  // store's reply, or why there is none.
  Result<RespReply> RunDelete(const std::string& name);
  // A value that failed to verify or is gone: forget it, count `why`
  // (PermissionDenied: it did not authenticate, also logged).
  void Drop(const BlockKey& key, const Status& why);
  void CountAuthFailure(const BlockKey& key, const Status& why);

  const RemoteTierOptions options_;
  const Clock& clock_;
  std::unique_ptr<ClusterClient> client_;
  std::unique_ptr<ValueMac> mac_;
  LogRateLimiter auth_log_limiter_{5, std::chrono::seconds(10)};

  mutable Mutex mu_;
  std::unordered_map<BlockKey, Known> known_ GUARDED_BY(mu_);
  std::list<BlockKey> order_ GUARDED_BY(mu_);
  uint64_t known_payload_bytes_ GUARDED_BY(mu_) = 0;
  std::unordered_set<BlockKey> writing_ GUARDED_BY(mu_);  // accepted, not done
  std::unordered_set<BlockKey> erased_while_writing_ GUARDED_BY(mu_);

  std::atomic<bool> available_{true};
  std::atomic<uint64_t> next_try_us_{0};  // on clock_: while unavailable, when one command tries
  std::atomic<uint64_t> staged_bytes_{0};
  Mutex spare_mu_;
  std::vector<Staged> spare_ GUARDED_BY(spare_mu_);  // at most staging_bytes in all
  uint64_t spare_bytes_ GUARDED_BY(spare_mu_) = 0;

  std::atomic<int64_t> writes_{0}, write_bytes_{0}, write_failures_{0}, writes_refused_busy_{0};
  std::atomic<int64_t> store_full_{0};  // writes the store refused at maxmemory under noeviction (NoSpace)
  std::atomic<int64_t> reads_{0}, read_bytes_{0}, read_failures_{0};
  std::atomic<int64_t> lost_{0}, corrupt_{0}, foreign_{0}, auth_failures_{0};
  std::atomic<int64_t> probes_{0}, probe_keys_{0}, probe_hits_{0}, probe_failures_{0};
  std::atomic<int64_t> erases_{0}, unavailable_{0}, timeouts_{0};
  std::atomic<uint64_t> device_bytes_{0};

  WorkerPool workers_;  // last: joined first, while everything above is alive
};

}  // namespace kvtier
