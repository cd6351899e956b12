// TestDaemon: a real kvtierd stack (host tier, engine, server) running in
// the test process on a private socket in a fresh temporary directory.
// Also: helpers to spawn the kvtierd binary and to build test namespaces
// and self-describing block bytes ("may miss, never wrong").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "daemon/engine/engine.h"
#include "daemon/server/server.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tiers/nvme/nvme_tier.h"
#include "kvtier/client.h"

namespace kvtier::testing {

struct TestDaemonOptions {
  uint64_t arena_bytes = 64ull << 20;
  // > 0: the arena allocates only this much before the daemon serves and
  // the rest behind it (kvtierd's host.allocate_at_start_bytes).
  uint64_t allocate_at_start_bytes = 0;
  // Block directory slots: 0 sizes it from the arena like kvtierd; -1: none.
  int64_t directory_slots = 0;
  uint32_t shards = 4;
  uint32_t io_threads = 2;
  uint32_t max_frame_bytes = 1u << 20;
  // The server's per-connection limits (kvtierd's defaults).
  ConnectionLimits limits;
  EvictionPolicyId eviction = EvictionPolicyId::kLru;
  // Non-empty: an NVMe tier in this file (index beside it), which survives
  // the TestDaemon so a second one can reopen it.
  std::string nvme_path;
  uint64_t nvme_bytes = 64ull << 20;
  uint64_t nvme_region_bytes = 4ull << 20;
  bool nvme_preallocate = true;
  std::string nvme_index_path;  // empty: nvme_path + ".index"
  // Which evicted blocks the NVMe tier gets (all here, so tests of the
  // tier see every eviction; kvtierd defaults to dwpd).
  AdmissionPolicyId nvme_admission = AdmissionPolicyId::kAll;
  // The drive budget of the dwpd admission of the in-memory tier (with
  // nvme_path it comes from the config's defaults); unset: the defaults,
  // which need a drive size.
  std::optional<DwpdOptions> nvme_dwpd;
  // With nvme_path empty: an NVMe tier on an in-memory device (nvme_bytes)
  // behind a FaultInjectingDevice (nvme_device()), whose index runs
  // nvme_index_hook (when set) before every mutation: the latches of the
  // stalled-tier tests.
  bool nvme_in_memory = false;
  std::function<void()> nvme_index_hook;
  uint64_t nvme_staging_bytes = 16ull << 20;
  // The in-memory tier's reclaim order and reinsertion share (NvmeTierOptions).
  ReclaimOrder nvme_eviction = NvmeTierOptions{}.reclaim;
  double nvme_reinsert_share = NvmeTierOptions{}.reinsert_share;
  uint64_t demotion_buffer_bytes = EngineOptions{}.demotion_buffer_bytes;
  // The engine's prefetch budget, a share of the host tier (0: off).
  double prefetch_share = EngineOptions{}.prefetch_share;
  // A tier stacked above the host (the HBM tier's place; a MapTier in
  // tests without a GPU), borrowed: it must outlive the TestDaemon.
  BlockTier* above = nullptr;
  // A tier stacked below the NVMe tier (or the host, without one) that
  // Lookup reports as remote, with this admission (a MapTier in tests of
  // the engine's glue with a remote tier), borrowed: it must outlive the
  // TestDaemon.
  BlockTier* remote = nullptr;
  AdmissionPolicyId remote_admission = AdmissionPolicyId::kAll;
  // The daemon's clock (the engine's and the NVMe tier's), borrowed: it
  // must outlive the TestDaemon. Null: the system clock. A FakeClock here
  // holds every retry and retry interval until the test moves it.
  Clock* clock = nullptr;
};

// A valid namespace (16-token blocks); `revision` varies the model revision.
NamespaceDescriptor TestNamespace(const std::string& revision = "rev-1");
// TestNamespace's layout (64 KiB blocks) for another model, revision and
// adapter (empty: none; else adapter revision "a1").
NamespaceDescriptor ModelNamespace(const std::string& model, const std::string& revision,
                                   const std::string& adapter = "");

class TestDaemon {
 public:
  explicit TestDaemon(const TestDaemonOptions& options = {});
  ~TestDaemon();  // drains and removes the directory

  const std::string& socket_path() const { return socket_path_; }
  Engine& engine() { return *engine_; }
  HostTier& host() { return *host_; }
  NvmeTier* nvme() { return nvme_.get(); }                      // null without one
  FaultInjectingDevice* nvme_device() { return nvme_device_; }  // null unless nvme_in_memory
  Server& server() { return *server_; }

