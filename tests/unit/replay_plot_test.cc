// kvtier replay --plot (tools/replay/replay_plot.h): compact capacity labels, the
// title without directories, the ceiling policy dashed, and a layout where
// the legends, the charts and the rotated run labels do not overlap.
#include "tools/replay/replay_plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

namespace kvtier::tools {
namespace {

ReplayResult MakeRun(const std::string& policy, uint64_t host_tokens, double token_hit_rate, bool nvme = false) {
  ReplayResult r;
  r.options.policy = policy;
  r.options.host.amount = host_tokens;
  if (nvme) r.options.nvme = Capacity{Capacity::Unit::kTokens, 4 * host_tokens, false};
  r.requests = 10;
  r.tokens = 1000;
  r.hit_tokens = uint64_t(token_hit_rate * 1000);
  r.blocks = 100;
  r.hit_blocks = uint64_t(token_hit_rate * 100);
  r.tiers[kHostTier].hits = r.hit_blocks / 2;
  r.tiers[kNvmeTier].hits = r.hit_blocks - r.hit_blocks / 2;
  return r;
}

std::vector<ReplayResult> Sweep(const std::vector<std::string>& policies, bool nvme = false) {
  std::vector<ReplayResult> runs;
  for (const std::string& p : policies) {
    double rate = p == kCeilingPolicy ? 0.5 : 0.2;
    for (uint64_t cap : {1'000'000ull, 3'000'000ull, 10'000'000ull, 50'000'000ull}) {
      runs.push_back(MakeRun(p, cap, rate, nvme));
      rate += 0.05;
    }
  }
  return runs;
}

// The value of attribute `name` of every element of `svg` whose opening tag
// contains `marker`.
std::vector<double> Attribute(const std::string& svg, const std::string& marker, const std::string& name) {
  std::vector<double> out;
  const std::regex tag("<[^>]*" + marker + "[^>]*>");
  const std::regex attr(" " + name + "=\"([-0-9.e+]+)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it) {
    std::smatch m;
    const std::string t = it->str();
    if (std::regex_search(t, m, attr)) out.push_back(std::stod(m[1]));
  }
  return out;
}

// The tag of the polyline drawn for `policy`.
std::string PolylineOf(const std::string& svg, const std::string& policy) {
  std::smatch m;
  const std::regex line("<polyline[^>]*data-policy=\"" + policy + "\"[^>]*>");
  return std::regex_search(svg, m, line) ? m.str() : "";
}

TEST(ReplayPlotTest, CapacitiesAreCompact) {
  EXPECT_EQ(CompactNumber(1'000'000), "1M");
  EXPECT_EQ(CompactNumber(2'500), "2.5k");
  EXPECT_EQ(CompactNumber(1'953), "1.95k");
  EXPECT_EQ(CompactNumber(999), "999");
  EXPECT_EQ(CompactNumber(999'999), "1M");  // rounds up into the next unit, not "1e+03k"
  EXPECT_EQ(CompactNumber(50'000'000), "50M");
  EXPECT_EQ(CompactNumber(0), "0");
  EXPECT_EQ(CompactBytes(64.0 * (1ull << 30)), "64 GiB");
  EXPECT_EQ(CompactBytes(1e6 * 131072), "122 GiB");
  EXPECT_EQ(CompactBytes(8000.0 * 131072), "1000 MiB");
  EXPECT_EQ(CompactBytes(512), "512 B");
  EXPECT_EQ(CapacityLabel(Capacity{Capacity::Unit::kTokens, 1'000'000, false}), "1M tok");
  EXPECT_EQ(CapacityLabel(Capacity{Capacity::Unit::kBlocks, 2'500, false}), "2.5k blk");
  EXPECT_EQ(CapacityLabel(Capacity{Capacity::Unit::kTokens, 0, true}), "inf");

  std::vector<ReplayResult> runs = Sweep({"lru"});
  for (auto& r : runs) r.options.bytes_per_token = 131072;
  const std::string svg = PlotSvg(runs, "t");
  EXPECT_EQ(svg.find("1000000tok"), std::string::npos);
  EXPECT_NE(svg.find(">1M tok</text>"), std::string::npos);
  EXPECT_NE(svg.find(">lru 10M tok</text>"), std::string::npos);
  EXPECT_NE(svg.find(">122 GiB</text>"), std::string::npos) << "bytes under the token label";
}

TEST(ReplayPlotTest, TheTitleNamesTheFileNotItsPath) {
  EXPECT_EQ(TitleWithoutDirectories("kvtier replay: ../traces/mooncake/conversation_trace.jsonl"),
            "kvtier replay: conversation_trace.jsonl");
  EXPECT_EQ(TitleWithoutDirectories("kvtier replay: /tmp/a.jsonl,tests/data/replay/b.jsonl"),
            "kvtier replay: a.jsonl, b.jsonl");
  EXPECT_EQ(TitleWithoutDirectories("kvtier replay: plain.jsonl"), "kvtier replay: plain.jsonl");
  const std::string svg = PlotSvg(Sweep({"lru"}), "kvtier replay: ../traces/x/conversation_trace.jsonl");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex("<text class=\"title\"[^>]*>([^<]*)</text>")));
  EXPECT_EQ(m[1].str(), "kvtier replay: conversation_trace.jsonl");
  EXPECT_EQ(svg.find("../"), std::string::npos);
}

TEST(ReplayPlotTest, BeladyIsTheDashedCeilingAndTheOthersAreSolid) {
  const std::string with = PlotSvg(Sweep({"lru", "belady", "fifo"}), "t");
  const std::string ceiling = PolylineOf(with, "belady");
  ASSERT_FALSE(ceiling.empty());
  EXPECT_NE(ceiling.find("stroke-dasharray"), std::string::npos) << ceiling;
  EXPECT_NE(ceiling.find("class=\"policy ceiling\""), std::string::npos) << ceiling;
  for (const char* p : {"lru", "fifo"}) {
    const std::string solid = PolylineOf(with, p);
    ASSERT_FALSE(solid.empty()) << p;
    EXPECT_EQ(solid.find("stroke-dasharray"), std::string::npos) << solid;
  }
  EXPECT_NE(with.find("belady: offline optimum (ceiling)</text>"), std::string::npos);
  // The legend's mark for the ceiling is a dashed line too.
  EXPECT_NE(with.find("<line class=\"legend-mark\""), std::string::npos);
  // Adding the ceiling recolours no other policy.
  const std::string without = PlotSvg(Sweep({"lru", "fifo"}), "t");
  const std::regex stroke(" stroke=\"(#[0-9a-f]+)\"");
  for (const char* p : {"lru", "fifo"}) {
    std::smatch a, b;
    const std::string line_with = PolylineOf(with, p), line_without = PolylineOf(without, p);
    ASSERT_TRUE(std::regex_search(line_with, a, stroke));
    ASSERT_TRUE(std::regex_search(line_without, b, stroke));
    EXPECT_EQ(a[1].str(), b[1].str()) << p;
  }
}

// Legends above both charts, run labels below them, all inside the
// picture, for few and for many runs (slanted and vertical labels).
TEST(ReplayPlotTest, LegendsChartsAndRunLabelsDoNotOverlap) {
  const std::vector<std::vector<ReplayResult>> cases = {
      {MakeRun("lru", 1'000'000, 0.3, true)},
      Sweep({"lru", "fifo", "queue_aware", "belady"}, true),
      Sweep({"lru", "fifo", "lru2", "s3fifo", "arc", "queue_aware", "belady"}, true),
  };
  for (const auto& runs : cases) {
    const PlotLayout l = LayoutPlot(runs);
    const std::string svg = PlotSvg(runs, "t");
    SCOPED_TRACE(std::to_string(runs.size()) + " runs");
    EXPECT_LE(l.legend_bottom, l.plot_top);
    EXPECT_LT(l.plot_bottom, l.run_labels_top);
    EXPECT_LE(l.run_labels_bottom, l.height);
    EXPECT_LE(l.capacity_labels_bottom, l.height);
    // Every legend mark and text lies in the legend band, above the charts.
    for (const char* marker : {"class=\"legend-mark\"", "class=\"legend-text\""}) {
      for (const char* attr : {"y", "y1"}) {
        for (double y : Attribute(svg, marker, attr)) {
          EXPECT_GE(y, l.legend_top);
          EXPECT_LE(y, l.legend_bottom);
          EXPECT_LT(y + 12, l.plot_top) << marker;
        }
      }
    }
    // Every rotated run label, by a generous width estimate, hangs below
    // the chart and ends inside the picture.
    const auto xs = Attribute(svg, "class=\"run-label\"", "x");
    const auto ys = Attribute(svg, "class=\"run-label\"", "y");
    ASSERT_EQ(ys.size(), runs.size());
    ASSERT_EQ(xs.size(), runs.size());
    const double angle = l.run_label_angle_deg * 3.14159265358979 / 180;
    for (size_t i = 0; i < runs.size(); ++i) {
      EXPECT_GT(ys[i], l.plot_bottom);
      const std::string label = runs[i].options.policy + " " + CapacityLabel(runs[i].options.host);
      const double width = 0.62 * 9 * double(label.size());
      EXPECT_LE(ys[i] + width * std::sin(angle), l.run_labels_bottom) << label;
      EXPECT_GT(xs[i] - width * std::cos(angle), 460.0) << label << ": clear of the left chart";
    }
    EXPECT_NE(svg.find("height=\"" + std::to_string(int(l.height))), std::string::npos);
  }
  // Many runs: labels turn vertical, and the picture grows to hold them.
  EXPECT_EQ(LayoutPlot(cases[1]).run_label_angle_deg, 40);
  EXPECT_EQ(LayoutPlot(cases[2]).run_label_angle_deg, 90);
  EXPECT_GT(LayoutPlot(cases[2]).height, LayoutPlot(cases[0]).height);
}

TEST(ReplayPlotTest, EachRunShowsTheShareOfTheGapItCloses) {
  std::vector<ReplayResult> runs = Sweep({"lru", "queue_aware", "belady"});
  SetGapClosed(runs);        // lru 0.2 .. 0.35, queue_aware the same, belady 0.5 .. 0.65
  runs[4].hit_tokens = 350;  // queue_aware at 1M tokens: 0.35, half of LRU's 0.2 to Belady's 0.5
  SetGapClosed(runs);
  const std::string svg = PlotSvg(runs, "t");
  EXPECT_NE(svg.find("queue_aware (gap closed 0.00 to 0.50)"), std::string::npos);
  EXPECT_NE(svg.find("queue_aware at 1M tok: 0.3500, gap closed 0.500"), std::string::npos);
  EXPECT_EQ(svg.find("lru (gap closed"), std::string::npos) << "LRU is the gap's floor";
  EXPECT_EQ(svg.find("gap closed 1.0"), std::string::npos) << "nor does Belady name it";
  runs[5].hit_tokens = 249;  // queue_aware at 3M tokens: a hair under LRU's 0.25
  SetGapClosed(runs);
  const std::string near_zero = PlotSvg(runs, "t");
  EXPECT_NE(near_zero.find("queue_aware (gap closed 0.00 to 0.50)"), std::string::npos) << "never -0.00";
  EXPECT_NE(near_zero.find("queue_aware at 3M tok: 0.2490, gap closed -0.003"), std::string::npos);
  runs[5].tokens = 1'000'000;
  runs[5].hit_tokens = 249'999;  // a millionth under LRU's 0.25
  SetGapClosed(runs);
  EXPECT_NE(PlotSvg(runs, "t").find("queue_aware at 3M tok: 0.2500, gap closed 0.000<"), std::string::npos)
      << "a tooltip never reads -0.000";
}

TEST(ReplayPlotTest, TheRateAxisEndsJustAboveTheBestRun) {
  const std::vector<ReplayResult> runs = Sweep({"lru", "arc"});  // rates 0.2 to 0.35
  const PlotLayout l = LayoutPlot(runs);
  EXPECT_DOUBLE_EQ(l.rate_top, 0.5);
  const std::string svg = PlotSvg(runs, "t");
  // The point at 0.35 sits at 0.7 of the height; the top tick reads 0.5.
  const std::vector<double> cy = Attribute(svg, "circle", "cy");
  ASSERT_FALSE(cy.empty());
  EXPECT_NEAR(*std::min_element(cy.begin(), cy.end()), l.plot_bottom - 0.7 * (l.plot_bottom - l.plot_top), 0.01);
  EXPECT_NE(svg.find(">0.5</text>"), std::string::npos);
  EXPECT_EQ(LayoutPlot(Sweep({"lru", "belady"})).rate_top, 1.0) << "belady reaches 0.65";
  EXPECT_EQ(LayoutPlot({MakeRun("lru", 1000, 0.04)}).rate_top, 0.05);
}

}  // namespace
}  // namespace kvtier::tools
