// Tests of the typed option rows (daemon/config/option_field.h): every row
// has a parser of its field's type, bools take only true and false, the
// policy options take the registry's names (policy/policy_registry.h) and
// hold its ids, and each row copies and compares its own field.
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "daemon/config/config.h"
#include "policy/policy_registry.h"
#include "tests/testing/config_checks.h"

namespace kvtier {
namespace {

using ::kvtier::testing::ExpectInvalidConfig;

// The row of option `name`; null if there is none.
const OptionSpec* FindSpec(std::string_view name) {
  for (const OptionSpec& spec : ConfigOptions()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

// "[section]\nkey = ": a TOML document setting `option`, less its value.
std::string Head(std::string_view option) {
  const size_t dot = option.find('.');
  return "[" + std::string(option.substr(0, dot)) + "]\n" + std::string(option.substr(dot + 1)) + " = ";
}

// Every bool option takes TOML's true and false and nothing else: not 1, 2
// or the strings "yes" and "true".
TEST(ConfigTest, BoolsTakeOnlyTrueOrFalse) {
  int bools = 0;
  for (const OptionSpec& spec : ConfigOptions()) {
    if (spec.type != OptionType::kBool) continue;
    ++bools;
    SCOPED_TRACE(std::string(spec.name));
    const std::string head = Head(spec.name);
    for (const char* bad : {"2", "1", "0", "\"yes\"", "\"true\"", "1.0"}) {
      const std::string message = std::string(spec.name) + " = " + bad + " must be true or false";
      ExpectInvalidConfig(head + bad + "\n", {"test.toml:2", message});
    }
    for (const char* good : {"true", "false"}) {
      auto config = ParseConfig(head + good + "\n", "test.toml");
      ASSERT_TRUE(config.ok()) << config.status().ToString();
      EXPECT_EQ(spec.field.toml(spec, *config), good);
    }
  }
  EXPECT_EQ(bools, 11);
}

// The policy options list the registry's names, in its order, and hold the
// registry's ids (EveryChoiceRowRoundTripsItsNames parses each name).
TEST(ConfigTest, PolicyOptionsTakeTheRegistrysNames) {
  struct Row {
    std::string_view option;
    std::string_view choices;
  };
  const Row rows[] = {{"engine.eviction", kEvictionPolicyChoices},
                      {"nvme.eviction", kEvictionPolicyChoices},
                      {"nvme.admission", kNvmeAdmissionChoices},
                      {"remote.admission", kRemoteAdmissionChoices}};
  for (const Row& row : rows) {
    SCOPED_TRACE(std::string(row.option));
    const OptionSpec* spec = FindSpec(row.option);
    ASSERT_NE(spec, nullptr);
    EXPECT_EQ(spec->type, OptionType::kChoice);
    EXPECT_EQ(spec->choices, row.choices);
  }
  auto config = ParseConfig("[engine]\neviction = \"lru2\"\n[remote]\nadmission = \"second_hit\"\n", "test.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->engine_eviction, EvictionPolicyId::kLru2);
  EXPECT_EQ(config->remote_admission, AdmissionPolicyId::kSecondHit);
  ExpectInvalidConfig("[nvme]\nadmission = \"rate\"\n", {"nvme.admission", "all|second_hit|dwpd"});
  ExpectInvalidConfig("[remote]\nadmission = \"dwpd\"\n", {"remote.admission", "all|second_hit|rate"});
}

// The choice options that are not policies keep exactly the names they
// always took, and hold them as enums.
TEST(ConfigTest, ChoiceOptionsTakeTheirNamesAsEnums) {
  const std::pair<std::string_view, std::string_view> rows[] = {
      {"host.lock_memory", "required|best_effort|off"},
      {"hbm.enabled", "auto|on|off"},
      {"nvme.io_engine", "auto|io_uring|threads"},
      {"log.level", "trace|debug|info|warn|error|critical|off"},
      {"log.format", "text|json"}};
  for (const auto& [option, choices] : rows) {
    SCOPED_TRACE(std::string(option));
    const OptionSpec* spec = FindSpec(option);
    ASSERT_NE(spec, nullptr);
    EXPECT_EQ(spec->type, OptionType::kChoice);
    EXPECT_EQ(spec->choices, choices);
  }
  auto config = ParseConfig(
      "[host]\nlock_memory = \"required\"\n[hbm]\nenabled = \"on\"\n[nvme]\nio_engine = \"io_uring\"\n"
      "[log]\nlevel = \"warn\"\nformat = \"json\"\n",
      "test.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->host_lock_memory, LockMemory::kRequired);
  EXPECT_EQ(config->hbm_enabled, HbmEnabled::kOn);
  EXPECT_EQ(config->nvme_io_engine, NvmeIoEngine::kIoUring);
  EXPECT_EQ(config->log_level, LogLevel::kWarn);
  EXPECT_EQ(config->log_format, LogFormat::kJson);
  ExpectInvalidConfig("[hbm]\nenabled = \"yes\"\n", {"test.toml:2", "hbm.enabled = \"yes\" is not one of auto|on|off"});
  ExpectInvalidConfig("[hbm]\nenabled = true\n", {"hbm.enabled = true must be a string, one of auto|on|off"});
  ExpectInvalidConfig("[log]\nformat = \"JSON\"\n", {"log.format = \"JSON\" is not one of text|json"});
  ExpectInvalidConfig("[log]\nlevel = \"warning\"\n", {"log.level", "trace|debug|info|warn|error|critical|off"});
}

// Every choice row, policies and the others alike: each of its names
// parses and writes back as itself, and another name is refused listing
// them all.
TEST(ConfigTest, EveryChoiceRowRoundTripsItsNames) {
  int choice_rows = 0;
  for (const OptionSpec& spec : ConfigOptions()) {
    if (spec.type != OptionType::kChoice) continue;
    ++choice_rows;
    SCOPED_TRACE(std::string(spec.name));
    const std::string head = Head(spec.name);
    std::string_view rest = spec.choices;
    while (!rest.empty()) {
      const std::string name(rest.substr(0, rest.find('|')));
      rest.remove_prefix(std::min(rest.size(), name.size() + 1));
      auto config = ParseConfig(head + TomlQuoted(name) + "\n", "test.toml");
      ASSERT_TRUE(config.ok()) << config.status().ToString();
      EXPECT_EQ(spec.field.toml(spec, *config), TomlQuoted(name));
    }
    ExpectInvalidConfig(head + "\"nope\"\n", {"test.toml:2", "\"nope\" is not one of", spec.choices});
  }
  EXPECT_EQ(choice_rows, 10);
}

// Each row's copy carries exactly its own field (what a SIGHUP reload
// applies), and ChangedOptions sees exactly that row change.
TEST(ConfigTest, EveryRowCopiesAndComparesItsOwnField) {
  auto defaults = ParseConfig("", "empty.toml");
  ASSERT_TRUE(defaults.ok());
  DaemonConfig zero;
  for (const OptionSpec& spec : ConfigOptions()) {
    SCOPED_TRACE(std::string(spec.name));
    DaemonConfig copy = zero;
    spec.field.copy(*defaults, copy);
    EXPECT_TRUE(spec.field.same(copy, *defaults));
    auto changed = ChangedOptions(zero, copy);
    if (spec.field.same(zero, *defaults)) {
      EXPECT_TRUE(changed.empty());
    } else {
      ASSERT_EQ(changed.size(), 1u);
      EXPECT_EQ(changed[0]->name, spec.name);
    }
  }
}

// A value of the wrong type is refused naming the option, the value given
// and what the option takes.
TEST(ConfigTest, WrongTypesNameTheValueAndWhatIsAllowed) {
  ExpectInvalidConfig("[server]\nio_threads = \"2\"\n",
                      {"test.toml:2", "server.io_threads = \"2\" must be an integer in [1, 256]"});
  ExpectInvalidConfig("[host]\ncapacity_bytes = true\n",
                      {"host.capacity_bytes = true must be a size like \"64MiB\" or an integer", "or 0 (auto)"});
  ExpectInvalidConfig("[nvme]\ndwpd = \"lots\"\n", {"nvme.dwpd = \"lots\" must be a number in [0.01, 100]"});
  ExpectInvalidConfig("[engine]\neviction = 3\n",
                      {"engine.eviction = 3 must be a string, one of lru|fifo|lru2|s3fifo|arc|queue_aware"});
  ExpectInvalidConfig("[server]\nsocket_path = [1]\n", {"server.socket_path must be a string"});
}

}  // namespace
}  // namespace kvtier
