#include "common/load_board.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <thread>

namespace kvtier {
namespace {

// Shared futexes (no FUTEX_PRIVATE_FLAG): the word lives in a MAP_SHARED
// mapping of a memfd that two processes map.
void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace

LoadBoardWriter::LoadBoardWriter(std::byte* memory, uint32_t blocks, uint32_t layers, uint64_t layer_bytes,
                                 bool checksums) {
  header_ = new (memory) LoadBoardHeader;
  header_->version = checksums ? kLoadBoardChecksumsVersion : kLoadBoardVersion;
  header_->blocks = blocks;
  header_->layers = layers;
  header_->layer_bytes = layer_bytes;
  blocks_ = reinterpret_cast<LoadBoardBlock*>(memory + sizeof(LoadBoardHeader));
  for (uint32_t i = 0; i < blocks; ++i) new (&blocks_[i]) LoadBoardBlock;
  if (checksums) {
    layers_ = layers;
    checksums_ = reinterpret_cast<std::atomic<uint64_t>*>(memory + LoadBoardBytes(blocks));
    for (size_t i = 0; i < size_t{blocks} * layers; ++i) new (&checksums_[i]) std::atomic<uint64_t>(0);
  }
  std::atomic_thread_fence(std::memory_order_release);
}

void LoadBoardWriter::SetLayerChecksum(uint32_t block, uint32_t layer, uint64_t checksum) {
  // Published by the release store that makes the layer count (layers_ready
  // or the block's state).
  checksums_[size_t{block} * layers_ + layer].store(checksum, std::memory_order_relaxed);
}

void LoadBoardWriter::SetOffset(uint32_t block, uint64_t offset) {
  blocks_[block].offset.store(offset, std::memory_order_release);
}

void LoadBoardWriter::SetLoaded(uint32_t block) {
  blocks_[block].state.store(static_cast<uint32_t>(BoardBlockState::kLoaded), std::memory_order_release);
  header_->resolved.fetch_add(1, std::memory_order_acq_rel);
}

void LoadBoardWriter::SetInDevice(uint32_t block, uint64_t offset) {
  blocks_[block].offset.store(offset, std::memory_order_release);
  blocks_[block].state.store(static_cast<uint32_t>(BoardBlockState::kInDevice), std::memory_order_release);
  header_->resolved.fetch_add(1, std::memory_order_acq_rel);
}

void LoadBoardWriter::SetFailed(uint32_t block, StatusCode code) {
  blocks_[block].code.store(static_cast<uint32_t>(code), std::memory_order_release);
  blocks_[block].state.store(static_cast<uint32_t>(BoardBlockState::kFailed), std::memory_order_release);
  header_->resolved.fetch_add(1, std::memory_order_acq_rel);
}

void LoadBoardWriter::PublishLayers(uint32_t layers) {
  header_->layers_ready.store(layers, std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&header_->layers_ready);
}

LoadBoardReader::LoadBoardReader(std::byte* memory, uint32_t blocks, uint32_t checksum_layers)
    : header_(reinterpret_cast<LoadBoardHeader*>(memory)),
      blocks_(reinterpret_cast<const LoadBoardBlock*>(memory + sizeof(LoadBoardHeader))),
      layers_(checksum_layers) {
  if (checksum_layers > 0) checksums_ = reinterpret_cast<const std::atomic<uint64_t>*>(memory + LoadBoardBytes(blocks));
}

bool LoadBoardReader::WaitBeyond(uint32_t layer, std::chrono::steady_clock::time_point deadline,
                                 std::chrono::microseconds spin, std::chrono::microseconds slice) const {
  auto ready = [&] { return layers_ready() > layer; };
  if (ready()) return true;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < spin) {
    if (ready()) return true;
    std::this_thread::yield();
  }
  const auto now = std::chrono::steady_clock::now();
  if (now >= deadline) return ready();
  const auto timeout = std::min<std::chrono::nanoseconds>(deadline - now, slice);
  header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t seen = header_->layers_ready.load(std::memory_order_seq_cst);
  if (seen <= layer) FutexWait(&header_->layers_ready, seen, timeout);
  header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return ready();
}

}  // namespace kvtier
