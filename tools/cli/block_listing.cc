#include "tools/cli/block_listing.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "common/logging.h"

namespace kvtier::tools {

void PrintBlocks(std::vector<HeldBlockInfo> blocks, bool json, std::FILE* out) {
  auto rank = [](const HeldBlockInfo& b) { return std::tie(b.tenant, b.tier, b.ns, b.key); };
  std::sort(blocks.begin(), blocks.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  blocks.erase(
      std::unique(blocks.begin(), blocks.end(), [&](const auto& a, const auto& b) { return rank(a) == rank(b); }),
      blocks.end());
  const bool tenants =
      std::any_of(blocks.begin(), blocks.end(), [](const HeldBlockInfo& b) { return !b.tenant.empty(); });
  if (json) {
    std::fputs("[", out);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const HeldBlockInfo& b = blocks[i];
      std::string line = i == 0 ? "\n" : ",\n";
      line += "{\"tier\":";
      AppendJsonString(line, TierName(b.tier));
      line += ",\"namespace\":\"" + b.ns.ToHex() + "\",\"key\":\"" + b.key.ToHex() + "\"";
      if (!b.tenant.empty()) {
        line += ",\"tenant\":";
        AppendJsonString(line, b.tenant);
      }
      line += "}";
      std::fputs(line.c_str(), out);
    }
    std::fputs(blocks.empty() ? "]\n" : "\n]\n", out);
    return;
  }
  if (tenants) std::fprintf(out, "%-16s  ", "TENANT");
  std::fprintf(out, "%-6s  %-32s  %s\n", "TIER", "NAMESPACE", "KEY");
  for (const HeldBlockInfo& b : blocks) {
    if (tenants) std::fprintf(out, "%-16s  ", b.tenant.empty() ? "-" : b.tenant.c_str());
    std::fprintf(out, "%-6s  %s  %s\n", std::string(TierName(b.tier)).c_str(), b.ns.ToHex().c_str(),
                 b.key.ToHex().c_str());
  }
}

}  // namespace kvtier::tools
