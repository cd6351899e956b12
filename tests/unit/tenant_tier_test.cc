// Tests of SharedTier and TenantTier (daemon/tenants/tenant_tier.h): two tenants on
// one shared tier (a MapTier) see only their own blocks, write only in
// their own namespaces, stay within their quotas and are charged their own
// writes; the shared tier's eviction sink and needed-hint reach the tenant
// whose block it is, with the key unscoped.
//
// MapTier neither evicts nor asks for hints, so the routing tests put
// HookTier (below) between it and SharedTier: it records the sink and hint
// installed on it, evicts on demand, and can hold writes in flight.
#include "daemon/tenants/tenant_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/counters.h"
#include "tests/testing/map_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MapTier;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kBlockBytes = 4096;
constexpr uint64_t kHeaderBytes = 512;  // HookTier's StoredBytes overhead
const std::string kSecret(kTenantKeyBytes, 's');
const NamespaceFingerprint kModel{0x1234567800abcdefULL, 0x0fedcba987654321ULL};
const NamespaceFingerprint kOtherModel{0x9999999911112222ULL, 0x3333444455556666ULL};

// Bytes that say whose they are: `owner` and `key` in every 8 bytes.
std::vector<std::byte> Payload(uint8_t owner, const BlockKey& key, uint64_t bytes = kBlockBytes) {
  std::vector<std::byte> payload(bytes);
  for (size_t i = 0; i < payload.size(); ++i) {
    const uint64_t word = (i % 8 == 0) ? owner : (key.lo >> (8 * (i % 8))) ^ key.hi ^ i;
    payload[i] = static_cast<std::byte>(word & 0xff);
  }
  return payload;
}

// The rejection, else the completion's status.
Status WriteAndWait(BlockTier& tier, const NamespaceFingerprint& ns, const BlockKey& key,
                    const std::vector<std::byte>& payload) {
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> result = done->get_future();
  Status accepted = tier.Write(ns, key, kLayers, payload, [done](Status s) { done->set_value(std::move(s)); });
  if (!accepted.ok()) return accepted;
  return result.get();
}

// The whole block: the rejection, else the completion's result.
Result<std::vector<std::byte>> ReadAndWait(BlockTier& tier, const BlockKey& key, uint64_t bytes = kBlockBytes) {
  std::vector<std::byte> out(bytes);
  auto done = std::make_shared<std::promise<Result<size_t>>>();
  std::future<Result<size_t>> result = done->get_future();
  Status accepted = tier.Read(key, 0, kLayers, out, [done](Result<size_t> r) { done->set_value(std::move(r)); });
  if (!accepted.ok()) return accepted;
  Result<size_t> read = result.get();
  if (!read.ok()) return read.status();
  EXPECT_EQ(*read, bytes);
  return out;
}

int64_t Counter(const CounterCollector& counters, const std::string& name) {
  for (const auto& [n, v] : counters.counters()) {
    if (n == name) return v;
  }
  ADD_FAILURE() << "no counter " << name;
  return -1;
}

std::map<BlockKey, NamespaceFingerprint> Blocks(const BlockTier& tier) {
  std::map<BlockKey, NamespaceFingerprint> blocks;
  tier.ForEachBlock([&blocks](const BlockKey& key, const BlockTier::BlockInfo& info) {
    EXPECT_TRUE(blocks.emplace(key, info.ns).second) << key.ToHex();
  });
  return blocks;
}

std::map<NamespaceFingerprint, uint64_t> NamespaceBytes(const BlockTier& tier) {
  std::map<NamespaceFingerprint, uint64_t> sums;
  VisitNamespaceBytes(tier, [&sums](const NamespaceFingerprint& ns, uint64_t bytes) {
    EXPECT_TRUE(sums.emplace(ns, bytes).second) << ns.ToHex();
  });
  return sums;
}

// A BlockTier over a MapTier that records the eviction sink and needed
// hint installed on it, evicts a block when told (calling the sink as a
// tier would), can hold writes in flight until told to finish them, and
// reports a settable reinsertion total.
class HookTier final : public BlockTier, public ReclaimHooks, public InPlaceHolds {
 public:
  explicit HookTier(MapTier& map) : map_(map) {}

