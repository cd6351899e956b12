// `kvtier stress` (tools/stress/stress.h): the tool against a private kvtierd runs
// every kind of operation with no violation; and its workload's oracle
// fails when a daemon serves wrong bytes (an in-process daemon given wrong
// bytes for a key, which it serves as a broken daemon would).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"
#include "tools/stress/stress_workload.h"

namespace kvtier::testing {
namespace {

using tools::KeySpace;
using tools::OpKind;
using tools::StressWorker;

TEST(StressTool, SpawnedDaemonEveryKindRunsAndNoReadIsWrong) {
  const std::string dir = MakeTempDir();
  const std::string json_path = dir + "/stress.json";
  const CommandResult run = RunCommand({KVTIER_TOOL_PATH, "stress", "--spawn", "--kvtierd", KVTIERD_PATH, "--seconds",
                                        "3", "--clients", "4", "--json", json_path});
  const std::string json = ReadFile(json_path);
  EXPECT_EQ(run.exit_code, 0) << run.output << json;
  ASSERT_FALSE(json.empty()) << run.output;
  const size_t kinds = json.find("\"kinds\"");
  ASSERT_NE(kinds, std::string::npos) << json;
  for (const char* kind : {"put", "reserve", "save", "get", "pin", "lookup", "erase", "load", "layers", "hint"}) {
    const size_t at = json.find("\"" + std::string(kind) + "\": {", kinds);
    ASSERT_NE(at, std::string::npos) << kind << " in " << json;
    EXPECT_GT(JsonInt(json, "ops", at), 0) << kind << ": " << json;
    EXPECT_GT(JsonInt(json, "ok", at), 0) << kind << ": " << json;
  }
  const size_t totals = json.find("\"operations\"");
  EXPECT_EQ(JsonInt(json, "violations", totals), 0) << json;
  EXPECT_EQ(JsonInt(json, "errors", totals), 0) << json;
  EXPECT_NE(json.find("\"daemon_died\": false"), std::string::npos) << json;
  // Sized so the host tier evicts to NVMe and reads come back from it.
  EXPECT_GT(JsonInt(json, "engine.demotions"), 0) << json;
  EXPECT_GT(JsonInt(json, "nvme.writes"), 0) << json;
  EXPECT_GT(JsonInt(json, "engine.promotions"), 0) << json;
  EXPECT_EQ(JsonInt(json, "nvme.corrupt_reads"), 0) << json;
  RemoveTree(dir);
}

TEST(StressTool, BadUsageExits2) {
  EXPECT_EQ(RunCommand({KVTIER_TOOL_PATH, "stress"}).exit_code, 2);  // neither --socket nor --spawn
  EXPECT_EQ(RunCommand({KVTIER_TOOL_PATH, "stress", "--spawn", "--mix", "get=x"}).exit_code, 2);
  EXPECT_EQ(RunCommand({KVTIER_TOOL_PATH, "stress", "--socket", "/nonexistent", "--crash-loop", "3"}).exit_code, 2);
}

// A worker over a key space of `chain_blocks` blocks in one chain of one
// namespace, so every operation names block 0 (and maybe the others).
class StressOracleTest : public ::testing::Test {
 protected:
  void Build(uint32_t chain_blocks) {
    auto space = KeySpace::Build({/*seed=*/7, /*namespaces=*/1, /*chains=*/1, chain_blocks});
    ASSERT_TRUE(space.ok()) << space.status().ToString();
    space_ = std::move(*space);
    client_ = daemon_.Connect(space_.Descriptors());
    ASSERT_NE(client_, nullptr);
    worker_ = std::make_unique<StressWorker>(space_, *client_, tools::WorkloadMix{}, 1, 0, stop_, killed_);
  }
  const tools::StressNamespace& ns() const { return space_.namespaces()[0]; }
  void PutExact(const BlockKey& key) {
    std::vector<std::byte> bytes(ns().shape.block_bytes());
    tools::FillBlock(ns().shape, key, bytes);
    ASSERT_TRUE(client_->Put(0, key, bytes).ok());
  }
  // A daemon that serves wrong bytes looks, to a reader, like one that was
  // given them: the put's checksum covers them, so nothing below the
  // oracle can tell.
  void PutBytes(const BlockKey& key, std::span<const std::byte> bytes) {
    ASSERT_TRUE(client_->Put(0, key, bytes).ok());
  }
  uint64_t Violations() const { return worker_->tally().violations; }
  // The violations described, and the errors by kind and code.
  std::string Samples() const {
    std::string out;
    for (const auto& v : worker_->tally().samples) out += v.what + "\n";
    for (const auto& [name, e] : worker_->tally().errors) out += name + ": " + e.first_message + "\n";
    return out;
  }

