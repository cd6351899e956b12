// What the sim-vs-live parity tests (replay_nvme_live_test.cc,
// replay_prefetch_live_test.cc) share: the live replay's options against
// an in-process daemon whose background work is waited for after every
// step, and the hits both runs must agree on.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "tests/testing/test_daemon.h"
#include "tools/replay/replay_live.h"
#include "tools/replay/replay_sim.h"

namespace kvtier::testing {

// ReplayLive's options for `daemon`: its socket, payloads of
// `bytes_per_token` per token, and after each step the engine's and the
// NVMe tier's work settled (a demotion's write, a reclaim turn's copies),
// so the daemon's tier writes land in the sim's order.
inline tools::LiveOptions SettledLiveOptions(TestDaemon& daemon, uint64_t bytes_per_token) {
  tools::LiveOptions o;
  o.socket_path = daemon.socket_path();
  o.bytes_per_token = bytes_per_token;
  o.settle = [&daemon] {
    daemon.engine().WaitForIdle();
    daemon.nvme()->WaitForIdle();
    daemon.engine().WaitForIdle();
  };
  return o;
}

// The live run hit what the sim did, block for block and in each tier.
inline void ExpectTheSameHits(const tools::LiveResult& live, const tools::ReplayResult& sim) {
  EXPECT_EQ(live.hit_blocks, sim.hit_blocks);
  EXPECT_EQ(live.tier_hits[tools::kHostTier], sim.tiers[tools::kHostTier].hits);
  EXPECT_EQ(live.tier_hits[tools::kNvmeTier], sim.tiers[tools::kNvmeTier].hits);
  EXPECT_EQ(live.tier_hits[tools::kRemoteTier], sim.tiers[tools::kRemoteTier].hits);
}

}  // namespace kvtier::testing