  std::string_view name() const override { return map_.name(); }
  bool asynchronous() const override { return true; }
  uint64_t capacity_bytes() const override { return map_.capacity_bytes(); }
  uint64_t used_bytes() const override { return map_.used_bytes(); }
  uint64_t StoredBytes(uint64_t payload_bytes) const override { return payload_bytes + kHeaderBytes; }
  std::optional<BlockInfo> Find(const BlockKey& key) const override { return map_.Find(key); }
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done, std::optional<uint64_t> payload_checksum) override {
    {
      std::lock_guard lock(mu_);
      if (hold_writes_) {
        held_.push_back(Held{ns, key, layer_count, {payload.begin(), payload.end()}, std::move(done)});
        return Status::Ok();
      }
    }
    return map_.Write(ns, key, layer_count, payload, std::move(done), payload_checksum);
  }
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    return map_.Read(key, first_layer, last_layer, dst, std::move(done));
  }
  void ForEachBlock(const BlockVisitor& visit) const override { map_.ForEachBlock(visit); }
  Status Erase(const BlockKey& key) override { return map_.Erase(key); }
  WriteTotals write_totals() const override {
    std::lock_guard lock(mu_);
    return WriteTotals{map_.write_totals().device_bytes + reinserted_bytes_, reinserted_bytes_};
  }
  ReclaimHooks* reclaim_hooks() override { return this; }
  InPlaceHolds* in_place_holds() override { return this; }
  void SetNeededHint(NeededHint needed) override {
    std::lock_guard lock(mu_);
    hint_ = std::move(needed);
  }
  void SetEvictionSink(EvictionSink sink) override {
    std::lock_guard lock(mu_);
    sink_ = std::move(sink);
    ++sink_sets_;
  }
  Result<InPlace> HoldInPlace(const BlockKey& key) override { return map_.HoldInPlace(key); }
  void ReleaseInPlace(const BlockKey& key, uint64_t offset) override { map_.ReleaseInPlace(key, offset); }
  void VisitCounters(CounterVisitor& visitor) const override { map_.VisitCounters(visitor); }

  bool has_sink() const {
    std::lock_guard lock(mu_);
    return bool(sink_);
  }
  int sink_sets() const {
    std::lock_guard lock(mu_);
    return sink_sets_;
  }
  bool has_hint() const {
    std::lock_guard lock(mu_);
    return bool(hint_);
  }
  // Asks the installed hint about `raw` (a key as the tier stores it).
  bool Needed(const BlockKey& raw) const {
    NeededHint hint;
    {
      std::lock_guard lock(mu_);
      hint = hint_;
    }
    return hint && hint(raw);
  }
  void set_reinserted_bytes(uint64_t bytes) {
    std::lock_guard lock(mu_);
    reinserted_bytes_ = bytes;
  }

  // Drops `raw` (a key as stored) the way a tier reclaiming room would:
  // reads it back, erases it, and offers it to the sink. False when the
  // block is not there.
  bool Evict(const BlockKey& raw) {
    auto info = map_.Find(raw);
    if (!info.has_value()) return false;
    auto bytes = ReadAndWait(map_, raw, info->payload_bytes);
    if (!bytes.ok()) return false;
    if (!map_.Erase(raw).ok()) return false;
    EvictionSink sink;
    {
      std::lock_guard lock(mu_);
      sink = sink_;
    }
    if (sink) sink(Evicted{info->ns, raw, info->layer_count, info->payload_checksum, 3}, *bytes);
    return true;
  }
  // Offers a block the tier never stored to the sink (what an eviction of
  // a namespace no tenant holds looks like).
  void EvictUnstored(const NamespaceFingerprint& ns, const BlockKey& raw, std::span<const std::byte> payload) {
    EvictionSink sink;
    {
      std::lock_guard lock(mu_);
      sink = sink_;
    }
    if (sink) sink(Evicted{ns, raw, kLayers, BlockChecksum(payload), 0}, payload);
  }

  void set_hold_writes(bool hold) {
    std::lock_guard lock(mu_);
    hold_writes_ = hold;
  }
  size_t held_writes() const {
    std::lock_guard lock(mu_);
    return held_.size();
  }
  // Finishes the held writes: stores them (their `done` runs on the map's
  // thread; waits for them) or fails them with IoError.
  void FinishHeldWrites(bool store) {
    std::vector<Held> held;
    {
      std::lock_guard lock(mu_);
      held.swap(held_);
    }
    for (Held& h : held) {
      if (!store) {
        h.done(IoError("device went away"));
        continue;
      }
      auto finished = std::make_shared<std::promise<void>>();
      std::future<void> wait = finished->get_future();
      Status accepted = map_.Write(
          h.ns, h.key, h.layer_count, h.payload,
          [done = std::move(h.done), finished](Status s) {
            done(std::move(s));
            finished->set_value();
          },
          std::nullopt);
      ASSERT_TRUE(accepted.ok()) << accepted.ToString();
      wait.get();
    }
  }

 private:
  struct Held {
    NamespaceFingerprint ns;
    BlockKey key;
    uint32_t layer_count = 0;
    std::vector<std::byte> payload;
    WriteDone done;
  };
  MapTier& map_;
  mutable std::mutex mu_;
  EvictionSink sink_;              // guarded by mu_
  NeededHint hint_;                // guarded by mu_
  int sink_sets_ = 0;              // guarded by mu_
  uint64_t reinserted_bytes_ = 0;  // guarded by mu_
  bool hold_writes_ = false;       // guarded by mu_
  std::vector<Held> held_;         // guarded by mu_
};

