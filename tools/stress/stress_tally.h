// What `kvtier stress` counts (stress.h): per kind of operation the calls,
// blocks, outcomes and a latency histogram; the violations of "a miss or
// byte-exact" with the first few described; and unexpected statuses by
// kind and code. One StressTally per client thread, merged at the end.
// Thread-compatible plain data.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::tools {

enum class OpKind : uint8_t {
  kPut = 0,  // Client::PutBatch (copies)
  kReserve,  // Reserve, write in place, Commit (or Abort)
  kSave,     // BeginSave, SaveLayer / LayerSpan + LayerWritten, FinishSave
  kGet,      // Get / GetBatch into a buffer
  kPin,      // zero-copy Pin, read the views, Release
  kLookup,   // Lookup of a prefix
  kErase,    // Erase of a chain's suffix
  kLoad,     // BeginLoad, WaitLayer per layer (zero-copy or into buffers), End
  kLayers,   // GetLayers of a layer range
  kHint,     // Enqueue / Started / Finished / OpenSession / CloseSession
};
inline constexpr size_t kOpKinds = 10;
std::string_view OpKindName(OpKind kind);
std::optional<OpKind> ParseOpKind(std::string_view name);

// Latencies in nanoseconds: a log-linear histogram (32 sub-buckets per
// power of two, so a percentile is within about 3%), plus the exact max.
class LatencyHistogramNs {
 public:
  void Add(uint64_t ns);
  void Merge(const LatencyHistogramNs& other);
  uint64_t count() const { return count_; }
  uint64_t max() const { return max_; }
  // The smallest bucket bound at or above the q-quantile (0 < q <= 1); 0
  // when empty.
  uint64_t Percentile(double q) const;

 private:
  std::vector<uint64_t> buckets_;
  uint64_t count_ = 0;
  uint64_t max_ = 0;
};

struct KindTally {
  uint64_t ops = 0;      // calls made
  uint64_t blocks = 0;   // blocks they named
  uint64_t ok = 0;       // blocks read byte-exact, written, erased, hit; hints accepted
  uint64_t misses = 0;   // NotFound (and lookup blocks past the prefix)
  uint64_t refused = 0;  // NoSpace, Busy, AlreadyExists: documented refusals
  uint64_t errors = 0;   // any other status
  uint64_t violations = 0;
  LatencyHistogramNs latency;
};

struct Violation {
  OpKind kind = OpKind::kGet;
  std::string ns;  // the namespace's model id
  BlockKey key;
  std::string what;
};

struct ErrorCount {
  uint64_t count = 0;
  std::string first_message;
};

inline constexpr size_t kMaxViolationSamples = 32;

struct StressTally {
  std::array<KindTally, kOpKinds> kinds{};
  uint64_t violations = 0;
  std::vector<Violation> samples;            // the first kMaxViolationSamples
  std::map<std::string, ErrorCount> errors;  // "<kind>: <status code>"
  // Calls that failed after the daemon was killed on purpose (crash loops):
  // expected, not errors.
  uint64_t after_kill = 0;
  // Lookup hits by tier (Tier values 0..4).
  std::array<uint64_t, 5> lookup_tiers{};
  // The (namespace index, key) of every Erase call made, answered or not,
  // when the worker records them (crash loops: an acknowledged block the
  // load erased may be missing).
  std::vector<std::pair<uint32_t, BlockKey>> erased;

  KindTally& of(OpKind kind) { return kinds[static_cast<size_t>(kind)]; }
  const KindTally& of(OpKind kind) const { return kinds[static_cast<size_t>(kind)]; }
  void AddViolation(OpKind kind, const std::string& ns, const BlockKey& key, std::string what);
  void AddError(OpKind kind, const Status& status);
  uint64_t errors_total() const;
  uint64_t ops_total() const;
  void Merge(const StressTally& other);
};

}  // namespace kvtier::tools
