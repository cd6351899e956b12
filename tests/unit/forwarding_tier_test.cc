// ForwardingTier and its users: every BlockTier method called through a
// wrapper reaches the wrapped tier, so no wrapper silently falls back to a
// default (a MeasuredTier that did not forward ForEachNamespaceBytes made
// every scrape walk each NVMe entry under the NVMe lock).
#include "tiers/forwarding_tier.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "daemon/engine/measured_tier.h"

namespace kvtier {
namespace {

// Records which of its methods ran.
class RecordingTier final : public BlockTier {
 public:
  mutable std::multiset<std::string> calls;

  Tier kind() const override { return Record("kind"), Tier::kNvme; }
  std::string_view name() const override { return Record("name"), "recording"; }
  bool asynchronous() const override { return Record("asynchronous"), true; }
  uint64_t capacity_bytes() const override { return Record("capacity_bytes"), 7; }
  uint64_t used_bytes() const override { return Record("used_bytes"), 3; }
  uint64_t StoredBytes(uint64_t payload_bytes) const override { return Record("StoredBytes"), payload_bytes + 1; }
  std::optional<BlockInfo> Find(const BlockKey&) const override { return Record("Find"), std::nullopt; }
  void Probe(const NamespaceFingerprint&, std::span<const BlockKey>) override { Record("Probe"); }
  bool probes() const override { return Record("probes"), true; }
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
  void ForEachNamespaceBytes(const NamespaceBytesVisitor& visit) const override {
    Record("ForEachNamespaceBytes");
    visit(NamespaceFingerprint{1, 2}, 42);
  }
  Status Erase(const BlockKey&) override { return Record("Erase"), Status::Ok(); }
  WriteTotals write_totals() const override { return Record("write_totals"), WriteTotals{5, 6}; }
  void SetNeededHint(NeededHint) override { Record("SetNeededHint"); }
  void SetEvictionSink(EvictionSink) override { Record("SetEvictionSink"); }
  void SetShares(ShareOf) override { Record("SetShares"); }
  uint64_t shareable_bytes() const override { return Record("shareable_bytes"), 9; }
  Result<InPlace> HoldInPlace(const BlockKey&) override { return Record("HoldInPlace"), InPlace{}; }
  void ReleaseInPlace(const BlockKey&, uint64_t) override { Record("ReleaseInPlace"); }
  void VisitCounters(CounterVisitor&) const override { Record("VisitCounters"); }

 private:
  void Record(const std::string& what) const { calls.insert(what); }
};

// Calls every BlockTier method once through `tier`.
void CallEverything(BlockTier& tier) {
  const BlockKey key{1, 1};
  const NamespaceFingerprint ns{1, 2};
  std::vector<std::byte> bytes(16);
  (void)tier.kind();
  (void)tier.name();
  (void)tier.asynchronous();
  (void)tier.capacity_bytes();
  (void)tier.used_bytes();
  (void)tier.StoredBytes(1);
  (void)tier.Find(key);
  tier.Probe(ns, std::span(&key, 1));
  (void)tier.probes();
  (void)tier.Write(ns, key, 1, bytes, [](Status) {});
  (void)tier.Read(key, 0, 1, bytes, [](Result<size_t>) {});
  (void)tier.keeps_layer_checksums();
  (void)tier.ReadWithLayerChecksums(key, 0, 1, bytes, [](Result<BlockTier::LayerRead>) {});
  tier.ForEachBlock([](const BlockKey&, const BlockTier::BlockInfo&) {});
  tier.ForEachNamespaceBytes([](const NamespaceFingerprint&, uint64_t) {});
  (void)tier.Erase(key);
  (void)tier.write_totals();
  tier.SetNeededHint(nullptr);
  tier.SetEvictionSink(nullptr);
  tier.SetShares(nullptr);
  (void)tier.shareable_bytes();
  (void)tier.HoldInPlace(key);
  tier.ReleaseInPlace(key, 0);
  CounterCollector counters;
  tier.VisitCounters(counters);
}

const std::set<std::string> kEveryMethod = {
    "kind", "name", "asynchronous", "capacity_bytes", "used_bytes", "StoredBytes", "Find", "Probe", "probes",
    "Write", "Read", "keeps_layer_checksums", "ReadWithLayerChecksums", "ForEachBlock", "ForEachNamespaceBytes",
    "Erase", "write_totals", "SetNeededHint", "SetEvictionSink", "SetShares", "shareable_bytes", "HoldInPlace",
    "ReleaseInPlace", "VisitCounters"};

TEST(ForwardingTier, EveryMethodReachesTheWrappedTier) {
  RecordingTier inner;
  ForwardingTier wrapper(inner);
  CallEverything(wrapper);
  const std::set<std::string> reached(inner.calls.begin(), inner.calls.end());
  EXPECT_EQ(reached, kEveryMethod);
}

TEST(ForwardingTier, TheMeasuredTierForwardsWhatItDoesNotMeasure) {
  RecordingTier inner;
  MeasuredTier measured(inner);
  inner.calls.clear();  // its constructor asks the name
  CallEverything(measured);
  for (const std::string& method : kEveryMethod) EXPECT_TRUE(inner.calls.count(method) > 0) << method;
}

TEST(ForwardingTier, AScrapeThroughTheMeasuredTierSumsPerNamespaceNeverPerBlock) {
  RecordingTier inner;
  MeasuredTier measured(inner);
  inner.calls.clear();
  uint64_t summed = 0;
  measured.ForEachNamespaceBytes([&summed](const NamespaceFingerprint&, uint64_t bytes) { summed += bytes; });
  EXPECT_EQ(summed, 42u);
  EXPECT_EQ(inner.calls.count("ForEachNamespaceBytes"), 1u);
  EXPECT_EQ(inner.calls.count("ForEachBlock"), 0u) << "the wrapped tier's sums, not a walk of its blocks";
}

}  // namespace
}  // namespace kvtier
