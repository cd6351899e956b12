// ForwardingTier and its users: every BlockTier method called through a
// wrapper reaches the wrapped tier, so no wrapper silently falls back to a
// default (a MeasuredTier that did not forward the namespace sums made
// every scrape walk each NVMe entry under the NVMe lock); and each optional
// capability (tiers/tier.h) a wrapped tier has, the wrapper has too, while
// one it lacks, the wrapper lacks.
#include "tiers/forwarding_tier.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "daemon/engine/measured_tier.h"
#include "tests/testing/recording_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CallEverything;
using ::kvtier::testing::Capabilities;
using ::kvtier::testing::CapabilitiesOf;
using ::kvtier::testing::ExpectSameCapabilities;
using ::kvtier::testing::kEveryCapability;
using ::kvtier::testing::RecordingTier;

const std::set<std::string> kEveryMethod = {"name",
                                            "asynchronous",
                                            "capacity_bytes",
                                            "used_bytes",
                                            "StoredBytes",
                                            "Find",
                                            "Probe",
                                            "Write",
                                            "Read",
                                            "keeps_layer_checksums",
                                            "ReadWithLayerChecksums",
                                            "ForEachBlock",
                                            "ForEachNamespaceBytes",
                                            "Erase",
                                            "write_totals",
                                            "SetNeededHint",
                                            "SetEvictionSink",
                                            "SetShares",
                                            "shareable_bytes",
                                            "HoldInPlace",
                                            "ReleaseInPlace",
                                            "VisitCounters",
                                            "CheckHealth"};

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

// Each capability alone, none, and all: a wrapper (and a wrapper of a
// wrapper) has exactly the wrapped tier's.
TEST(ForwardingTier, AWrapperHasExactlyTheCapabilitiesOfTheTierItWraps) {
  const std::vector<Capabilities> cases = {{},
                                           kEveryCapability,
                                           {.prober = true},
                                           {.in_place_holds = true},
                                           {.reclaim_hooks = true},
                                           {.reclaim_shares = true},
                                           {.namespace_sums = true},
                                           {.health = true}};
  for (size_t i = 0; i < cases.size(); ++i) {
    RecordingTier inner(cases[i]);
    ForwardingTier forwarding(inner);
    MeasuredTier measured(inner);
    MeasuredTier measured_forwarding(forwarding);
    ExpectSameCapabilities(CapabilitiesOf(inner), cases[i], "case " + std::to_string(i) + " itself");
    ExpectSameCapabilities(CapabilitiesOf(forwarding), cases[i], "case " + std::to_string(i) + " ForwardingTier");
    ExpectSameCapabilities(CapabilitiesOf(measured), cases[i], "case " + std::to_string(i) + " MeasuredTier");
    ExpectSameCapabilities(CapabilitiesOf(measured_forwarding), cases[i],
                           "case " + std::to_string(i) + " two wrappers");
  }
}

TEST(ForwardingTier, ACapabilityThroughAWrapperIsTheWrappedTiers) {
  RecordingTier inner;
  MeasuredTier measured(inner);
  EXPECT_EQ(measured.prober(), inner.prober());
  EXPECT_EQ(measured.in_place_holds(), inner.in_place_holds());
  EXPECT_EQ(measured.reclaim_hooks(), inner.reclaim_hooks());
  EXPECT_EQ(measured.reclaim_shares(), inner.reclaim_shares());
  EXPECT_EQ(measured.namespace_sums(), inner.namespace_sums());
}

TEST(ForwardingTier, AScrapeThroughTheMeasuredTierSumsPerNamespaceNeverPerBlock) {
  RecordingTier inner;
  MeasuredTier measured(inner);
  inner.calls.clear();
  uint64_t summed = 0;
  VisitNamespaceBytes(measured, [&summed](const NamespaceFingerprint&, uint64_t bytes) { summed += bytes; });
  EXPECT_EQ(summed, 42u);
  EXPECT_EQ(inner.calls.count("ForEachNamespaceBytes"), 1u);
  EXPECT_EQ(inner.calls.count("ForEachBlock"), 0u) << "the wrapped tier's sums, not a walk of its blocks";
}

TEST(ForwardingTier, WithoutKeptSumsTheSumsWalkTheBlocks) {
  RecordingTier inner(Capabilities{});
  MeasuredTier measured(inner);
  inner.calls.clear();
  VisitNamespaceBytes(measured, [](const NamespaceFingerprint&, uint64_t) {});
  EXPECT_EQ(inner.calls.count("ForEachNamespaceBytes"), 0u);
  EXPECT_EQ(inner.calls.count("ForEachBlock"), 1u);
}

}  // namespace
}  // namespace kvtier
