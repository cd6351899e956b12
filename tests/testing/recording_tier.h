// RecordingTier: a BlockTier for tests of wrappers (ForwardingTier,
// MeasuredTier, TenantTier) that records which of its methods ran and has
// the optional capabilities (tiers/tier.h) it is given. It stores nothing:
// Find misses, Write and Read complete at once (inline, unlike a real
// tier), its kept namespace sums are one namespace of 42 bytes, and its
// health report (when given one) is kRecordingProblem and kRecordingWarning.
// Not thread-safe. CapabilitiesOf and CallEverything (below) ask and call
// through any tier.
#pragma once

#include <set>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/counters.h"
#include "common/health_findings.h"

#include "tiers/tier.h"

namespace kvtier::testing {

// Which optional capabilities a RecordingTier has, and whether its
// CheckHealth reports anything (a wrapper must pass that on too, and never
// report what the tier does not).
struct Capabilities {
  bool prober = false;
  bool in_place_holds = false;
  bool reclaim_hooks = false;
  bool reclaim_shares = false;
  bool namespace_sums = false;
  bool health = false;
};

constexpr Capabilities kEveryCapability{true, true, true, true, true, true};

// What a RecordingTier with `health` reports.
inline constexpr char kRecordingProblem[] = "the recording tier is failing";
inline constexpr char kRecordingWarning[] = "the recording tier wants a look";

// Expects `got` to be `want`, capability by capability; `what` names the case.
inline void ExpectSameCapabilities(const Capabilities& got, const Capabilities& want, const std::string& what) {
  EXPECT_EQ(got.prober, want.prober) << what << ": prober";
  EXPECT_EQ(got.in_place_holds, want.in_place_holds) << what << ": in_place_holds";
  EXPECT_EQ(got.reclaim_hooks, want.reclaim_hooks) << what << ": reclaim_hooks";
  EXPECT_EQ(got.reclaim_shares, want.reclaim_shares) << what << ": reclaim_shares";
  EXPECT_EQ(got.namespace_sums, want.namespace_sums) << what << ": namespace_sums";
  EXPECT_EQ(got.health, want.health) << what << ": health";
}

// Records which of its methods ran; has the capabilities it is given.
class RecordingTier final : public BlockTier,
                            public Prober,
                            public InPlaceHolds,
                            public ReclaimHooks,
                            public ReclaimShares,
                            public NamespaceSums {
 public:
  explicit RecordingTier(Capabilities has = kEveryCapability) : has_(has) {}

  mutable std::multiset<std::string> calls;
  ShareOf installed_shares;  // the last SetShares

  std::string_view name() const override { return Record("name"), "recording"; }
  bool asynchronous() const override { return Record("asynchronous"), true; }
  uint64_t capacity_bytes() const override { return Record("capacity_bytes"), 7; }
  uint64_t used_bytes() const override { return Record("used_bytes"), 3; }
  uint64_t StoredBytes(uint64_t payload_bytes) const override { return Record("StoredBytes"), payload_bytes + 1; }
  std::optional<BlockInfo> Find(const BlockKey&) const override { return Record("Find"), std::nullopt; }
  Status Write(const NamespaceFingerprint&, const BlockKey&, uint32_t, std::span<const std::byte>, WriteDone done,
               std::optional<uint64_t>) override {
    Record("Write");
    done(Status::Ok());
    return Status::Ok();
  }
  Status Read(const BlockKey&, uint32_t, uint32_t, std::span<std::byte> dst, ReadDone done) override {
    Record("Read");
    done(dst.size());
    return Status::Ok();
  }
  bool keeps_layer_checksums() const override { return Record("keeps_layer_checksums"), true; }
  Status ReadWithLayerChecksums(const BlockKey&, uint32_t, uint32_t, std::span<std::byte> dst,
                                LayerReadDone done) override {
    Record("ReadWithLayerChecksums");
    done(LayerRead{dst.size(), {}});
    return Status::Ok();
  }
  void ForEachBlock(const BlockVisitor&) const override { Record("ForEachBlock"); }
  Status Erase(const BlockKey&) override { return Record("Erase"), Status::Ok(); }
  WriteTotals write_totals() const override { return Record("write_totals"), WriteTotals{5, 6}; }
  void VisitCounters(CounterVisitor&) const override { Record("VisitCounters"); }
  void CheckHealth(HealthFindings& out) const override {
    Record("CheckHealth");
    if (!has_.health) return;
    out.AddProblem(kRecordingProblem);
    out.AddWarning(kRecordingWarning);
  }

  Prober* prober() override { return has_.prober ? this : nullptr; }
  InPlaceHolds* in_place_holds() override { return has_.in_place_holds ? this : nullptr; }
  ReclaimHooks* reclaim_hooks() override { return has_.reclaim_hooks ? this : nullptr; }
  ReclaimShares* reclaim_shares() override { return has_.reclaim_shares ? this : nullptr; }
  const NamespaceSums* namespace_sums() const override { return has_.namespace_sums ? this : nullptr; }

  void Probe(const NamespaceFingerprint&, std::span<const BlockKey>) override { Record("Probe"); }
  Result<InPlace> HoldInPlace(const BlockKey&) override { return Record("HoldInPlace"), InPlace{}; }
  void ReleaseInPlace(const BlockKey&, uint64_t) override { Record("ReleaseInPlace"); }
  void SetNeededHint(NeededHint) override { Record("SetNeededHint"); }
  void SetEvictionSink(EvictionSink) override { Record("SetEvictionSink"); }
  void SetShares(ShareOf shares) override {
    Record("SetShares");
    installed_shares = std::move(shares);
  }
  uint64_t shareable_bytes() const override { return Record("shareable_bytes"), 9; }
  void ForEachNamespaceBytes(const NamespaceBytesVisitor& visit) const override {
    Record("ForEachNamespaceBytes");
    visit(NamespaceFingerprint{1, 2}, 42);
  }

 private:
  void Record(const std::string& what) const { calls.insert(what); }
  const Capabilities has_;
};

// What `tier` answers for each capability: whether it has it; and
// whether its health report has any line.
inline Capabilities CapabilitiesOf(BlockTier& tier) {
  HealthFindings health;
  tier.CheckHealth(health);
  return Capabilities{tier.prober() != nullptr,         tier.in_place_holds() != nullptr,
                      tier.reclaim_hooks() != nullptr,  tier.reclaim_shares() != nullptr,
                      tier.namespace_sums() != nullptr, !health.problems.empty() || !health.warnings.empty()};
}

// Calls every core method and every capability `tier` has once through it.
inline void CallEverything(BlockTier& tier) {
  const BlockKey key{1, 1};
  const NamespaceFingerprint ns{1, 2};
  std::vector<std::byte> bytes(16);
  (void)tier.name();
  (void)tier.asynchronous();
  (void)tier.capacity_bytes();
  (void)tier.used_bytes();
  (void)tier.StoredBytes(1);
  (void)tier.Find(key);
  (void)tier.Write(ns, key, 1, bytes, [](Status) {});
  (void)tier.Read(key, 0, 1, bytes, [](Result<size_t>) {});
  (void)tier.keeps_layer_checksums();
  (void)tier.ReadWithLayerChecksums(key, 0, 1, bytes, [](Result<BlockTier::LayerRead>) {});
  tier.ForEachBlock([](const BlockKey&, const BlockTier::BlockInfo&) {});
  (void)tier.Erase(key);
  (void)tier.write_totals();
  CounterCollector counters;
  tier.VisitCounters(counters);
  HealthFindings health;
  tier.CheckHealth(health);
  if (Prober* prober = tier.prober()) prober->Probe(ns, std::span(&key, 1));
  if (InPlaceHolds* holds = tier.in_place_holds()) {
    (void)holds->HoldInPlace(key);
    holds->ReleaseInPlace(key, 0);
  }
  if (ReclaimHooks* hooks = tier.reclaim_hooks()) {
    hooks->SetNeededHint(nullptr);
    hooks->SetEvictionSink(nullptr);
  }
  if (ReclaimShares* shares = tier.reclaim_shares()) {
    shares->SetShares(nullptr);
    (void)shares->shareable_bytes();
  }
  if (const NamespaceSums* sums = tier.namespace_sums()) {
    sums->ForEachNamespaceBytes([](const NamespaceFingerprint&, uint64_t) {});
  }
}

}  // namespace kvtier::testing
