// The load board: the completion words of one layer-wise load
// (Client::BeginLoad), which kvtierd writes and the client reads, so that
// waiting for a layer that is already in place is a memory read, never a
// round trip.
//
// Format (version 2): a LoadBoardHeader (64 bytes), then `blocks`
// LoadBoardBlock (16 bytes each), in an extent of the host arena that the
// daemon allocates per load and frees once the client ended the load and no
// read of it is in flight (the client stops reading it at EndLoad).
// Version 3 (a load that verifies, BeginLoadRequest.verify) appends the
// layer checksum table: `blocks` x `layers` u64, block-major, the xxh3-64
// of layer l of block i at [i * layers + l].
//
// Protocol:
// - Block i's bytes are the arena range [offset, offset + layers *
//   layer_bytes), layer-major. The daemon writes `offset` before it counts
//   any layer of the block as in place.
// - `layers_ready` = n means: layers [0, n) are in place in every block
//   that has not failed. It only grows; the daemon stores it (release) after
//   the bytes and offsets it covers. A reader loads it (acquire) and may
//   then read those layers and offsets. It reaches `layers` only once
//   every block is in a final state (`resolved` == `blocks`).
// - A block's `state` goes from kLoading to kLoaded (every layer in place,
//   the block pinned for the load) or kFailed, with `code` (a StatusCode)
//   written before it. A failed block's layers are never in place: its
//   bytes must not be used, also those of layers below `layers_ready` (a
//   block can fail after some of its layers landed).
// - kInDevice (version 2): the block is not in the arena but in the
//   daemon's device pool (the HBM tier, mapped by the client over CUDA
//   IPC), whole, at `offset` there; it is final like kLoaded and counts as
//   every layer in place. Only loads that asked for it (the client mapped
//   the pool) see it; the daemon holds the range until the load ends.
// - Version 3: the daemon writes the checksum of layer l of block i before
//   that layer counts as in place (so layers_ready's release covers it),
//   and before a block's kLoaded state.
// - `resolved` counts blocks in a final state; when it equals `blocks`
//   (and layers_ready == layers, or every block failed) the load is over.
// - Wake-ups: `layers_ready` is a futex word (FUTEX_WAIT on the shared
//   mapping, not process-private). A reader about to sleep increments
//   `sleepers`, re-checks `layers_ready`, sleeps, decrements; the daemon
//   stores `layers_ready`, then wakes only when `sleepers` is non-zero (both
//   sides sequentially consistent, so no wake-up is lost).
//
// The client can write its arena mapping, so it can scribble on its own
// board: the daemon never reads the board back (it keeps its own state).
// For the same reason the checksum table guards a block's bytes against
// stray or hostile writes to them, not against a writer that rewrites the
// table too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "kvtier/status.h"

namespace kvtier {

inline constexpr uint32_t kLoadBoardVersion = 2;
inline constexpr uint32_t kLoadBoardChecksumsVersion = 3;  // with the layer checksum table

struct LoadBoardHeader {
  std::atomic<uint32_t> layers_ready{0};  // the futex word
  std::atomic<uint32_t> sleepers{0};
  std::atomic<uint32_t> resolved{0};
  uint32_t version = 0;
  uint32_t blocks = 0;
  uint32_t layers = 0;
  uint64_t layer_bytes = 0;
  uint64_t reserved[4] = {};
};
static_assert(sizeof(LoadBoardHeader) == 64);

enum class BoardBlockState : uint32_t { kLoading = 0, kLoaded = 1, kFailed = 2, kInDevice = 3 };

struct LoadBoardBlock {
  std::atomic<uint32_t> state{0};  // a BoardBlockState
  std::atomic<uint32_t> code{0};   // StatusCode of a failure
  std::atomic<uint64_t> offset{0};
};
static_assert(sizeof(LoadBoardBlock) == 16);
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

// `checksum_layers` > 0: with the checksum table of that many layers a block.
constexpr size_t LoadBoardBytes(uint32_t blocks, uint32_t checksum_layers = 0) {
  return sizeof(LoadBoardHeader) + size_t{blocks} * sizeof(LoadBoardBlock) +
         size_t{blocks} * checksum_layers * sizeof(uint64_t);
}

// The daemon's side. `memory` is the board's extent (at least
// LoadBoardBytes(blocks), 8-byte aligned) in the daemon's arena mapping.
// Not thread-safe: the caller serializes calls (the load's own mutex).
class LoadBoardWriter {
 public:
  LoadBoardWriter() = default;
  // Formats the board: nothing loaded, nothing ready; with `checksums`,
  // version 3 with its table (LoadBoardBytes(blocks, layers) bytes).
  LoadBoardWriter(std::byte* memory, uint32_t blocks, uint32_t layers, uint64_t layer_bytes, bool checksums = false);

