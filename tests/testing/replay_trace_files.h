// ReplayTraceFiles: a fixture for `kvtier replay` tests that write small
// Mooncake-format traces into a fresh temporary directory (removed after
// the test).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/test_daemon.h"  // MakeTempDir, RemoveTree

namespace kvtier::testing {

class ReplayTraceFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { RemoveTree(dir_); }

  // A trace file of `lines`, one request each; returns its path.
  std::string Write(const std::vector<std::string>& lines) {
    const std::string path = dir_ + "/t" + std::to_string(files_++) + ".jsonl";
    std::ofstream out(path);
    for (const auto& l : lines) out << l << "\n";
    return path;
  }
  // A line of `input` tokens over `ids`, arriving at `ms`.
  static std::string Line(uint64_t ms, uint64_t input, const std::string& ids) {
    return "{\"timestamp\": " + std::to_string(ms) + ", \"input_length\": " + std::to_string(input) +
           ", \"output_length\": 7, \"hash_ids\": [" + ids + "]}";
  }

  std::string dir_;
  int files_ = 0;
};

}  // namespace kvtier::testing
