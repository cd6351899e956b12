// Checks shared by the configuration tests.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "daemon/config/config.h"

namespace kvtier::testing {

// Parses `toml` as origin "test.toml" and expects InvalidArgument whose
// message contains every one of `needles`.
inline void ExpectInvalidConfig(std::string_view toml, std::initializer_list<std::string_view> needles) {
  SCOPED_TRACE(std::string(toml));
  auto config = ParseConfig(toml, "test.toml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << config.status().ToString();
  for (std::string_view needle : needles) {
    EXPECT_NE(config.status().message().find(needle), std::string::npos)
        << "'" << needle << "' not in: " << config.status().message();
  }
}

}  // namespace kvtier::testing
