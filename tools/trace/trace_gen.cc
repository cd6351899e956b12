#include "tools/trace/trace_gen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <tuple>

namespace kvtier::tools {
namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status Validate(const MultiRoundQaOptions& o) {
  if (o.users < 1) return InvalidArgument("--users must be at least 1");
  if (o.rounds < 1) return InvalidArgument("--rounds must be at least 1");
  if (!(o.qps > 0) || !std::isfinite(o.qps)) return InvalidArgument("--qps must be above 0, got " + Num(o.qps));
  if (o.question_tokens < 1) return InvalidArgument("--question-tokens must be at least 1 (a round asks something)");
  if (!(o.think_s >= 0) || !std::isfinite(o.think_s)) {
    return InvalidArgument("--think-s must be 0 or more, got " + Num(o.think_s));
  }
  if (o.think != "exp" && o.think != "fixed")
    return InvalidArgument("--think must be exp or fixed, got '" + o.think + "'");
  if (o.block_tokens < 1) return InvalidArgument("--block-tokens must be at least 1");
  // The longest prompt must fit the trace form's numbers with room to spare.
  const long double longest = (long double)o.system_tokens + o.history_tokens +
                              (long double)o.rounds * o.question_tokens + (long double)(o.rounds - 1) * o.answer_tokens;
  if (longest > 1e15L)
    return InvalidArgument("the longest prompt would exceed 1e15 tokens: lower the lengths or --rounds");
  if ((long double)o.users * o.rounds > 1e9L) return InvalidArgument("--users x --rounds must be at most 1e9");
  return Status::Ok();
}

// A uniform double in [0, 1) from 53 bits of the generator.
double Uniform(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

// Seconds from each user's first round to each of its rounds, drawn user by
// user, round by round.
std::vector<std::vector<double>> DrawOffsets(const MultiRoundQaOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<double>> offsets(o.users, std::vector<double>(o.rounds, 0.0));
  for (auto& user : offsets) {
    for (uint32_t k = 1; k < o.rounds; ++k) {
      const double think = o.think == "fixed" ? o.think_s : -std::log1p(-Uniform(rng)) * o.think_s;
      user[k] = user[k - 1] + think;
    }
  }
  return offsets;
}

// The stagger g of trace_gen.h, or InvalidArgument when the users'
// sessions end before enough of them have started to reach qps.
Result<double> StartGap(const MultiRoundQaOptions& o) {
  if (o.users < 2) return 0.0;
  const double session_s = double(o.rounds - 1) * o.think_s;               // mean
  const double most_qps = double(o.users) * double(o.rounds) / session_s;  // inf when session_s is 0
  if (o.qps > most_qps) {
    return InvalidArgument("--qps " + Num(o.qps) + " is never reached: " + std::to_string(o.users) +
                           " users whose sessions last " + Num(session_s) + " s on average (--rounds " +
                           std::to_string(o.rounds) + ", --think-s " + Num(o.think_s) + ") send at most " +
                           Num(most_qps) + " requests/s together; lower --qps or --think-s, or raise --users");
  }
  return double(o.rounds) / o.qps;
}

// Block ids by (parent id, content identity); ids by first appearance.
class BlockNumbering {
 public:
  // The block ids of a prompt of `input_tokens` tokens from `user` (0-based).
  std::vector<uint64_t> Chain(const MultiRoundQaOptions& o, uint64_t user, uint64_t input_tokens) {
    std::vector<uint64_t> ids;
    uint64_t parent = kNoParent;
    for (uint64_t start = 0; start < input_tokens; start += o.block_tokens) {
      const uint64_t len = std::min<uint64_t>(o.block_tokens, input_tokens - start);
      // Whose text the block holds: the shared system prompt (0) only when
      // it lies wholly inside it; else user + 1's conversation.
      const uint64_t owner = start + len <= o.system_tokens ? 0 : user + 1;
      auto [it, inserted] = ids_.try_emplace(Key{parent, owner, start, len}, ids_.size());
      ids.push_back(it->second);
      parent = it->second;
    }
    return ids;
  }
  uint64_t size() const { return ids_.size(); }

 private:
  static constexpr uint64_t kNoParent = UINT64_MAX;
  using Key = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>;  // parent, owner, first token, tokens
  std::map<Key, uint64_t> ids_;
};

}  // namespace

Result<GeneratedTrace> GenerateMultiRoundQa(const MultiRoundQaOptions& o) {
  if (Status s = Validate(o); !s.ok()) return s;
  auto gap = StartGap(o);
  if (!gap.ok()) return gap.status();
  const auto offsets = DrawOffsets(o);
  GeneratedTrace trace;
  trace.user_start_gap_s = *gap;
  trace.requests.reserve(size_t(o.users) * o.rounds);
  for (uint32_t u = 0; u < o.users; ++u) {
    for (uint32_t k = 1; k <= o.rounds; ++k) {
      GeneratedRequest r;
      const double arrival_s = double(u) * *gap + offsets[u][k - 1];
      r.timestamp_ms = static_cast<uint64_t>(std::floor(arrival_s * 1000));
      r.input_tokens =
          o.system_tokens + o.history_tokens + uint64_t{k} * o.question_tokens + uint64_t{k - 1} * o.answer_tokens;
      r.output_tokens = o.answer_tokens;
      r.session = u + 1;
      r.turn = k;
      trace.requests.push_back(std::move(r));
    }
  }
  std::sort(trace.requests.begin(), trace.requests.end(), [](const GeneratedRequest& a, const GeneratedRequest& b) {
    return std::tie(a.timestamp_ms, a.session, a.turn) < std::tie(b.timestamp_ms, b.session, b.turn);
  });
  BlockNumbering numbering;
  for (GeneratedRequest& r : trace.requests) r.hash_ids = numbering.Chain(o, r.session - 1, r.input_tokens);
  trace.distinct_blocks = numbering.size();
  return trace;
}

std::string TraceJsonLine(const GeneratedRequest& r) {
  std::string line = "{\"timestamp\":" + std::to_string(r.timestamp_ms) +
                     ",\"input_length\":" + std::to_string(r.input_tokens) +
                     ",\"output_length\":" + std::to_string(r.output_tokens) + ",\"hash_ids\":[";
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    if (i > 0) line += ',';
    line += std::to_string(r.hash_ids[i]);
  }
  line += "],\"session\":" + std::to_string(r.session) + ",\"turn\":" + std::to_string(r.turn) + "}";
  return line;
}

