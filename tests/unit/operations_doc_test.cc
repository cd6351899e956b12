// docs/OPERATIONS.md must list every option of the table with its default,
// so the operations doc cannot drift from the code.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "daemon/config/config.h"

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

}  // namespace
}  // namespace kvtier
