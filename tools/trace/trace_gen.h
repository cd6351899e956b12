// `kvtier trace gen multi-round-qa`: a synthetic block trace of the
// multi-round QA benchmark KV-cache projects use (LMCache's
// benchmarks/multi-round-qa), written in the JSONL form `kvtier replay`
// reads (docs/REPLAY.md, "Generated traces").
//
// The workload: `users` users, each asking `rounds` questions. Round k
// (1-based) of user u sends
//   shared system prompt (system_tokens, identical for every user)
//   + the user's own history (history_tokens, LMCache's user history prompt)
//   + questions 1..k-1 and their answers + question k,
// so input_length = system + history + k x question + (k-1) x answer and
// output_length = answer: the answer becomes part of the next round's prompt
// and the chain grows.
//
// Blocks: the prompt is cut into block_tokens pieces, the last one partial,
// len(hash_ids) == ceil(input_length / block_tokens). A block's identity is
// its parent's id and its content: which text it covers (the system prompt,
// or user u's conversation) and where (first token, length). Two prompts
// share a block id iff their tokens up to and including that block are
// identical, so every user shares the blocks wholly inside the system
// prompt, a user's rounds share their common prefix, and a partial block
// that later grows is a new block. Ids are numbered 0, 1, 2... by first
// appearance in the output (like the Mooncake release).
//
// Time: round k+1 of a user arrives a think time after round k (the think
// time covers the answer's generation and the user's reading and typing;
// `think` = "exp": exponential with mean think_s, "fixed": exactly think_s).
// User u starts at u x g with g = rounds / qps: each start brings `rounds`
// requests, so once the first user's session is over (and until the last
// user starts) the aggregate rate is qps, as in LMCache's benchmark, where
// users join at a steady pace. The run ramps up over the first session
// length, (rounds - 1) x think_s on average, and down over the last, so its
// average (requests over first to last arrival) is somewhat below qps; the
// command prints both. A target above what all users together can send,
// users x rounds / ((rounds - 1) x think_s) (their sessions would end before
// enough users have started), is an error. With one user there is no
// stagger: the rate is set by the think time and qps is unused.
//
// Randomness: std::mt19937_64 seeded with `seed` (its output is fixed by the
// C++ standard) and exponentials by inversion, so a seed gives the same
// output byte for byte. Not thread-safe; no shared state.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/result.h"

namespace kvtier::tools {

struct MultiRoundQaOptions {
  uint32_t users = 10;             // >= 1
  uint32_t rounds = 5;             // >= 1
  double qps = 0.5;                // > 0: the aggregate request rate once users overlap
  uint64_t system_tokens = 1000;   // the shared system prompt; may be 0
  uint64_t history_tokens = 2000;  // each user's own context before round 1; may be 0
  uint64_t question_tokens = 100;  // >= 1
  uint64_t answer_tokens = 100;    // output_length of every round; may be 0
  double think_s = 10;             // >= 0: mean (exp) or exact (fixed) seconds between a user's rounds
  std::string think = "exp";       // exp | fixed
  uint32_t block_tokens = 512;     // >= 1
  uint64_t seed = 1;
  std::string out_path;  // required by the command
};

// One request of a generated trace, the fields of a JSONL line.
struct GeneratedRequest {
  uint64_t timestamp_ms = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t session = 0;  // user + 1 (0 means "none" in the trace form)
  uint64_t turn = 0;     // the round, 1-based
  std::vector<uint64_t> hash_ids;
};

struct GeneratedTrace {
  std::vector<GeneratedRequest> requests;  // by timestamp, ties by session then turn
  uint64_t distinct_blocks = 0;
  double user_start_gap_s = 0;  // g above
};

// Generates the trace. InvalidArgument naming the option for a value out
// of bounds, or a qps the users cannot reach together (the message gives
// the highest rate they allow).
Result<GeneratedTrace> GenerateMultiRoundQa(const MultiRoundQaOptions& options);

// The JSONL line of `r` (no newline), the form tools/trace/sharegpt_convert writes:
// {"timestamp":..,"input_length":..,"output_length":..,"hash_ids":[..],"session":..,"turn":..}
std::string TraceJsonLine(const GeneratedRequest& r);

// Registers the options of `kvtier trace gen multi-round-qa` on `app`, each
// with its default in --help. `options` must outlive parsing.
void AddMultiRoundQaOptions(CLI::App& app, MultiRoundQaOptions& options);

// Runs the command: generates, writes --out, prints a summary. Exit codes:
// 0 done; 2 a bad value (the message names the option); 1 --out could not
// be written.
int RunMultiRoundQa(const MultiRoundQaOptions& options);

}  // namespace kvtier::tools
