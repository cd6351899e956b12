#include "daemon/config/config.h"

#include <charconv>
#include <cstdio>
#include <sstream>
#include <toml++/toml.h>

#include "daemon/config/option_field.h"
#include "daemon/config/regular_file.h"
#include "daemon/config/tenant_config.h"

namespace kvtier {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;
constexpr int64_t kTiB = 1024 * kGiB;

std::string Where(std::string_view origin, const toml::node& node) {
  std::ostringstream out;
  out << origin;
  if (node.source().begin) out << ":" << node.source().begin.line;
  return out.str();
}

bool IsChoice(std::string_view choices, std::string_view value) {
  while (!choices.empty()) {
    size_t bar = choices.find('|');
    if (choices.substr(0, bar) == value) return true;
    if (bar == std::string_view::npos) break;
    choices.remove_prefix(bar + 1);
  }
  return false;
}

// `node` as an OptionValue; monostate for arrays, tables, dates and times.
OptionValue ValueOf(const toml::node& node) {
  if (node.is_boolean()) return node.as_boolean()->get();
  if (node.is_integer()) return static_cast<int64_t>(node.as_integer()->get());
  if (node.is_floating_point()) return node.as_floating_point()->get();
  if (node.is_string()) return node.as_string()->get();
  return std::monostate();
}

// Checks one TOML value with its row's parser and stores it.
Status ApplyOption(const OptionSpec& spec, const toml::node& node, std::string_view origin, DaemonConfig& config) {
  Status s = spec.field.parse(spec, ValueOf(node), config);
  if (s.ok()) return s;
  return InvalidArgument(Where(origin, node) + ": " + std::string(spec.name) + s.message());
}

}  // namespace

namespace config_internal {

namespace {

// " = <value as TOML>" for an error message ("" for an array or a table).
std::string Given(const OptionValue& value) {
  if (const auto* b = std::get_if<bool>(&value)) return *b ? " = true" : " = false";
  if (const auto* i = std::get_if<int64_t>(&value)) return " = " + std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) return " = " + RealToml(*d);
  if (const auto* text = std::get_if<std::string>(&value)) return " = " + TomlQuoted(*text);
  return "";
}

std::string Range(const OptionSpec& spec) {
  return " in [" + std::to_string(spec.min) + ", " + std::to_string(spec.max) + "]" +
         (spec.zero_is_auto ? " or 0 (auto)" : "");
}

}  // namespace

Result<int64_t> ParseIntValue(const OptionSpec& spec, const OptionValue& value) {
  int64_t number = 0;
  if (const auto* i = std::get_if<int64_t>(&value)) {
    number = *i;
  } else if (const auto* text = std::get_if<std::string>(&value); text != nullptr && spec.type == OptionType::kBytes) {
    auto parsed = ParseBytes(*text);
    if (!parsed.ok()) return InvalidArgument(": " + parsed.status().message());
    number = *parsed;
  } else if (spec.type == OptionType::kBytes) {
    return InvalidArgument(Given(value) + " must be a size like \"64MiB\" or an integer" + Range(spec));
  } else {
    return InvalidArgument(Given(value) + " must be an integer" + Range(spec));
  }
  if ((number < spec.min || number > spec.max) && !(spec.zero_is_auto && number == 0)) {
    return InvalidArgument(" = " + std::to_string(number) + " is outside [" + std::to_string(spec.min) + ", " +
                           std::to_string(spec.max) + "]");
  }
  return number;
}

Result<bool> ParseBoolValue(const OptionSpec& spec, const OptionValue& value) {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  return InvalidArgument(Given(value) + " must be true or false");
}

