// The choice options that are not policies (those come from
// policy/policy_registry.h): each is an enum with one table of its names
// as written in TOML. The option table (config_options.cc) lists a row's
// choices from the table, its parser (option_field.h) turns the name into
// the enum once, and everything after reads the enum. Constants and pure
// functions: callable from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "common/check.h"
#include "common/logging.h"
#include "policy/policy_registry.h"

namespace kvtier {

// host.lock_memory: whether the arena is mlocked (HostArenaOptions::LockMode).
enum class LockMemory : uint8_t { kRequired, kBestEffort, kOff };
// hbm.enabled: run the HBM tier when it can (kAuto), or fail start-up when it cannot (kOn), or never.
enum class HbmEnabled : uint8_t { kAuto, kOn, kOff };
// nvme.io_engine: the NVMe tier's I/O (IoEngine, tiers/nvme/block_device.h).
enum class NvmeIoEngine : uint8_t { kAuto, kIoUring, kThreads };
// events.format: vLLM's KVEventBatch as msgpack maps (its current form) or arrays (its earlier array_like form).
enum class EventsFormat : uint8_t { kMap, kArray };
// log.level is a LogLevel and log.format a LogFormat (common/logging.h).

// One name of a choice option's enum.
template <typename T>
struct OptionChoice {
  T value;
  std::string_view name;  // as written in TOML (and, for log.format, on kvtierd's command line)
};

inline constexpr OptionChoice<LockMemory> kLockMemoryChoices[] = {
    {LockMemory::kRequired, "required"}, {LockMemory::kBestEffort, "best_effort"}, {LockMemory::kOff, "off"}};
inline constexpr OptionChoice<HbmEnabled> kHbmEnabledChoices[] = {
    {HbmEnabled::kAuto, "auto"}, {HbmEnabled::kOn, "on"}, {HbmEnabled::kOff, "off"}};
inline constexpr OptionChoice<NvmeIoEngine> kNvmeIoEngineChoices[] = {
    {NvmeIoEngine::kAuto, "auto"}, {NvmeIoEngine::kIoUring, "io_uring"}, {NvmeIoEngine::kThreads, "threads"}};
inline constexpr OptionChoice<EventsFormat> kEventsFormatChoices[] = {{EventsFormat::kMap, "map"},
                                                                      {EventsFormat::kArray, "array"}};
inline constexpr OptionChoice<LogLevel> kLogLevelChoices[] = {
    {LogLevel::kTrace, "trace"}, {LogLevel::kDebug, "debug"}, {LogLevel::kInfo, "info"},
    {LogLevel::kWarn, "warn"},   {LogLevel::kError, "error"}, {LogLevel::kCritical, "critical"},
    {LogLevel::kOff, "off"}};
inline constexpr OptionChoice<LogFormat> kLogFormatChoices[] = {{LogFormat::kText, "text"}, {LogFormat::kJson, "json"}};

// The table of T's names (a choice option's field type has one).
template <typename T>
struct ChoiceTable;
template <>
struct ChoiceTable<LockMemory> {
  static constexpr const auto& rows = kLockMemoryChoices;
};
template <>
struct ChoiceTable<HbmEnabled> {
  static constexpr const auto& rows = kHbmEnabledChoices;
};
template <>
struct ChoiceTable<NvmeIoEngine> {
  static constexpr const auto& rows = kNvmeIoEngineChoices;
};
template <>
struct ChoiceTable<EventsFormat> {
  static constexpr const auto& rows = kEventsFormatChoices;
};
template <>
struct ChoiceTable<LogLevel> {
  static constexpr const auto& rows = kLogLevelChoices;
};
template <>
struct ChoiceTable<LogFormat> {
  static constexpr const auto& rows = kLogFormatChoices;
};

template <typename T>
concept ChoiceEnum = requires {
  ChoiceTable<T>::rows;
};

// "a|b|c": T's names, in table order (a row's OptionSpec::choices).
template <ChoiceEnum T>
inline constexpr std::string_view kChoiceNames(registry_internal::kJoined<ChoiceTable<T>::rows>.data(),
                                               registry_internal::kJoined<ChoiceTable<T>::rows>.size());

// The value named `name`; nullopt for a name not in T's table.
template <ChoiceEnum T>
constexpr std::optional<T> FindChoice(std::string_view name) {
  for (const auto& row : ChoiceTable<T>::rows) {
    if (row.name == name) return row.value;
  }
  return std::nullopt;
}

// The name of `value` (every value of T has one).
template <ChoiceEnum T>
constexpr std::string_view ChoiceName(T value) {
  for (const auto& row : ChoiceTable<T>::rows) {
    if (row.value == value) return row.name;
  }
  KVTIER_CHECK(false, "a value outside its choice table");
  return "";
}

}  // namespace kvtier
