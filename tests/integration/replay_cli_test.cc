// `kvtier replay` as a process: the command-line contract scripts depend on
// (bad input exits 2 naming the file and line; JSON output; a sweep's
// numbers do not depend on the thread count).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "policy/policy_registry.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

class ReplayCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { RemoveTree(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
    return dir_ + "/" + name;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string dir_;
};

// 40 requests over a few shared roots, 4-token blocks.
std::string SmallTrace() {
  std::string text;
  for (int r = 0; r < 40; ++r) {
    text += "{\"timestamp\": " + std::to_string(r) + ", \"input_length\": 12, \"output_length\": 3, \"hash_ids\": [" +
            std::to_string(r % 3) + ", " + std::to_string(10 + r % 7) + ", " + std::to_string(100 + r) + "]}\n";
  }
  return text;
}

TEST_F(ReplayCliTest, WritesJsonRunsForEachPolicyAndCapacity) {
  const std::string trace = Write("t.jsonl", SmallTrace());
  CommandResult r = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--block-tokens", "4", "--capacity",
                                "host=inf", "--policy", "lru,fifo", "--sweep", "8blk,inf", "--json", dir_ + "/out.json",
                                "--csv", dir_ + "/out.csv"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = Read(dir_ + "/out.json");
  // header, 6 runs (lru and fifo as asked, belady always: the gap's ends), footer
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 8) << json;
  for (const char* field :
       {"\"runs\"", "\"capacities\"", "\"block_hit_rate\"", "\"token_hit_rate\"", "\"requests\": 40", "\"blocks\": 120",
        "\"ttft_ms\"", "\"wall_seconds\"", "\"policy\": \"fifo\"", "\"policy\": \"belady\"", "\"gap_closed\": -1",
        "\"gap_closed\": null"}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  }
  // Unlimited: every root and middle block after its first sighting hits.
  // Roots: 3 first sightings; middles: 7; hits = 37 roots + 33 middles
  // (a middle hits only after its root did, always true here) = 70 of 120.
  EXPECT_NE(json.find("\"block_hit_rate\": 0.583333"), std::string::npos) << json;
  const std::string csv = Read(dir_ + "/out.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7) << csv;
}

TEST_F(ReplayCliTest, AnNvmeTierUnderDwpdReportsItsWritesAndBudget) {
  const std::string trace = Write("t.jsonl", SmallTrace());
  const std::string out = dir_ + "/nvme.json";
  CommandResult r = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--block-tokens", "4", "--capacity",
                                "host=4blk,nvme=64KiB", "--bytes-per-token", "2", "--admission", "dwpd",
                                "--drive-bytes", "1GB", "--json", out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = Read(out);
  for (const char* field : {"\"nvme\": \"32768tok\"", "\"nvme\": {\"hits\"", "\"ssd_bytes_written\"",
                            "\"ssd_budget_bytes\": 1000000000", "\"admission\": \"dwpd\""}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  }
  // dwpd without an nvme tier, an nvme tier without bytes per token, one
  // too small for the daemon's two regions (of at least one 8 KiB record),
  // an unknown reclaim order: bad input.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--capacity", "host=4blk", "--admission", "dwpd", "--bytes-per-token", "2"},
        {"--capacity", "host=4blk,nvme=8blk"},
        {"--capacity", "host=4blk,nvme=1KiB", "--bytes-per-token", "2"},
        {"--capacity", "host=4blk,nvme=64KiB", "--bytes-per-token", "2", "--nvme-eviction", "clock"},
        {"--capacity", "host=4blk,nvme=64KiB", "--bytes-per-token", "2", "--nvme-region", "5000B"}}) {
    std::vector<std::string> argv = {KVTIER_TOOL_PATH, "replay", "--trace", trace};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_EQ(RunCommand(argv).exit_code, 2) << args[1];
  }
}

