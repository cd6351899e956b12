// EngineStack: an Engine over a test host tier and an NVMe tier on an
// in-memory device, with a fake clock: what engine unit tests build in
// SetUp. Members are public, declared in the order they are built; the
// destructor closes the engine before the tiers, then removes `dir`.
//
// Thread-compatible, like the Engine's users in a test body.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/memory_device.h"
#include "tiers/host/host_tier.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier::testing {

class EngineStack {
 public:
  // A host tier of `host_bytes` (no directory) over a 16 MiB in-memory
  // NVMe tier. On an error the test fails (ADD_FAILURE) and `engine` is
  // null.
  explicit EngineStack(uint64_t host_bytes, const EngineOptions& options = EngineOptions{2, EvictionPolicyId::kLru});
  ~EngineStack();
  EngineStack(const EngineStack&) = delete;
  EngineStack& operator=(const EngineStack&) = delete;

  FakeClock clock;
  std::string dir;
  std::unique_ptr<MemoryDevice> memory;
  std::unique_ptr<HostTier> host;
  std::unique_ptr<NvmeTier> nvme;
  std::unique_ptr<Engine> engine;
};

}  // namespace kvtier::testing
