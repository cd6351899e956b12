#include "tools/replay/replay_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

namespace kvtier::tools {
namespace {

constexpr double kWidth = 960;
constexpr double kPlotX = 70, kPlotW = 380;   // left chart
constexpr double kBarsX = 540, kBarsW = 390;  // right chart
constexpr double kPlotH = 300;
constexpr double kTitleY = 24;
constexpr double kLegendY = 40, kLegendRow = 18;  // first legend row's top; row height
constexpr double kLegendFont = 12, kTickFont = 10, kBytesFont = 9, kRunLabelFont = 9;
constexpr double kPi = 3.14159265358979323846;
const char* const kPolicyColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                     "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
const char* const kCeilingColor = "#333333";
const char* const kCeilingDash = "7 4";
const char* const kTierColors[] = {"#4c9be8", "#f2a541", "#8c8c8c"};

std::string Fixed(double v, int digits = 1) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

// A generous estimate of a sans-serif text's width (ASCII): wide enough
// that layouts built on it do not overlap in common fonts.
double TextWidth(const std::string& text, double font_px) { return 0.62 * font_px * double(text.size()); }

bool IsCeiling(const std::string& policy) { return policy == kCeilingPolicy; }

// Policies in order of first appearance.
std::vector<std::string> Policies(const std::vector<ReplayResult>& runs) {
  std::vector<std::string> out;
  for (const ReplayResult& r : runs) {
    if (std::find(out.begin(), out.end(), r.options.policy) == out.end()) out.push_back(r.options.policy);
  }
  return out;
}

struct Style {
  std::string color;
  bool dashed = false;
};

// The ceiling is dark and dashed; the others take the palette in order, so
// adding a ceiling run does not recolour them.
std::map<std::string, Style> PolicyStyles(const std::vector<std::string>& policies) {
  std::map<std::string, Style> out;
  size_t next = 0;
  for (const std::string& p : policies) {
    out[p] = IsCeiling(p) ? Style{kCeilingColor, true} : Style{kPolicyColors[next++ % std::size(kPolicyColors)], false};
  }
  return out;
}

struct LegendItem {
  std::string label;
  Style style;
  bool swatch = true;  // false: a plain text item (a heading)
};

// A gap closed with `digits` decimals, never "-0.00".
std::string GapText(double v, int digits) {
  const std::string t = Fixed(v, digits);
  return t.find_first_not_of("-0.") == std::string::npos ? Fixed(0, digits) : t;
}

// " (gap closed A to B)": the range of `policy`'s runs' shares of the
// LRU-to-Belady gap ("" when none has one: no LRU or Belady run to
// compare, or the policy is LRU).
std::string GapClosedRange(const std::vector<ReplayResult>& runs, const std::string& policy) {
  std::optional<double> low, high;
  for (const ReplayResult& r : runs) {
    if (r.options.policy != policy || !r.gap_closed || policy == "lru") continue;
    low = std::min(low.value_or(*r.gap_closed), *r.gap_closed);
    high = std::max(high.value_or(*r.gap_closed), *r.gap_closed);
  }
  if (!low) return "";
  auto text = [](double v) { return GapText(v, 2); };
  if (text(*low) == text(*high)) return " (gap closed " + text(*low) + ")";
  return " (gap closed " + text(*low) + " to " + text(*high) + ")";
}

std::vector<LegendItem> PolicyLegend(const std::vector<ReplayResult>& runs) {
  const auto policies = Policies(runs);
  const auto styles = PolicyStyles(policies);
  std::vector<LegendItem> items;
  for (const std::string& p : policies) {
    items.push_back({IsCeiling(p) ? p + ": offline optimum (ceiling)" : p + GapClosedRange(runs, p), styles.at(p)});
  }
  return items;
}

// Tiers that some run has: host always, NVMe and remote when configured.
std::vector<LegendItem> TierLegend(const std::vector<ReplayResult>& runs) {
  bool present[kSimTiers] = {true, false, false};
  for (const ReplayResult& r : runs) {
    present[kNvmeTier] = present[kNvmeTier] || r.options.nvme.has_value();
    present[kRemoteTier] = present[kRemoteTier] || r.options.remote.has_value();
  }
  std::vector<LegendItem> items = {{"share of hits by tier:", {}, false}};
  for (int t = 0; t < kSimTiers; ++t) {
    if (present[t]) items.push_back({std::string(SimTierName(t)), {kTierColors[t], false}});
  }
  return items;
}

double ItemWidth(const LegendItem& item) {
  const double mark = !item.swatch ? 0 : item.style.dashed ? 24 + 5 : 12 + 5;
  return mark + TextWidth(item.label, kLegendFont) + 14;
}

// Items flowed left to right within `width`, wrapping to new rows: each
// item's x offset and row.
std::vector<std::pair<double, int>> Flow(const std::vector<LegendItem>& items, double width) {
  std::vector<std::pair<double, int>> out;
  double x = 0;
  int row = 0;
  for (const LegendItem& item : items) {
    const double w = ItemWidth(item);
    if (x > 0 && x + w > width) {
      x = 0;
      ++row;
    }
    out.emplace_back(x, row);
    x += w;
  }
  return out;
}

int Rows(const std::vector<LegendItem>& items, double width) {
  const auto placed = Flow(items, width);
  return placed.empty() ? 0 : placed.back().second + 1;
}

std::string RunLabel(const ReplayResult& r) { return r.options.policy + " " + CapacityLabel(r.options.host); }

bool AnyBytes(const std::vector<ReplayResult>& runs) {
  for (const ReplayResult& r : runs) {
    if (r.options.bytes_per_token > 0 && !r.options.host.infinite && r.options.host.unit == Capacity::Unit::kTokens) {
      return true;
    }
  }
  return false;
}

void DrawLegend(std::ostringstream& svg, const std::vector<LegendItem>& items, double left, double width,
                const char* group_class) {
  const auto placed = Flow(items, width);
  svg << "<g class=\"" << group_class << "\">\n";
  for (size_t i = 0; i < items.size(); ++i) {
    const LegendItem& item = items[i];
    const double x = left + placed[i].first;
    const double top = kLegendY + kLegendRow * placed[i].second;
    double text_x = x;
    if (item.swatch && item.style.dashed) {
      svg << "<line class=\"legend-mark\" x1=\"" << x << "\" y1=\"" << top + 6 << "\" x2=\"" << x + 24 << "\" y2=\""
          << top + 6 << "\" stroke=\"" << item.style.color << "\" stroke-width=\"2\" stroke-dasharray=\""
          << kCeilingDash << "\"/>";
      text_x = x + 29;
    } else if (item.swatch) {
      svg << "<rect class=\"legend-mark\" x=\"" << x << "\" y=\"" << top << "\" width=\"12\" height=\"12\" fill=\""
          << item.style.color << "\"/>";
      text_x = x + 17;
    }
    svg << "<text class=\"legend-text\" x=\"" << text_x << "\" y=\"" << top + 10.5 << "\">" << Escape(item.label)
        << "</text>\n";
  }
  svg << "</g>\n";
}

}  // namespace

std::string CompactNumber(double v) {
  static const char* const kSuffix[] = {"", "k", "M", "G", "T", "P", "E"};
  size_t s = 0;
  while (std::fabs(v) >= 999.5 && s + 1 < std::size(kSuffix)) {
    v /= 1000;
    ++s;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g%s", v, kSuffix[s]);
  return buf;
}

std::string CompactBytes(double bytes) {
  static const char* const kUnit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t s = 0;
  while (std::fabs(bytes) >= 1023.5 && s + 1 < std::size(kUnit)) {
    bytes /= 1024;
    ++s;
  }
  // 3 significant digits; 1000 to 1023 whole (not "0.977 GiB").
  char buf[48];
  std::snprintf(buf, sizeof buf, std::fabs(bytes) >= 999.5 ? "%.0f %s" : "%.3g %s", bytes, kUnit[s]);
  return buf;
}

std::string CapacityLabel(const Capacity& c) {
  if (c.infinite) return "inf";
  return CompactNumber(double(c.amount)) + (c.unit == Capacity::Unit::kTokens ? " tok" : " blk");
}

std::string TitleWithoutDirectories(const std::string& title) {
  std::string out;
  size_t i = 0;
  while (i < title.size()) {
    if (title[i] == ' ' || title[i] == ',') {
      out += title[i];
      if (title[i] == ',' && i + 1 < title.size() && title[i + 1] != ' ') out += ' ';
      ++i;
      continue;
    }
    const size_t end = title.find_first_of(" ,", i);
    std::string word = title.substr(i, end == std::string::npos ? std::string::npos : end - i);
    const size_t slash = word.find_last_of('/');
    if (slash != std::string::npos && slash + 1 < word.size()) word = word.substr(slash + 1);
    out += word;
    i = end == std::string::npos ? title.size() : end;
  }
  return out;
}

PlotLayout LayoutPlot(const std::vector<ReplayResult>& runs) {
  PlotLayout l;
  l.width = kWidth;
  l.legend_top = kLegendY;
  const int rows = std::max(Rows(PolicyLegend(runs), kPlotW), Rows(TierLegend(runs), kBarsW));
  l.legend_bottom = kLegendY + kLegendRow * rows;
  l.plot_top = l.legend_bottom + 14;
  l.plot_bottom = l.plot_top + kPlotH;
  double best = 0;
  for (const ReplayResult& r : runs) best = std::max(best, r.token_hit_rate());
  for (double top : {0.05, 0.1, 0.25, 0.5, 1.0}) {  // the tightest whose fifths are round numbers
    l.rate_top = top;
    if (best <= top) break;
  }
  // Left: capacity labels (and their bytes), then the axis title.
  l.capacity_labels_bottom = l.plot_bottom + (AnyBytes(runs) ? 30 : 18) + 22;
  // Right: run labels hang from the axis, rotated; vertical when the bars
  // are too close for slanted labels to clear each other.
  const double step = runs.empty() ? kBarsW : kBarsW / double(runs.size());
  l.run_label_angle_deg = step * std::sin(40 * kPi / 180) >= kRunLabelFont + 3 ? 40 : 90;
  double longest = 0;
  for (const ReplayResult& r : runs) longest = std::max(longest, TextWidth(RunLabel(r), kRunLabelFont));
  const double a = l.run_label_angle_deg * kPi / 180;
  l.run_labels_top = l.plot_bottom + 4;
  l.run_labels_bottom = l.plot_bottom + 12 + longest * std::sin(a) + kRunLabelFont * std::cos(a);
  l.height = std::ceil(std::max(l.capacity_labels_bottom, l.run_labels_bottom) + 12);
  return l;
}

namespace {

// The left chart's x axis: host capacity, on a log scale when it spans 10x
// or more; `inf` at twice the largest finite capacity.
class CapacityScale {
 public:
  explicit CapacityScale(const std::vector<ReplayResult>& runs) {
    for (const ReplayResult& r : runs) {
      if (!r.options.host.infinite) largest_ = std::max(largest_, double(r.options.host.amount));
    }
    smallest_ = largest_;
    for (const ReplayResult& r : runs) {
      smallest_ = std::min(smallest_, std::max(1.0, Value(r.options.host)));
      x_max_ = std::max(x_max_, Value(r.options.host));
    }
  }
  bool log() const { return x_max_ / smallest_ >= 10; }
  double Value(const Capacity& c) const { return c.infinite ? largest_ * 2 : double(c.amount); }
  double X(const Capacity& c) const {
    if (x_max_ <= smallest_) return kPlotX + kPlotW / 2;
    const double v = Value(c);
    const double f =
        log() ? std::log(v / smallest_) / std::log(x_max_ / smallest_) : (v - smallest_) / (x_max_ - smallest_);
    return kPlotX + f * kPlotW;
  }

 private:
  double largest_ = 1, smallest_ = 1, x_max_ = 1;
};

double RateY(double rate, const PlotLayout& l) { return l.plot_bottom - rate / l.rate_top * kPlotH; }

// The left chart's grid, axes, axis titles and capacity labels (bytes
// under tokens when bytes per token is known), left to right, skipping a
// label that would touch the one before.
void DrawHitRateAxes(std::ostringstream& svg, const std::vector<ReplayResult>& runs, const PlotLayout& l,
                     const CapacityScale& scale) {
  svg << "<g stroke=\"#999\" stroke-width=\"1\">\n";
  for (int i = 0; i <= 5; ++i) {
    const double rate = l.rate_top * i / 5.0;
    svg << "<line x1=\"" << kPlotX << "\" y1=\"" << RateY(rate, l) << "\" x2=\"" << kPlotX + kPlotW << "\" y2=\""
        << RateY(rate, l) << "\" stroke=\"#eee\"/>\n";
  }
  svg << "<line x1=\"" << kPlotX << "\" y1=\"" << l.plot_bottom << "\" x2=\"" << kPlotX + kPlotW << "\" y2=\""
      << l.plot_bottom << "\"/>\n<line x1=\"" << kPlotX << "\" y1=\"" << l.plot_top << "\" x2=\"" << kPlotX
      << "\" y2=\"" << l.plot_bottom << "\"/>\n</g>\n";
  for (int i = 0; i <= 5; ++i) {
    const double rate = l.rate_top * i / 5.0;
    svg << "<text class=\"rate-tick\" x=\"" << kPlotX - 6 << "\" y=\"" << RateY(rate, l) + 4
        << "\" text-anchor=\"end\">" << Fixed(rate, l.rate_top < 0.5 ? 2 : 1) << "</text>\n";
  }
  const double mid_y = (l.plot_top + l.plot_bottom) / 2;
  svg << "<text x=\"" << kPlotX + kPlotW / 2 << "\" y=\"" << l.capacity_labels_bottom - 4
      << "\" text-anchor=\"middle\">host capacity" << (scale.log() ? " (log scale)" : "") << "</text>\n"
      << "<text x=\"20\" y=\"" << mid_y << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 " << mid_y
      << ")\">token hit rate</text>\n";
  std::map<double, const ReplayResult*> ticks;
  for (const ReplayResult& r : runs) ticks.emplace(scale.X(r.options.host), &r);
  double last_right = -1e9;
  for (const auto& [x, r] : ticks) {
    const Capacity& c = r->options.host;
    const std::string label = CapacityLabel(c);
    const bool bytes = r->options.bytes_per_token > 0 && !c.infinite && c.unit == Capacity::Unit::kTokens;
    const std::string bytes_label = bytes ? CompactBytes(double(c.amount) * double(r->options.bytes_per_token)) : "";
    const double half = std::max(TextWidth(label, kTickFont), TextWidth(bytes_label, kBytesFont)) / 2;
    if (x - half < last_right + 4) continue;
    last_right = x + half;
    svg << "<text class=\"capacity\" x=\"" << x << "\" y=\"" << l.plot_bottom + 15
        << "\" text-anchor=\"middle\" font-size=\"" << kTickFont << "\">" << Escape(label) << "</text>\n";
    if (bytes) {
      svg << "<text class=\"capacity-bytes\" x=\"" << x << "\" y=\"" << l.plot_bottom + 27
          << "\" text-anchor=\"middle\" font-size=\"" << kBytesFont << "\" fill=\"#666\">" << Escape(bytes_label)
          << "</text>\n";
    }
  }
}

// Left chart: token hit rate against host capacity, one line per policy,
// points in capacity order; the ceiling dashed.
void DrawHitRates(std::ostringstream& svg, const std::vector<ReplayResult>& runs, const PlotLayout& l) {
  const CapacityScale scale(runs);
  DrawHitRateAxes(svg, runs, l, scale);
  const auto policies = Policies(runs);
  const auto styles = PolicyStyles(policies);
  for (const std::string& policy : policies) {
    std::vector<const ReplayResult*> points;
    for (const ReplayResult& r : runs) {
      if (r.options.policy == policy) points.push_back(&r);
    }
    std::stable_sort(points.begin(), points.end(), [&](const ReplayResult* a, const ReplayResult* b) {
      return scale.Value(a->options.host) < scale.Value(b->options.host);
    });
    const Style& style = styles.at(policy);
    svg << "<polyline class=\"policy" << (style.dashed ? " ceiling" : "") << "\" data-policy=\"" << Escape(policy)
        << "\" fill=\"none\" stroke=\"" << style.color << "\" stroke-width=\"2\"";
    if (style.dashed) svg << " stroke-dasharray=\"" << kCeilingDash << "\"";
    svg << " points=\"";
    for (const ReplayResult* r : points) svg << scale.X(r->options.host) << "," << RateY(r->token_hit_rate(), l) << " ";
    svg << "\"/>\n";
    for (const ReplayResult* r : points) {
      svg << "<circle cx=\"" << scale.X(r->options.host) << "\" cy=\"" << RateY(r->token_hit_rate(), l)
          << "\" r=\"3.5\" fill=\"" << style.color << "\"><title>" << Escape(policy) << " at "
          << CapacityLabel(r->options.host) << ": " << Fixed(r->token_hit_rate(), 4);
      if (r->gap_closed && policy != "lru" && !IsCeiling(policy)) svg << ", gap closed " << GapText(*r->gap_closed, 3);
      svg << "</title></circle>\n";
    }
  }
}

// Right chart: where the hits came from, one stacked bar per run.
void DrawTierBars(std::ostringstream& svg, const std::vector<ReplayResult>& runs, const PlotLayout& l) {
  const double bar_w = runs.empty() ? 0 : std::min(40.0, kBarsW / double(runs.size()) * 0.7);
  const double step = runs.empty() ? 0 : kBarsW / double(runs.size());
  svg << "<line x1=\"" << kBarsX << "\" y1=\"" << l.plot_bottom << "\" x2=\"" << kBarsX + kBarsW << "\" y2=\""
      << l.plot_bottom << "\" stroke=\"#999\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = l.plot_bottom - i / 4.0 * kPlotH;
    svg << "<line x1=\"" << kBarsX - 4 << "\" y1=\"" << y << "\" x2=\"" << kBarsX << "\" y2=\"" << y
        << "\" stroke=\"#999\"/><text x=\"" << kBarsX - 7 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << 25 * i
        << "%</text>\n";
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const ReplayResult& r = runs[i];
    const double x = kBarsX + step * (double(i) + 0.5) - bar_w / 2;
    double bottom = l.plot_bottom;
    for (int t = 0; t < kSimTiers; ++t) {
      const double h = r.hit_share(t) * kPlotH;
      if (h <= 0) continue;
      bottom -= h;
      svg << "<rect class=\"share\" x=\"" << x << "\" y=\"" << bottom << "\" width=\"" << bar_w << "\" height=\"" << h
          << "\" fill=\"" << kTierColors[t] << "\"><title>" << Escape(r.options.policy) << " at "
          << CapacityLabel(r.options.host) << ": " << SimTierName(t) << " " << Fixed(100 * r.hit_share(t))
          << "%</title></rect>\n";
    }
    const double cx = x + bar_w / 2, cy = l.plot_bottom + 12;
    svg << "<text class=\"run-label\" x=\"" << cx << "\" y=\"" << cy << "\" text-anchor=\"end\" font-size=\""
        << kRunLabelFont << "\" transform=\"rotate(-" << l.run_label_angle_deg << " " << cx << " " << cy << ")\">"
        << Escape(RunLabel(r)) << "</text>\n";
  }
}

}  // namespace

std::string PlotSvg(const std::vector<ReplayResult>& runs, const std::string& title) {
  const PlotLayout l = LayoutPlot(runs);
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << l.width << "\" height=\"" << l.height
      << "\" viewBox=\"0 0 " << l.width << " " << l.height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text class=\"title\" x=\"" << l.width / 2 << "\" y=\"" << kTitleY
      << "\" text-anchor=\"middle\" font-size=\"15\">" << Escape(TitleWithoutDirectories(title)) << "</text>\n";
  DrawLegend(svg, PolicyLegend(runs), kPlotX, kPlotW, "legend policies");
  DrawLegend(svg, TierLegend(runs), kBarsX, kBarsW, "legend tiers");
  DrawHitRates(svg, runs, l);
  DrawTierBars(svg, runs, l);
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace kvtier::tools