// What a tenant's eviction sink received.
struct Sunk {
  BlockTier::Evicted block;
  std::vector<std::byte> payload;
};

class TenantTierTest : public ::testing::Test {
 protected:
  TenantTierTest() : scope_a_(kSecret, "team-a"), scope_b_(kSecret, "team-b"), scope_x_(kSecret, "nobody") {}

  // Two tenants on `tier`; quotas 0: none.
  void Open(BlockTier& tier, uint64_t quota_a = 0, uint64_t quota_b = 0) {
    shared_ = std::make_unique<SharedTier>(tier);
    a_ = std::make_unique<TenantTier>(*shared_, scope_a_, quota_a);
    b_ = std::make_unique<TenantTier>(*shared_, scope_b_, quota_b);
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    shared_.reset();
  }
  NamespaceFingerprint NsA(const NamespaceFingerprint& model = kModel) const { return scope_a_.ScopeNamespace(model); }
  NamespaceFingerprint NsB(const NamespaceFingerprint& model = kModel) const { return scope_b_.ScopeNamespace(model); }
  CounterCollector Counters(const BlockTier& tier) const {
    CounterCollector counters;
    tier.VisitCounters(counters);
    return counters;
  }

  MapTier map_{uint64_t{1} << 40, "nvme"};
  HookTier hook_{map_};
  const TenantScope scope_a_, scope_b_, scope_x_;
  std::unique_ptr<SharedTier> shared_;
  std::unique_ptr<TenantTier> a_, b_;
};

const BlockKey kK1{0x1000, 1}, kK2{0x2000, 2}, kK3{0x3000, 3};

