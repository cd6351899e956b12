#include "policy/share_guard.h"

#include <algorithm>

namespace kvtier {

ShareSplit SplitByShare(std::vector<ShareCandidate> candidates, const std::unordered_map<uint32_t, uint64_t>& held) {
  std::sort(candidates.begin(), candidates.end(),
            [](const ShareCandidate& a, const ShareCandidate& b) { return a.offset < b.offset; });
  std::unordered_map<uint32_t, uint64_t> left;  // each owner's bytes once the candidates let go are gone
  for (const auto& [owner, bytes] : held) left[owner] = bytes;
  ShareSplit split;
  for (ShareCandidate& c : candidates) {
    if (c.owner.owner == 0) {
      split.may_go.push_back(std::move(c));
      continue;
    }
    uint64_t& owner_left = left[c.owner.owner];
    if (owner_left > c.owner.share_bytes) {
      owner_left -= std::min(owner_left, c.bytes);
      split.may_go.push_back(std::move(c));
    } else {
      split.protected_.push_back(std::move(c));
    }
  }
  return split;
}

}  // namespace kvtier
