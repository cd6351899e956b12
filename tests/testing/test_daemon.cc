#include "tests/testing/test_daemon.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <gtest/gtest.h>

#include "daemon/setup/nvme_setup.h"
#include "support/temp_dir.h"
#include "tests/testing/memory_nvme.h"

namespace kvtier::testing {

std::string SmallHostOverNvmeToml(const std::string& dir) {
  return "[host]\ncapacity_bytes = \"4MiB\"\nlock_memory = \"off\"\n[nvme]\npath = \"" + dir +
         "/nvme.dat\"\ncapacity_bytes = \"64MiB\"\nregion_bytes = \"1MiB\"\nadmission = \"all\"\n";
}

std::string MakeTempDir() {
  Result<std::string> dir = support::MakeTempDir("kvtier-test-");
  if (!dir.ok()) {
    ADD_FAILURE() << dir.status().ToString();
    return "/tmp";
  }
  return *dir;
}

void RemoveTree(const std::string& path) { support::RemoveTree(path); }

NamespaceDescriptor TestNamespace(const std::string& revision) {
  NamespaceDescriptor ns;
  ns.model_id = "test/model";
  ns.model_revision = revision;
  ns.kv_dtype = "bf16";
  ns.block_tokens = 16;
  ns.layer_count = 4;
  ns.kv_layout = "layer_major_kv";
  ns.bytes_per_token_per_layer = 1024;
  return ns;
}

NamespaceDescriptor ModelNamespace(const std::string& model, const std::string& revision, const std::string& adapter) {
  NamespaceDescriptor ns = TestNamespace(revision);
  ns.model_id = model;
  ns.adapter_id = adapter;
  ns.adapter_revision = adapter.empty() ? "" : "a1";
  return ns;
}

std::unique_ptr<HostTier> OpenTestHostTier(uint64_t capacity_bytes, uint32_t directory_slots,
                                           uint64_t allocate_at_start_bytes) {
  HostArenaOptions arena;
  arena.capacity_bytes = capacity_bytes;
  arena.lock = HostArenaOptions::LockMode::kOff;
  arena.name = "kvtier-test-arena";
  if (allocate_at_start_bytes > 0) {
    arena.warm_in_background = true;
    arena.allocate_at_open_bytes = allocate_at_start_bytes;
  }
  auto host = HostTier::Open(arena, directory_slots);
  if (!host.ok()) {
    ADD_FAILURE() << "HostTier::Open: " << host.status().ToString();
    return nullptr;
  }
  return std::move(*host);
}

std::span<std::byte> SlotBytes(HostTier& host, uint64_t offset, uint64_t length) {
  return host.Bytes(HostTier::Extent{offset, length});
}

Status PutFilledBlock(Engine& engine, HostTier& host, ConnectionId session, const NamespaceFingerprint& ns,
                      const BlockKey& key, uint64_t size) {
  auto grants = engine.Reserve(session, ns, {&key, 1}, {&size, 1});
  if (!grants[0].status.ok()) return grants[0].status;
  FillBlockBytes(key, 0, SlotBytes(host, grants[0].offset, grants[0].length));
  return engine.Commit(session, ns, {&key, 1}, {&size, 1})[0];
}

Status PinAndRelease(Engine& engine, ConnectionId connection, const NamespaceFingerprint& ns, const BlockKey& key) {
  auto grants = engine.Pin(connection, ns, {&key, 1});
  if (!grants[0].status.ok()) return grants[0].status;
  return engine.Release(connection, {&grants[0].lease, 1})[0];
}

Tier LookupTier(Engine& engine, const NamespaceFingerprint& ns, const BlockKey& key) {
  const LookupOutcome found = engine.Lookup(ns, {&key, 1});
  return found.prefix_blocks == 1 ? found.tiers[0] : Tier::kNone;
}

TestDaemon::TestDaemon(const TestDaemonOptions& options)
    : clock_(options.clock != nullptr ? *options.clock : system_clock_) {
  dir_ = MakeTempDir();
  socket_path_ = dir_ + "/kvtierd.sock";
  const uint32_t directory_slots = options.directory_slots < 0    ? 0
                                   : options.directory_slots == 0 ? HostDirectory::DefaultSlots(options.arena_bytes)
                                                                  : static_cast<uint32_t>(options.directory_slots);
  host_ = OpenTestHostTier(options.arena_bytes, directory_slots, options.allocate_at_start_bytes);
  if (host_ == nullptr) std::abort();
  DwpdOptions dwpd;
  if (!options.nvme_path.empty()) {
    auto config = ParseConfig("", "<test>");
    config->nvme_path = options.nvme_path;
    config->nvme_capacity_bytes = static_cast<int64_t>(options.nvme_bytes);
    config->nvme_region_bytes = static_cast<int64_t>(options.nvme_region_bytes);
    config->nvme_staging_bytes = 16 << 20;
    config->nvme_preallocate = options.nvme_preallocate;
    config->nvme_index_path = options.nvme_index_path;
    auto nvme = OpenNvmeTier(*config, clock_);
    if (!nvme.ok() && nvme.status().code() == StatusCode::kInvalidArgument) {
      config->nvme_direct_io = false;  // a TMPDIR without O_DIRECT (tmpfs)
      nvme = OpenNvmeTier(*config, clock_);
    }
    if (!nvme.ok()) {
      ADD_FAILURE() << "OpenNvmeTier: " << nvme.status().ToString();
      std::abort();
    }
    nvme_ = std::move(*nvme);
    auto from_config = DwpdFromConfig(*config);
    if (!from_config.ok()) ADD_FAILURE() << "DwpdFromConfig: " << from_config.status().ToString();
    if (from_config.ok()) dwpd = *from_config;
  }
  if (options.nvme_path.empty() && options.nvme_in_memory) {
    nvme_memory_ = std::make_unique<MemoryDevice>(options.nvme_bytes);
    NvmeTierOptions nvme_options = SmallNvmeOptions();
    nvme_options.region_bytes = options.nvme_region_bytes;
    nvme_options.staging_bytes = options.nvme_staging_bytes;
    nvme_options.reclaim = options.nvme_eviction;
    nvme_options.reinsert_share = options.nvme_reinsert_share;
    auto nvme =
        OpenMemoryNvmeTier(*nvme_memory_, dir_, clock_, nvme_options, {}, &nvme_device_, options.nvme_index_hook);
    if (!nvme.ok()) {
      ADD_FAILURE() << "OpenMemoryNvmeTier: " << nvme.status().ToString();
      std::abort();
    }
    nvme_ = std::move(*nvme);
    if (options.nvme_dwpd) dwpd = *options.nvme_dwpd;
  }
  EngineOptions engine_options{options.shards, options.eviction};
  engine_options.demotion_buffer_bytes = options.demotion_buffer_bytes;
  engine_options.prefetch_share = options.prefetch_share;
  engine_options.admission = options.nvme_admission;
  engine_options.dwpd = dwpd;
  std::vector<LowerTier> below;
  if (nvme_ != nullptr) below.push_back(LowerTier{nvme_.get(), options.nvme_admission, dwpd, 0, Tier::kNvme});
  if (options.remote != nullptr) {
    LowerTier remote;
    remote.tier = options.remote;
    remote.admission = options.remote_admission;
    remote.reported = Tier::kRemote;
    below.push_back(remote);
  }
  auto engine = Engine::Create(engine_options, *host_, clock_, std::move(below), options.above);
  if (!engine.ok()) {
    ADD_FAILURE() << "Engine::Create: " << engine.status().ToString();
    std::abort();
  }
  engine_ = std::move(*engine);
  ServerOptions server_options{socket_path_, options.io_threads, options.max_frame_bytes, 5000};
  server_options.limits = options.limits;
  server_options.clock = &clock_;  // the accept backoff's
  auto server = Server::Start(server_options, *engine_, *host_);
  if (!server.ok()) {
    ADD_FAILURE() << "Server::Start: " << server.status().ToString();
    std::abort();
  }
  server_ = std::move(*server);
}

TestDaemon::~TestDaemon() {
  server_->Shutdown();
  server_->Wait();
  server_.reset();
  engine_.reset();
  nvme_.reset();
  nvme_memory_.reset();
  host_.reset();
  RemoveTree(dir_);
}

ClientOptions TestDaemon::Options(std::vector<NamespaceDescriptor> namespaces) const {
  ClientOptions options;
  options.socket_path = socket_path_;
  options.client_name = "kvtier-test";
  options.namespaces = std::move(namespaces);
  options.verify_checksums = true;
  return options;
}

std::unique_ptr<Client> TestDaemon::Connect(std::vector<NamespaceDescriptor> namespaces) const {
  return ConnectWith(Options(std::move(namespaces)));
}

std::unique_ptr<Client> TestDaemon::ConnectSocketOnly(std::vector<NamespaceDescriptor> namespaces) const {
  ClientOptions options = Options(std::move(namespaces));
  options.use_directory = false;
  return ConnectWith(options);
}

std::unique_ptr<Client> TestDaemon::ConnectWith(const ClientOptions& options) const {
  auto client = Client::Connect(options);
  if (!client.ok()) {
    ADD_FAILURE() << "Connect: " << client.status().ToString();
    return nullptr;
  }
  return std::move(*client);
}

namespace {

// splitmix64: a cheap, well-mixed stream seeded by the block identity.
uint64_t Mix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Seed(const BlockKey& key, uint64_t salt, size_t size) {
  return key.hi ^ (key.lo * 31) ^ (salt * 0x2545f4914f6cdd1dULL) ^ size;
}

}  // namespace

void FillBlockBytes(const BlockKey& key, uint64_t salt, std::span<std::byte> out) {
  uint64_t state = Seed(key, salt, out.size());
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t v = Mix(state);
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    uint64_t v = Mix(state);
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

bool CheckBlockBytes(const BlockKey& key, uint64_t salt, std::span<const std::byte> bytes) {
  std::vector<std::byte> expected(bytes.size());
  FillBlockBytes(key, salt, expected);
  return std::memcmp(expected.data(), bytes.data(), bytes.size()) == 0;
}

std::vector<BlockKey> TestKeys(const NamespaceDescriptor& ns, size_t blocks, uint32_t seed) {
  auto hasher = ChainHasher::Create(ns);
  EXPECT_TRUE(hasher.ok()) << hasher.status().ToString();
  std::vector<uint32_t> tokens(blocks * ns.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919 + seed * 104729) % 128256);
  return hasher->Keys(tokens);
}

std::vector<BlockKey> FillArenaWithMiBBlocks(TestDaemon& daemon, Client& client, uint32_t seed, size_t extra) {
  const size_t fit = daemon.host().capacity_bytes() / kMiBBlock;
  std::vector<BlockKey> keys = TestKeys(TestNamespace(), fit + extra, seed);
  std::vector<std::byte> block(kMiBBlock);
  for (size_t i = 0; i < fit; ++i) {
    FillBlockBytes(keys[i], 0, block);
    Status put = client.Put(0, keys[i], block);
    if (!put.ok()) ADD_FAILURE() << "Put of block " << i << ": " << put.ToString();
  }
  if (daemon.host().used_bytes() != daemon.host().capacity_bytes()) ADD_FAILURE() << "the arena is not exactly full";
  return keys;
}

std::vector<std::byte> Block(const BlockKey& key, size_t size, uint64_t salt) {
  std::vector<std::byte> bytes(size);
  FillBlockBytes(key, salt, bytes);
  return bytes;
}

int64_t FindCounter(const CounterCollector& c, std::string_view name) {
  for (const auto& [n, value] : c.counters()) {
    if (n == name) return value;
  }
  ADD_FAILURE() << "no counter " << name;
  return -1;
}

int64_t EngineCounter(TestDaemon& daemon, std::string_view name) {
  CounterCollector c;
  daemon.engine().VisitCounters(c);
  return FindCounter(c, name);
}

int64_t ServerCounter(TestDaemon& daemon, std::string_view name) {
  CounterCollector c;
  daemon.server().VisitCounters(c);
  return FindCounter(c, name);
}

int64_t StatsCounter(Client& client, std::string_view name) {
  auto stats = client.Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (!stats.ok()) return -1;
  for (const auto& c : *stats) {
    if (c.name == name) return c.value;
  }
  ADD_FAILURE() << "no counter " << name;
  return -1;
}

std::map<std::string, int64_t> EngineCounters(const Engine& engine) {
  CounterCollector c;
  engine.VisitCounters(c);
  return {c.counters().begin(), c.counters().end()};
}

std::map<std::string, int64_t> StatsCounters(Client& client) {
  auto stats = client.Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  std::map<std::string, int64_t> out;
  if (stats.ok()) {
    for (const auto& c : *stats) out[c.name] = c.value;
  }
  return out;
}

}  // namespace kvtier::testing
