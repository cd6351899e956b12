// The typed parsers of the option table: OptionFieldOf<&DaemonConfig::x>()
// is the OptionField of field x, chosen by the field's type (int64_t, bool,
// double, std::string, an enum of option_choices.h, EvictionPolicyId,
// AdmissionPolicyId). Private to
// daemon/config (config_options.cc builds kOptions with it).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "daemon/config/config.h"
#include "daemon/config/option_choices.h"
#include "policy/policy_registry.h"

namespace kvtier::config_internal {

// Per-type checks, shared by every field of that type. Each returns
// InvalidArgument with the text that follows "<where>: <name>".
Result<int64_t> ParseIntValue(const OptionSpec& spec, const OptionValue& value);
Result<bool> ParseBoolValue(const OptionSpec& spec, const OptionValue& value);
Result<double> ParseRealValue(const OptionSpec& spec, const OptionValue& value);
// kString and kChoice rows: a string, not empty unless may_be_empty, one
// of `choices` for kChoice.
Result<std::string> ParseStringValue(const OptionSpec& spec, const OptionValue& value);
std::string RealToml(double value);

// A default written as TOML text at compile time, from a named constant
// (policy/option_defaults.h).
struct DefaultText {
  char text[32] = {};
  size_t size = 0;
};

// `value` (>= 0) in decimal; for a size, in the largest binary unit that
// divides it, quoted ("64MiB"); 0 stays 0.
constexpr DefaultText FormatDefault(int64_t value, bool bytes) {
  struct Unit {
    const char* name;
    int64_t factor;
  };
  constexpr Unit kUnits[] = {
      {"TiB", int64_t{1} << 40}, {"GiB", int64_t{1} << 30}, {"MiB", int64_t{1} << 20}, {"KiB", int64_t{1} << 10}};
  const char* unit = "";
  if (bytes && value != 0) {
    for (const Unit& u : kUnits) {
      if (value % u.factor == 0) {
        value /= u.factor;
        unit = u.name;
        break;
      }
    }
  }
  DefaultText out;
  const bool quoted = unit[0] != '\0';
  if (quoted) out.text[out.size++] = '"';
  char digits[24] = {};
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  while (n > 0) out.text[out.size++] = digits[--n];
  for (const char* c = unit; *c != '\0'; ++c) out.text[out.size++] = *c;
  if (quoted) out.text[out.size++] = '"';
  return out;
}

template <int64_t kValue, bool kBytes>
inline constexpr DefaultText kDefaultText = FormatDefault(kValue, kBytes);

// The default text of a kInt row / a kBytes row / a kBool row.
template <int64_t kValue>
constexpr std::string_view DefaultInt() {
  static_assert(kValue >= 0);
  return {kDefaultText<kValue, false>.text, kDefaultText<kValue, false>.size};
}
template <int64_t kValue>
constexpr std::string_view DefaultBytes() {
  static_assert(kValue >= 0);
  return {kDefaultText<kValue, true>.text, kDefaultText<kValue, true>.size};
}
constexpr std::string_view DefaultBool(bool value) { return value ? "true" : "false"; }

// `value` (>= 0, at most 6 decimals) as a TOML float: "1.0", "0.25".
constexpr DefaultText FormatRealDefault(double value) {
  DefaultText out = FormatDefault(static_cast<int64_t>(value), false);
  out.text[out.size++] = '.';
  int64_t micros = static_cast<int64_t>((value - static_cast<double>(static_cast<int64_t>(value))) * 1e6 + 0.5);
  char digits[6] = {'0', '0', '0', '0', '0', '0'};
  for (int i = 5; i >= 0; --i) {
    digits[i] = static_cast<char>('0' + micros % 10);
    micros /= 10;
  }
  int last = 0;
  for (int i = 0; i < 6; ++i) {
    if (digits[i] != '0') last = i;
  }
  for (int i = 0; i <= last; ++i) out.text[out.size++] = digits[i];
  return out;
}

template <const double* kValue>
inline constexpr DefaultText kRealDefaultText = FormatRealDefault(*kValue);

// The default text of a kReal row, from a named constant.
template <const double* kValue>
constexpr std::string_view DefaultReal() {
  return {kRealDefaultText<kValue>.text, kRealDefaultText<kValue>.size};
}

template <typename T>
struct MemberType;
template <typename T>
struct MemberType<T DaemonConfig::*> {
  using type = T;
};

// The value of one field, checked by its row and converted to the field's type.
template <typename T>
Result<T> ParseTyped(const OptionSpec& spec, const OptionValue& value) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return ParseIntValue(spec, value);
  } else if constexpr (std::is_same_v<T, bool>) {
    return ParseBoolValue(spec, value);
  } else if constexpr (std::is_same_v<T, double>) {
    return ParseRealValue(spec, value);
  } else {
    auto text = ParseStringValue(spec, value);
    if (!text.ok()) return text.status();
    if constexpr (std::is_same_v<T, std::string>) {
      return std::move(text).value();
    } else if constexpr (ChoiceEnum<T>) {
      const std::optional<T> choice = FindChoice<T>(*text);  // in spec.choices: never fails
      if (!choice) return InvalidArgument(" = \"" + *text + "\" is not one of " + std::string(kChoiceNames<T>));
      return *choice;
    } else if constexpr (std::is_same_v<T, EvictionPolicyId>) {
      auto id = ParseEvictionPolicy(*text);  // in spec.choices: never fails
      if (!id.ok()) return InvalidArgument(": " + id.status().message());
      return *id;
    } else {
      static_assert(std::is_same_v<T, AdmissionPolicyId>, "a DaemonConfig field type with no parser");
      auto id = ParseAdmissionPolicy(*text, kAdmissionForNvme | kAdmissionForRemote);
      if (!id.ok()) return InvalidArgument(": " + id.status().message());
      return *id;
    }
  }
}

template <typename T>
std::string TomlOf(const OptionSpec& spec, const T& v) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return std::to_string(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    return RealToml(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return TomlQuoted(v);
  } else if constexpr (ChoiceEnum<T>) {
    return TomlQuoted(ChoiceName(v));
  } else if constexpr (std::is_same_v<T, EvictionPolicyId>) {
    return TomlQuoted(EvictionPolicyName(v));
  } else {
    return TomlQuoted(AdmissionPolicyName(v));
  }
}

template <auto kField>
constexpr OptionField OptionFieldOf() {
  using T = typename MemberType<decltype(kField)>::type;
  OptionField f;
  f.parse = [](const OptionSpec& spec, const OptionValue& value, DaemonConfig& config) -> Status {
    auto typed = ParseTyped<T>(spec, value);
    if (!typed.ok()) return typed.status();
    config.*kField = std::move(typed).value();
    return Status::Ok();
  };
  f.toml = [](const OptionSpec& spec, const DaemonConfig& config) { return TomlOf<T>(spec, config.*kField); };
  f.same = [](const DaemonConfig& a, const DaemonConfig& b) { return a.*kField == b.*kField; };
  f.copy = [](const DaemonConfig& from, DaemonConfig& to) { to.*kField = from.*kField; };
  return f;
}

}  // namespace kvtier::config_internal
