// `kvtier replay --plot OUT.svg`: one self-contained SVG (no scripts, no
// external fonts or files; any browser shows it) with two charts:
// - token hit rate against host capacity, one line per policy (x on a log
//   scale when the capacities span more than 10x; `inf` at the right end).
//   A policy named "belady" (the offline optimum) is the ceiling: a dashed
//   line, labelled so; every other policy is a solid line. The share of
//   the LRU-to-Belady gap each run closes is in its point's tooltip, and
//   its range over the policy's runs in the legend;
// - per run, a stacked bar of where the hits came from (host, NVMe,
//   remote shares of the hit blocks).
// Top to bottom: the title, the legends (policies over the left chart,
// tiers over the right one), the charts, the capacity labels; the height
// grows with the longest run label so nothing overlaps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/replay/replay_sim.h"

namespace kvtier::tools {

// `title` goes on top; any directory part of a path in it is dropped
// (TitleWithoutDirectories), so the plot names the trace's file, not where
// it was read from. Runs in any order.
std::string PlotSvg(const std::vector<ReplayResult>& runs, const std::string& title);

// Where PlotSvg puts things, in SVG units (y grows downward).
struct PlotLayout {
  double width = 0, height = 0;
  double legend_top = 0, legend_bottom = 0;  // both legends' rows
  double plot_top = 0, plot_bottom = 0;      // both charts' plot areas
  // The hit rate at the left chart's top: the smallest of 0.05, 0.1, 0.25,
  // 0.5 and 1 at or above every run's, so close curves stay apart.
  double rate_top = 1;
  double capacity_labels_bottom = 0;                 // the left chart's x labels and axis title
  double run_labels_top = 0, run_labels_bottom = 0;  // the right chart's rotated run labels
  double run_label_angle_deg = 0;                    // their rotation, counter-clockwise: 40 or 90 degrees
};
PlotLayout LayoutPlot(const std::vector<ReplayResult>& runs);

// Compact labels: 3 significant digits and a unit.
// CompactNumber: 1000000 -> "1M", 2500 -> "2.5k", 1953 -> "1.95k", 64 -> "64".
// CompactBytes (binary units): 68719476736 -> "64 GiB", 131072000000 -> "122 GiB",
//   1048576000 -> "1000 MiB".
// CapacityLabel: "1M tok", "2.5k blk", "inf".
std::string CompactNumber(double v);
std::string CompactBytes(double bytes);
std::string CapacityLabel(const Capacity& c);

// Each word of `title` (split at spaces and commas) that holds a '/' keeps
// only what follows its last '/': "replay: ../t/a.jsonl,b/c.jsonl" ->
// "replay: a.jsonl, c.jsonl".
std::string TitleWithoutDirectories(const std::string& title);

// The policy name drawn as the ceiling (dashed).
inline constexpr const char* kCeilingPolicy = "belady";

}  // namespace kvtier::tools