  bool has_checksums() const { return checksums_ != nullptr; }
  // Version 3: the checksum of `layer` of `block` (before it counts).
  void SetLayerChecksum(uint32_t block, uint32_t layer, uint64_t checksum);
  void SetOffset(uint32_t block, uint64_t offset);
  void SetLoaded(uint32_t block);
  // The block is whole in the device pool at `offset` (resolved).
  void SetInDevice(uint32_t block, uint64_t offset);
  void SetFailed(uint32_t block, StatusCode code);
  // Publishes layers_ready = `layers` (only grows) and wakes sleepers.
  void PublishLayers(uint32_t layers);

 private:
  LoadBoardHeader* header_ = nullptr;
  LoadBoardBlock* blocks_ = nullptr;
  std::atomic<uint64_t>* checksums_ = nullptr;  // version 3's table
  uint32_t layers_ = 0;
};

// The client's side, over its own arena mapping of the board. Checks the
// header against what the daemon's answer said. Thread-safe (reads only,
// and the sleepers count).
class LoadBoardReader {
 public:
  LoadBoardReader() = default;
  // `checksum_layers` > 0: the board has the checksum table (version 3).
  LoadBoardReader(std::byte* memory, uint32_t blocks, uint32_t checksum_layers = 0);

  uint32_t layers_ready() const { return header()->layers_ready.load(std::memory_order_acquire); }
  uint32_t resolved() const { return header()->resolved.load(std::memory_order_acquire); }
  BoardBlockState state(uint32_t block) const {
    return static_cast<BoardBlockState>(blocks_[block].state.load(std::memory_order_acquire));
  }
  StatusCode code(uint32_t block) const {
    return static_cast<StatusCode>(blocks_[block].code.load(std::memory_order_acquire));
  }
  uint64_t offset(uint32_t block) const { return blocks_[block].offset.load(std::memory_order_acquire); }
  // Version 3: the checksum of `layer` of `block`, valid once the layer is
  // in place (layers_ready > layer, or the block kLoaded).
  uint64_t layer_checksum(uint32_t block, uint32_t layer) const {
    return checksums_[size_t{block} * layers_ + layer].load(std::memory_order_relaxed);
  }

  // Waits until layers_ready > `layer` or `deadline` passes (false then):
  // spins for `spin` first, then sleeps on the futex in slices of at most
  // `slice`, so the caller can check its connection between them (returns
  // false at the end of each slice as well; call again).
  bool WaitBeyond(uint32_t layer, std::chrono::steady_clock::time_point deadline, std::chrono::microseconds spin,
                  std::chrono::microseconds slice) const;

 private:
  LoadBoardHeader* header() const { return header_; }
  LoadBoardHeader* header_ = nullptr;  // mutable words in shared memory
  const LoadBoardBlock* blocks_ = nullptr;
  const std::atomic<uint64_t>* checksums_ = nullptr;
  uint32_t layers_ = 0;
};

}  // namespace kvtier