  TestDaemon daemon_;
  KeySpace space_;
  std::unique_ptr<Client> client_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> killed_{false};
  std::unique_ptr<StressWorker> worker_;
};

TEST_F(StressOracleTest, ExactBlocksPassEveryReadKind) {
  Build(1);
  PutExact(ns().keys[0]);
  for (OpKind kind : {OpKind::kGet, OpKind::kPin, OpKind::kLayers, OpKind::kLoad, OpKind::kLookup}) {
    for (int i = 0; i < 5; ++i) worker_->RunOne(kind);
    EXPECT_GT(worker_->tally().of(kind).ok, 0u) << tools::OpKindName(kind);
  }
  EXPECT_EQ(Violations(), 0u) << Samples();
  EXPECT_EQ(worker_->tally().errors_total(), 0u);
}

TEST_F(StressOracleTest, AWrongByteIsAViolationOfEveryReadKind) {
  Build(1);
  const BlockKey key = ns().keys[0];
  std::vector<std::byte> bytes(ns().shape.block_bytes());
  tools::FillBlock(ns().shape, key, bytes);
  for (uint32_t l = 0; l < ns().shape.layer_count; ++l) bytes[l * ns().shape.layer_bytes + 100] ^= std::byte{0x40};
  PutBytes(key, bytes);
  for (OpKind kind : {OpKind::kGet, OpKind::kPin, OpKind::kLayers, OpKind::kLoad}) {
    const uint64_t before = Violations();
    worker_->RunOne(kind);
    EXPECT_EQ(Violations(), before + 1) << tools::OpKindName(kind) << "\n" << Samples();
  }
  EXPECT_NE(Samples().find("wrong_bytes"), std::string::npos) << Samples();
}

TEST_F(StressOracleTest, AnotherKeysBytesAreAViolation) {
  Build(2);
  const BlockKey k0 = ns().keys[0], k1 = ns().keys[1];
  std::vector<std::byte> bytes(ns().shape.block_bytes());
  tools::FillBlock(ns().shape, k1, bytes);
  PutBytes(k0, bytes);  // k0 reads back k1's bytes
  PutExact(k1);
  worker_->RunOne(OpKind::kGet);  // every prefix of the chain starts with k0
  worker_->RunOne(OpKind::kPin);
  EXPECT_EQ(Violations(), 2u) << Samples();
  EXPECT_NE(Samples().find("other_key"), std::string::npos) << Samples();
  EXPECT_NE(Samples().find(k1.ToHex()), std::string::npos) << Samples();
}

TEST_F(StressOracleTest, AShortBlockIsAViolation) {
  Build(1);
  const BlockKey key = ns().keys[0];
  std::vector<std::byte> bytes(ns().shape.block_bytes());
  tools::FillBlock(ns().shape, key, bytes);
  PutBytes(key, std::span<const std::byte>(bytes).first(bytes.size() / 2));
  worker_->RunOne(OpKind::kGet);
  worker_->RunOne(OpKind::kPin);
  EXPECT_EQ(Violations(), 2u) << Samples();
  EXPECT_NE(Samples().find("wrong_length"), std::string::npos) << Samples();
}

}  // namespace
}  // namespace kvtier::testing