TEST_F(ReplayCliTest, TheEngineModelReportsTtftPercentiles) {
  const std::string trace = Write("t.jsonl", SmallTrace());
  const std::string out = dir_ + "/ttft.json";
  CommandResult r = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--block-tokens", "4", "--capacity",
                                "host=inf", "--engines", "1", "--prefill-tps", "4000", "--json", out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json = Read(out);
  // One request a millisecond, 12 tokens each: 3 ms of prefill when all
  // miss, so the queue grows at first.
  EXPECT_NE(json.find("\"ttft_ms\": {\"p50\": "), std::string::npos) << json;
  EXPECT_NE(json.find("\"p99\": "), std::string::npos) << json;
  EXPECT_EQ(
      RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--capacity", "host=inf", "--engines", "2"}).exit_code,
      2)
      << "engines need a prefill rate";
  EXPECT_EQ(RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--capacity", "host=inf", "--read-bandwidth",
                        "nvme=fast"})
                .exit_code,
            2);
}

TEST_F(ReplayCliTest, PlotWritesAnSvgWithALinePerPolicyAndTierShares) {
  const std::string trace = Write("t.jsonl", SmallTrace());
  const std::string svg_path = dir_ + "/p.svg";
  CommandResult r = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--block-tokens", "4", "--capacity",
                                "host=inf,nvme=inf", "--bytes-per-token", "1", "--policy", "lru,queue_aware", "--sweep",
                                "3blk,9blk,inf", "--plot", svg_path});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string svg = Read(svg_path);
  ASSERT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << svg.substr(0, 80);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  auto count = [&svg](const std::string& what) {
    size_t n = 0;
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<polyline class=\"policy\""), 2u);
  EXPECT_EQ(count("<polyline class=\"policy ceiling\""), 1u) << "belady runs too";
  EXPECT_EQ(count("<circle"), 9u) << "a point per run";
  EXPECT_GE(count("<rect class=\"share\""), 9u) << "at least one tier share per run";
  EXPECT_NE(svg.find(">queue_aware"), std::string::npos) << "the legend";
  EXPECT_EQ(count("<script"), 0u);
}

// A trace with reuse and eviction pressure at 8 blocks: 60 requests of 2-4
// full 4-token blocks over 3 roots, each chain named twice within 6
// requests. Sim mode at 8 blocks: LRU 0.483, FIFO 0.206, queue-aware 0.444.
std::string LiveTrace() {
  std::string text;
  for (int r = 0; r < 60; ++r) {
    const int blocks = 2 + r % 3;
    std::string ids = std::to_string(r % 3);
    for (int b = 1; b < blocks; ++b) ids += ", " + std::to_string(10 * (r % 3) + 100 * b + (r / 6) % 2);
    text += "{\"timestamp\": " + std::to_string(r) + ", \"input_length\": " + std::to_string(4 * blocks) +
            ", \"hash_ids\": [" + ids + "]}\n";
  }
  return text;
}

std::string Field(const std::string& json, const std::string& name) {
  const size_t at = json.find("\"" + name + "\": ");
  if (at == std::string::npos) return "";
  const size_t start = at + name.size() + 4;
  return json.substr(start, json.find_first_of(",}", start) - start);
}

// Live mode against a daemon with one shard, no NVMe tier and room for 8
// blocks of 64 KiB gives the hits sim mode gives at 8 blocks, policy by
// policy (the three policies give three different rates here).
TEST_F(ReplayCliTest, LiveModeHitsWhatSimModeHitsOnTheSameCapacityAndPolicy) {
  const std::string trace = Write("live.jsonl", LiveTrace());
  for (const char* policy : {"lru", "fifo", "queue_aware"}) {
    SCOPED_TRACE(policy);
    TestDaemonOptions options;
    options.arena_bytes = 8 * (64 << 10);
    options.shards = 1;
    options.eviction = *ParseEvictionPolicy(policy);
    options.directory_slots = -1;
    TestDaemon daemon(options);
    const std::string live_json = dir_ + "/live_" + policy + ".json";
    CommandResult live = RunCommand({KVTIER_TOOL_PATH, "replay", "--live", "--socket", daemon.socket_path(), "--trace",
                                     trace, "--block-tokens", "4", "--bytes-per-token", "16384", "--json", live_json});
    ASSERT_EQ(live.exit_code, 0) << live.output;
    const std::string sim_json = dir_ + "/sim_" + policy + ".json";
    CommandResult sim = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--block-tokens", "4", "--capacity",
                                    "host=8blk", "--policy", policy, "--json", sim_json});
    ASSERT_EQ(sim.exit_code, 0) << sim.output;
    const std::string l = Read(live_json), m = Read(sim_json);
    EXPECT_EQ(Field(l, "blocks"), Field(m, "blocks"));
    EXPECT_EQ(Field(l, "block_hit_rate"), Field(m, "block_hit_rate")) << l << "\n" << m;
    EXPECT_EQ(Field(l, "token_hit_rate"), Field(m, "token_hit_rate"));
    EXPECT_NE(Field(l, "block_hit_rate"), "0") << "the trace must reuse something";
    EXPECT_NE(Field(l, "request_us"), "") << l;
  }
  // Without a daemon: a clear error, not a crash.
  CommandResult none = RunCommand({KVTIER_TOOL_PATH, "replay", "--live", "--socket", dir_ + "/no.sock", "--trace",
                                   trace, "--block-tokens", "4", "--bytes-per-token", "16384"});
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_NE(none.output.find("no.sock"), std::string::npos) << none.output;
}

