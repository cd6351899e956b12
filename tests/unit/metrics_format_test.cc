// The latency histogram's buckets and the Prometheus text exposition of
// the counter registry: names, suffixes, types, labels, grouping and the
// histogram series.
#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "common/counters.h"
#include "common/histogram.h"
#include "daemon/server/metrics_format.h"

namespace kvtier {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(LatencyHistogramTest, EachObservationLandsInTheFirstBucketThatHoldsIt) {
  LatencyHistogram h;
  h.Record(nanoseconds(0));            // <= 1 us
  h.Record(nanoseconds(1000));         // exactly 1 us
  h.Record(nanoseconds(1001));         // just above: <= 2 us
  h.Record(microseconds(3));           // <= 4 us
  h.Record(microseconds(1 << 23));     // the last bound
  h.Record(std::chrono::seconds(60));  // past every bound
  const HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.counts[0], 2u);
  EXPECT_EQ(s.counts[1], 1u);
  EXPECT_EQ(s.counts[2], 1u);
  EXPECT_EQ(s.counts[kHistogramBuckets - 1], 1u);
  EXPECT_EQ(s.overflow, 1u);
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.sum_ns, 0u + 1000 + 1001 + 3000 + (uint64_t{1} << 23) * 1000 + 60'000'000'000ull);
}

TEST(PrometheusWriterTest, CountersGaugesAndLabelsKeepTheirFamilyTogether) {
  PrometheusWriter w;
  w.Visit("nvme.reads", 7);
  w.VisitGauge("tier.used_bytes{tier=\"host\"}", 10);
  w.Visit("tier.hits{tier=\"host\"}", 3);
  w.VisitGauge("tier.used_bytes{tier=\"nvme\"}", 20);  // the family seen earlier: written with it
  w.Visit("tier.hits{tier=\"nvme\"}", 4);
  w.Visit("odd-name.x/y", 1);
  const std::vector<std::string> expected = {
      "# HELP kvtier_nvme_reads_total kvtier registry name nvme.reads (docs/OPERATIONS.md)",
      "# TYPE kvtier_nvme_reads_total counter",
      "kvtier_nvme_reads_total 7",
      "# HELP kvtier_tier_used_bytes kvtier registry name tier.used_bytes (docs/OPERATIONS.md)",
      "# TYPE kvtier_tier_used_bytes gauge",
      "kvtier_tier_used_bytes{tier=\"host\"} 10",
      "kvtier_tier_used_bytes{tier=\"nvme\"} 20",
      "# HELP kvtier_tier_hits_total kvtier registry name tier.hits (docs/OPERATIONS.md)",
      "# TYPE kvtier_tier_hits_total counter",
      "kvtier_tier_hits_total{tier=\"host\"} 3",
      "kvtier_tier_hits_total{tier=\"nvme\"} 4",
      "# HELP kvtier_odd_name_x_y_total kvtier registry name odd-name.x/y (docs/OPERATIONS.md)",
      "# TYPE kvtier_odd_name_x_y_total counter",
      "kvtier_odd_name_x_y_total 1",
  };
  EXPECT_EQ(Lines(w.Text()), expected);
}

TEST(PrometheusWriterTest, ASampleTwiceOrAFamilyOfTwoTypesIsWrittenOnceAsFirstSeen) {
  PrometheusWriter w;
  w.Visit("a.b", 1);
  w.Visit("a.b", 2);        // the same sample again: dropped
  w.VisitGauge("a.b", 3);   // a gauge named like the counter family is another family (no _total)
  w.Visit("c.d_total", 5);  // already ends in _total: not doubled
  const std::string text = w.Text();
  EXPECT_NE(text.find("kvtier_a_b_total 1\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("kvtier_a_b_total 2"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE kvtier_a_b gauge\nkvtier_a_b 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvtier_c_d_total 5\n"), std::string::npos) << text;
  PrometheusWriter mixed;
  mixed.VisitGauge("x.y", 1);
  mixed.VisitHistogram("x.y", HistogramSnapshot{});  // same family name, another type: dropped
  EXPECT_EQ(Lines(mixed.Text()).size(), 3u) << mixed.Text();
}

TEST(PrometheusWriterTest, HistogramsAreCumulativeBucketsInSecondsThenSumAndCount) {
  LatencyHistogram h;
  h.Record(microseconds(1));
  h.Record(microseconds(3));
  h.Record(microseconds(3));
  h.Record(std::chrono::seconds(100));
  PrometheusWriter w;
  w.VisitHistogram("tier.read_seconds{tier=\"nvme\"}", h.Snapshot());
  const auto lines = Lines(w.Text());
  ASSERT_EQ(lines.size(), 2 + kHistogramBuckets + 1 + 2);
  EXPECT_EQ(lines[1], "# TYPE kvtier_tier_read_seconds histogram");
  EXPECT_EQ(lines[2], "kvtier_tier_read_seconds_bucket{tier=\"nvme\",le=\"1e-06\"} 1");
  EXPECT_EQ(lines[3], "kvtier_tier_read_seconds_bucket{tier=\"nvme\",le=\"2e-06\"} 1");
  EXPECT_EQ(lines[4], "kvtier_tier_read_seconds_bucket{tier=\"nvme\",le=\"4e-06\"} 3");
  EXPECT_EQ(lines[2 + kHistogramBuckets - 1], "kvtier_tier_read_seconds_bucket{tier=\"nvme\",le=\"8.388608\"} 3");
  EXPECT_EQ(lines[2 + kHistogramBuckets], "kvtier_tier_read_seconds_bucket{tier=\"nvme\",le=\"+Inf\"} 4");
  EXPECT_EQ(lines[3 + kHistogramBuckets], "kvtier_tier_read_seconds_sum{tier=\"nvme\"} 100.000007");
  EXPECT_EQ(lines[4 + kHistogramBuckets], "kvtier_tier_read_seconds_count{tier=\"nvme\"} 4");
  // Without labels the le label stands alone.
  PrometheusWriter plain;
  plain.VisitHistogram("x.seconds", h.Snapshot());
  EXPECT_NE(plain.Text().find("kvtier_x_seconds_bucket{le=\"1e-06\"} 1\n"), std::string::npos);
}

TEST(CounterVisitorTest, NumberOnlyVisitorsGetHistogramsAsCountAndSum) {
  LatencyHistogram h;
  h.Record(microseconds(5));
  h.Record(microseconds(7));
  CounterCollector c;
  c.VisitGauge("g", 2);
  c.VisitHistogram("tier.read_seconds{tier=\"nvme\"}", h.Snapshot());
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"g", 2}, {"tier.read_seconds_count{tier=\"nvme\"}", 2}, {"tier.read_seconds_sum_us{tier=\"nvme\"}", 12}};
  EXPECT_EQ(c.counters(), expected);
}

}  // namespace
}  // namespace kvtier