TEST_F(TenantTierTest, SameKeyInTwoTenantsIsTwoBlocks) {
  Open(map_);
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  ASSERT_TRUE(WriteAndWait(*b_, NsB(), kK1, Payload('B', kK1)).ok());
  EXPECT_EQ(map_.blocks(), 2u);
  EXPECT_FALSE(map_.Find(kK1).has_value());  // stored scoped, never as the client named it
  EXPECT_TRUE(map_.Find(scope_a_.Scope(kK1)).has_value());
  EXPECT_TRUE(map_.Find(scope_b_.Scope(kK1)).has_value());

  auto found_a = a_->Find(kK1);
  auto found_b = b_->Find(kK1);
  ASSERT_TRUE(found_a.has_value());
  ASSERT_TRUE(found_b.has_value());
  EXPECT_EQ(found_a->ns, NsA());
  EXPECT_EQ(found_b->ns, NsB());
  EXPECT_EQ(found_a->payload_bytes, kBlockBytes);
  EXPECT_EQ(found_a->layer_count, kLayers);

  auto read_a = ReadAndWait(*a_, kK1);
  auto read_b = ReadAndWait(*b_, kK1);
  ASSERT_TRUE(read_a.ok()) << read_a.status().ToString();
  ASSERT_TRUE(read_b.ok()) << read_b.status().ToString();
  EXPECT_EQ(*read_a, Payload('A', kK1));
  EXPECT_EQ(*read_b, Payload('B', kK1));

  // Erasing one tenant's block leaves the other's.
  ASSERT_TRUE(a_->Erase(kK1).ok());
  EXPECT_FALSE(a_->Find(kK1).has_value());
  EXPECT_EQ(ReadAndWait(*a_, kK1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a_->Erase(kK1).code(), StatusCode::kNotFound);
  EXPECT_TRUE(b_->Find(kK1).has_value());
  auto still_b = ReadAndWait(*b_, kK1);
  ASSERT_TRUE(still_b.ok()) << still_b.status().ToString();
  EXPECT_EQ(*still_b, Payload('B', kK1));
  EXPECT_EQ(map_.blocks(), 1u);
}

TEST_F(TenantTierTest, AnotherTenantsBlockIsNotFound) {
  Open(map_);
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  EXPECT_FALSE(b_->Find(kK1).has_value());
  EXPECT_EQ(ReadAndWait(*b_, kK1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->Erase(kK1).code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->HoldInPlace(kK1).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(a_->Find(kK1).has_value());  // B's attempts did not touch it

  // Even the one key that B's scoping maps onto A's stored block (which B
  // could only know with the daemon's key) reaches nothing: the block's
  // namespace is A's.
  const BlockKey forged = scope_b_.Unscope(scope_a_.Scope(kK1));
  ASSERT_EQ(scope_b_.Scope(forged), scope_a_.Scope(kK1));
  EXPECT_FALSE(b_->Find(forged).has_value());
  EXPECT_EQ(ReadAndWait(*b_, forged).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->Erase(forged).code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->HoldInPlace(forged).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(map_.holds(), 0);
  auto read_a = ReadAndWait(*a_, kK1);
  ASSERT_TRUE(read_a.ok()) << read_a.status().ToString();
  EXPECT_EQ(*read_a, Payload('A', kK1));
}

TEST_F(TenantTierTest, ForEachBlockGivesOwnBlocksUnscoped) {
  Open(map_);
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  ASSERT_TRUE(WriteAndWait(*a_, NsA(kOtherModel), kK2, Payload('A', kK2)).ok());
  ASSERT_TRUE(WriteAndWait(*b_, NsB(), kK1, Payload('B', kK1)).ok());
  ASSERT_TRUE(WriteAndWait(*b_, NsB(), kK3, Payload('B', kK3)).ok());

  EXPECT_EQ(Blocks(*a_), (std::map<BlockKey, NamespaceFingerprint>{{kK1, NsA()}, {kK2, NsA(kOtherModel)}}));
  EXPECT_EQ(Blocks(*b_), (std::map<BlockKey, NamespaceFingerprint>{{kK1, NsB()}, {kK3, NsB()}}));
  EXPECT_EQ(Blocks(map_).size(), 4u);
}

TEST_F(TenantTierTest, ForEachNamespaceBytesCountsOwnNamespacesOnly) {
  Open(map_);
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK2, Payload('A', kK2, 2 * kBlockBytes)).ok());
  ASSERT_TRUE(WriteAndWait(*a_, NsA(kOtherModel), kK3, Payload('A', kK3)).ok());
  ASSERT_TRUE(WriteAndWait(*b_, NsB(), kK1, Payload('B', kK1, 8 * kBlockBytes)).ok());

  EXPECT_EQ(NamespaceBytes(*a_),
            (std::map<NamespaceFingerprint, uint64_t>{{NsA(), 3 * kBlockBytes}, {NsA(kOtherModel), kBlockBytes}}));
  EXPECT_EQ(NamespaceBytes(*b_), (std::map<NamespaceFingerprint, uint64_t>{{NsB(), 8 * kBlockBytes}}));
  EXPECT_EQ(a_->used_bytes(), 4 * kBlockBytes);
  EXPECT_EQ(b_->used_bytes(), 8 * kBlockBytes);
  EXPECT_EQ(map_.used_bytes(), 12 * kBlockBytes);
}

TEST_F(TenantTierTest, WriteOutsideOwnNamespacesIsInvalidArgument) {
  Open(map_);
  bool ran = false;
  const std::vector<std::byte> payload = Payload('A', kK1);
  const auto done = [&ran](Status) { ran = true; };
  EXPECT_EQ(a_->Write(NsB(), kK1, kLayers, payload, done).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->Write(scope_x_.ScopeNamespace(kModel), kK1, kLayers, payload, done).code(),
            StatusCode::kInvalidArgument);
  ASSERT_NE(static_cast<uint32_t>(kModel.hi >> 32), scope_a_.tag());
  EXPECT_EQ(a_->Write(kModel, kK1, kLayers, payload, done).code(), StatusCode::kInvalidArgument);  // unscoped
  EXPECT_EQ(map_.blocks(), 0u);
  EXPECT_FALSE(ran);
  EXPECT_EQ(a_->write_totals().device_bytes, 0u);
}

TEST_F(TenantTierTest, QuotaRefusesWritesPastIt) {
  Open(map_, /*quota_a=*/3 * kBlockBytes);
  EXPECT_EQ(a_->capacity_bytes(), 3 * kBlockBytes);
  EXPECT_EQ(b_->capacity_bytes(), map_.capacity_bytes());

  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  ASSERT_TRUE(WriteAndWait(*a_, NsA(kOtherModel), kK2, Payload('A', kK2)).ok());
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK3, Payload('A', kK3)).ok());  // exactly the quota
  const BlockKey k4{0x4000, 4};
  Status refused = WriteAndWait(*a_, NsA(), k4, Payload('A', k4));
  EXPECT_EQ(refused.code(), StatusCode::kNoSpace) << refused.ToString();
  EXPECT_EQ(Counter(Counters(*a_), "nvme.quota_refusals"), 1);
  EXPECT_EQ(Counter(Counters(*a_), "nvme.quota_bytes"), static_cast<int64_t>(3 * kBlockBytes));
  EXPECT_FALSE(a_->Find(k4).has_value());

  // A smaller block that would still pass it is refused too.
  EXPECT_EQ(WriteAndWait(*a_, NsA(), k4, Payload('A', k4, kBlockBytes / kLayers)).code(), StatusCode::kNoSpace);
  EXPECT_EQ(Counter(Counters(*a_), "nvme.quota_refusals"), 2);

  // The other tenant's blocks do not count against A, nor A's quota against B.
  for (uint64_t i = 0; i < 8; ++i) {
    const BlockKey k{0xb000, i};
    ASSERT_TRUE(WriteAndWait(*b_, NsB(), k, Payload('B', k)).ok());
  }
  EXPECT_EQ(Counter(Counters(*b_), "nvme.quota_refusals"), 0);
  EXPECT_EQ(Counter(Counters(*b_), "nvme.quota_bytes"), 0);

  // Room made is room to write again.
  ASSERT_TRUE(a_->Erase(kK2).ok());
  EXPECT_TRUE(WriteAndWait(*a_, NsA(), k4, Payload('A', k4)).ok());
  EXPECT_EQ(Counter(Counters(*a_), "nvme.quota_refusals"), 2);
}

