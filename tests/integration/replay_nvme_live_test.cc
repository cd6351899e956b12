// The replay's NVMe tier is the daemon's placement, not a copy of it: the
// same trace through the simulator and through a daemon (in-process, one
// shard, an in-memory NVMe tier of the same geometry) gives the same hits
// in each tier, for each reclaim order. The daemon's background work (a
// demotion's write, a reclaim turn's copies) is waited for after every
// step (LiveOptions::settle), so its tier writes land in the sim's order.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "policy/policy_registry.h"
#include "tests/testing/live_parity.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/seeded_numbers.h"
#include "tests/testing/test_daemon.h"
#include "tools/replay/replay_live.h"
#include "tools/replay/replay_sim.h"

namespace kvtier::tools {
namespace {

using testing::EngineCounter;
using testing::TestDaemon;
using testing::TestDaemonOptions;

constexpr uint32_t kBlockTokens = 4;
constexpr uint64_t kBytesPerToken = 16384;            // 64 KiB blocks
constexpr uint64_t kRecordBytes = 4096 + (64 << 10);  // the NVMe record: header + payload
constexpr uint64_t kRegionBytes = 4 * kRecordBytes;
constexpr uint64_t kNvmeBytes = 6 * kRegionBytes;
static_assert(kNvmeBytes % kBytesPerToken == 0, "the sim's capacity is in tokens");
constexpr uint64_t kHostBlocks = 8;

// Documents of 1 to 4 blocks, drawn with a skew (a few hot, many warm),
// each request the document's prefix of a drawn length, and one request in
// five adding a block of its own: host hits, NVMe hits after the host let
// them go, reclaim of cold regions and copies forward of read blocks.
Trace MixedTrace() {
  Trace t;
  t.path = "mixed";
  t.block_tokens = kBlockTokens;
  testing::SeededNumbers numbers(12345);
  const auto next = [&numbers] { return numbers.Next(); };
  for (uint64_t r = 0; r < 400; ++r) {
    TraceRequest req;
    req.arrival_us = r * 1000;
    const uint64_t a = next() % 24, b = next() % 24;
    const uint64_t doc = std::min(a, b);  // skewed to small ids
    const uint64_t length = 1 + (doc + next() % 2) % 4;
    for (uint64_t i = 0; i < length; ++i) req.blocks.push_back(BlockKey{doc + 1, i + 1});
    if (next() % 5 == 0) req.blocks.push_back(BlockKey{1000 + r, 1});
    req.input_tokens = kBlockTokens * req.blocks.size();
    t.requests.push_back(std::move(req));
  }
  return t;
}

ReplayOptions SimOptions(const std::string& nvme_eviction, double reinsert_share) {
  ReplayOptions o;
  o.host = Capacity{Capacity::Unit::kBlocks, kHostBlocks, false};
  o.nvme = Capacity{Capacity::Unit::kTokens, kNvmeBytes / kBytesPerToken, false};
  o.policy = "lru";
  o.nvme_eviction = nvme_eviction;
  o.nvme_region_bytes = kRegionBytes;
  o.nvme_reinsert_share = reinsert_share;
  o.bytes_per_token = kBytesPerToken;
  o.write_bytes_per_s = {0, 0, 0};  // the live run has no write channel model
  return o;
}

// The trace through the simulator and through an in-process daemon with
// the same host policy, NVMe geometry, reclaim order and reinsertion
// share; the sim's result once both agree on every hit.
// The NVMe tier's admission of a run: its name, and for dwpd the drive
// budget both sides run.
struct Admission {
  std::string name = "all";
  std::optional<DwpdOptions> dwpd;
  // With a remote tier below the NVMe tier (the daemon's: a MapTier that
  // Lookup reports as remote), taking what this admission admits: the NVMe
  // admission's refusals and the NVMe log's evictions go there. It never
  // fills (the sim's never evicts either): the store's own eviction is
  // Redis's, which no sim models.
  std::optional<std::string> remote;
};

constexpr uint64_t kRemoteBytes = uint64_t{1} << 30;

// The blocks `tier`'s admission refused, of every class.
int64_t Refusals(TestDaemon& daemon, const std::string& tier) {
  int64_t refused = 0;
  const std::string family = "admission.refusals{tier=\"" + tier + "\"";
  for (const auto& [name, value] : testing::EngineCounters(daemon.engine())) {
    if (name.starts_with(family)) refused += value;
  }
  return refused;
}

ReplayResult SimAndLiveAgree(const Trace& trace, ReclaimOrder order, const std::string& host_policy,
                             const Admission& admission = {}) {
  const std::string nvme_eviction(ReclaimOrderName(order));
  SCOPED_TRACE("nvme " + nvme_eviction + ", host " + host_policy + ", admission " + admission.name +
               (admission.remote ? ", remote " + *admission.remote : std::string()));
  const double share = 0.5;
  ReplayOptions sim_options = SimOptions(nvme_eviction, share);
  sim_options.policy = host_policy;
  sim_options.admission = admission.name;
  if (admission.dwpd) sim_options.dwpd = *admission.dwpd;
  if (admission.remote) {
    sim_options.remote = Capacity{Capacity::Unit::kTokens, kRemoteBytes / kBytesPerToken, false};
    sim_options.remote_admission = *admission.remote;
  }
  auto sim = Replay(trace, sim_options);
  EXPECT_TRUE(sim.ok()) << sim.status().ToString();
  if (!sim.ok()) return {};

  TestDaemonOptions options;
  options.arena_bytes = kHostBlocks * (64 << 10);
  // The replay's one client reserves a request's blocks at once, as the
  // simulator admits them: it may hold the whole (tiny) arena.
  options.limits.max_reserved_bytes = options.arena_bytes;
  options.shards = 1;
  options.eviction = *ParseEvictionPolicy(host_policy);
  options.directory_slots = -1;
  options.nvme_in_memory = true;
  options.nvme_bytes = kNvmeBytes;
  options.nvme_region_bytes = kRegionBytes;
  options.nvme_eviction = order;
  options.nvme_reinsert_share = share;
  options.nvme_admission = *ParseAdmissionPolicy(admission.name, kAdmissionForNvme);
  options.nvme_dwpd = admission.dwpd;
  testing::MapTier remote(kRemoteBytes, "remote");
  if (admission.remote) {
    options.remote = &remote;
    options.remote_admission = *ParseAdmissionPolicy(*admission.remote, kAdmissionForRemote);
  }
  TestDaemon daemon(options);
  LiveOptions live_options = testing::SettledLiveOptions(daemon, kBytesPerToken);
  auto live = ReplayLive(trace, live_options);
  EXPECT_TRUE(live.ok()) << live.status().ToString();
  if (!live.ok()) return {};

  EXPECT_EQ(live->blocks, sim->blocks);
  testing::ExpectTheSameHits(*live, *sim);
  EXPECT_EQ(EngineCounter(daemon, "nvme.reinserted"), static_cast<int64_t>(sim->nvme_reinserted));
  if (!admission.remote) {
    // The same victims refused: the NVMe admission decided as the sim's did
    // (no tier under it, so each refusal is a drop).
    EXPECT_EQ(EngineCounter(daemon, "engine.admission_drops"), static_cast<int64_t>(sim->admission_refused));
  } else {
    // Each tier's admission refused what the sim's did.
    EXPECT_EQ(Refusals(daemon, "nvme"), static_cast<int64_t>(sim->admission_refused));
    EXPECT_EQ(Refusals(daemon, "remote"), static_cast<int64_t>(sim->remote_admission_refused));
  }
  // The trace exercises what it should: both tiers hit and the log wraps.
  EXPECT_GT(sim->tiers[kHostTier].hits, 0u);
  EXPECT_GT(sim->tiers[kNvmeTier].hits, 0u);
  EXPECT_GT(sim->tiers[kNvmeTier].evictions, 0u);
  return std::move(*sim);
}

// The reclaim orders whose decisions read no clock (the sim's clock is the
// trace's, the daemon's the wall: lru2 and arc rank by times, and ties the
// trace's clock makes the wall's may break another way).
TEST(ReplayNvmeLiveTest, SimAndLiveHitTheSameBlocksInEachTier) {
  const Trace trace = MixedTrace();
  for (const std::string host_policy : {"lru", "fifo", "queue_aware"}) {
    const ReplayResult fifo = SimAndLiveAgree(trace, ReclaimOrder::kFifo, host_policy);
    EXPECT_EQ(fifo.nvme_reinserted, 0u) << "fifo copies nothing forward";
    for (ReclaimOrder order : {ReclaimOrder::kLru, ReclaimOrder::kQueueAware, ReclaimOrder::kS3Fifo}) {
      const ReplayResult r = SimAndLiveAgree(trace, order, host_policy);
      EXPECT_GT(r.nvme_reinserted, 0u) << ReclaimOrderName(order) << " copies blocks forward";
    }
  }
}

// The NVMe admissions decide as the sim's do: second_hit (a victim goes
// down on its second eviction) and dwpd (second_hit's rules within the
// drive's write budget; the reinsertions charged to it too), with a bucket
// of 40 records: more than the log holds, so it wraps, and less than the
// trace asks for, so the budget refuses on both sides. The budget's refill
// over the run (a drive of this size earns about 20 bytes a second) is far
// below the half record of margin the bucket leaves, on the sim's clock
// and on the wall's alike. Admission classes victims by their uses since
// they last entered the host tier, on both sides.
TEST(ReplayNvmeLiveTest, SimAndLiveAdmitTheSameVictims) {
  const Trace trace = MixedTrace();
  const ReplayResult second_hit = SimAndLiveAgree(trace, ReclaimOrder::kLru, "lru", Admission{"second_hit", {}});
  EXPECT_GT(second_hit.admission_refused, 0u) << "second_hit refuses first evictions";

  DwpdOptions budget;
  budget.drive_capacity_bytes = kNvmeBytes;
  budget.bucket_bytes = 40 * kRecordBytes + kRecordBytes / 2;
  for (const std::string host_policy : {"lru", "queue_aware"}) {
    const ReplayResult dwpd = SimAndLiveAgree(trace, ReclaimOrder::kLru, host_policy, Admission{"dwpd", budget});
    EXPECT_GT(dwpd.admission_refused, second_hit.admission_refused) << "the budget refuses more than second_hit";
  }
}

// With a remote tier under the NVMe tier, the same hits in each of the
// three: the remote tier gets what the NVMe admission refuses and what the
// NVMe log evicts (ChooseDemotionTarget and the NVMe tier's eviction sink
// on the daemon's side), through its own admission, and a remote hit is
// promoted into the host tier as an NVMe hit is.
TEST(ReplayNvmeLiveTest, SimAndLiveAgreeWithARemoteTierBelow) {
  const Trace trace = MixedTrace();
  for (const std::string nvme_admission : {"all", "second_hit"}) {
    for (const std::string remote_admission : {"all", "second_hit"}) {
      const ReplayResult r =
          SimAndLiveAgree(trace, ReclaimOrder::kLru, "lru", Admission{nvme_admission, {}, remote_admission});
      EXPECT_GT(r.tiers[kRemoteTier].hits, 0u) << "the remote tier serves hits";
      if (remote_admission == "second_hit") {
        EXPECT_GT(r.remote_admission_refused, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::tools