  // Client options for this daemon with `namespaces` registered.
  ClientOptions Options(std::vector<NamespaceDescriptor> namespaces = {TestNamespace()}) const;
  // Connects a client; fails the test (ADD_FAILURE) and returns null on error.
  std::unique_ptr<Client> Connect(std::vector<NamespaceDescriptor> namespaces = {TestNamespace()}) const;
  // Connect with ClientOptions::use_directory = false: every Lookup and Get
  // is a request on the socket (Pin + Release for gets).
  std::unique_ptr<Client> ConnectSocketOnly(std::vector<NamespaceDescriptor> namespaces = {TestNamespace()}) const;

 private:
  std::unique_ptr<Client> ConnectWith(const ClientOptions& options) const;
  std::string dir_;
  std::string socket_path_;
  SystemClock system_clock_;
  Clock& clock_;  // options.clock, or system_clock_
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<MemoryDevice> nvme_memory_;
  FaultInjectingDevice* nvme_device_ = nullptr;  // owned by nvme_
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Server> server_;
};

// A host tier for tests: unlocked arena of `capacity_bytes` with a block
// directory of `directory_slots` slots (0: none). Fails the
// test (ADD_FAILURE) and returns null if it cannot be opened.
// `allocate_at_start_bytes` > 0: as TestDaemonOptions says.
std::unique_ptr<HostTier> OpenTestHostTier(uint64_t capacity_bytes, uint32_t directory_slots = 0,
                                           uint64_t allocate_at_start_bytes = 0);

// The arena bytes of a slot handed out by the engine (for writing or
// checking block bytes in tests that drive the Engine directly).
std::span<std::byte> SlotBytes(HostTier& host, uint64_t offset, uint64_t length);
// The engine-level Put of unit tests: reserves `size` bytes for `key`,
// fills them with FillBlockBytes(key, 0) and commits. The Reserve's or the
// Commit's status.
Status PutFilledBlock(Engine& engine, HostTier& host, ConnectionId session, const NamespaceFingerprint& ns,
                      const BlockKey& key, uint64_t size);

// One use of a cached block by `connection`: a Pin and its Release. The
// first status that is not ok, else ok.
Status PinAndRelease(Engine& engine, ConnectionId connection, const NamespaceFingerprint& ns, const BlockKey& key);
// The tier engine.Lookup reports for `key` alone, kNone on a miss.
Tier LookupTier(Engine& engine, const NamespaceFingerprint& ns, const BlockKey& key);

// A fresh directory under $TMPDIR (or /tmp); removed by RemoveTree.
std::string MakeTempDir();
void RemoveTree(const std::string& path);
// The tiers of a kvtierd child for the admin tests: a 4 MiB host tier over
// a 64 MiB NVMe tier of 1 MiB regions in `dir`, admitting every block.
std::string SmallHostOverNvmeToml(const std::string& dir);

// Fills `out` with bytes derived from (key, size, salt): any corruption,
// truncation or mix-up of blocks shows in CheckBlockBytes.
void FillBlockBytes(const BlockKey& key, uint64_t salt, std::span<std::byte> out);
// True if `bytes` is exactly what FillBlockBytes(key, salt, ...) wrote.
bool CheckBlockBytes(const BlockKey& key, uint64_t salt, std::span<const std::byte> bytes);

// `size` bytes of FillBlockBytes(key, salt, ...).
std::vector<std::byte> Block(const BlockKey& key, size_t size, uint64_t salt = 0);

// Counters by name (ADD_FAILURE and -1 when absent): from a collection;
// engine.*/host.*/nvme.* and server.* read in-process (no request reaches
// the daemon); or through a Stats request (which carries whatever `client`
// deferred, so the daemon has seen it first).
int64_t FindCounter(const CounterCollector& c, std::string_view name);
int64_t EngineCounter(TestDaemon& daemon, std::string_view name);
int64_t ServerCounter(TestDaemon& daemon, std::string_view name);
int64_t StatsCounter(Client& client, std::string_view name);
// Every counter by name: the engine's (in-process), or through one Stats
// request (an empty map, and a test failure, if it fails).
std::map<std::string, int64_t> EngineCounters(const Engine& engine);
std::map<std::string, int64_t> StatsCounters(Client& client);

// The key chain of `blocks` blocks of a deterministic token sequence.
std::vector<BlockKey> TestKeys(const NamespaceDescriptor& ns, size_t blocks, uint32_t seed);

// Blocks of this size are a size class of their own: an arena of whole MiB
// holds exactly capacity / kMiBBlock of them, with no slack.
inline constexpr uint64_t kMiBBlock = 1ull << 20;
// Puts kMiBBlock blocks (FillBlockBytes(key, 0)) through `client` (of
// TestNamespace()) until `daemon`'s arena is exactly full, without evicting.
// Returns their keys followed by `extra` keys not put. Fails the test
// (ADD_FAILURE) when a Put fails or the arena is not exactly full.
std::vector<BlockKey> FillArenaWithMiBBlocks(TestDaemon& daemon, Client& client, uint32_t seed, size_t extra);

}  // namespace kvtier::testing
