#include "support/redis_cluster_nodes.h"

#include <charconv>
#include <sstream>

namespace kvtier::support::redis_cluster_internal {

std::string LastLines(const std::string& text, int lines) {
  size_t start = text.size() - (text.ends_with('\n') ? 1 : 0);
  for (int n = 0; n < lines && start != std::string::npos && start > 0; ++n) start = text.rfind('\n', start - 1);
  return start == std::string::npos ? text : text.substr(start == 0 ? 0 : start + 1);
}

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) {
    if (!part.empty() && part.back() == '\r') part.pop_back();
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

int64_t ToInt(std::string_view text, int64_t fallback) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() ? value : fallback;
}

NodeLine ParseNodeLine(const std::string& line) {
  const std::vector<std::string> fields = Split(line, ' ');
  NodeLine node;
  if (fields.size() < 8) return node;
  node.id = fields[0];
  const size_t colon = fields[1].rfind(':', fields[1].find('@'));
  if (colon != std::string::npos) {
    node.port = static_cast<int>(ToInt(fields[1].substr(colon + 1, fields[1].find('@') - colon - 1)));
  }
  for (const auto& flag : Split(fields[2], ',')) {
    node.myself |= flag == "myself";
    node.master |= flag == "master";
    node.failing |= flag == "fail" || flag == "fail?";
  }
  node.master_id = fields[3];
  node.config_epoch = ToInt(fields[6], 0);
  for (size_t i = 8; i < fields.size(); ++i) {
    if (fields[i].front() == '[') continue;
    const size_t dash = fields[i].find('-');
    const int first = static_cast<int>(ToInt(fields[i].substr(0, dash)));
    const int last = dash == std::string::npos ? first : static_cast<int>(ToInt(fields[i].substr(dash + 1)));
    node.slots.emplace_back(first, last);
  }
  return node;
}

std::string Canonical(const std::vector<NodeLine>& lines) {
  std::vector<std::string> rows;
  for (const auto& n : lines) {
    std::string row = n.id + (n.master ? " master" : " replica of " + n.master_id);
    for (const auto& [first, last] : n.slots) row += " " + std::to_string(first) + "-" + std::to_string(last);
    if (n.failing) row += " failing";
    rows.push_back(row);
  }
  std::sort(rows.begin(), rows.end());
  std::string text;
  for (const auto& row : rows) text += row + "\n";
  return text;
}

const NodeLine* Myself(const std::vector<NodeLine>& lines) {
  for (const auto& n : lines) {
    if (n.myself) return &n;
  }
  return nullptr;
}

}  // namespace kvtier::support::redis_cluster_internal