TEST_F(TenantTierTest, QuotaCountsWritesInFlight) {
  Open(hook_, /*quota_a=*/2 * kBlockBytes);
  hook_.set_hold_writes(true);
  int done_ok = 0, done_failed = 0;
  std::mutex mu;
  const auto done = [&](Status s) {
    std::lock_guard lock(mu);
    ++(s.ok() ? done_ok : done_failed);
  };
  const BlockKey k4{0x4000, 4};
  ASSERT_TRUE(a_->Write(NsA(), kK1, kLayers, Payload('A', kK1), done).ok());
  ASSERT_TRUE(a_->Write(NsA(), kK2, kLayers, Payload('A', kK2), done).ok());
  EXPECT_EQ(hook_.held_writes(), 2u);
  EXPECT_EQ(a_->used_bytes(), 0u);  // nothing stored yet...
  EXPECT_EQ(a_->Write(NsA(), kK3, kLayers, Payload('A', kK3), done).code(),
            StatusCode::kNoSpace);  // ...but the two in flight hold the quota
  EXPECT_EQ(Counter(Counters(*a_), "nvme.quota_refusals"), 1);

  // Failed writes give their room back.
  hook_.FinishHeldWrites(/*store=*/false);
  EXPECT_EQ(done_failed, 2);
  EXPECT_EQ(a_->write_totals().device_bytes, 0u);  // nothing reached the medium
  ASSERT_TRUE(a_->Write(NsA(), kK1, kLayers, Payload('A', kK1), done).ok());
  ASSERT_TRUE(a_->Write(NsA(), kK2, kLayers, Payload('A', kK2), done).ok());
  EXPECT_EQ(a_->Write(NsA(), kK3, kLayers, Payload('A', kK3), done).code(), StatusCode::kNoSpace);

  // Stored ones keep it, counted once (stored, no longer in flight).
  hook_.FinishHeldWrites(/*store=*/true);
  EXPECT_EQ(done_ok, 2);
  EXPECT_EQ(a_->used_bytes(), 2 * kBlockBytes);
  EXPECT_EQ(a_->Write(NsA(), kK3, kLayers, Payload('A', kK3), done).code(), StatusCode::kNoSpace);
  hook_.set_hold_writes(false);
  ASSERT_TRUE(a_->Erase(kK1).ok());
  EXPECT_TRUE(WriteAndWait(*a_, NsA(), k4, Payload('A', k4)).ok());
  EXPECT_EQ(Counter(Counters(*a_), "nvme.quota_refusals"), 3);
}

