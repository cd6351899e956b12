// The fault-injecting device does what it promises: each fault kind happens
// at roughly its rate and has exactly its documented effect on the medium
// and on the reported outcome.
#include "tests/testing/fault_injecting_device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>

#include "tests/testing/memory_device.h"

namespace kvtier::testing {
namespace {

constexpr uint32_t kAlign = 4096;
constexpr size_t kBytes = 16 * kAlign;

struct Buffer {
  explicit Buffer(size_t n) : data(static_cast<std::byte*>(std::aligned_alloc(kAlign, n))), size(n) {}
  ~Buffer() { std::free(data); }
  std::span<std::byte> span() { return {data, size}; }
  std::byte* data;
  size_t size;
};

std::map<std::string, int64_t> Counters(const BlockDevice& d) {
  CounterCollector c;
  d.VisitCounters(c);
  return {c.counters().begin(), c.counters().end()};
}

TEST(FaultInjectingDevice, NoFaultsIsTransparent) {
  MemoryDevice memory(1 << 20);
  FaultInjectingDevice device(memory, FaultOptions{});
  Buffer out(kBytes), in(kBytes);
  std::memset(out.data, 0x42, kBytes);
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(*WriteSync(device, 0, out.span()), kBytes);
    ASSERT_EQ(*ReadSync(device, 0, in.span()), kBytes);
  }
  EXPECT_EQ(std::memcmp(out.data, in.data, kBytes), 0);
  EXPECT_EQ(device.injected(), 0);
}

TEST(FaultInjectingDevice, TornWriteLiesAboutAPrefix) {
  MemoryDevice memory(1 << 20);
  FaultOptions options;
  options.torn_write_rate = 1;
  FaultInjectingDevice device(memory, options);
  Buffer out(kBytes);
  std::memset(out.data, 0x42, kBytes);
  auto w = WriteSync(device, 0, out.span());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, kBytes) << "a torn write reports full success";
  EXPECT_EQ(Counters(device)["faults.injected_torn_write"], 1);
  // The medium holds a strictly shorter aligned prefix of the data.
  size_t kept = 0;
  while (kept < kBytes && memory.raw()[kept] == std::byte{0x42}) ++kept;
  EXPECT_LT(kept, kBytes);
  EXPECT_EQ(kept % kAlign, 0u);
}

TEST(FaultInjectingDevice, ShortTransfersReportTheShortCount) {
  MemoryDevice memory(1 << 20);
  FaultOptions options;
  options.short_write_rate = 1;
  options.short_read_rate = 1;
  FaultInjectingDevice device(memory, options);
  Buffer buffer(kBytes);
  auto w = WriteSync(device, 0, buffer.span());
  ASSERT_TRUE(w.ok());
  EXPECT_LT(*w, kBytes);
  auto r = ReadSync(device, 0, buffer.span());
  ASSERT_TRUE(r.ok());
  EXPECT_LT(*r, kBytes);
}

TEST(FaultInjectingDevice, CorruptReadFlipsExactlyOneByte) {
  MemoryDevice memory(1 << 20);
  FaultInjectingDevice device(memory, FaultOptions{});
  Buffer out(kBytes), in(kBytes);
  std::memset(out.data, 0x42, kBytes);
  ASSERT_TRUE(WriteSync(device, 0, out.span()).ok());
  FaultOptions corrupt;
  corrupt.corrupt_read_rate = 1;
  device.SetOptions(corrupt);
  auto r = ReadSync(device, 0, in.span());
  ASSERT_TRUE(r.ok());
  int differing = 0;
  for (size_t i = 0; i < kBytes; ++i) differing += in.data[i] != out.data[i];
  EXPECT_EQ(differing, 1);
}

TEST(FaultInjectingDevice, EioAndFailAfterAndHealing) {
  MemoryDevice memory(1 << 20);
  FaultOptions options;
  options.fail_after = 3;
  FaultInjectingDevice device(memory, options);
  Buffer buffer(kBytes);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ReadSync(device, 0, buffer.span()).ok()) << i;
  for (int i = 0; i < 5; ++i) {
    auto r = ReadSync(device, 0, buffer.span());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  }
  EXPECT_EQ(FlushSync(device).code(), StatusCode::kIoError);
  device.SetOptions(FaultOptions{});  // healed
  EXPECT_TRUE(ReadSync(device, 0, buffer.span()).ok());
  EXPECT_TRUE(FlushSync(device).ok());
}

TEST(FaultInjectingDevice, RatesAreRoughlyHonouredAndSeeded) {
  auto run = [](uint64_t seed) {
    MemoryDevice memory(1 << 20);
    FaultOptions options;
    options.seed = seed;
    options.eio_rate = 0.1;
    FaultInjectingDevice device(memory, options);
    Buffer buffer(kAlign);
    int failed = 0;
    for (int i = 0; i < 2000; ++i) failed += !ReadSync(device, 0, buffer.span()).ok();
    return failed;
  };
  const int failed = run(5);
  EXPECT_GT(failed, 100);  // expected 200; binomial sd ~13
  EXPECT_LT(failed, 300);
  EXPECT_EQ(run(5), failed) << "same seed, same faults";
}

}  // namespace
}  // namespace kvtier::testing