TEST_F(ReplayCliTest, SweepNumbersDoNotDependOnTheThreadCount) {
  const std::string trace = Write("t.jsonl", SmallTrace());
  std::string outputs[2];
  for (int i = 0; i < 2; ++i) {
    const std::string out = dir_ + "/o" + std::to_string(i) + ".json";
    CommandResult r = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--block-tokens", "4", "--capacity",
                                  "host=inf", "--policy", "lru,fifo,queue_aware", "--sweep", "3blk,6blk,12blk,30tok",
                                  "--threads", i == 0 ? "1" : "3", "--json", out});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    outputs[i] = std::regex_replace(Read(out), std::regex("\"wall_seconds\": [0-9.e+-]+"), "");
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

// 15 conversations of 4 turns, turn-major, 4-token blocks: turn t of
// conversation c sends blocks c*100 .. c*100+t (60 distinct blocks).
std::string ConversationTrace() {
  std::string text;
  for (int t = 0, r = 0; t < 4; ++t) {
    for (int c = 0; c < 15; ++c, ++r) {
      std::string ids;
      for (int b = 0; b <= t; ++b) ids += (b > 0 ? ", " : "") + std::to_string(c * 100 + b);
      text += "{\"timestamp\": " + std::to_string(r) + ", \"input_length\": " + std::to_string(4 * (t + 1)) +
              ", \"hash_ids\": [" + ids + "]}\n";
    }
  }
  return text;
}

