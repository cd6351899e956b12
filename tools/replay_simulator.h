// The replay simulator's machinery (tools/replay_sim.h is its interface):
// one Simulator runs one trace under one ReplayOptions.
//   replay_simulator.cc  the request loop: engine model, queue hints,
//                        lookups, a request's pins and new blocks
//   replay_placement.cc  where blocks go: eviction, demotion through
//                        admission, promotion, the NVMe log's hooks, prefetch
// Internal to tools/; not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "policy/admission_policy.h"
#include "policy/eviction_policy.h"
#include "tools/replay_belady.h"
#include "tools/replay_log.h"
#include "tools/replay_sim.h"

namespace kvtier::tools {

inline constexpr uint32_t kNoParent = UINT32_MAX;

struct SimBlock {
  BlockKey key;
  uint64_t tokens = 0;                     // from the latest request naming it
  std::array<bool, kSimTiers> in{};        // resident in each tier
  std::array<uint64_t, kSimTiers> held{};  // what it takes of each policy-run tier's capacity
  uint64_t pinned_by = 0;                  // the request (1-based) pinning it in the host tier, 0: none
  uint64_t uses = 0;                       // requests that found it resident
  uint32_t parent = kNoParent;             // the block before it in the latest chain
  uint64_t session = 0;                    // the conversation of the latest request naming it
  bool prefetched = false;                 // read in by a prefetch plan and not used since
  uint64_t arrives_us = 0;                 // prefetched: when its read lands
  bool anywhere() const { return in[0] || in[1] || in[2]; }
};

// A tier run by an eviction policy over a capacity (host, remote, and the
// NVMe tier when it is not a log).
struct SimTierState {
  const Capacity* capacity = nullptr;  // null: the tier is absent
  std::unique_ptr<EvictionPolicy> policy;
  uint64_t used = 0;
};

class Simulator {
 public:
  // `log`: the NVMe log's options when the NVMe tier is one (validated by
  // the caller), nullopt otherwise.
  Simulator(const Trace& trace, const ReplayOptions& options, std::unique_ptr<AdmissionPolicy> admission,
            const std::optional<SimLogOptions>& log);
  ReplayResult Run();

 private:
  // A running prefill: its blocks become resident when it ends.
  struct Pending {
    uint64_t done_us;
    size_t request;
    std::vector<uint32_t> ids;
    bool operator>(const Pending& o) const {
      return done_us != o.done_us ? done_us > o.done_us : request > o.request;
    }
  };
  using PendingQueue = std::priority_queue<Pending, std::vector<Pending>, std::greater<>>;

  // replay_simulator.cc
  uint32_t IdOf(const BlockKey& key);
  void IndexFuture();
  void CommitNext(PendingQueue& pending);
  void Hint(size_t r, uint64_t expected_start_us);
  void Unhint(size_t r);
  double Lookup(size_t r, const std::vector<uint32_t>& ids, uint64_t start, bool measured);
  void Commit(const std::vector<uint32_t>& ids, uint64_t request, uint64_t now);
  void CommitBlocks(const std::vector<uint32_t>& ids, uint64_t request, uint64_t now);

  // replay_placement.cc
  bool Present(int tier) const { return tiers_[tier].capacity != nullptr; }
  uint64_t Cost(int tier, const SimBlock& b) const;
  uint64_t Bytes(const SimBlock& b) const { return b.tokens * options_.bytes_per_token; }
  bool MakeRoom(int tier, uint64_t cost, uint64_t now);
  AdmissionClass ClassOf(const SimBlock& b) const;
  // The NVMe admission's answer for `b`: Force (`forced`: a queued request
  // needs it) or Decide (a refusal is counted).
  bool NvmeAdmits(const SimBlock& b, bool forced, uint64_t now);
  // A victim of `from`; `needed`: a queued request needs it within the lookahead.
  void Demote(int from, uint32_t id, uint64_t now, bool needed);
  // Writes `id` into tier `to` (its write channel, then its room); false
  // when it did not land.
  bool WriteBelow(int to, uint32_t id, uint64_t now);
  // Reads `id` from the highest tier below holding it into the host tier
  // (room made first); false when it is held nowhere below (any more) or
  // does not fit.
  bool Promote(uint32_t id, uint64_t now);
  void EndPrefetched(SimBlock& b);
  // One prefetch plan over the queued requests, at `now`.
  void Prefetch(uint64_t now);
  SimLog::Hooks LogHooks();

  const Trace& trace_;
  const ReplayOptions& options_;
  std::unique_ptr<AdmissionPolicy> admission_;
  std::array<SimTierState, kSimTiers> tiers_;
  std::unique_ptr<SimLog> log_;  // the NVMe tier, when it is a log
  uint64_t now_us_ = 0;              // the time of the event in progress (the log's hooks)
  std::unordered_map<BlockKey, uint32_t> index_;
  std::vector<SimBlock> blocks_;
  std::unordered_map<uint64_t, size_t> last_turn_;  // conversation -> its last request
  std::unordered_set<uint64_t> closed_;             // conversations whose last turn ran
  // Queued requests (hinted, not started): their blocks, expected starts,
  // and each block's count of queued chains naming it.
  std::unordered_map<size_t, std::vector<uint32_t>> queued_;
  std::unordered_map<size_t, uint64_t> expected_start_;
  std::unordered_map<uint32_t, uint32_t> queued_count_;
  uint64_t still_prefetched_ = 0;                   // bytes of blocks with `prefetched`
  std::vector<QueuedBlock> hint_chain_;             // Hint's scratch
  std::vector<size_t> scratch_pinned_;              // CommitBlocks' scratch
  std::array<uint64_t, kSimTiers> write_busy_until_{};  // each tier's write channel
  // Belady only: per block, its next use (a request index) and depth; per
  // request block, the request after it naming the block.
  std::vector<uint64_t> next_use_;
  std::vector<uint32_t> depth_;
  std::vector<uint64_t> future_;
  std::vector<size_t> future_begin_;
  std::array<BeladyPolicy*, kSimTiers> belady_{};
  ReplayResult result_;
};

}  // namespace kvtier::tools
