// Tests of ChooseDemotionTarget (policy/demotion_target.h): where a victim
// goes among the tiers below, and which tiers are asked.
#include "policy/demotion_target.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvtier {
namespace {

// Two tiers below; each callback logs its question and answers from the
// given per-level answers.
struct Tiers {
  std::vector<bool> holds, force, admit;
  std::vector<std::string> asked;
  DemotionTarget Choose(bool needed) {
    return ChooseDemotionTarget(
        holds.size(), needed,
        [this](size_t l) {
          asked.push_back("holds" + std::to_string(l));
          return bool(holds[l]);
        },
        [this](size_t l) {
          asked.push_back("force" + std::to_string(l));
          return bool(force[l]);
        },
        [this](size_t l) {
          asked.push_back("admit" + std::to_string(l));
          return bool(admit[l]);
        });
  }
};

TEST(DemotionTargetTest, TheFirstTierThatAdmitsTakesIt) {
  Tiers t{{false, false}, {true, true}, {false, true}};
  DemotionTarget d = t.Choose(/*needed=*/false);
  EXPECT_EQ(d.level, 1u);
  EXPECT_FALSE(d.forced);
  EXPECT_FALSE(d.held_below);
  EXPECT_EQ(t.asked, (std::vector<std::string>{"holds0", "admit0", "holds1", "admit1"})) << "force is never asked";
}

TEST(DemotionTargetTest, ATierHoldingItEndsTheWalkWithoutAWrite) {
  Tiers t{{false, true}, {true, true}, {false, true}};
  DemotionTarget d = t.Choose(false);
  EXPECT_FALSE(d.level);
  EXPECT_TRUE(d.held_below);
  EXPECT_EQ(t.asked, (std::vector<std::string>{"holds0", "admit0", "holds1"}));
  Tiers top{{true, false}, {true, true}, {true, true}};
  EXPECT_TRUE(top.Choose(true).held_below);
  EXPECT_EQ(top.asked, (std::vector<std::string>{"holds0"})) << "held at the top: nothing else is asked";
}

TEST(DemotionTargetTest, ANeededBlockIsForcedIntoTheFirstTierWhenItsBudgetPays) {
  Tiers t{{false, false}, {true, true}, {false, false}};
  DemotionTarget d = t.Choose(/*needed=*/true);
  EXPECT_EQ(d.level, 0u);
  EXPECT_TRUE(d.forced);
  EXPECT_EQ(t.asked, (std::vector<std::string>{"holds0", "force0"}));
  // The budget cannot pay: admission as usual, and only the first tier is forced.
  Tiers poor{{false, false}, {false, true}, {false, true}};
  DemotionTarget p = poor.Choose(true);
  EXPECT_EQ(p.level, 1u);
  EXPECT_FALSE(p.forced);
  EXPECT_EQ(poor.asked, (std::vector<std::string>{"holds0", "force0", "admit0", "holds1", "admit1"}));
  // Nobody takes it: dropped.
  Tiers none{{false, false}, {false, false}, {false, false}};
  DemotionTarget n = none.Choose(true);
  EXPECT_FALSE(n.level);
  EXPECT_FALSE(n.held_below);
  const auto never = [](size_t) -> bool {
    ADD_FAILURE() << "no tier to ask";
    return false;
  };
  EXPECT_FALSE(ChooseDemotionTarget(0, true, never, never, never).level) << "no tier below";
}

}  // namespace
}  // namespace kvtier
