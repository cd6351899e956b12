// docs/OPERATIONS.md must list every option of the table with its default,
// so the operations doc cannot drift from the code.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "daemon/config/config.h"
#include "policy/policy_registry.h"

namespace kvtier {
namespace {

TEST(OperationsDoc, ListsEveryOptionWithItsDefault) {
  std::ifstream in(std::string(KVTIER_SOURCE_DIR) + "/docs/OPERATIONS.md");
  ASSERT_TRUE(in) << "docs/OPERATIONS.md missing";
  std::stringstream text;
  text << in.rdbuf();
  for (const OptionSpec& spec : ConfigOptions()) {
    std::string row = "| `" + std::string(spec.name) + "` | `" + std::string(spec.default_value) + "` |";
    EXPECT_NE(text.str().find(row), std::string::npos) << "OPERATIONS.md lacks the row: " << row;
  }
}

// The allowed-values column of a choice row lists the row's choices (the
// registry's names for the policy options), or first..last; of a bool row
// "true, false".
TEST(OperationsDoc, ListsTheAllowedValuesOfEveryChoiceAndBool) {
  std::ifstream in(std::string(KVTIER_SOURCE_DIR) + "/docs/OPERATIONS.md");
  ASSERT_TRUE(in) << "docs/OPERATIONS.md missing";
  std::stringstream text;
  text << in.rdbuf();
  for (const OptionSpec& spec : ConfigOptions()) {
    const std::string row = "| `" + std::string(spec.name) + "` | `" + std::string(spec.default_value) + "` | ";
    if (spec.type == OptionType::kBool) {
      EXPECT_NE(text.str().find(row + "true, false |"), std::string::npos) << row;
    } else if (spec.type == OptionType::kChoice) {
      const std::string_view choices = spec.choices;
      const std::string range = std::string(choices.substr(0, choices.find('|'))) + ".." +
                                std::string(choices.substr(choices.rfind('|') + 1));
      EXPECT_TRUE(text.str().find(row + ListChoices(choices) + " |") != std::string::npos ||
                  text.str().find(row + range + " |") != std::string::npos)
          << "OPERATIONS.md lists other values than " << ListChoices(choices) << " in: " << row;
    }
  }
}

}  // namespace
}  // namespace kvtier
