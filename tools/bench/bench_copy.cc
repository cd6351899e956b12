#include "tools/bench/bench_copy.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRounds = 2;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Keeps the compiler from dropping stores nobody reads.
inline void Clobber(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

// Anonymous private memory, pre-faulted and filled with a pattern that
// differs per 8-byte word. Regular 4 KiB pages, like the shmem arena.
class HostBuffer {
 public:
  static Result<HostBuffer> Allocate(uint64_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      return IoError("mmap of " + std::to_string(bytes) + " bytes of bench buffers: " + std::strerror(errno));
    }
    HostBuffer b;
    b.data_ = static_cast<std::byte*>(p);
    b.bytes_ = bytes;
    for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t word = (i / 8) * 0x9e3779b97f4a7c15ULL + 1;
      std::memcpy(b.data_ + i, &word, 8);
    }
    return b;
  }
  HostBuffer() = default;
  HostBuffer(HostBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  HostBuffer& operator=(HostBuffer&&) = delete;
  ~HostBuffer() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// Timed totals of one op at one size.
struct Tally {
  uint64_t ops = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double Gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

// State of one block size: its buffers, keys and the key generation that
// is committed in the daemon now (put passes replace it with a new one).
struct SizeCase {
  Client& client;
  NamespaceId ns;
  uint64_t block_bytes;
  uint64_t blocks;
  uint64_t key_salt;
  std::byte* caller;   // blocks * block_bytes: put source, get destination
  std::byte* scratch;  // blocks * block_bytes: the memcpy destination
  uint64_t generation = 0;
  bool committed = false;
  std::vector<BlockKey> keys;  // of `generation`

  std::byte* Caller(uint64_t i) const { return caller + i * block_bytes; }
  void MakeKeys() {
    keys.resize(blocks);
    for (uint64_t i = 0; i < blocks; ++i) {
      keys[i] = BlockKey{key_salt ^ (block_bytes << 20) ^ generation, 0xb10c000000000000ULL | i};
    }
  }
};

Status EraseCommitted(SizeCase& c) {
  if (!c.committed) return Status::Ok();
  auto erased = c.client.Erase(c.ns, c.keys);
  if (!erased.ok()) return erased.status();
  c.committed = false;
  return Status::Ok();
}

// Blocks per PutBatch / GetBatch in the batched rows: an engine stores a
// prefix after prefill, and loads a cached one, all its blocks at once, so
// the round trips are paid once a batch.
constexpr uint64_t kBatchBlocks = 16;

// Fails a pass over c's blocks after `i` of them went in: erases what did
// (so the next pass has room) and reports `s` for block `i`.
Status PutFailed(SizeCase& c, const char* call, uint64_t i, const Status& s) {
  c.committed = true;               // some blocks are; erase them before failing
  EraseCommitted(c).IgnoreError();  // the Put error is the one to report
  return Status(s.code(), std::string(call) + " of block " + std::to_string(i) + " of " + std::to_string(c.blocks) +
                              " (" + std::to_string(c.block_bytes) + " bytes): " + s.message() +
                              " (try a smaller --working-set-bytes)");
}

// One pass over the working set with each op; returns the seconds spent in
// the timed part (the whole pass except what the op says is untimed).
Result<double> MemcpyPass(SizeCase& c) {
  const auto start = Clock::now();
  for (uint64_t i = 0; i < c.blocks; ++i) {
    std::memcpy(c.scratch + i * c.block_bytes, c.Caller(i), c.block_bytes);
    Clobber(c.scratch + i * c.block_bytes);
  }
  return SecondsSince(start);
}

// memcpy with non-temporal (streaming) stores, as the put's copy writes the
// arena (common/checksum.h): glibc's memcpy here only streams from
// x86_non_temporal_threshold on (192 MiB on the bench VM). A second
// ceiling: put against it shows what the hash and the round trips cost.
void StreamingCopy(std::byte* dst, const std::byte* src, uint64_t length) {
#if defined(__SSE2__)
  uint64_t i = 0;
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    for (; i + 64 <= length; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    _mm_sfence();
  }
  std::memcpy(dst + i, src + i, length - i);
#else
  std::memcpy(dst, src, length);
#endif
}

Result<double> StreamingCopyPass(SizeCase& c) {
  const auto start = Clock::now();
  for (uint64_t i = 0; i < c.blocks; ++i) {
    StreamingCopy(c.scratch + i * c.block_bytes, c.Caller(i), c.block_bytes);
    Clobber(c.scratch + i * c.block_bytes);
  }
  return SecondsSince(start);
}

Result<double> PutPass(SizeCase& c) {
  if (Status s = EraseCommitted(c); !s.ok()) return s;  // untimed: makes room
  ++c.generation;
  c.MakeKeys();
  const auto start = Clock::now();
  for (uint64_t i = 0; i < c.blocks; ++i) {
    Status s = c.client.Put(c.ns, c.keys[i], std::span<const std::byte>(c.Caller(i), c.block_bytes));
    if (!s.ok()) return PutFailed(c, "Put", i, s);
  }
  const double seconds = SecondsSince(start);
  c.committed = true;
  return seconds;
}

// The zero-copy put as an engine without a CPU copy uses it: Reserve, the
// bytes written into the slot (here by memcpy; by a DMA in an engine), and a
// Commit without a checksum, so the daemon hashes the block.
Result<double> ReservePass(SizeCase& c) {
  if (Status s = EraseCommitted(c); !s.ok()) return s;  // untimed: makes room
  ++c.generation;
  c.MakeKeys();
  const auto start = Clock::now();
  for (uint64_t i = 0; i < c.blocks; ++i) {
    const uint64_t size = c.block_bytes;
    auto reservation = c.client.Reserve(c.ns, std::span<const BlockKey>(&c.keys[i], 1), std::span(&size, 1));
    if (!reservation.ok()) return PutFailed(c, "Reserve", i, reservation.status());
    WritableBlock& block = reservation->blocks()[0];
    if (!block.status.ok()) return PutFailed(c, "Reserve", i, block.status);
    std::memcpy(block.data.data(), c.Caller(i), size);
    Status s = reservation->Commit()[0];
    if (!s.ok()) return PutFailed(c, "Commit", i, s);
  }
  const double seconds = SecondsSince(start);
  c.committed = true;
  return seconds;
}

Result<double> PutBatchPass(SizeCase& c) {
  if (Status s = EraseCommitted(c); !s.ok()) return s;  // untimed: makes room
  ++c.generation;
  c.MakeKeys();
  std::vector<std::span<const std::byte>> src;
  const auto start = Clock::now();
  for (uint64_t first = 0; first < c.blocks; first += kBatchBlocks) {
    const uint64_t count = std::min(kBatchBlocks, c.blocks - first);
    src.clear();
    for (uint64_t i = first; i < first + count; ++i) src.emplace_back(c.Caller(i), c.block_bytes);
    auto put = c.client.PutBatch(c.ns, std::span<const BlockKey>(c.keys).subspan(first, count), src);
    for (uint64_t j = 0; j < count; ++j) {
      if (!put[j].ok()) return PutFailed(c, "PutBatch", first + j, put[j]);
    }
  }
  const double seconds = SecondsSince(start);
  c.committed = true;
  return seconds;
}

Result<double> GetPass(SizeCase& c) {
  const auto start = Clock::now();
  for (uint64_t i = 0; i < c.blocks; ++i) {
    auto got = c.client.Get(c.ns, c.keys[i], std::span<std::byte>(c.Caller(i), c.block_bytes));
    if (!got.ok()) return Status(got.status().code(), "Get: " + got.status().message());
    if (*got != c.block_bytes) return Internal("Get returned " + std::to_string(*got) + " bytes");
  }
  return SecondsSince(start);
}

Result<double> GetBatchPass(SizeCase& c) {
  std::vector<std::span<std::byte>> dst;
  const auto start = Clock::now();
  for (uint64_t first = 0; first < c.blocks; first += kBatchBlocks) {
    const uint64_t count = std::min(kBatchBlocks, c.blocks - first);
    dst.clear();
    for (uint64_t i = first; i < first + count; ++i) dst.emplace_back(c.Caller(i), c.block_bytes);
    auto got = c.client.GetBatch(c.ns, std::span<const BlockKey>(c.keys).subspan(first, count), dst);
    for (const auto& r : got) {
      if (!r.ok()) return Status(r.status().code(), "GetBatch: " + r.status().message());
      if (*r != c.block_bytes) return Internal("GetBatch returned " + std::to_string(*r) + " bytes");
    }
  }
  return SecondsSince(start);
}

uint64_t SumWords(std::span<const std::byte> data) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const std::byte* p = data.data();
  size_t i = 0;
  for (; i + 32 <= data.size(); i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    s0 += w[0];
    s1 += w[1];
    s2 += w[2];
    s3 += w[3];
  }
  for (; i < data.size(); ++i) s0 += static_cast<uint64_t>(p[i]);
  return s0 + s1 + s2 + s3;
}

volatile uint64_t g_sum_sink = 0;

Result<double> PinSumPass(SizeCase& c) {
  uint64_t sum = 0;
  const auto start = Clock::now();
  for (uint64_t i = 0; i < c.blocks; ++i) {
    auto views = c.client.Pin(c.ns, std::span<const BlockKey>(&c.keys[i], 1));
    if (!views[0].ok()) return Status(views[0].status().code(), "Pin: " + views[0].status().message());
    sum += SumWords(views[0]->data());
    if (Status s = views[0]->Release(); !s.ok()) return s;
  }
  const double seconds = SecondsSince(start);
  g_sum_sink = g_sum_sink + sum;
  return seconds;
}

// Untimed first pass: commits the first generation, faults the arena pages
// into this process, and checks that a get returns what the put wrote (the
// caller buffers are zeroed in between).
Status WarmUp(SizeCase& c) {
  if (auto m = MemcpyPass(c); !m.ok()) return m.status();
  if (auto p = PutPass(c); !p.ok()) return p.status();
  std::memset(c.caller, 0, c.blocks * c.block_bytes);
  if (auto g = GetPass(c); !g.ok()) return g.status();
  for (uint64_t i = 0; i < c.blocks; ++i) {
    for (uint64_t at : {uint64_t{0}, c.block_bytes / 2, c.block_bytes - 8}) {
      const uint64_t offset = i * c.block_bytes + (at & ~uint64_t{7});
      uint64_t word = 0;
      std::memcpy(&word, c.caller + offset, 8);
      if (word != (offset / 8) * 0x9e3779b97f4a7c15ULL + 1) {
        return Corruption("get returned other bytes than put wrote (block " + std::to_string(i) + ")");
      }
    }
  }
  return PinSumPass(c).status();
}

using Pass = std::function<Result<double>(SizeCase&)>;

// Whole passes until `seconds` of timed work have accumulated (at least one).
Status RunFor(SizeCase& c, const Pass& pass, double seconds, Tally& tally) {
  double spent = 0;
  do {
    auto s = pass(c);
    if (!s.ok()) return s.status();
    spent += *s;
    tally.seconds += *s;
    tally.ops += c.blocks;
    tally.bytes += c.blocks * c.block_bytes;
  } while (spent < seconds);
  return Status::Ok();
}

Status RunSize(SizeCase& c, double seconds_per_case, std::vector<CopyRow>& rows) {
  if (Status s = WarmUp(c); !s.ok()) return s;
  const Pass passes[] = {MemcpyPass,  StreamingCopyPass, PutPass,      PutBatchPass,
                         ReservePass, GetPass,           GetBatchPass, PinSumPass};
  constexpr int kOps = 8;
  Tally tallies[kOps];
  for (int round = 0; round < kRounds; ++round) {
    for (int op = 0; op < kOps; ++op) {
      if (Status s = RunFor(c, passes[op], seconds_per_case / kRounds, tallies[op]); !s.ok()) return s;
    }
  }
  const char* names[] = {"memcpy", "nt copy", "put", "put x16", "put zc", "get", "get x16", "pin+sum"};
  for (int op = 1; op < kOps; ++op) {
    CopyRow row;
    row.op = names[op];
    row.block_bytes = c.block_bytes;
    row.blocks = c.blocks;
    row.ops = tallies[op].ops;
    row.seconds = tallies[op].seconds;
    row.gbps = tallies[op].Gbps();
    row.memcpy_gbps = tallies[0].Gbps();
    rows.push_back(row);
  }
  return EraseCommitted(c);
}

}  // namespace

Result<std::vector<CopyRow>> RunCopyBench(Client& client, NamespaceId ns, const CopyBenchConfig& config) {
  uint64_t footprint = 0;
  for (uint64_t b : config.block_bytes) {
    if (b == 0 || b % 8 != 0) return InvalidArgument("block sizes must be positive multiples of 8 bytes");
    footprint = std::max(footprint, std::max<uint64_t>(1, config.working_set_bytes / b) * b);
  }
  auto caller = HostBuffer::Allocate(footprint);
  if (!caller.ok()) return caller.status();
  auto scratch = HostBuffer::Allocate(footprint);
  if (!scratch.ok()) return scratch.status();
  std::vector<CopyRow> rows;
  for (uint64_t block_bytes : config.block_bytes) {
    SizeCase c{client,          ns,
               block_bytes,     std::max<uint64_t>(1, config.working_set_bytes / block_bytes),
               config.key_salt, caller->data(),
               scratch->data()};
    Status s = RunSize(c, config.seconds_per_case, rows);
    if (!s.ok()) {
      EraseCommitted(c).IgnoreError();  // leave the shared daemon clean; report `s`
      return s;
    }
  }
  return rows;
}

}  // namespace kvtier::tools
