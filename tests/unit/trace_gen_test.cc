// kvtier trace gen multi-round-qa (tools/trace/trace_gen.h): the trace's shape,
// block sharing checked against an independent model of the token content,
// the arrival process, reproducibility, errors, and that replay reads it.
#include "tools/trace/trace_gen.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/testing/test_daemon.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace {

MultiRoundQaOptions Small() {
  MultiRoundQaOptions o;
  o.users = 4;
  o.rounds = 3;
  o.qps = 1;
  o.system_tokens = 10;
  o.history_tokens = 3;
  o.question_tokens = 5;
  o.answer_tokens = 7;
  o.think_s = 2;
  o.block_tokens = 4;
  return o;
}

GeneratedTrace Generate(const MultiRoundQaOptions& o) {
  auto t = GenerateMultiRoundQa(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : GeneratedTrace{};
}

std::string Text(const GeneratedTrace& t) {
  std::string s;
  for (const auto& r : t.requests) s += TraceJsonLine(r) + "\n";
  return s;
}

TEST(TraceGenTest, EveryUserSendsEveryRoundWithItsWholeHistory) {
  const MultiRoundQaOptions o = Small();
  const GeneratedTrace t = Generate(o);
  ASSERT_EQ(t.requests.size(), size_t{o.users} * o.rounds);
  std::map<uint64_t, std::vector<uint64_t>> turns;  // session -> turns in file order
  for (const auto& r : t.requests) {
    turns[r.session].push_back(r.turn);
    // system + history + k questions + (k-1) answers.
    EXPECT_EQ(r.input_tokens, 10 + 3 + 5 * r.turn + 7 * (r.turn - 1));
    EXPECT_EQ(r.output_tokens, 7u);
    EXPECT_EQ(r.hash_ids.size(), (r.input_tokens + 3) / 4) << "ceil(input_length / block_tokens)";
  }
  ASSERT_EQ(turns.size(), size_t{o.users});
  for (const auto& [session, ks] : turns) {
    EXPECT_GE(session, 1u);
    EXPECT_LE(session, uint64_t{o.users});
    EXPECT_EQ(ks, (std::vector<uint64_t>{1, 2, 3})) << "session " << session;
  }
  for (size_t i = 1; i < t.requests.size(); ++i) {
    const auto& a = t.requests[i - 1];
    const auto& b = t.requests[i];
    EXPECT_TRUE(std::tie(a.timestamp_ms, a.session, a.turn) < std::tie(b.timestamp_ms, b.session, b.turn))
        << "sorted by timestamp, ties by session and turn (line " << i + 1 << ")";
  }
}

// Two blocks share an id iff the token content up to and including them is
// identical. The content model, independent of the generator: user u's
// token p is the system prompt's token p when p < system_tokens, else u's
// own; a block at index i ending at token e of user u therefore has the
// same content prefix as one of user v iff the index and end agree and
// (u == v or e <= system_tokens).
void ExpectIdsMatchContent(const MultiRoundQaOptions& o, const GeneratedTrace& t) {
  using Content = std::tuple<uint64_t, uint64_t, uint64_t>;  // index, end, owner (0: system prompt)
  std::map<uint64_t, Content> content_of;
  std::map<Content, uint64_t> id_of;
  for (const auto& r : t.requests) {
    for (size_t i = 0; i < r.hash_ids.size(); ++i) {
      const uint64_t end = std::min<uint64_t>((i + 1) * o.block_tokens, r.input_tokens);
      const Content c{i, end, end <= o.system_tokens ? 0 : r.session};
      auto [a, new_id] = content_of.try_emplace(r.hash_ids[i], c);
      EXPECT_EQ(a->second, c) << "id " << r.hash_ids[i] << " names two contents";
      auto [b, new_content] = id_of.try_emplace(c, r.hash_ids[i]);
      EXPECT_EQ(b->second, r.hash_ids[i])
          << "one content, two ids (session " << r.session << " turn " << r.turn << " block " << i << ")";
    }
  }
  EXPECT_EQ(content_of.size(), t.distinct_blocks);
  // Ids are numbered by first appearance.
  uint64_t next = 0;
  for (const auto& r : t.requests) {
    for (uint64_t id : r.hash_ids) {
      EXPECT_LE(id, next);
      if (id == next) ++next;
    }
  }
}

TEST(TraceGenTest, BlocksAreSharedExactlyWhenTheirPrefixIsTheSame) {
  MultiRoundQaOptions o = Small();
  ExpectIdsMatchContent(o, Generate(o));
  o.system_tokens = 8;  // a multiple of the block: block 2 starts with the user's text
  ExpectIdsMatchContent(o, Generate(o));
  o.system_tokens = 0;
  o.history_tokens = 0;
  ExpectIdsMatchContent(o, Generate(o));
  o = Small();
  o.users = 20;
  o.rounds = 6;
  o.block_tokens = 16;
  o.system_tokens = 100;
  ExpectIdsMatchContent(o, Generate(o));
}

TEST(TraceGenTest, TheSystemPromptIsSharedAndTheRestIsEachUsersOwn) {
  MultiRoundQaOptions o = Small();  // 10 system tokens in 4-token blocks: 2 shared blocks
  const GeneratedTrace t = Generate(o);
  std::map<uint64_t, std::set<uint64_t>> ids_of_user;
  for (const auto& r : t.requests) ids_of_user[r.session].insert(r.hash_ids.begin(), r.hash_ids.end());
  const std::vector<uint64_t> shared = {t.requests[0].hash_ids[0], t.requests[0].hash_ids[1]};
  for (const auto& r : t.requests) {
    EXPECT_EQ(r.hash_ids[0], shared[0]);
    EXPECT_EQ(r.hash_ids[1], shared[1]);
  }
  for (const auto& [u, ids] : ids_of_user) {
    for (const auto& [v, other] : ids_of_user) {
      if (u == v) continue;
      std::set<uint64_t> common;
      for (uint64_t id : ids) {
        if (other.count(id)) common.insert(id);
      }
      EXPECT_EQ(common, (std::set<uint64_t>{shared[0], shared[1]})) << "users " << u << " and " << v;
    }
  }
  o.system_tokens = 0;
  const GeneratedTrace none = Generate(o);
  std::set<uint64_t> firsts;
  for (const auto& r : none.requests) firsts.insert(r.hash_ids[0]);
  EXPECT_EQ(firsts.size(), size_t{o.users}) << "no system prompt: nothing shared across users";
}

TEST(TraceGenTest, ARoundExtendsThePreviousRoundsChainAndAPartialBlockIsReplacedWhenItGrows) {
  const MultiRoundQaOptions o = Small();
  const GeneratedTrace t = Generate(o);
  std::map<uint64_t, const GeneratedRequest*> last;
  int partial_replaced = 0;
  for (const auto& r : t.requests) {
    auto it = last.find(r.session);
    if (it != last.end()) {
      const GeneratedRequest& prev = *it->second;
      ASSERT_GT(r.hash_ids.size(), prev.hash_ids.size());
      const bool prev_partial = prev.input_tokens % o.block_tokens != 0;
      const size_t full = prev.hash_ids.size() - (prev_partial ? 1 : 0);
      for (size_t i = 0; i < full; ++i) EXPECT_EQ(r.hash_ids[i], prev.hash_ids[i]);
      if (prev_partial) {
        EXPECT_NE(r.hash_ids[full], prev.hash_ids[full]) << "the grown block is a new block";
        ++partial_replaced;
      }
    }
    last[r.session] = &r;
  }
  EXPECT_GT(partial_replaced, 0);  // 13 + 5 = 18 tokens: round 1 ends in a partial block
}

TEST(TraceGenTest, TheSameSeedGivesTheSameBytes) {
  MultiRoundQaOptions o = Small();
  o.users = 30;
  o.rounds = 5;
  o.qps = 3;
  const std::string a = Text(Generate(o));
  EXPECT_EQ(a, Text(Generate(o)));
  o.seed = 2;
  EXPECT_NE(a, Text(Generate(o)));
  const std::string first = a.substr(0, a.find('\n'));
  EXPECT_EQ(first,
            "{\"timestamp\":0,\"input_length\":18,\"output_length\":7,\"hash_ids\":[0,1,2,3,4],"
            "\"session\":1,\"turn\":1}");
}

// Users start every rounds / qps seconds, so once the first session is
// over and until the last user starts, requests arrive at qps.
TEST(TraceGenTest, OnceUsersOverlapTheRateIsTheTarget) {
  for (const char* think : {"exp", "fixed"}) {
    MultiRoundQaOptions o;
    o.users = 80;
    o.rounds = 10;
    o.qps = 2;
    o.think_s = 10;
    o.think = think;
    const GeneratedTrace t = Generate(o);
    ASSERT_EQ(t.requests.size(), 800u);
    EXPECT_DOUBLE_EQ(t.user_start_gap_s, 5.0);
    EXPECT_EQ(t.requests.front().timestamp_ms, 0u);
    // Sessions last 90 s on average; the last user starts at 395 s.
    int in_window = 0;
    for (const auto& r : t.requests) in_window += r.timestamp_ms >= 100'000 && r.timestamp_ms < 390'000;
    EXPECT_NEAR(in_window / 290.0, 2.0, 0.3) << think;
    // Over the whole run the ramps pull the average below the target.
    const double span_s = double(t.requests.back().timestamp_ms) / 1000;
    EXPECT_LT(799 / span_s, 2.0) << think;
    EXPECT_GT(799 / span_s, 1.4) << think;
  }
}

TEST(TraceGenTest, ThinkTimesAreFixedOrExponentialWithTheStatedMean) {
  MultiRoundQaOptions o = Small();
  o.users = 5;
  o.rounds = 4;
  o.think = "fixed";
  o.think_s = 3;
  o.qps = 0.5;  // users start every 4 / 0.5 = 8 s
  GeneratedTrace t = Generate(o);
  EXPECT_DOUBLE_EQ(t.user_start_gap_s, 8.0);
  std::map<uint64_t, uint64_t> prev;
  for (const auto& r : t.requests) {
    if (r.turn == 1) {
      EXPECT_NEAR(double(r.timestamp_ms), std::floor(double(r.session - 1) * t.user_start_gap_s * 1000), 1);
    } else {
      EXPECT_NEAR(double(r.timestamp_ms - prev[r.session]), 3000, 1);
    }
    prev[r.session] = r.timestamp_ms;
  }
  o.think = "exp";
  o.users = 200;
  o.rounds = 20;
  o.think_s = 5;
  o.qps = 10;
  t = Generate(o);
  prev.clear();
  double sum_ms = 0;
  int gaps = 0;
  for (const auto& r : t.requests) {
    if (r.turn > 1) {
      sum_ms += double(r.timestamp_ms - prev[r.session]);
      ++gaps;
    }
    prev[r.session] = r.timestamp_ms;
  }
  ASSERT_EQ(gaps, 200 * 19);
  EXPECT_NEAR(sum_ms / gaps / 1000, 5.0, 0.4) << "3800 exponential gaps of mean 5 s (sd of the mean 0.08 s)";
}

TEST(TraceGenTest, OneUserHasNoStaggerAndIgnoresQps) {
  MultiRoundQaOptions o = Small();
  o.users = 1;
  o.qps = 1000;
  o.think = "fixed";
  const GeneratedTrace t = Generate(o);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[2].timestamp_ms, 4000u);
}

