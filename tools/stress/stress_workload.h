// One client thread of `kvtier stress` (stress.h): a mixed workload over
// the key space (stress_values.h) through its own kvtier::Client, every
// read checked against the bytes it must be.
//
// Per operation it picks a namespace, a chain (low-numbered chains are
// hotter, so some blocks are reused and others age out of the host tier)
// and a prefix of it, then one kind by weight (WorkloadMix). Outcomes: a
// read is ok (byte-exact), a miss (NotFound) or a violation (anything
// else that came back as data: other bytes, another key's, another
// layer's, a wrong length, a lookup that contradicts itself); NoSpace,
// Busy and AlreadyExists are refusals; any other status is an error,
// counted by kind and code (once the daemon was killed on purpose they are
// expected and counted apart).
//
// Not thread-safe: one thread runs a worker; `stop` and `killed` are
// written by another.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/result.h"
#include "tools/stress/stress_tally.h"
#include "tools/stress/stress_values.h"

namespace kvtier::tools {

// Relative weights of the kinds; 0 leaves a kind out.
struct WorkloadMix {
  std::array<uint32_t, kOpKinds> weights = {14, 8, 4, 20, 10, 14, 4, 8, 8, 10};
};
// "get=30,put=10": those weights replace the defaults (others keep theirs).
// InvalidArgument for an unknown kind, a bad number, or all weights 0.
Result<WorkloadMix> ParseMix(std::string_view text);
std::string MixToString(const WorkloadMix& mix);

class StressWorker {
 public:
  // `space`, `client`, `stop` and `killed` are borrowed for the worker's
  // life. `client` registered space.Descriptors() in that order.
  StressWorker(const KeySpace& space, Client& client, const WorkloadMix& mix, uint64_t seed, uint32_t index,
               const std::atomic<bool>& stop, const std::atomic<bool>& killed);

  // Records the keys of every Erase in the tally (StressTally::erased).
  void RecordErases() { record_erases_ = true; }

  // Runs operations until `stop` is set.
  void Run();
  // One operation of `kind` (tests, and Run).
  void RunOne(OpKind kind);

  const StressTally& tally() const { return tally_; }

 private:
  struct Pick {
    NamespaceId ns = 0;
    const StressNamespace* space = nullptr;
    std::span<const BlockKey> keys;  // a prefix of a chain, root first
    std::span<const BlockKey> chain;
  };
  Pick PickPrefix();
  // A buffer for block i of an operation, `bytes` long (<= the largest block + 4 KiB).
  std::span<std::byte> Buffer(size_t i, uint64_t bytes);
  // Counts one block's status as ok, miss, refusal or error.
  void Count(OpKind kind, const Status& status);
  void Error(OpKind kind, const Status& status);
  // A read's bytes (layers [first, last) of the key): ok or a violation.
  void CheckRead(OpKind kind, const Pick& pick, const BlockKey& key, uint32_t first, uint32_t last,
                 std::span<const std::byte> got);
  void Violate(OpKind kind, const Pick& pick, const BlockKey& key, std::string what);

  void Put();
  void Reserve();
  void Save();
  void Get();
  void PinViews();
  void Lookup();
  void Erase();
  void Load();
  void LoadCheck(const Pick& pick, LayerLoad& load, bool copy, std::span<const std::span<std::byte>> dst,
                 const std::vector<ValueCheck>& zero_copy_checks);
  void GetLayers();
  void Hint();
  void EraseKeys(const Pick& pick, std::span<const BlockKey> keys);

  const KeySpace& space_;
  Client& client_;
  const std::atomic<bool>& stop_;
  const std::atomic<bool>& killed_;
  std::discrete_distribution<size_t> kinds_;
  std::mt19937_64 rng_;
  uint32_t index_;
  StressTally tally_;
  std::vector<std::vector<std::byte>> buffers_;
  uint64_t buffer_bytes_ = 0;
  bool record_erases_ = false;
  uint64_t next_request_ = 1;
  std::deque<uint64_t> queued_;  // hint requests enqueued and not yet dequeued
};

// N workers, each on its own thread with its own Client, over one key
// space. Not thread-safe: one thread drives it.
class StressLoad {
 public:
  // Connects `clients` Clients to the daemon at `socket_path`, registering
  // space.Descriptors(); even-numbered ones read through the block
  // directory, odd ones through the socket. `space` is borrowed.
  static Result<std::unique_ptr<StressLoad>> Connect(const std::string& socket_path, const KeySpace& space,
                                                     uint32_t clients, bool reconnect);
  ~StressLoad();  // stops the workers

  // Starts one worker per client (seeded from `seed`); with
  // `record_erases`, they record the keys they erase (StressTally::erased).
  void Start(const WorkloadMix& mix, uint64_t seed, bool record_erases = false);
  // Errors from now on are expected (the daemon is being killed).
  void MarkKilled() { killed_ = true; }
  // Stops and joins the workers, adding their tallies to `into`.
  void Stop(StressTally& into);

 private:
  explicit StressLoad(const KeySpace& space) : space_(space) {}
  const KeySpace& space_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::unique_ptr<StressWorker>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> killed_{false};
};

}  // namespace kvtier::tools
