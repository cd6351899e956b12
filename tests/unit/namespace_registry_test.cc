// Tests of NamespaceRegistry, the engine's namespaces: a kept namespace is
// never a candidate to forget, a used one becomes one when its last
// connection releases it, ForgetUnused spares those with blocks (and those
// used or kept again meanwhile), the sweep comes due as unused namespaces
// double, a block's layout follows its size, and a model names its
// namespaces.
#include "daemon/engine/namespace_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

namespace kvtier {
namespace {

// A descriptor of `model` and `revision` with `layers` layers of 16 tokens
// of 1 KiB each.
NamespaceDescriptor Describe(const std::string& model, const std::string& revision, uint32_t layers = 4) {
  NamespaceDescriptor d;
  d.model_id = model;
  d.model_revision = revision;
  d.kv_dtype = "bf16";
  d.block_tokens = 16;
  d.layer_count = layers;
  d.kv_layout = "layer_major_kv";
  d.bytes_per_token_per_layer = 1024;
  return d;
}

NamespaceFingerprint Ns(uint64_t i) { return NamespaceFingerprint{0x5eed, i}; }

// Registers `ns` as used by `connection` alone, described as `d`.
void UseOne(NamespaceRegistry& registry, ConnectionId connection, const NamespaceFingerprint& ns,
            const NamespaceDescriptor& d) {
  registry.Use(connection, std::span(&ns, 1), std::span(&d, 1));
}

void ExpectLayout(const NamespaceLayout& got, uint32_t layers, uint64_t bytes, const std::string& what) {
  EXPECT_EQ(got.layer_count, layers) << what;
  EXPECT_EQ(got.block_bytes, bytes) << what;
}

TEST(NamespaceRegistryTest, ABlockOfTheRegisteredSizeHasItsLayersAnyOtherIsOneLayer) {
  NamespaceRegistry registry;
  registry.Keep(Ns(1), NamespaceLayout{4, 4096});
  ExpectLayout(registry.LayoutOf(Ns(1), 4096), 4, 4096, "the registered size");
  ExpectLayout(registry.LayoutOf(Ns(1), 1000), 1, 1000, "another size");
  ExpectLayout(registry.LayoutOf(Ns(2), 4096), 1, 4096, "an unknown namespace");
  registry.Keep(Ns(3), NamespaceLayout{0, 4096});
  ExpectLayout(registry.LayoutOf(Ns(3), 4096), 1, 4096, "a layout of no layers");
  ASSERT_TRUE(registry.Layout(Ns(3)).has_value());
  ExpectLayout(*registry.Layout(Ns(3)), 0, 4096, "Layout answers as registered");
  EXPECT_FALSE(registry.Layout(Ns(2)).has_value());
}

TEST(NamespaceRegistryTest, AKeptNamespaceIsNeverForgotten) {
  NamespaceRegistry registry;
  const NamespaceDescriptor d = Describe("org/model", "rev-1");
  registry.Keep(Ns(1), d);
  ExpectLayout(registry.LayoutOf(Ns(1), d.BlockBytes()), 4, d.BlockBytes(), "from the descriptor");
  UseOne(registry, 7, Ns(1), d);
  EXPECT_FALSE(registry.Release(7));
  EXPECT_FALSE(registry.HasUnused()) << "kept: not unused when its connection goes";
  EXPECT_EQ(registry.ForgetUnused({}), 0u);
  EXPECT_EQ(registry.described(), 1u);
  EXPECT_TRUE(registry.DescriptorOf(Ns(1)).has_value());
}

TEST(NamespaceRegistryTest, ANamespaceIsUnusedWhenItsLastConnectionReleasesIt) {
  NamespaceRegistry registry;
  const NamespaceDescriptor d = Describe("org/model", "rev-1");
  const std::vector<NamespaceFingerprint> twice = {Ns(1), Ns(1)};
  const std::vector<NamespaceDescriptor> descriptors = {d, d};
  registry.Use(1, twice, descriptors);  // listed twice in one Hello: one use
  UseOne(registry, 2, Ns(1), d);
  EXPECT_EQ(registry.described(), 1u);
  EXPECT_FALSE(registry.Release(1));
  EXPECT_FALSE(registry.HasUnused()) << "connection 2 still uses it";
  EXPECT_FALSE(registry.Release(2));
  EXPECT_TRUE(registry.HasUnused());
  EXPECT_FALSE(registry.Release(2)) << "a connection released twice";
  EXPECT_FALSE(registry.Release(99)) << "a connection that used nothing";
}

TEST(NamespaceRegistryTest, ForgettingSparesNamespacesWithBlocks) {
  NamespaceRegistry registry;
  const NamespaceDescriptor d = Describe("org/model", "rev-1");
  UseOne(registry, 1, Ns(1), d);
  UseOne(registry, 1, Ns(2), d);
  registry.Release(1);
  EXPECT_EQ(registry.ForgetUnused({Ns(2)}), 1u) << "Ns(2) has blocks";
  EXPECT_FALSE(registry.DescriptorOf(Ns(1)).has_value());
  EXPECT_FALSE(registry.Layout(Ns(1)).has_value()) << "its layout goes with it";
  ExpectLayout(registry.LayoutOf(Ns(1), d.BlockBytes()), 1, d.BlockBytes(), "a forgotten namespace");
  EXPECT_TRUE(registry.DescriptorOf(Ns(2)).has_value());
  EXPECT_EQ(registry.described(), 1u);
  EXPECT_TRUE(registry.HasUnused()) << "Ns(2) stays a candidate";
  EXPECT_EQ(registry.ForgetUnused({}), 1u) << "its blocks are gone";
  EXPECT_EQ(registry.described(), 0u);
  EXPECT_FALSE(registry.HasUnused());
}

TEST(NamespaceRegistryTest, ANamespaceUsedOrKeptAgainIsNotForgotten) {
  NamespaceRegistry registry;
  const NamespaceDescriptor d = Describe("org/model", "rev-1");
  UseOne(registry, 1, Ns(1), d);
  UseOne(registry, 1, Ns(2), d);
  registry.Release(1);
  UseOne(registry, 2, Ns(1), d);                             // a new connection uses it
  registry.Keep(Ns(2), NamespaceLayout{4, d.BlockBytes()});  // an operator keeps it
  EXPECT_EQ(registry.ForgetUnused({}), 0u);
  EXPECT_TRUE(registry.DescriptorOf(Ns(1)).has_value());
  EXPECT_TRUE(registry.DescriptorOf(Ns(2)).has_value());
}

TEST(NamespaceRegistryTest, ALaterUseReplacesTheDescriptorAndLayout) {
  NamespaceRegistry registry;
  UseOne(registry, 1, Ns(1), Describe("org/model", "rev-1", 4));
  const NamespaceDescriptor wider = Describe("org/model", "rev-1", 8);
  UseOne(registry, 2, Ns(1), wider);
  ExpectLayout(registry.LayoutOf(Ns(1), wider.BlockBytes()), 8, wider.BlockBytes(), "the later one");
  ASSERT_TRUE(registry.DescriptorOf(Ns(1)).has_value());
  EXPECT_EQ(registry.DescriptorOf(Ns(1))->layer_count, 8u);
}

// The sweep is due once the unused namespaces reach twice those a sweep
// left (they had blocks) plus kUnusedSweep.
TEST(NamespaceRegistryTest, ASweepIsDueWhenTheUnusedNamespacesDouble) {
  constexpr size_t kSweep = NamespaceRegistry::kUnusedSweep;
  NamespaceRegistry registry;
  const NamespaceDescriptor d = Describe("org/model", "rev-1");
  uint64_t next = 0;
  // One namespace per connection; true when its release makes a sweep due.
  auto use_and_release = [&] {
    const ConnectionId connection = ++next;
    UseOne(registry, connection, Ns(connection), d);
    return registry.Release(connection);
  };
  for (size_t i = 1; i < kSweep; ++i) ASSERT_FALSE(use_and_release()) << i;
  EXPECT_TRUE(use_and_release()) << "the " << kSweep << "th unused namespace";
  std::unordered_set<NamespaceFingerprint> with_blocks;
  for (uint64_t i = 1; i <= kSweep / 2; ++i) with_blocks.insert(Ns(i));
  EXPECT_EQ(registry.ForgetUnused(with_blocks), kSweep / 2);
  const size_t left = kSweep / 2;
  for (size_t unused = left + 1; unused < 2 * left + kSweep; ++unused) ASSERT_FALSE(use_and_release()) << unused;
  EXPECT_TRUE(use_and_release()) << "twice the " << left << " left, plus " << kSweep;
}

TEST(NamespaceRegistryTest, AModelNamesItsNamespacesOfARevisionOrOfAll) {
  NamespaceRegistry registry;
  registry.Keep(Ns(1), Describe("org/model", "rev-1"));
  registry.Keep(Ns(2), Describe("org/model", "rev-2"));
  UseOne(registry, 1, Ns(3), Describe("org/model", "rev-1"));
  registry.Keep(Ns(4), Describe("org/other", "rev-1"));
  registry.Keep(Ns(5), NamespaceLayout{4, 4096});  // no descriptor: no model
  auto sorted = [](std::vector<NamespaceFingerprint> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(registry.OfModel("org/model", "rev-1")), (std::vector<NamespaceFingerprint>{Ns(1), Ns(3)}));
  EXPECT_EQ(sorted(registry.OfModel("org/model", "")), (std::vector<NamespaceFingerprint>{Ns(1), Ns(2), Ns(3)}));
  EXPECT_TRUE(registry.OfModel("org/none", "").empty());
  std::map<NamespaceFingerprint, std::string> visited;
  registry.ForEachDescriptor([&](const NamespaceFingerprint& ns, const NamespaceDescriptor& d) {
    visited[ns] = d.model_id + "@" + d.model_revision;
  });
  EXPECT_EQ(visited, (std::map<NamespaceFingerprint, std::string>{{Ns(1), "org/model@rev-1"},
                                                                  {Ns(2), "org/model@rev-2"},
                                                                  {Ns(3), "org/model@rev-1"},
                                                                  {Ns(4), "org/other@rev-1"}}));
  EXPECT_EQ(registry.described(), 4u);
}

}  // namespace
}  // namespace kvtier