// Two nodes, round robin, 30 blocks of DRAM each over a shared remote
// tier: each conversation's turns alternate between the nodes, so hits
// split into local and shared; the reports name the nodes and router.
TEST_F(ReplayCliTest, NodesReportLocalAndSharedHitsAndRequestsPerNode) {
  const std::string trace = Write("c.jsonl", ConversationTrace());
  CommandResult r = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", trace, "--block-tokens", "4", "--capacity",
                                "host=30blk,remote=inf", "--bytes-per-token", "1", "--nodes", "2", "--router",
                                "round_robin", "--json", dir_ + "/n.json", "--csv", dir_ + "/n.csv"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nodes: 2, router: round_robin"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("local_tok shared_tok  node_requests"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" 30/30\n"), std::string::npos) << r.output;
  const std::string json = Read(dir_ + "/n.json");
  for (const char* field : {"\"nodes\": 2", "\"router\": \"round_robin\"", "\"node_requests\": [30, 30]",
                            "\"local_block_hit_rate\"", "\"node_token_hit_rates\": [{\"local\": "}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  }
  const double local = std::stod(Field(json, "local_token_hit_rate"));
  const double shared = std::stod(Field(json, "shared_token_hit_rate"));
  EXPECT_GT(local, 0);
  EXPECT_GT(shared, 0);
  EXPECT_NEAR(local + shared, std::stod(Field(json, "token_hit_rate")), 1e-5);
  const std::string csv = Read(dir_ + "/n.csv");
  EXPECT_NE(csv.find(",wall_seconds,nodes,router,affinity_blocks,local_block_hit_rate,shared_block_hit_rate,"
                     "local_token_hit_rate,shared_token_hit_rate,node_requests\n"),
            std::string::npos)
      << csv;
  EXPECT_NE(csv.find(",2,round_robin,1,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",30;30\n"), std::string::npos) << csv;
}

// Without --nodes the reports are those of before the option (no node
// fields or columns); --nodes 1 adds them and changes no figure.
TEST_F(ReplayCliTest, WithoutNodesTheReportsAreUnchangedAndOneNodeChangesNoFigure) {
  const std::string trace = Write("c.jsonl", ConversationTrace());
  std::string json[2], csv[2], text[2];
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> argv = {KVTIER_TOOL_PATH,
                                     "replay",
                                     "--trace",
                                     trace,
                                     "--block-tokens",
                                     "4",
                                     "--capacity",
                                     "host=20blk,nvme=64KiB,remote=24blk",
                                     "--bytes-per-token",
                                     "2",
                                     "--policy",
                                     "lru,fifo",
                                     "--json",
                                     dir_ + "/o" + std::to_string(i) + ".json",
                                     "--csv",
                                     dir_ + "/o" + std::to_string(i) + ".csv"};
    if (i == 1) argv.insert(argv.end(), {"--nodes", "1", "--router", "round_robin"});
    CommandResult r = RunCommand(argv);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    text[i] = r.output;
    json[i] = Read(dir_ + "/o" + std::to_string(i) + ".json");
    csv[i] = Read(dir_ + "/o" + std::to_string(i) + ".csv");
  }
  EXPECT_EQ(json[0].find("\"nodes\""), std::string::npos) << json[0];
  EXPECT_EQ(json[0].find("router"), std::string::npos) << json[0];
  EXPECT_EQ(text[0].find("nodes:"), std::string::npos) << text[0];
  EXPECT_EQ(text[0].find("local_tok"), std::string::npos) << text[0];
  EXPECT_EQ(csv[0].substr(0, csv[0].find('\n')),
            "policy,host,nvme,remote,admission,requests,blocks,tokens,block_hit_rate,token_hit_rate,gap_closed,"
            "mean_queue,host_hits,nvme_hits,remote_hits,ssd_bytes_written,ssd_budget_bytes,nvme_eviction,"
            "nvme_reinserted,prefetches,prefetch_used,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,wall_seconds");
  EXPECT_NE(json[1].find("\"nodes\": 1, \"router\": \"round_robin\""), std::string::npos) << json[1];
  EXPECT_NE(json[1].find("\"node_requests\": [60]"), std::string::npos) << json[1];
  EXPECT_NE(text[1].find("nodes: 1, router: round_robin"), std::string::npos) << text[1];
  // The node fields taken out, the JSON is the same, figure for figure.
  const std::regex node_fields(", \"nodes\": .*?(?=, \"wall_seconds\")");
  const std::regex wall("\"wall_seconds\": [0-9.e+-]+");
  EXPECT_EQ(std::regex_replace(std::regex_replace(json[1], node_fields, ""), wall, ""),
            std::regex_replace(json[0], wall, ""));
  EXPECT_NE(json[0].find("\"remote\": {\"hits\": "), std::string::npos) << "the trace reaches every tier";
}

TEST_F(ReplayCliTest, BadNodeCountsAndRoutersExitTwoNamingTheOption) {
  const std::string trace = Write("c.jsonl", ConversationTrace());
  // Each case ends with the bad option and its value.
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--nodes", "0"},
                                               {"--nodes", "257"},
                                               {"--nodes", "-2"},
                                               {"--nodes", "two"},
                                               {"--nodes", "2", "--router", "random"},
                                               {"--nodes", "2", "--affinity-blocks", "0"}}) {
    std::vector<std::string> argv = {KVTIER_TOOL_PATH, "replay", "--trace", trace, "--capacity", "host=inf"};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult c = RunCommand(argv);
    EXPECT_EQ(c.exit_code, 2) << args.back() << ": " << c.output;
    EXPECT_NE(c.output.find(args[args.size() - 2]), std::string::npos) << c.output;
  }
  CommandResult live = RunCommand({KVTIER_TOOL_PATH, "replay", "--live", "--socket", dir_ + "/no.sock", "--trace",
                                   trace, "--bytes-per-token", "1", "--nodes", "2"});
  EXPECT_EQ(live.exit_code, 2) << live.output;
  EXPECT_NE(live.output.find("--nodes"), std::string::npos) << live.output;
}