void AddMultiRoundQaOptions(CLI::App& app, MultiRoundQaOptions& o) {
  app.add_option("--out", o.out_path, "Write the JSONL trace here")->required();
  app.add_option("--users", o.users, "Users (sessions), >= 1")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds (questions) per user, >= 1")->capture_default_str();
  app.add_option("--qps", o.qps, "Requests/s once users overlap, > 0: user u starts at u x rounds / qps s")
      ->capture_default_str();
  app.add_option("--system-tokens", o.system_tokens, "Shared system prompt, the same for every user (tokens)")
      ->capture_default_str();
  app.add_option("--history-tokens", o.history_tokens, "Each user's own context before round 1 (tokens)")
      ->capture_default_str();
  app.add_option("--question-tokens", o.question_tokens, "Tokens per question, >= 1")->capture_default_str();
  app.add_option("--answer-tokens", o.answer_tokens,
                 "Tokens per answer (output_length; part of the next round's prompt)")
      ->capture_default_str();
  app.add_option("--think", o.think, "Time between a user's rounds: exp (exponential, mean --think-s) | fixed")
      ->capture_default_str();
  app.add_option("--think-s", o.think_s, "Mean (exp) or exact (fixed) seconds between a user's rounds, >= 0")
      ->capture_default_str();
  app.add_option("--block-tokens", o.block_tokens, "Tokens per block (give replay the same --block-tokens)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Random seed: the same seed gives the same file byte for byte")
      ->capture_default_str();
}

int RunMultiRoundQa(const MultiRoundQaOptions& o) {
  auto trace = GenerateMultiRoundQa(o);
  if (!trace.ok()) {
    std::fprintf(stderr, "kvtier trace gen multi-round-qa: %s\n", trace.status().message().c_str());
    return 2;
  }
  if (o.users == 1 && o.rounds > 1) {
    std::fprintf(stderr, "kvtier trace gen multi-round-qa: one user: the rate is set by --think-s, --qps is unused\n");
  }
  std::ofstream out(o.out_path, std::ios::binary);
  for (const GeneratedRequest& r : trace->requests) out << TraceJsonLine(r) << '\n';
  out.close();
  if (!out) {
    std::fprintf(stderr, "kvtier trace gen multi-round-qa: cannot write %s\n", o.out_path.c_str());
    return 1;
  }
  const auto& rs = trace->requests;
  const double span_s = rs.empty() ? 0 : double(rs.back().timestamp_ms - rs.front().timestamp_ms) / 1000;
  std::printf(
      "%zu requests (%u users x %u rounds), %llu distinct blocks of %u tokens; users start every %.3f s "
      "(%.3f requests/s once they overlap); first to last arrival %.3f s (%.3f requests/s on average): %s\n",
      rs.size(), o.users, o.rounds, static_cast<unsigned long long>(trace->distinct_blocks), o.block_tokens,
      trace->user_start_gap_s, trace->user_start_gap_s > 0 ? double(o.rounds) / trace->user_start_gap_s : 0.0, span_s,
      span_s > 0 ? double(rs.size() - 1) / span_s : 0.0, o.out_path.c_str());
  return 0;
}

}  // namespace kvtier::tools
