// The C++ example of README.md, kept compiling and working against a daemon.
#include <gtest/gtest.h>

#include <chrono>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

TEST(ReadmeExample, RunsAsWritten) {
  TestDaemon daemon;
  std::vector<uint32_t> prompt_tokens(1000);
  for (size_t i = 0; i < prompt_tokens.size(); ++i) prompt_tokens[i] = static_cast<uint32_t>(i);
  std::vector<std::vector<std::byte>> kv(8, std::vector<std::byte>(64 << 10, std::byte{7}));
  auto kv_buffer = [&](size_t i) { return std::span<std::byte>(kv[i]); };
  auto kv_bytes = [&](size_t i) { return std::span<const std::byte>(kv[i]); };

  // --- as in README.md, with the socket of the test daemon ---
  kvtier::NamespaceDescriptor ns{.model_id = "meta-llama/Llama-3.1-8B",
                                 .model_revision = "0e9e39f",
                                 .kv_dtype = "bf16",
                                 .block_tokens = 256,
                                 .layer_count = 32,
                                 .kv_layout = "layer_major_kv",
                                 .bytes_per_token_per_layer = 4096};
  auto hasher = kvtier::ChainHasher::Create(ns).value();
  auto client = kvtier::Client::Connect({.socket_path = daemon.socket_path(), .namespaces = {ns}}).value();
  std::vector<kvtier::BlockKey> keys = hasher.Keys(prompt_tokens);
  size_t cached = client->Lookup(0, keys)->prefix_blocks;
  for (size_t i = 0; i < cached; ++i) ASSERT_TRUE(client->Get(0, keys[i], kv_buffer(i)).ok());
  for (size_t i = cached; i < keys.size(); ++i) ASSERT_TRUE(client->Put(0, keys[i], kv_bytes(i)).ok());
  // ---
  const uint64_t request_id = 1, conversation_id = 5;
  const auto expected_start = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  // --- the queue hints, as in README.md ---
  ASSERT_TRUE(client->Enqueue(request_id, 0, keys, expected_start).ok());  // steady_clock time point
  ASSERT_TRUE(client->Started(request_id).ok());                           // or Finished() if it never ran
  ASSERT_TRUE(client->CloseSession(conversation_id).ok());                 // its blocks go first from now on
  // ---

  EXPECT_EQ(keys.size(), 3u) << "1000 tokens = 3 full blocks of 256";
  EXPECT_EQ(cached, 0u);
  EXPECT_EQ(client->Lookup(0, keys)->prefix_blocks, 3u);
}

}  // namespace
}  // namespace kvtier::testing