TEST_F(TenantTierTest, RejectedWriteGivesItsQuotaBack) {
  Open(map_, /*quota_a=*/2 * kBlockBytes);
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  // The tier refuses (already stored): `done` never runs, nothing stays charged.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a_->Write(NsA(), kK1, kLayers, Payload('A', kK1), [](Status) { ADD_FAILURE() << "ran"; }).code(),
              StatusCode::kAlreadyExists);
  }
  EXPECT_TRUE(WriteAndWait(*a_, NsA(), kK2, Payload('A', kK2)).ok());
  EXPECT_EQ(Counter(Counters(*a_), "nvme.quota_refusals"), 0);
}

TEST_F(TenantTierTest, WriteTotalsChargeOwnWritesAndAShareOfReinsertion) {
  Open(hook_, /*quota_a=*/2 * kBlockBytes);
  const uint64_t stored = kBlockBytes + kHeaderBytes;
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK2, Payload('A', kK2)).ok());
  ASSERT_TRUE(WriteAndWait(*b_, NsB(), kK1, Payload('B', kK1)).ok());
  // Refused writes send nothing: quota, foreign namespace, already stored.
  EXPECT_EQ(WriteAndWait(*a_, NsA(), kK3, Payload('A', kK3)).code(), StatusCode::kNoSpace);
  EXPECT_EQ(WriteAndWait(*b_, NsA(), kK3, Payload('B', kK3)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteAndWait(*b_, NsB(), kK1, Payload('B', kK1)).code(), StatusCode::kAlreadyExists);

  EXPECT_EQ(a_->write_totals().device_bytes, 2 * stored);
  EXPECT_EQ(a_->write_totals().reinserted_bytes, 0u);
  EXPECT_EQ(b_->write_totals().device_bytes, stored);

  hook_.set_reinserted_bytes(10000);
  EXPECT_EQ(a_->write_totals().device_bytes, 2 * stored + 5000);
  EXPECT_EQ(a_->write_totals().reinserted_bytes, 5000u);
  EXPECT_EQ(b_->write_totals().device_bytes, stored + 5000);
  EXPECT_EQ(b_->write_totals().reinserted_bytes, 5000u);

  // With one tenant left, all of it is that tenant's.
  b_.reset();
  EXPECT_EQ(shared_->tenants(), 1u);
  EXPECT_EQ(a_->write_totals().reinserted_bytes, 10000u);
  EXPECT_EQ(a_->write_totals().device_bytes, 2 * stored + 10000);
}