// --remote-admission: each node's writes into the shared remote tier go
// through it. Two nodes, round robin, so each conversation's next turn is
// on the other node: second_hit refuses the blocks a node never found
// again (first sightings), writes less and loses shared hits; the reports
// name the admission, its rate and its refusals.
TEST_F(ReplayCliTest, RemoteAdmissionIsHonouredAndReported) {
  const std::string trace = Write("c.jsonl", ConversationTrace());
  std::string json[3];
  const char* admissions[3] = {"all", "second_hit", "rate"};
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> argv = {KVTIER_TOOL_PATH,
                                     "replay",
                                     "--trace",
                                     trace,
                                     "--block-tokens",
                                     "4",
                                     "--capacity",
                                     "host=10blk,remote=inf",
                                     "--bytes-per-token",
                                     "1",
                                     "--nodes",
                                     "2",
                                     "--router",
                                     "round_robin",
                                     "--remote-admission",
                                     admissions[i],
                                     "--json",
                                     dir_ + "/r.json",
                                     "--csv",
                                     dir_ + "/r.csv"};
    if (i == 2) argv.insert(argv.end(), {"--remote-write-rate", "1KiB"});
    CommandResult r = RunCommand(argv);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(std::string("remote admission: ") + admissions[i]), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("remote_written remote_refused"), std::string::npos) << r.output;
    json[i] = Read(dir_ + "/r.json");
    EXPECT_NE(json[i].find(std::string("\"remote_admission\": \"") + admissions[i] + "\""), std::string::npos)
        << json[i];
    const std::string csv = Read(dir_ + "/r.csv");
    EXPECT_NE(csv.find(",node_requests,remote_admission,remote_write_rate,remote_admission_refused,"
                       "remote_bytes_written\n"),
              std::string::npos)
        << csv;
  }
  EXPECT_EQ(Field(json[0], "remote_admission_refused"), "0");
  EXPECT_EQ(Field(json[0], "remote_write_rate"), "null");
  EXPECT_GT(std::stoull(Field(json[1], "remote_admission_refused")), 0u) << json[1];
  EXPECT_LT(std::stod(Field(json[1], "shared_token_hit_rate")), std::stod(Field(json[0], "shared_token_hit_rate")))
      << "the other node needed what a first node never found again";
  // The remote tier's bytes_written is the first in the JSON after "remote": {.
  auto remote_written = [](const std::string& j) {
    const std::string tier = j.substr(j.find("\"remote\": {\"hits\""));
    return std::stoull(Field(tier, "bytes_written"));
  };
  EXPECT_LT(remote_written(json[1]), remote_written(json[0]));
  EXPECT_EQ(Field(json[2], "remote_write_rate"), "1024");
  EXPECT_LE(remote_written(json[2]), remote_written(json[1])) << "rate: second_hit's rules within a cap";
}

// Without the remote admission options the reports are those of before
// them; --remote-admission all (the replay's default) changes no figure.
TEST_F(ReplayCliTest, WithoutRemoteAdmissionTheReportsAreUnchanged) {
  const std::string trace = Write("c.jsonl", ConversationTrace());
  std::string json[2], text[2];
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> argv = {
        KVTIER_TOOL_PATH,    "replay",      "--trace",    trace,
        "--block-tokens",    "4",           "--capacity", "host=10blk,nvme=64KiB,remote=24blk",
        "--bytes-per-token", "2",           "--nodes",    "2",
        "--router",          "round_robin", "--json",     dir_ + "/d" + std::to_string(i) + ".json"};
    if (i == 1) argv.insert(argv.end(), {"--remote-admission", "all"});
    CommandResult r = RunCommand(argv);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    text[i] = r.output;
    json[i] = Read(dir_ + "/d" + std::to_string(i) + ".json");
  }
  EXPECT_EQ(json[0].find("remote_admission"), std::string::npos) << json[0];
  EXPECT_EQ(text[0].find("remote admission"), std::string::npos) << text[0];
  EXPECT_EQ(text[0].find("remote_written"), std::string::npos) << text[0];
  const std::regex fields(", \"remote_admission\": .*?(?=, \"not_kept\")");
  const std::regex wall("\"wall_seconds\": [0-9.e+-]+");
  EXPECT_EQ(std::regex_replace(std::regex_replace(json[1], fields, ""), wall, ""),
            std::regex_replace(json[0], wall, ""));
  EXPECT_NE(json[0].find("\"remote\": {\"hits\": "), std::string::npos);
}

