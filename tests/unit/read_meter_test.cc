// Tests of ReadMeter, a tier's read bandwidth while busy: one sample per
// busy period (reads in flight together are one period, not each read's
// own slower rate), a sample every kSampleBytes of a long period, no
// sample from a period whose reads all failed, and the reads and bytes in
// flight.
#include "daemon/engine/read_meter.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

constexpr double kInitial = 1e9;

TEST(ReadMeterTest, BeforeAnyReadItIsTheInitialEstimate) {
  ReadMeter meter(kInitial);
  EXPECT_EQ(meter.estimate().bytes_per_s(), kInitial);
  EXPECT_EQ(meter.estimate().Percentile(10), kInitial);
}

TEST(ReadMeterTest, OverlappingReadsAreOneBusyPeriod) {
  ReadMeter meter(kInitial);
  // Two reads of 1 MB each, in flight together from t=100 to t=1,100:
  // the tier delivered 2 MB in 1 ms (2 GB/s), though each read alone
  // took ~1 ms for 1 MB.
  meter.Started(1'000'000, 100);
  meter.Started(1'000'000, 150);
  meter.Ended(1'000'000, 1'000'000, 600);  // still busy: no sample yet
  EXPECT_EQ(meter.estimate().Percentile(0), kInitial);
  meter.Ended(1'000'000, 1'000'000, 1'100);
  EXPECT_DOUBLE_EQ(meter.estimate().Percentile(0), 2e9);
}

TEST(ReadMeterTest, ALongBusyPeriodIsSampledEverySampleBytes) {
  ReadMeter meter(kInitial);
  meter.Started(ReadMeter::kSampleBytes, 0);
  meter.Started(4096, 0);                                                    // keeps the tier busy throughout
  meter.Ended(ReadMeter::kSampleBytes, ReadMeter::kSampleBytes, 1'000'000);  // 64 MiB in 1 s
  EXPECT_DOUBLE_EQ(meter.estimate().Percentile(100), double(ReadMeter::kSampleBytes));
  meter.Started(ReadMeter::kSampleBytes / 2, 1'000'000);
  meter.Ended(ReadMeter::kSampleBytes / 2, ReadMeter::kSampleBytes / 2, 1'250'000);  // still busy, half a sample
  meter.Ended(4096, 0, 1'500'000);  // idle: 32 MiB over the 0.5 s since the last sample
  EXPECT_DOUBLE_EQ(meter.estimate().Percentile(0), double(ReadMeter::kSampleBytes));
  EXPECT_LT(meter.estimate().bytes_per_s(), kInitial) << "the moving average took both samples";
}

TEST(ReadMeterTest, APeriodOfFailedReadsIsNoSample) {
  ReadMeter meter(kInitial);
  meter.Started(4096, 0);
  meter.Ended(4096, 0, 5'000'000);
  EXPECT_EQ(meter.estimate().bytes_per_s(), kInitial);
  EXPECT_EQ(meter.estimate().Percentile(50), kInitial);
}

// What a new read waits behind: the reads started and not ended, with the
// bytes they were started with (a failed or short read gives back all of
// its started bytes when it ends).
TEST(ReadMeterTest, InFlightCountsTheStartedBytesUntilEachReadEnds) {
  ReadMeter meter(kInitial);
  EXPECT_EQ(meter.in_flight().reads, 0);
  EXPECT_EQ(meter.in_flight().bytes, 0u);
  meter.Started(1000, 0);
  meter.Started(3000, 0);
  EXPECT_EQ(meter.in_flight().reads, 2);
  EXPECT_EQ(meter.in_flight().bytes, 4000u);
  meter.Ended(3000, 100, 10);  // short: still all of its 3000 bytes leave the queue
  EXPECT_EQ(meter.in_flight().reads, 1);
  EXPECT_EQ(meter.in_flight().bytes, 1000u);
  meter.Ended(1000, 0, 20);  // failed
  EXPECT_EQ(meter.in_flight().reads, 0);
  EXPECT_EQ(meter.in_flight().bytes, 0u);
}

}  // namespace
}  // namespace kvtier