TEST(TraceGenTest, BadValuesAreRefusedNamingTheOption) {
  const std::vector<std::pair<std::function<void(MultiRoundQaOptions&)>, std::string>> cases = {
      {[](auto& o) { o.users = 0; }, "--users"},
      {[](auto& o) { o.rounds = 0; }, "--rounds"},
      {[](auto& o) { o.qps = 0; }, "--qps"},
      {[](auto& o) { o.qps = -1; }, "--qps"},
      {[](auto& o) { o.qps = std::nan(""); }, "--qps"},
      {[](auto& o) { o.question_tokens = 0; }, "--question-tokens"},
      {[](auto& o) { o.think_s = -1; }, "--think-s"},
      {[](auto& o) { o.think = "uniform"; }, "--think"},
      {[](auto& o) { o.block_tokens = 0; }, "--block-tokens"},
      // 2 users of 10 rounds 100 s apart send at most 20 / 900 requests/s.
      {[](auto& o) {
         o.users = 2;
         o.rounds = 10;
         o.think = "fixed";
         o.think_s = 100;
         o.qps = 10;
       },
       "at most 0.0222"},
  };
  for (const auto& [change, needle] : cases) {
    MultiRoundQaOptions o = Small();
    change(o);
    auto t = GenerateMultiRoundQa(o);
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
    o.out_path = "/nonexistent-dir/x.jsonl";
    EXPECT_EQ(RunMultiRoundQa(o), 2) << needle;
  }
}

