// Block traces for `kvtier replay` (docs/REPLAY.md): the Mooncake JSONL form
// (one request per line: timestamp in ms, input_length and output_length in
// tokens, hash_ids of prefix-chained blocks, the last one partial; an
// optional "session", the conversation). Other sources (ShareGPT) are
// converted into this form first (tools/trace/sharegpt_convert).
//
// Reading checks every line and stops at the first bad one with an error
// "FILE:LINE: what" (InvalidArgument): malformed JSON, a missing or
// mistyped field, a negative or fractional number, more hash_ids than
// input_length covers, a "session" of 2^48 or more (or of 0 in the
// converted ShareGPT form, where every line names its conversation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier::tools {

struct TraceRequest {
  uint64_t arrival_us = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t session = 0;  // the conversation ("session", converted ShareGPT), 0: none
  // The prompt's blocks, root first; block i holds
  // min(block_tokens, input_tokens - block_tokens * i) tokens.
  std::vector<BlockKey> blocks;
};

struct Trace {
  std::string path;
  uint32_t block_tokens = 512;
  std::vector<TraceRequest> requests;  // file order
};

// Reads a Mooncake-form JSONL file. Block ids are namespaced by
// `trace_index` (ids of different files never collide).
// `require_session`: the converted ShareGPT form, where every line names
// its conversation ("session"); a line without one is an error.
Result<Trace> ReadMooncakeTrace(const std::string& path, uint32_t block_tokens, uint64_t trace_index,
                                bool require_session = false);

// Tokens held by block `i` of `r`.
inline uint64_t BlockTokens(const TraceRequest& r, size_t i, uint32_t block_tokens) {
  const uint64_t before = uint64_t{block_tokens} * i;
  return r.input_tokens > before ? std::min<uint64_t>(block_tokens, r.input_tokens - before) : 0;
}

}  // namespace kvtier::tools
