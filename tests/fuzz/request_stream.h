// The input format of request_handler_fuzz, shared with the seed writer
// (make_corpus.cc) so both read it the same way:
//
//   byte 0   flags (RequestStreamFlags)
//   then     frames as a client writes them on the socket: a u32
//            little-endian length and that many bytes of a serialized
//            kvtier.v1.Request. A length past the end takes what is left;
//            fewer than 4 bytes left end the stream. An empty frame is no
//            request: the connection's timer runs with every reservation
//            expired (RequestHandler::AbortExpiredReservations).
//            A lease below 2^16 in a Release is an index into the leases
//            the connection was granted (lease ids start at random).
//
// Header-only; the functions are pure.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/framing.h"
#include "kvtier/block_key.h"
#include "kvtier/v1/kvtier.pb.h"
#include "policy/policy_registry.h"

namespace kvtier::fuzz {

enum RequestStreamFlags : uint8_t {
  // No Hello is sent before the input's requests (they meet "send Hello
  // first", or the input says Hello itself).
  kSkipHello = 1 << 0,
  // A second, operator's connection (no engine, every tenant in view)
  // takes the requests with odd ids; the tenant's connection the others.
  kOperatorConnection = 1 << 1,
  // The tenant may register only model "fuzz/allowed" (not the Hello's).
  kModelAllowList = 1 << 2,
  // Bits 3..5: the engine's eviction policy, the registry's
  // (policy/policy_registry.h) row bits % 6.
  kEvictionShift = 3,
};

inline ::kvtier::EvictionPolicyId EvictionPolicy(uint8_t flags) {
  return ::kvtier::kEvictionPolicies[((flags >> kEvictionShift) & 7) % std::size(::kvtier::kEvictionPolicies)].id;
}

// The namespaces of the Hello the fuzzer sends first (indices 0 and 1):
// 4 KiB blocks of 4 layers (small, so that hashing and page faults do not
// dominate a run), two revisions of one model.
inline constexpr uint64_t kFuzzBlockBytes = 16 * 4 * 64;

inline std::vector<NamespaceDescriptor> FuzzNamespaces() {
  std::vector<NamespaceDescriptor> out;
  for (const char* revision : {"rev-1", "rev-2"}) {
    NamespaceDescriptor ns;
    ns.model_id = "fuzz/model";
    ns.model_revision = revision;
    ns.kv_dtype = "bf16";
    ns.block_tokens = 16;
    ns.layer_count = 4;
    ns.kv_layout = "layer_major_kv";
    ns.bytes_per_token_per_layer = 64;
    out.push_back(ns);
  }
  return out;
}

// One input: `flags`, then each request framed as on the socket.
inline std::string EncodeRequestStream(uint8_t flags, std::span<const v1::Request> requests) {
  std::string out(1, static_cast<char>(flags));
  for (const v1::Request& r : requests) {
    const std::string body = r.SerializeAsString();
    uint8_t header[kFrameHeaderBytes];
    EncodeFrameHeader(static_cast<uint32_t>(body.size()), header);
    out.append(reinterpret_cast<const char*>(header), kFrameHeaderBytes);
    out += body;
  }
  return out;
}

// The frame bodies of `frames` (the input after its flags byte), in order.
inline std::vector<std::span<const uint8_t>> SplitFrames(std::span<const uint8_t> frames) {
  std::vector<std::span<const uint8_t>> out;
  while (frames.size() >= kFrameHeaderBytes) {
    const size_t length = std::min<size_t>(DecodeFrameHeader(frames.data()), frames.size() - kFrameHeaderBytes);
    out.push_back(frames.subspan(kFrameHeaderBytes, length));
    frames = frames.subspan(kFrameHeaderBytes + length);
  }
  return out;
}

}  // namespace kvtier::fuzz