TEST_F(TenantTierTest, HoldInPlaceOfOwnBlock) {
  Open(map_);
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  auto held = a_->HoldInPlace(kK1);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->info.ns, NsA());
  EXPECT_EQ(map_.InPlaceBytes(held->offset), Payload('A', kK1));
  EXPECT_EQ(map_.holds(), 1);
  a_->ReleaseInPlace(kK1, held->offset);
  EXPECT_EQ(map_.holds(), 0);
  EXPECT_EQ(map_.bad_releases(), 0);
}

TEST_F(TenantTierTest, DelegatesTheTiersFace) {
  Open(map_);
  EXPECT_EQ(a_->name(), "nvme");
  EXPECT_EQ(a_->asynchronous(), map_.asynchronous());
  EXPECT_EQ(a_->StoredBytes(1000), map_.StoredBytes(1000));
  EXPECT_EQ(shared_->tenants(), 2u);
  EXPECT_EQ(&shared_->tier(), &map_);

  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  CounterCollector counters;
  shared_->VisitCounters(counters);
  EXPECT_EQ(Counter(counters, "maptier.blocks"), 1);  // the tier's own, once
  EXPECT_EQ(Counter(counters, "nvme.unowned_evictions"), 0);
}

TEST_F(TenantTierTest, EvictionGoesToTheOwningTenantUnscoped) {
  Open(hook_);
  EXPECT_FALSE(hook_.has_sink());  // nobody wants victims yet: the tier need not read them back
  std::mutex mu;
  std::vector<Sunk> sunk_a, sunk_b;
  a_->SetEvictionSink([&](const BlockTier::Evicted& block, std::span<const std::byte> payload) {
    std::lock_guard lock(mu);
    sunk_a.push_back(Sunk{block, {payload.begin(), payload.end()}});
  });
  EXPECT_TRUE(hook_.has_sink());
  b_->SetEvictionSink([&](const BlockTier::Evicted& block, std::span<const std::byte> payload) {
    std::lock_guard lock(mu);
    sunk_b.push_back(Sunk{block, {payload.begin(), payload.end()}});
  });
  EXPECT_EQ(hook_.sink_sets(), 1);  // installed once for both

  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  ASSERT_TRUE(WriteAndWait(*b_, NsB(), kK1, Payload('B', kK1)).ok());
  ASSERT_TRUE(WriteAndWait(*b_, NsB(kOtherModel), kK2, Payload('B', kK2)).ok());

  ASSERT_TRUE(hook_.Evict(scope_a_.Scope(kK1)));
  ASSERT_EQ(sunk_a.size(), 1u);
  EXPECT_TRUE(sunk_b.empty());
  EXPECT_EQ(sunk_a[0].block.key, kK1);
  EXPECT_EQ(sunk_a[0].block.ns, NsA());
  EXPECT_EQ(sunk_a[0].block.layer_count, kLayers);
  EXPECT_EQ(sunk_a[0].block.hits, 3u);
  EXPECT_EQ(sunk_a[0].block.payload_checksum, BlockChecksum(Payload('A', kK1)));
  EXPECT_EQ(sunk_a[0].payload, Payload('A', kK1));

  ASSERT_TRUE(hook_.Evict(scope_b_.Scope(kK2)));
  ASSERT_TRUE(hook_.Evict(scope_b_.Scope(kK1)));
  ASSERT_EQ(sunk_b.size(), 2u);
  EXPECT_EQ(sunk_a.size(), 1u);
  EXPECT_EQ(sunk_b[0].block.key, kK2);
  EXPECT_EQ(sunk_b[0].block.ns, NsB(kOtherModel));
  EXPECT_EQ(sunk_b[1].block.key, kK1);
  EXPECT_EQ(sunk_b[1].payload, Payload('B', kK1));

  CounterCollector counters;
  shared_->VisitCounters(counters);
  EXPECT_EQ(Counter(counters, "nvme.unowned_evictions"), 0);
}

