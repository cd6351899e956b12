// The Engine's value types: its options, what its calls answer (grants,
// lookups, layer spans), and how a tier below the host is stacked. Split
// from engine.h so that callers and the engine's parts can name them
// without the Engine class.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/engine/lease_table.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/status.h"
#include "policy/dwpd_budget.h"
#include "policy/option_defaults.h"
#include "policy/policy_registry.h"
#include "tiers/tier.h"

namespace kvtier {

class BlockEvents;  // daemon/engine/block_events.h

using ConnectionId = uint64_t;  // also in daemon/engine/block_entry.h
// The connection the host tier's BlockTier face (HostBlockTier) reserves
// and pins under; the server numbers its connections from 1 upwards.
constexpr ConnectionId kHostTierConnection = ~ConnectionId{0};
// The connection operator holds (Engine::Hold, `kvtier pin`) pin under; no
// client connection ever gets it.
constexpr ConnectionId kHoldConnection = ~ConnectionId{0} - 1;

struct EngineOptions {
  uint32_t shards = defaults::kEngineShards;  // 1..256
  // The host tier's eviction policy (kvtierd: engine.eviction).
  EvictionPolicyId eviction = EvictionPolicyId::kLru;
  // For Create with one tier below the host: which evicted blocks it gets
  // (kDwpd: then `dwpd` must validate).
  AdmissionPolicyId admission = AdmissionPolicyId::kAll;
  DwpdOptions dwpd;
  // queue_aware: a victim some queued request needs within this window is
  // demoted to the first tier below whatever its class, as long as that
  // tier's write budget (if any) can pay for it; past the budget it goes
  // through admission like any other block.
  uint64_t lookahead_us = defaults::kLookaheadMs * 1000;
  // Prefetch (queue hints + a tier below): lower-tier prefix blocks of
  // queued requests are read into the host tier before their start, at
  // most this share of the host capacity per plan, skipping hits shorter
  // than prefetch_min_blocks. 0 turns prefetch off.
  double prefetch_share = defaults::kPrefetchPercent / 100.0;
  uint32_t prefetch_min_blocks = defaults::kPrefetchMinBlocks;
  // Queue hints one connection may hold at once: requests, and chain keys
  // over all of them. Past either, that connection's Enqueue is Busy;
  // other connections are unaffected.
  // Layer-range reads of blocks below the host tier land in transient arena
  // space held by their lease: at most this share of the host capacity at
  // once (more: Busy for that key), so layer reads never push the host
  // tier's blocks out beyond it.
  double layer_read_share = 0.125;
  // Demotions a busy tier below cannot take at once wait, copied out of
  // the arena, in the demoter (a mover thread) for room there: at most
  // this many bytes. Past it, such a victim is dropped (counted).
  uint64_t demotion_buffer_bytes = defaults::kDemotionBufferBytes;
  size_t max_queued_requests_per_connection = 8192;
  size_t max_queued_keys_per_connection = size_t{1} << 20;
  // Commit hashes every block even when the client sent its checksum, and
  // fails a block whose bytes do not match (host.verify_commits). Off: a
  // client's checksum is recorded as sent (one pass less over the bytes);
  // demotion and verifying readers still check the bytes against it.
  bool verify_commits = defaults::kVerifyCommits;
  // Where block events go (block_events.h: KV events); null: nowhere.
  // Borrowed: outlives the engine.
  BlockEvents* events = nullptr;
};

// What a Reserve says of its keys' chain: with `chain` they are consecutive
// blocks of one prefix chain, root first (keys[i - 1] is keys[i]'s parent),
// and `parent`, if any, is keys[0]'s parent.
struct ReserveChain {
  bool chain = false;
  std::optional<BlockKey> parent;
};

struct SlotGrant {
  Status status;  // ok, AlreadyExists, NoSpace, InvalidArgument
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct PinGrant {
  Status status;  // ok or NotFound
  uint64_t offset = 0;
  uint64_t length = 0;
  LeaseId lease = 0;
  // The block's xxh3-64; for a layer range of a host block the whole
  // block's, which lies at [block_offset, block_offset + block_length) in
  // the arena (so a reader can verify the range within it); 0 for a layer
  // range read from below (only its layers are in the arena).
  uint64_t checksum = 0;
  uint64_t block_offset = 0;
  uint64_t block_length = 0;
  // The xxh3-64 of each layer granted: for a layer range, its layers (as
  // committed, or as the tier below verified them); for a whole block,
  // every layer's, only when the pin asked for them (a verifying load),
  // else empty. A block of one layer has its whole checksum as layer 0's.
  std::vector<uint64_t> layer_checksums;
};

// What a pin's caller gets once every key resolved: one grant per key.
using PinDone = std::function<void(std::vector<PinGrant>)>;

struct LookupOutcome {
  size_t prefix_blocks = 0;
  std::vector<Tier> tiers;
};

// A Lookup made a few keys at a time (Engine::LookupSome): what it found so
// far, where it goes on, and whether the tiers below were probed.
struct LookupCursor {
  LookupOutcome out;  // prefix_blocks is set once done
  size_t next = 0;    // the index of the next key to place
  bool probed = false;
  bool done = false;  // a key missed, or every key was placed
};

// How a namespace's blocks split into layers (from its descriptor).
struct NamespaceLayout {
  uint32_t layer_count = 1;
  uint64_t block_bytes = 0;  // bytes of a whole block
};

// Layers [first, last) of a block; {0, 0} means the whole block. A block is
// layer-major with its namespace's layer_count equal layers when it has the
// namespace's block size, else it is one layer.
struct LayerSpan {
  uint32_t first = 0;
  uint32_t last = 0;
  bool whole() const { return first == 0 && last == 0; }
};

// One tier under the host tier, as the engine's stack is built.
struct LowerTier {
  BlockTier* tier = nullptr;  // borrowed; outlives the Engine
  // Which blocks evicted from the tier above it takes (kDwpd: then `dwpd`
  // must validate; kRate: then `rate_bytes_per_second` must be positive).
  AdmissionPolicyId admission = AdmissionPolicyId::kAll;
  DwpdOptions dwpd;
  uint64_t rate_bytes_per_second = 0;
  // How Lookup, loads and preload plans name this place to clients
  // (include/kvtier/client.h's Tier): kNvme or kRemote. Tiers are known to
  // the engine by their place in the stack only; this is the answer's word
  // for it, which the registration (daemon/setup/tier_stack.cc) chooses.
  Tier reported = Tier::kNone;
};

// Namespaces and where their blocks are (Engine::NamespaceUses).
struct EngineTierUse {
  std::string tier;  // "hbm", "host", "nvme", ...: the stack, top first
  uint64_t blocks = 0;
  uint64_t bytes = 0;  // payload bytes
};
struct EngineNamespaceUse {
  NamespaceFingerprint ns;
  // Known when a client registered the namespace since this daemon
  // started (a namespace found only in a persistent tier is not).
  std::optional<NamespaceDescriptor> descriptor;
  std::vector<EngineTierUse> tiers;  // one per tier of the stack, top first
};

// How a layer-wise load is asked for (Engine::BeginLoad, Loader::Begin).
struct LoadFlags {
  // Blocks held in the tier above are handed out in place (loader.h).
  bool in_place = false;
  // The client verifies every layer: the board gets the layer checksums.
  bool verify = false;
  // > 0: microseconds from now until the load's deadline. A block below
  // the host tier that the ready estimate (ReadyEstimator::Late) says
  // cannot be in host memory by then fails at once with TimedOut and is
  // not read. 0: none.
  uint64_t deadline_us = 0;
};

// A layer-wise load as begun (Engine::BeginLoad).
struct EngineLoadStart {
  uint64_t load = 0;  // for EndLoad
  uint64_t board_offset = 0;
  uint64_t board_bytes = 0;
  uint32_t layers = 1;
  uint64_t layer_bytes = 0;
  // Per key: Ok (loading or loaded: see the board), or why it will not
  // load (NotFound, InvalidArgument: not a whole block, NoSpace...).
  std::vector<Status> blocks;
  // The slowest tier a block is read from (kHost: every block was a host
  // hit), and the bytes a layer reads from the tiers below.
  Tier source = Tier::kHost;
  uint64_t below_bytes_per_layer = 0;
  // With `verify`: per key settled at once (a host hit), its checksum and
  // its layers' (empty when its writer sent none: the reader checks it
  // whole); empty for the others (on the board when they land).
  struct BlockChecksums {
    bool settled = false;  // the block was settled at once; else nothing here
    uint64_t block = 0;
    std::vector<uint64_t> layers;
  };
  std::vector<BlockChecksums> layer_checksums;
};

// One key's outcome of an operator hold (Engine::Hold).
struct EngineHoldResult {
  // ok (held, or pending), NotFound (cached in no tier, or its namespace
  // was dropped meanwhile), NoSpace (no host room to read it into),
  // Busy (the tier below stayed busy), InvalidArgument (bad TTL).
  Status status;
  // ok but not yet held: the block is on its way into the host tier
  // (read from a tier below, or its demotion ends first); it is held from
  // when it lands, unless that read fails (engine.hold_failures).
  bool pending = false;
};

}  // namespace kvtier