Result<double> ParseRealValue(const OptionSpec& spec, const OptionValue& value) {
  double real = 0;
  if (const auto* d = std::get_if<double>(&value)) {
    real = *d;
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    real = static_cast<double>(*i);
  } else {
    std::ostringstream out;
    out << Given(value) << " must be a number in [" << spec.real_min << ", " << spec.real_max << "]";
    return InvalidArgument(out.str());
  }
  if (!(real >= spec.real_min && real <= spec.real_max)) {
    std::ostringstream out;
    out << " = " << real << " is outside [" << spec.real_min << ", " << spec.real_max << "]";
    return InvalidArgument(out.str());
  }
  return real;
}

Result<std::string> ParseStringValue(const OptionSpec& spec, const OptionValue& value) {
  const auto* text = std::get_if<std::string>(&value);
  if (text == nullptr) {
    return InvalidArgument(Given(value) + " must be a string" +
                           (spec.type == OptionType::kChoice ? ", one of " + std::string(spec.choices) : ""));
  }
  if (spec.type == OptionType::kChoice && !IsChoice(spec.choices, *text)) {
    return InvalidArgument(" = \"" + *text + "\" is not one of " + std::string(spec.choices));
  }
  if (spec.type == OptionType::kString && text->empty() && !spec.may_be_empty) {
    return InvalidArgument(" must not be empty");
  }
  return *text;
}

std::string RealToml(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  std::string out = buffer;
  if (out.find_first_of(".eEn") == std::string::npos) out += ".0";  // a TOML float
  return out;
}

}  // namespace config_internal

namespace {

const OptionSpec* FindOption(std::string_view name) {
  for (const auto& spec : ConfigOptions()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

// Applies every key of `table` (two levels: section.key); unknown keys fail.
Status ApplyTable(const toml::table& table, std::string_view origin, DaemonConfig& config) {
  for (const auto& [section, section_node] : table) {
    if (section.str() == "tenant") {
      Status s = ApplyTenants(section_node, origin, config.tenants);
      if (!s.ok()) return s;
      continue;
    }
    const auto* section_table = section_node.as_table();
    if (section_table == nullptr) {
      return InvalidArgument(Where(origin, section_node) + ": unknown option '" + std::string(section.str()) +
                             "' (options live in sections, e.g. [host])");
    }
    for (const auto& [key, node] : *section_table) {
      std::string name = std::string(section.str()) + "." + std::string(key.str());
      const OptionSpec* spec = FindOption(name);
      if (spec == nullptr) {
        return InvalidArgument(Where(origin, node) + ": unknown option '" + name + "'");
      }
      Status s = ApplyOption(*spec, node, origin, config);
      if (!s.ok()) return s;
    }
  }
  return Status::Ok();
}

Result<toml::table> ParseToml(std::string_view text, std::string_view origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream out;
    out << origin << ":" << e.source().begin.line << ": " << e.description();
    return InvalidArgument(out.str());
  }
}

}  // namespace

std::string DefaultConfigToml() {
  std::string out = "# kvtierd embedded defaults (kvtierd --print-default-config)\n";
  std::string_view current_section;
  for (const auto& spec : ConfigOptions()) {
    size_t dot = spec.name.find('.');
    std::string_view section = spec.name.substr(0, dot);
    if (section != current_section) {
      out += "\n[" + std::string(section) + "]\n";
      current_section = section;
    }
    out += "# " + std::string(spec.doc) + "\n";
    out += std::string(spec.name.substr(dot + 1)) + " = " + std::string(spec.default_value) + "\n";
  }
  return out;
}

std::string TomlQuoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(byte));
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string ConfigToml(const DaemonConfig& config) {
  std::string out;
  std::string_view current_section;
  for (const auto& spec : ConfigOptions()) {
    const size_t dot = spec.name.find('.');
    const std::string_view section = spec.name.substr(0, dot);
    if (section != current_section) {
      out += (out.empty() ? "[" : "\n[") + std::string(section) + "]\n";
      current_section = section;
    }
    out += std::string(spec.name.substr(dot + 1)) + " = " + spec.field.toml(spec, config) + "\n";
  }
  return out + TenantsToml(config.tenants);
}