TEST_F(ReplayCliTest, BadRemoteAdmissionsExitTwoNamingTheOption) {
  const std::string trace = Write("c.jsonl", ConversationTrace());
  struct Case {
    std::vector<std::string> args;
    std::string named;
  };
  const std::vector<Case> cases = {
      {{"--capacity", "host=4blk,remote=inf", "--bytes-per-token", "1", "--remote-admission", "lru"},
       "--remote-admission 'lru'"},
      {{"--capacity", "host=4blk", "--remote-admission", "second_hit"}, "give remote=CAP"},
      {{"--capacity", "host=4blk,remote=inf", "--remote-admission", "rate"}, "--bytes-per-token"},
      {{"--capacity", "host=4blk,remote=inf", "--bytes-per-token", "1", "--remote-admission", "rate",
        "--remote-write-rate", "0"},
       "--remote-write-rate '0'"},
      {{"--capacity", "host=4blk,remote=inf", "--bytes-per-token", "1", "--remote-admission", "rate",
        "--remote-write-rate", "fast"},
       "--remote-write-rate 'fast'"},
      {{"--capacity", "host=4blk,remote=inf", "--bytes-per-token", "1", "--remote-write-rate", "1GiB"},
       "give --remote-admission rate"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {KVTIER_TOOL_PATH, "replay", "--trace", trace, "--block-tokens", "4"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << c.named << ": " << r.output;
    EXPECT_NE(r.output.find(c.named), std::string::npos) << r.output;
  }
}

TEST_F(ReplayCliTest, BadInputExitsTwoNamingTheFileAndLine) {
  const std::string bad = Write("bad.jsonl",
                                "{\"timestamp\": 0, \"input_length\": 4, \"hash_ids\": [1]}\n"
                                "{\"timestamp\": 1, \"input_length\": -4, \"hash_ids\": [1]}\n");
  CommandResult r = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", bad, "--capacity", "host=inf"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(bad + ":2:"), std::string::npos) << r.output;
  const std::string good = Write("good.jsonl", SmallTrace());
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--capacity", "host=12parsecs"},
                                               {"--capacity", "host=1e6tok", "--bogus"},
                                               {"--capacity", "host=1e6tok", "--policy", "arc"},
                                               {"--capacity", "disk=1e6tok"},
                                               {"--capacity", "host=64GiB"},
                                               {"--capacity", "host=inf", "--warmup", "1.5"}}) {
    std::vector<std::string> argv = {KVTIER_TOOL_PATH, "replay", "--trace", good};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult c = RunCommand(argv);
    EXPECT_EQ(c.exit_code, 2) << args.back() << ": " << c.output;
  }
  CommandResult missing = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", dir_ + "/none", "--capacity", "host=inf"});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  // Raw ShareGPT JSON: exit 2 with the conversion to run.
  const std::string raw = Write("raw.json", "[{\"id\": \"a\", \"messages\": []}]");
  CommandResult unconverted = RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", raw, "--capacity", "host=inf"});
  EXPECT_EQ(unconverted.exit_code, 2);
  EXPECT_NE(unconverted.output.find("sharegpt_convert"), std::string::npos) << unconverted.output;
  // --format sharegpt wants the converted form: a line without "session" is named.
  CommandResult no_session =
      RunCommand({KVTIER_TOOL_PATH, "replay", "--trace", good, "--format", "sharegpt", "--capacity", "host=inf"});
  EXPECT_EQ(no_session.exit_code, 2);
  EXPECT_NE(no_session.output.find(good + ":1: missing field \"session\""), std::string::npos) << no_session.output;
  CommandResult converted =
      RunCommand({KVTIER_TOOL_PATH, "replay", "--trace",
                  std::string(KVTIER_SOURCE_DIR) + "/tests/data/replay/sharegpt_conv_128_mt4_8.b64.jsonl", "--format",
                  "sharegpt", "--block-tokens", "64", "--capacity", "host=inf"});
  EXPECT_EQ(converted.exit_code, 0) << converted.output;
}

}  // namespace
}  // namespace kvtier::testing
