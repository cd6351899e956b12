#include "tests/testing/engine_stack.h"

#include <gtest/gtest.h>

#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {

EngineStack::EngineStack(uint64_t host_bytes, const EngineOptions& options)
    : dir(MakeTempDir()), memory(std::make_unique<MemoryDevice>(16 << 20)), host(OpenTestHostTier(host_bytes)) {
  if (host == nullptr) return;  // OpenTestHostTier failed the test
  auto tier = OpenMemoryNvmeTier(*memory, dir, clock);
  if (!tier.ok()) {
    ADD_FAILURE() << "memory NVMe tier: " << tier.status().ToString();
    return;
  }
  nvme = std::move(*tier);
  auto created = Engine::Create(options, *host, clock, nvme.get());
  if (!created.ok()) {
    ADD_FAILURE() << "engine: " << created.status().ToString();
    return;
  }
  engine = std::move(*created);
}

EngineStack::~EngineStack() {
  engine.reset();
  nvme.reset();
  RemoveTree(dir);
}

}  // namespace kvtier::testing
