// `kvtier replay --plot OUT.svg`: one self-contained SVG (no scripts, no
// external fonts or files; any browser shows it) with two charts:
// - token hit rate against host capacity, one line per policy (x on a log
//   scale when the capacities span more than 10x; `inf` at the right end);
// - per run, a stacked bar of where the hits came from (host, NVMe,
//   remote shares of the hit blocks).
#pragma once

#include <string>
#include <vector>

#include "tools/replay_sim.h"

namespace kvtier::tools {

// `title` goes on top (the trace's name). Runs in any order.
std::string PlotSvg(const std::vector<ReplayResult>& runs, const std::string& title);

}  // namespace kvtier::tools
