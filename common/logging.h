// Logging goes through spdlog's default logger; this header keeps the
// include in one place so components do not depend on its configuration.
#pragma once

#include <spdlog/spdlog.h>

namespace kvtier {

// Sets the default logger's level from a name ("trace".."off"). Returns false
// for an unknown name and leaves the level unchanged.
bool SetLogLevel(std::string_view level);

}  // namespace kvtier
