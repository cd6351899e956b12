#include "common/logging.h"

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <memory>
#include <spdlog/formatter.h>
#include <spdlog/pattern_formatter.h>

#include "common/utf8.h"

namespace kvtier {
namespace {

void AppendIsoTime(std::string& out, std::chrono::system_clock::time_point time) {
  const auto since_epoch = time.time_since_epoch();
  const auto seconds = std::chrono::floor<std::chrono::seconds>(since_epoch);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(since_epoch - seconds).count();
  const std::time_t t = static_cast<std::time_t>(seconds.count());
  std::tm utc{};
  ::gmtime_r(&t, &utc);
  char buffer[40];
  const size_t n = std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%S", &utc);
  out.append(buffer, n);
  std::snprintf(buffer, sizeof(buffer), ".%06lldZ", static_cast<long long>(micros));
  out += buffer;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string line =
        JsonLogRecord(msg.level, std::string_view(msg.payload.data(), msg.payload.size()), msg.time, msg.thread_id,
                      std::string_view(msg.logger_name.data(), msg.logger_name.size()));
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

void SetLogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::set_level(spdlog::level::trace);
    case LogLevel::kDebug:
      return spdlog::set_level(spdlog::level::debug);
    case LogLevel::kInfo:
      return spdlog::set_level(spdlog::level::info);
    case LogLevel::kWarn:
      return spdlog::set_level(spdlog::level::warn);
    case LogLevel::kError:
      return spdlog::set_level(spdlog::level::err);
    case LogLevel::kCritical:
      return spdlog::set_level(spdlog::level::critical);
    case LogLevel::kOff:
      return spdlog::set_level(spdlog::level::off);
  }
}

void SetLogFormat(LogFormat format) {
  switch (format) {
    case LogFormat::kText:
      return spdlog::set_formatter(std::make_unique<spdlog::pattern_formatter>());  // spdlog's default pattern
    case LogFormat::kJson:
      return spdlog::set_formatter(std::make_unique<JsonFormatter>());
  }
}

void AppendJsonString(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  while (!text.empty()) {
    const size_t length = Utf8CharBytes(text);
    if (length == 0) {
      out += "\\ufffd";  // not UTF-8: the replacement character
      text.remove_prefix(1);
      continue;
    }
    const char c = text[0];
    if (length > 1) {
      out.append(text.data(), length);
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<uint8_t>(c) < 0x20 || c == 0x7f) {
      out += "\\u00";
      out += kHex[static_cast<uint8_t>(c) >> 4];
      out += kHex[static_cast<uint8_t>(c) & 0xf];
    } else {
      out += c;
    }
    text.remove_prefix(length);
  }
  out += '"';
}

std::string JsonLogRecord(spdlog::level::level_enum level, std::string_view message,
                          std::chrono::system_clock::time_point time, size_t thread_id, std::string_view logger_name) {
  std::string out;
  out.reserve(96 + message.size());
  out += "{\"time\":\"";
  AppendIsoTime(out, time);
  out += "\",\"level\":";
  const auto level_name = spdlog::level::to_string_view(level);
  AppendJsonString(out, std::string_view(level_name.data(), level_name.size()));
  out += ",\"thread\":";
  out += std::to_string(thread_id);
  if (!logger_name.empty()) {
    out += ",\"logger\":";
    AppendJsonString(out, logger_name);
  }
  out += ",\"message\":";
  AppendJsonString(out, message);
  out += "}\n";
  return out;
}

}  // namespace kvtier