TEST_F(TenantTierTest, EvictionOfNoTenantsBlockIsDroppedAndCounted) {
  Open(hook_);
  int sunk = 0;
  a_->SetEvictionSink([&](const BlockTier::Evicted&, std::span<const std::byte>) { ++sunk; });
  b_->SetEvictionSink([&](const BlockTier::Evicted&, std::span<const std::byte>) { ++sunk; });
  const std::vector<std::byte> payload = Payload('X', kK1);
  hook_.EvictUnstored(scope_x_.ScopeNamespace(kModel), kK1, payload);
  hook_.EvictUnstored(kModel, kK2, payload);
  EXPECT_EQ(sunk, 0);
  CounterCollector counters;
  shared_->VisitCounters(counters);
  EXPECT_EQ(Counter(counters, "nvme.unowned_evictions"), 2);

  // A tenant that leaves stops receiving its blocks.
  ASSERT_TRUE(WriteAndWait(*a_, NsA(), kK1, Payload('A', kK1)).ok());
  const BlockKey raw = scope_a_.Scope(kK1);
  a_.reset();
  ASSERT_TRUE(hook_.Evict(raw));
  EXPECT_EQ(sunk, 0);
  CounterCollector after;
  shared_->VisitCounters(after);
  EXPECT_EQ(Counter(after, "nvme.unowned_evictions"), 3);
}

TEST_F(TenantTierTest, SinkIsClearedOnTheTierWhenNoTenantWantsVictims) {
  Open(hook_);
  const auto sink = [](const BlockTier::Evicted&, std::span<const std::byte>) {};
  a_->SetEvictionSink(sink);
  b_->SetEvictionSink(sink);
  ASSERT_TRUE(hook_.has_sink());
  a_->SetEvictionSink(nullptr);
  EXPECT_TRUE(hook_.has_sink());  // B still wants them
  b_->SetEvictionSink(nullptr);
  EXPECT_FALSE(hook_.has_sink());

  // A tenant leaving with its sink set clears it too.
  a_->SetEvictionSink(sink);
  ASSERT_TRUE(hook_.has_sink());
  a_.reset();
  EXPECT_FALSE(hook_.has_sink());

  // And the shared tier going away clears what it installed.
  b_->SetEvictionSink(sink);
  ASSERT_TRUE(hook_.has_sink());
  ASSERT_TRUE(hook_.has_hint());
  b_.reset();
  shared_.reset();
  EXPECT_FALSE(hook_.has_sink());
  EXPECT_FALSE(hook_.has_hint());
}

TEST_F(TenantTierTest, NeededHintAsksWithTheTenantsOwnKey) {
  Open(hook_);
  ASSERT_TRUE(hook_.has_hint());                    // installed by SharedTier from the start
  EXPECT_FALSE(hook_.Needed(scope_a_.Scope(kK1)));  // no tenant hints yet

  std::mutex mu;
  std::vector<BlockKey> asked_a, asked_b;
  a_->SetNeededHint([&](const BlockKey& key) {
    std::lock_guard lock(mu);
    asked_a.push_back(key);
    return key == kK1;
  });
  b_->SetNeededHint([&](const BlockKey& key) {
    std::lock_guard lock(mu);
    asked_b.push_back(key);
    return key == kK2;
  });

  EXPECT_TRUE(hook_.Needed(scope_a_.Scope(kK1)));
  ASSERT_FALSE(asked_a.empty());
  EXPECT_EQ(asked_a.back(), kK1);  // A's hint sees A's key, not the stored one
  EXPECT_TRUE(hook_.Needed(scope_b_.Scope(kK2)));
  EXPECT_EQ(asked_b.back(), kK2);
  EXPECT_FALSE(hook_.Needed(scope_b_.Scope(kK1)));  // B's kK1 is not A's kK1
  EXPECT_FALSE(hook_.Needed(scope_a_.Scope(kK2)));
  EXPECT_FALSE(hook_.Needed(kK1));  // the raw key is nobody's

  a_->SetNeededHint(nullptr);
  EXPECT_FALSE(hook_.Needed(scope_a_.Scope(kK1)));
  EXPECT_TRUE(hook_.Needed(scope_b_.Scope(kK2)));
}

}  // namespace
}  // namespace kvtier
