#include "tools/stress/stress_tally.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace kvtier::tools {
namespace {

constexpr int kSubBits = 5;  // 32 sub-buckets per power of two
constexpr uint64_t kSub = uint64_t{1} << kSubBits;

size_t BucketOf(uint64_t v) {
  if (v < kSub) return static_cast<size_t>(v);
  const int msb = 63 - std::countl_zero(v);
  const int shift = msb - kSubBits;
  return static_cast<size_t>((shift + 1) * kSub + ((v >> shift) & (kSub - 1)));
}

// The largest value of bucket `b`.
uint64_t UpperBound(size_t b) {
  if (b < kSub) return b;
  const int shift = static_cast<int>(b / kSub) - 1;
  const uint64_t low = (kSub + (b % kSub)) << shift;
  return low + ((uint64_t{1} << shift) - 1);
}

constexpr std::string_view kNames[kOpKinds] = {"put",    "reserve", "save", "get",    "pin",
                                               "lookup", "erase",   "load", "layers", "hint"};

}  // namespace

std::string_view OpKindName(OpKind kind) { return kNames[static_cast<size_t>(kind)]; }

std::optional<OpKind> ParseOpKind(std::string_view name) {
  for (size_t i = 0; i < kOpKinds; ++i) {
    if (kNames[i] == name) return static_cast<OpKind>(i);
  }
  return std::nullopt;
}

void LatencyHistogramNs::Add(uint64_t ns) {
  const size_t b = BucketOf(ns);
  if (b >= buckets_.size()) buckets_.resize(b + 1);
  ++buckets_[b];
  ++count_;
  max_ = std::max(max_, ns);
}

void LatencyHistogramNs::Merge(const LatencyHistogramNs& other) {
  if (other.buckets_.size() > buckets_.size()) buckets_.resize(other.buckets_.size());
  for (size_t i = 0; i < other.buckets_.size(); ++i) buckets_[i] += other.buckets_[i];
  count_ += other.count_;
  max_ = std::max(max_, other.max_);
}

uint64_t LatencyHistogramNs::Percentile(double q) const {
  if (count_ == 0) return 0;
  const uint64_t rank = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_))));
  uint64_t seen = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    seen += buckets_[b];
    if (seen >= rank) return std::min(UpperBound(b), max_);
  }
  return max_;
}

void StressTally::AddViolation(OpKind kind, const std::string& ns, const BlockKey& key, std::string what) {
  ++violations;
  ++of(kind).violations;
  if (samples.size() < kMaxViolationSamples) samples.push_back({kind, ns, key, std::move(what)});
}

void StressTally::AddError(OpKind kind, const Status& status) {
  ++of(kind).errors;
  ErrorCount& e = errors[std::string(OpKindName(kind)) + ": " + std::string(StatusCodeName(status.code()))];
  if (e.count++ == 0) e.first_message = status.message();
}

uint64_t StressTally::errors_total() const {
  uint64_t n = 0;
  for (const auto& k : kinds) n += k.errors;
  return n;
}

uint64_t StressTally::ops_total() const {
  uint64_t n = 0;
  for (const auto& k : kinds) n += k.ops;
  return n;
}

void StressTally::Merge(const StressTally& other) {
  for (size_t i = 0; i < kOpKinds; ++i) {
    KindTally& a = kinds[i];
    const KindTally& b = other.kinds[i];
    a.ops += b.ops;
    a.blocks += b.blocks;
    a.ok += b.ok;
    a.misses += b.misses;
    a.refused += b.refused;
    a.errors += b.errors;
    a.violations += b.violations;
    a.latency.Merge(b.latency);
  }
  violations += other.violations;
  for (const auto& v : other.samples) {
    if (samples.size() < kMaxViolationSamples) samples.push_back(v);
  }
  for (const auto& [name, e] : other.errors) {
    ErrorCount& mine = errors[name];
    if (mine.count == 0) mine.first_message = e.first_message;
    mine.count += e.count;
  }
  after_kill += other.after_kill;
  for (size_t i = 0; i < lookup_tiers.size(); ++i) lookup_tiers[i] += other.lookup_tiers[i];
  erased.insert(erased.end(), other.erased.begin(), other.erased.end());
}

}  // namespace kvtier::tools
