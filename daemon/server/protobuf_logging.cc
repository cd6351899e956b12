#include "daemon/server/protobuf_logging.h"

#include <google/protobuf/stubs/logging.h>
#include <string>

#include "common/log_rate_limiter.h"
#include "common/logging.h"

namespace kvtier {
namespace {

// Protobuf takes a plain function pointer, so the limiter it uses is a
// static of this file: the one process-wide object here, because the
// handler it serves is process-wide.
LogRateLimiter& Limiter() {
  static LogRateLimiter limiter(5, std::chrono::seconds(10));
  return limiter;
}

void Handle(google::protobuf::LogLevel level, const char* filename, int line, const std::string& message) {
  if (level == google::protobuf::LOGLEVEL_FATAL) {  // protobuf aborts next: always say why
    spdlog::critical("protobuf: {}", message);
    return;
  }
  uint64_t suppressed = 0;
  if (!Limiter().Allow(suppressed)) return;
  const auto spd_level = level == google::protobuf::LOGLEVEL_INFO ? spdlog::level::debug : spdlog::level::warn;
  if (suppressed > 0) {
    spdlog::log(spd_level, "protobuf: {} ({} similar lines suppressed)", message, suppressed);
  } else {
    spdlog::log(spd_level, "protobuf: {}", message);
  }
}

}  // namespace

void RouteProtobufLogging() { google::protobuf::SetLogHandler(&Handle); }

}  // namespace kvtier