std::string TenantConfigToml(DaemonConfig config, std::string_view tenant) {
  std::erase_if(config.tenants, [tenant](const TenantConfig& t) { return t.name != tenant; });
  config.tenant_key_file.clear();
  config.remote_password_file.clear();
  config.metrics_bearer_token_file.clear();
  return "# the running configuration as tenant " + std::string(tenant) +
         " sees it: its own [[tenant]] table only; the secret files' paths are the operator's\n" + ConfigToml(config);
}

Result<DaemonConfig> ParseConfig(std::string_view toml_text, std::string_view origin) {
  DaemonConfig config;
  auto defaults = ParseToml(DefaultConfigToml(), "<embedded defaults>");
  if (!defaults.ok()) return defaults.status();
  Status s = ApplyTable(*defaults, "<embedded defaults>", config);
  if (!s.ok()) return s;
  auto user = ParseToml(toml_text, origin);
  if (!user.ok()) return user.status();
  s = ApplyTable(*user, origin, config);
  if (!s.ok()) return s;
  if (auto mode = ParseFileMode(config.socket_mode); !mode.ok()) {
    return InvalidArgument(std::string(origin) + ": server.socket_mode: " + mode.status().message());
  }
  return config;
}

Result<DaemonConfig> LoadConfigFile(const std::string& path) {
  auto text = ReadRegularFile(path, kMaxConfigFileBytes, "config file");
  if (!text.ok()) return text.status();
  return ParseConfig(*text, path);
}

Result<int64_t> ParseBytes(std::string_view text) {
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || value < 0) return InvalidArgument("'" + std::string(text) + "' is not a size");
  std::string_view unit(ptr, text.data() + text.size() - ptr);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  struct Unit {
    std::string_view name;
    int64_t factor;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"B", 1},
                                    {"KiB", kKiB},
                                    {"MiB", kMiB},
                                    {"GiB", kGiB},
                                    {"TiB", kTiB},
                                    {"KB", 1000},
                                    {"MB", 1000 * 1000},
                                    {"GB", 1000LL * 1000 * 1000},
                                    {"TB", 1000LL * 1000 * 1000 * 1000}};
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      if (value > INT64_MAX / u.factor) return InvalidArgument("'" + std::string(text) + "' is too large");
      return value * u.factor;
    }
  }
  return InvalidArgument("'" + std::string(text) + "' has an unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
}

Result<uint32_t> ParseFileMode(std::string_view text) {
  std::string_view digits = text;
  if (digits.starts_with("0o")) digits.remove_prefix(2);
  uint32_t mode = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), mode, 8);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() || mode > 0777) {
    return InvalidArgument("'" + std::string(text) + "' is not an octal file mode like \"0660\"");
  }
  return mode;
}

std::vector<const OptionSpec*> ChangedOptions(const DaemonConfig& a, const DaemonConfig& b) {
  std::vector<const OptionSpec*> changed;
  for (const auto& spec : ConfigOptions()) {
    const bool differs = !spec.field.same(a, b);
    if (differs) changed.push_back(&spec);
  }
  return changed;
}

std::string OptionsHelp() {
  std::ostringstream out;
  out << "Configuration options (TOML, --config FILE; defaults embedded):\n";
  for (const auto& spec : ConfigOptions()) {
    out << "  " << spec.name << " = " << spec.default_value;
    if (spec.type == OptionType::kChoice) out << "  (" << spec.choices << ")";
    if (spec.type == OptionType::kInt || spec.type == OptionType::kBytes) {
      out << "  [" << spec.min << ".." << spec.max << "]" << (spec.zero_is_auto ? " or 0 (auto)" : "");
    }
    if (spec.type == OptionType::kReal) out << "  [" << spec.real_min << ".." << spec.real_max << "]";
    if (spec.runtime_changeable) out << "  (run-time)";
    out << "\n      " << spec.doc << "\n";
  }
  return out.str();
}

}  // namespace kvtier