TEST(TraceGenTest, TheWrittenFileIsWhatReplayReads) {
  const std::string dir = ::kvtier::testing::MakeTempDir();
  MultiRoundQaOptions o = Small();
  o.out_path = dir + "/mrqa.jsonl";
  ASSERT_EQ(RunMultiRoundQa(o), 0);
  std::ifstream in(o.out_path);
  std::stringstream text;
  text << in.rdbuf();
  const GeneratedTrace t = Generate(o);
  EXPECT_EQ(text.str(), Text(t));
  auto read = ReadMooncakeTrace(o.out_path, o.block_tokens, 0, /*require_session=*/true);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->requests.size(), t.requests.size());
  for (size_t i = 0; i < t.requests.size(); ++i) {
    EXPECT_EQ(read->requests[i].arrival_us, t.requests[i].timestamp_ms * 1000);
    EXPECT_EQ(read->requests[i].input_tokens, t.requests[i].input_tokens);
    EXPECT_EQ(read->requests[i].blocks.size(), t.requests[i].hash_ids.size());
    EXPECT_NE(read->requests[i].session, 0u);
  }
  o.out_path = dir + "/no-such-dir/x.jsonl";
  EXPECT_EQ(RunMultiRoundQa(o), 1);
  ::kvtier::testing::RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::tools
