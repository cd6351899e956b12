#include "common/logging.h"

namespace kvtier {

bool SetLogLevel(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") return false;
  spdlog::set_level(parsed);
  return true;
}

}  // namespace kvtier
