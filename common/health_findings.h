// HealthFindings: what the daemon's parts find wrong with themselves, as
// lines for an operator (`kvtier health`, /healthz; the client sees them
// in its HealthReport). A problem is something failing now (the daemon is
// not healthy while it lasts); a warning is worth a look before it
// becomes one. Each part adds its own lines (BlockTier::CheckHealth,
// Engine::CheckHealth); whoever asked formats them. Not thread-safe: one
// caller fills it.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kvtier {

struct HealthFindings {
  std::vector<std::string> problems;
  std::vector<std::string> warnings;

  void AddProblem(std::string line) { problems.push_back(std::move(line)); }
  void AddWarning(std::string line) { warnings.push_back(std::move(line)); }
};

}  // namespace kvtier
