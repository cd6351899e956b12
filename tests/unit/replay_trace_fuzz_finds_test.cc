// What tests/fuzz/replay_trace_fuzz found in the trace reader
// (tools/replay/replay_trace.h), kept as regression tests:
// - a ShareGPT-form line with "session": 0 was read as "no conversation"
//   although that form names every line's conversation;
// - a session of 2^48 or more left the file's namespace (bits 48 and up),
//   so conversations of two files could collide or become 0;
// - input_length near 2^64 overflowed the block count, refusing a line
//   whose hash_ids fit.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "tests/testing/test_daemon.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace {

class ReplayTraceFuzzFindsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::kvtier::testing::MakeTempDir(); }
  void TearDown() override { ::kvtier::testing::RemoveTree(dir_); }

  // A one-line trace file.
  std::string Write(const std::string& line) {
    const std::string path = dir_ + "/t" + std::to_string(files_++) + ".jsonl";
    std::ofstream(path) << line << "\n";
    return path;
  }
  static std::string SessionLine(const std::string& session) {
    return "{\"timestamp\": 1, \"input_length\": 4, \"hash_ids\": [1], \"session\": " + session + "}";
  }

  std::string dir_;
  int files_ = 0;
};

TEST_F(ReplayTraceFuzzFindsTest, TheShareGptFormRefusesSessionZero) {
  auto sharegpt = ReadMooncakeTrace(Write(SessionLine("0")), 4, 0, /*require_session=*/true);
  ASSERT_FALSE(sharegpt.ok());
  EXPECT_EQ(sharegpt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sharegpt.status().message().find(":1: \"session\" must be at least 1"), std::string::npos)
      << sharegpt.status().message();
  // In the plain Mooncake form 0 still means "no conversation".
  auto plain = ReadMooncakeTrace(Write(SessionLine("0")), 4, 0);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->requests.at(0).session, 0u);
}

TEST_F(ReplayTraceFuzzFindsTest, SessionsStayInTheirFilesNamespace) {
  const std::string largest = std::to_string((uint64_t{1} << 48) - 1);
  auto ok = ReadMooncakeTrace(Write(SessionLine(largest)), 4, 3, true);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->requests.at(0).session >> 48, 3u);
  // 2^48 was read as (1 << 48) ^ 2^48 in file 1: session 0, none.
  auto too_large = ReadMooncakeTrace(Write(SessionLine(std::to_string(uint64_t{1} << 48))), 4, 1, true);
  ASSERT_FALSE(too_large.ok());
  EXPECT_NE(too_large.status().message().find("\"session\" is too large"), std::string::npos)
      << too_large.status().message();
}

TEST_F(ReplayTraceFuzzFindsTest, AnInputLengthNear2To64CoversItsBlocks) {
  const std::string line = "{\"timestamp\": 1, \"input_length\": 18446744073709551200, \"hash_ids\": [1, 2]}";
  auto trace = ReadMooncakeTrace(Write(line), 512, 0);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->requests.at(0).blocks.size(), 2u);
}

}  // namespace
}  // namespace kvtier::tools
