#include "tools/replay_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

namespace kvtier::tools {
namespace {

constexpr double kWidth = 960, kHeight = 420;
constexpr double kPlotX = 70, kPlotY = 50, kPlotW = 380, kPlotH = 300;  // left chart
constexpr double kBarsX = 540, kBarsW = 390;                           // right chart
const char* const kPolicyColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
const char* const kTierColors[] = {"#4c9be8", "#f2a541", "#8c8c8c"};

std::string Fixed(double v, int digits = 1) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// A capacity as an x value: its amount; infinite ones after the largest.
double CapacityValue(const Capacity& c, double largest) { return c.infinite ? largest * 2 : double(c.amount); }

}  // namespace

std::string PlotSvg(const std::vector<ReplayResult>& runs, const std::string& title) {
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kWidth / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << Escape(title)
      << "</text>\n";
  // Left: hit rate vs host capacity.
  double largest = 1;
  for (const ReplayResult& r : runs) {
    if (!r.options.host.infinite) largest = std::max(largest, double(r.options.host.amount));
  }
  double smallest = largest, x_max = 1;
  for (const ReplayResult& r : runs) {
    smallest = std::min(smallest, std::max(1.0, CapacityValue(r.options.host, largest)));
    x_max = std::max(x_max, CapacityValue(r.options.host, largest));
  }
  const bool log_x = x_max / smallest >= 10;
  auto x_of = [&](double v) {
    if (x_max <= smallest) return kPlotX + kPlotW / 2;
    const double f = log_x ? std::log(v / smallest) / std::log(x_max / smallest) : (v - smallest) / (x_max - smallest);
    return kPlotX + f * kPlotW;
  };
  auto y_of = [&](double rate) { return kPlotY + kPlotH - rate * kPlotH; };
  svg << "<g stroke=\"#999\" stroke-width=\"1\">\n";
  for (int i = 0; i <= 5; ++i) {
    const double y = y_of(i / 5.0);
    svg << "<line x1=\"" << kPlotX << "\" y1=\"" << y << "\" x2=\"" << kPlotX + kPlotW << "\" y2=\"" << y
        << "\" stroke=\"#eee\"/>\n";
  }
  svg << "<line x1=\"" << kPlotX << "\" y1=\"" << kPlotY + kPlotH << "\" x2=\"" << kPlotX + kPlotW << "\" y2=\""
      << kPlotY + kPlotH << "\"/>\n<line x1=\"" << kPlotX << "\" y1=\"" << kPlotY << "\" x2=\"" << kPlotX << "\" y2=\""
      << kPlotY + kPlotH << "\"/>\n</g>\n";
  for (int i = 0; i <= 5; ++i) {
    svg << "<text x=\"" << kPlotX - 6 << "\" y=\"" << y_of(i / 5.0) + 4 << "\" text-anchor=\"end\">" << Fixed(i / 5.0)
        << "</text>\n";
  }
  svg << "<text x=\"" << kPlotX + kPlotW / 2 << "\" y=\"" << kPlotY + kPlotH + 40
      << "\" text-anchor=\"middle\">host capacity" << (log_x ? " (log scale)" : "") << "</text>\n"
      << "<text x=\"20\" y=\"" << kPlotY + kPlotH / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
      << kPlotY + kPlotH / 2 << ")\">token hit rate</text>\n";
  // One line per policy, points in capacity order.
  std::map<std::string, std::vector<const ReplayResult*>> by_policy;
  std::vector<std::string> policies;
  for (const ReplayResult& r : runs) {
    if (by_policy.count(r.options.policy) == 0) policies.push_back(r.options.policy);
    by_policy[r.options.policy].push_back(&r);
  }
  std::map<std::string, bool> labelled;
  for (size_t p = 0; p < policies.size(); ++p) {
    auto& points = by_policy[policies[p]];
    std::sort(points.begin(), points.end(), [&](const ReplayResult* a, const ReplayResult* b) {
      return CapacityValue(a->options.host, largest) < CapacityValue(b->options.host, largest);
    });
    const char* color = kPolicyColors[p % std::size(kPolicyColors)];
    svg << "<polyline class=\"policy\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (const ReplayResult* r : points) {
      svg << x_of(CapacityValue(r->options.host, largest)) << "," << y_of(r->token_hit_rate()) << " ";
    }
    svg << "\"/>\n";
    for (const ReplayResult* r : points) {
      const double x = x_of(CapacityValue(r->options.host, largest));
      svg << "<circle cx=\"" << x << "\" cy=\"" << y_of(r->token_hit_rate()) << "\" r=\"3.5\" fill=\"" << color
          << "\"><title>" << Escape(policies[p]) << " at " << CapacityText(r->options.host) << ": "
          << Fixed(r->token_hit_rate(), 4) << "</title></circle>\n";
      const std::string label = CapacityText(r->options.host);
      if (!labelled[label]) {
        labelled[label] = true;
        svg << "<text x=\"" << x << "\" y=\"" << kPlotY + kPlotH + 16 << "\" text-anchor=\"middle\" font-size=\"10\">"
            << Escape(label) << "</text>\n";
      }
    }
    svg << "<rect x=\"" << kPlotX + 10 << "\" y=\"" << kPlotY + 8 + 18 * p << "\" width=\"12\" height=\"12\" fill=\""
        << color << "\"/><text x=\"" << kPlotX + 28 << "\" y=\"" << kPlotY + 18 + 18 * p << "\">"
        << Escape(policies[p]) << "</text>\n";
  }
  // Right: where the hits came from, one stacked bar per run.
  const double bar_w = runs.empty() ? 0 : std::min(40.0, kBarsW / double(runs.size()) * 0.7);
  const double step = runs.empty() ? 0 : kBarsW / double(runs.size());
  svg << "<text x=\"" << kBarsX + kBarsW / 2 << "\" y=\"" << kPlotY - 8
      << "\" text-anchor=\"middle\">share of hits by tier</text>\n";
  svg << "<line x1=\"" << kBarsX << "\" y1=\"" << kPlotY + kPlotH << "\" x2=\"" << kBarsX + kBarsW << "\" y2=\""
      << kPlotY + kPlotH << "\" stroke=\"#999\"/>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const ReplayResult& r = runs[i];
    const double x = kBarsX + step * (double(i) + 0.5) - bar_w / 2;
    double bottom = kPlotY + kPlotH;
    for (int t = 0; t < kSimTiers; ++t) {
      const double h = r.hit_share(t) * kPlotH;
      if (h <= 0) continue;
      bottom -= h;
      svg << "<rect class=\"share\" x=\"" << x << "\" y=\"" << bottom << "\" width=\"" << bar_w << "\" height=\"" << h
          << "\" fill=\"" << kTierColors[t] << "\"><title>" << Escape(r.options.policy) << " at "
          << CapacityText(r.options.host) << ": " << SimTierName(t) << " " << Fixed(100 * r.hit_share(t))
          << "%</title></rect>\n";
    }
    svg << "<text x=\"" << x + bar_w / 2 << "\" y=\"" << kPlotY + kPlotH + 14 << "\" text-anchor=\"end\" font-size=\"9\""
        << " transform=\"rotate(-40 " << x + bar_w / 2 << " " << kPlotY + kPlotH + 14 << ")\">"
        << Escape(r.options.policy + " " + CapacityText(r.options.host)) << "</text>\n";
  }
  for (int t = 0; t < kSimTiers; ++t) {
    svg << "<rect x=\"" << kBarsX + 120 * t << "\" y=\"" << kHeight - 22 << "\" width=\"12\" height=\"12\" fill=\""
        << kTierColors[t] << "\"/><text x=\"" << kBarsX + 120 * t + 18 << "\" y=\"" << kHeight - 12 << "\">"
        << SimTierName(t) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace kvtier::tools
