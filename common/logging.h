// Logging goes through spdlog's default logger; this header keeps the
// include in one place so components do not depend on its configuration.
//
// Two formats: text (spdlog's default pattern) and json, one object per
// line: {"time":"2026-01-31T12:00:00.123456Z","level":"info",
// "thread":1234,"message":"..."} (plus "logger" when the logger has a
// name). Strings are escaped for JSON: quotes, backslashes and control
// characters, and every byte that is not part of valid UTF-8 becomes
// \ufffd, so every line parses whatever a message contains.
#pragma once

#include <chrono>
#include <cstdint>
#include <spdlog/spdlog.h>
#include <string>
#include <string_view>

namespace kvtier {

// The levels and formats kvtierd's log.level and log.format choose
// (daemon/config/option_choices.h names them).
enum class LogLevel : uint8_t { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };
enum class LogFormat : uint8_t { kText, kJson };

// Sets the default logger's level.
void SetLogLevel(LogLevel level);

// Sets the default logger's format. Thread-safe (spdlog's sinks lock), so
// it may change while other threads log.
void SetLogFormat(LogFormat format);

// Appends `text` to `out` as a JSON string (with its quotes), escaped as
// described above.
void AppendJsonString(std::string& out, std::string_view text);

// One json-format record (with its trailing newline), the same as the
// json format writes: for the lines written outside spdlog.
std::string JsonLogRecord(spdlog::level::level_enum level, std::string_view message,
                          std::chrono::system_clock::time_point time, size_t thread_id,
                          std::string_view logger_name = {});

}  // namespace kvtier
