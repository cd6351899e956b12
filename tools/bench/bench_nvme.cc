#include "tools/bench/bench_nvme.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <sys/mman.h>
#include <unistd.h>

#include "common/checksum.h"
#include "common/clock.h"
#include "support/process.h"
#include "tiers/nvme/nvme_tier.h"
#include "tools/bench/bench_fio.h"
#include "tools/bench/bench_window.h"

namespace kvtier::tools {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr NamespaceFingerprint kBenchNs{0xbe4c, 0x4e7e};

double Since(SteadyClock::time_point t) { return std::chrono::duration<double>(SteadyClock::now() - t).count(); }

std::string Size(uint64_t b) {
  char out[32];
  if (b >= (1u << 20))
    std::snprintf(out, sizeof(out), "%llu MiB", (unsigned long long)(b >> 20));
  else
    std::snprintf(out, sizeof(out), "%llu KiB", (unsigned long long)(b >> 10));
  return out;
}

// Page-aligned anonymous memory (reads land in it; writes come from it).
class Buffer {
 public:
  explicit Buffer(uint64_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~Buffer() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

 private:
  std::byte* data_;
  uint64_t bytes_;
};

struct Measured {
  double seconds = 0;
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  double Gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }
  double Iops() const { return seconds > 0 ? double(ops) / seconds : 0; }
};

// Writes the whole device once, sequentially, in 8 MiB chunks.
Status LayOut(BlockDevice& device) {
  constexpr uint64_t kChunk = 8ull << 20;
  Buffer zeros(kChunk);
  for (uint64_t at = 0; at < device.capacity_bytes(); at += kChunk) {
    const uint64_t n = std::min(kChunk, device.capacity_bytes() - at);
    auto w = WriteSync(device, at, std::span<const std::byte>(zeros.data(), n));
    if (!w.ok()) return w.status();
  }
  return FlushSync(device);
}

// A fresh tier on `dir`/kvtier-bench-PID.dat (+ .index), removed on
// destruction (the pid keeps concurrent runs off each other's files).
class BenchTier {
 public:
  static Result<std::unique_ptr<BenchTier>> Open(const NvmeBenchOptions& o, uint64_t block_bytes) {
    std::unique_ptr<BenchTier> t(new BenchTier());
    t->path_ = o.dir + "/kvtier-bench-" + std::to_string(::getpid()) + ".dat";
    std::filesystem::remove_all(t->path_ + ".index");
    BlockDeviceOptions d;
    d.path = t->path_;
    d.capacity_bytes = o.file_bytes;
    d.queue_depth = o.queue_depth;
    d.io_threads = o.io_threads;
    auto device = OpenBlockDevice(d);
    if (!device.ok()) return device.status();
    t->kind_ = std::string((*device)->kind());
    // fio lays its file out (writes it once) before it measures; so do we,
    // so neither side pays for converting fallocated extents on first write.
    if (Status s = LayOut(**device); !s.ok()) return s;
    auto index = NvmeIndex::Open(t->path_ + ".index", false);
    if (!index.ok()) return index.status();
    NvmeTierOptions options;
    options.staging_bytes = uint64_t{o.queue_depth} * RecordBytes(block_bytes, 4096) * 2;
    if (o.region_bytes != 0) options.region_bytes = o.region_bytes;
    auto tier = NvmeTier::Open(std::move(*device), std::move(*index), options, t->clock_);
    if (!tier.ok()) return tier.status();
    t->tier_ = std::move(*tier);
    return t;
  }
  ~BenchTier() {
    tier_.reset();
    std::filesystem::remove(path_);
    std::filesystem::remove_all(path_ + ".index");
  }
  NvmeTier& tier() { return *tier_; }
  const std::string& kind() const { return kind_; }

 private:
  BenchTier() = default;
  SystemClock clock_;
  std::string path_, kind_;
  std::unique_ptr<NvmeTier> tier_;
};

// Writes blocks with keys first_key, first_key + 1, ... for `seconds` (or
// `max_blocks`), `depth` in flight. Returns what completed.
Measured WriteBlocks(NvmeTier& tier, uint64_t block_bytes, uint32_t depth, double seconds, uint64_t first_key,
                     uint64_t max_blocks) {
  Buffer payload(block_bytes);
  for (uint64_t i = 0; i < block_bytes; i += 8) std::memcpy(payload.data() + i, &i, 8);
  // The daemon demotes blocks whose xxh3 the host tier recorded at Commit,
  // and hands it over; so does the bench (one hash, before the clock starts).
  const uint64_t checksum = BlockChecksum(std::span<const std::byte>(payload.data(), block_bytes));
  Window window(depth);
  std::mutex mu;
  Measured m;
  const auto start = SteadyClock::now();
  for (uint64_t n = 0; n < max_blocks && Since(start) < seconds; ++n) {
    window.Acquire();
    const BlockKey key{0xbe4c, first_key + n};
    Status accepted;
    while (true) {
      accepted = tier.Write(
          kBenchNs, key, 1, std::span<const std::byte>(payload.data(), block_bytes),
          [&](Status s) {
            {
              std::lock_guard lock(mu);
              if (s.ok()) {
                ++m.ops;
                m.bytes += block_bytes;
              } else {
                ++m.errors;
              }
            }
            window.Release();
          },
          checksum);
      if (accepted.code() != StatusCode::kBusy) break;
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // staging or regions busy: retry
    }
    if (!accepted.ok()) {
      window.Release();
      std::lock_guard lock(mu);
      ++m.errors;
    }
  }
  window.Drain();
  m.seconds = Since(start);
  return m;
}

// Reads the given keys (whole blocks) in order, cycling, for `seconds`.
Measured ReadBlocks(NvmeTier& tier, const std::vector<BlockKey>& keys, uint64_t block_bytes, uint32_t depth,
                    double seconds) {
  Buffer dst(uint64_t{depth} * block_bytes);
  std::vector<uint32_t> free_slots(depth);
  for (uint32_t i = 0; i < depth; ++i) free_slots[i] = i;
  std::mutex mu;
  std::condition_variable cv;
  Measured m;
  const auto start = SteadyClock::now();
  for (uint64_t n = 0; Since(start) < seconds && !keys.empty(); ++n) {
    uint32_t slot;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !free_slots.empty(); });
      slot = free_slots.back();
      free_slots.pop_back();
    }
    auto give_back = [&, slot] {
      std::lock_guard lock(mu);
      free_slots.push_back(slot);
      cv.notify_all();
    };
    Status accepted;
    while (true) {
      accepted = tier.Read(keys[n % keys.size()], 0, 1,
                           std::span<std::byte>(dst.data() + uint64_t{slot} * block_bytes, block_bytes),
                           [&, give_back](Result<size_t> r) {
                             {
                               std::lock_guard lock(mu);
                               if (r.ok()) {
                                 ++m.ops;
                                 m.bytes += *r;
                               } else {
                                 ++m.errors;
                               }
                             }
                             give_back();
                           });
      if (accepted.code() != StatusCode::kBusy) break;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!accepted.ok()) {
      {
        std::lock_guard lock(mu);
        ++m.errors;
      }
      give_back();
    }
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return free_slots.size() == depth; });
  m.seconds = Since(start);
  return m;
}

// One case measured over rounds: round i runs the tier and fio back to
// back, the tier first in even rounds and fio first in odd ones, so both
// see the device in the same state. The figures printed are the medians;
// the ratio is the median of the rounds' own ratios (paired).
struct Row {
  std::string op;
  uint64_t block_bytes = 0;
  bool iops = false;  // compare IOPS rather than GB/s
  std::vector<Measured> tier_rounds;
  std::vector<FioResult> fio_rounds;

  double TierFigure(const Measured& m) const { return iops ? m.Iops() : m.Gbps(); }
  double FioFigure(const FioResult& f) const { return iops ? f.iops : f.gbps; }
  bool fio_ran() const {
    return !fio_rounds.empty() &&
           std::all_of(fio_rounds.begin(), fio_rounds.end(), [](const FioResult& f) { return f.ran; });
  }
  uint64_t errors() const {
    uint64_t n = 0;
    for (const Measured& m : tier_rounds) n += m.errors;
    return n;
  }
  std::vector<double> Ratios() const {
    std::vector<double> r;
    if (!fio_ran()) return r;
    for (size_t i = 0; i < tier_rounds.size() && i < fio_rounds.size(); ++i) {
      const double f = FioFigure(fio_rounds[i]);
      r.push_back(f > 0 ? TierFigure(tier_rounds[i]) / f : 0);
    }
    return r;
  }
  const Measured& tier() const {
    return MedianOf(tier_rounds, [this](const Measured& m) { return TierFigure(m); });
  }
  const FioResult& fio() const {
    return MedianOf(fio_rounds, [this](const FioResult& f) { return FioFigure(f); });
  }
  double Ratio() const {
    std::vector<double> r = Ratios();
    if (r.empty()) return 0;
    std::sort(r.begin(), r.end());
    return r[r.size() / 2];
  }

 private:
  // The element with the median figure (the upper one of an even count).
  template <typename T, typename F>
  static const T& MedianOf(const std::vector<T>& v, F figure) {
    std::vector<size_t> order(v.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return figure(v[a]) < figure(v[b]); });
    return v[order[order.size() / 2]];
  }
};

void PrintRow(const Row& r) {
  char ratio[16] = "n/a";
  const bool fio = r.fio_ran();
  if (fio) std::snprintf(ratio, sizeof(ratio), "%.2fx", r.Ratio());
  const Measured& t = r.tier();
  if (r.iops) {
    std::printf("  %-9s %8s  %10.0f IOPS  %8.2f GB/s | fio %10.0f IOPS | %s", r.op.c_str(), Size(r.block_bytes).c_str(),
                t.Iops(), t.Gbps(), r.fio().iops, ratio);
  } else {
    std::printf("  %-9s %8s  %8.2f GB/s  %8.0f ops/s | fio %7.2f GB/s | %s", r.op.c_str(), Size(r.block_bytes).c_str(),
                t.Gbps(), t.Iops(), r.fio().gbps, ratio);
  }
  std::vector<double> ratios = r.Ratios();
  if (ratios.size() > 1) {
    const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
    std::printf("  (rounds %.2fx-%.2fx)", *lo, *hi);
  }
  std::printf("  (errors %llu)\n", (unsigned long long)r.errors());
  if (!fio) {
    for (const FioResult& f : r.fio_rounds) {
      if (f.ran) continue;
      std::printf("            fio: %s\n", f.why.c_str());
      break;
    }
  }
}

void WriteJson(const std::string& path, const NvmeBenchOptions& o, const std::string& kind,
               const std::vector<Row>& rows) {
  std::ofstream out(path);
  out << "{\n  \"dir\": \"" << o.dir << "\", \"file_bytes\": " << o.file_bytes << ", \"queue_depth\": " << o.queue_depth
      << ", \"io_threads\": " << o.io_threads << ", \"io_engine\": \"" << kind << "\", \"rounds\": " << o.rounds
      << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << "    {\"op\": \"" << r.op << "\", \"block_bytes\": " << r.block_bytes << ", \"gbps\": " << r.tier().Gbps()
        << ", \"iops\": " << r.tier().Iops() << ", \"errors\": " << r.errors() << ", \"fio_gbps\": " << r.fio().gbps
        << ", \"fio_iops\": " << r.fio().iops << ", \"ratio\": " << r.Ratio() << ", \"round_ratios\": [";
    const std::vector<double> ratios = r.Ratios();
    for (size_t k = 0; k < ratios.size(); ++k) out << (k ? ", " : "") << ratios[k];
    out << "]}" << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  out << "  ]\n}\n";
}

// Round `round` of one case into `row`: `tier` and `fio` once each, in
// the alternating order Row describes.
template <typename TierRun, typename FioRun>
void RunRound(uint32_t round, Row& row, TierRun tier, FioRun fio) {
  if (round % 2 == 1) row.fio_rounds.push_back(fio());
  row.tier_rounds.push_back(tier());
  if (round % 2 == 0) row.fio_rounds.push_back(fio());
}

}  // namespace

void AddNvmeBenchOptions(CLI::App& app, NvmeBenchOptions& o) {
  app.add_option("--dir", o.dir, "Directory on the file system under test (files are removed after)")
      ->capture_default_str();
  app.add_option("--file-bytes", o.file_bytes, "Size of the tier file and of fio's file")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--block-bytes", o.block_bytes, "Block sizes of the sequential cases")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--random-read-bytes", o.random_read_bytes, "Block size of the random-read case")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--queue-depth", o.queue_depth, "I/Os in flight (tier and fio)")->capture_default_str();
  app.add_option("--region-bytes", o.region_bytes, "Tier region size (0: the nvme.region_bytes default)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "Tier I/O threads (rings)")->capture_default_str();
  app.add_option("--seconds", o.seconds, "Seconds per case and round (tier and fio each)")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds per case, tier and fio alternating first; medians are reported")
      ->check(CLI::Range(1, 99))
      ->capture_default_str();
  app.add_option("--fio", o.fio, "fio binary")->capture_default_str();
  app.add_flag("--skip-fio", o.skip_fio, "Do not run fio (ratios print as n/a)");
  app.add_option("--json", o.json_path, "Also write the results to this file as JSON");
}

int RunNvmeBench(const NvmeBenchOptions& o) {
  std::vector<Row> rows;
  std::string kind;
  auto fail = [](const std::string& what, const Status& s) {
    std::fprintf(stderr, "kvtier bench nvme: %s: %s\n", what.c_str(), s.ToString().c_str());
    return 1;
  };
  for (uint64_t block : o.block_bytes) {
    auto bench = BenchTier::Open(o, block);
    if (!bench.ok()) return fail("cannot open the tier in " + o.dir, bench.status());
    kind = (*bench)->kind();
    NvmeTier& tier = (*bench)->tier();
    // Each round's writes take keys after the last round's; the log wraps
    // around (reclaim) once the file is full. Reads cycle over what is left.
    uint64_t next_key = 0;
    Row write{"write", block};
    Row read{"read", block};
    for (uint32_t round = 0; round < o.rounds; ++round) {
      RunRound(
          round, write,
          [&] {
            Measured m = WriteBlocks(tier, block, o.queue_depth, o.seconds, next_key, UINT64_MAX);
            next_key += m.ops + m.errors;
            return m;
          },
          [&] { return RunFio(o, "write", block); });
      std::vector<BlockKey> resident;
      for (uint64_t k = 0; k < next_key; ++k) {
        if (tier.Find(BlockKey{0xbe4c, k})) resident.push_back(BlockKey{0xbe4c, k});
      }
      RunRound(
          round, read, [&] { return ReadBlocks(tier, resident, block, o.queue_depth, o.seconds); },
          [&] { return RunFio(o, "read", block); });
    }
    rows.push_back(write);
    rows.push_back(read);
  }
  {
    const uint64_t block = o.random_read_bytes;
    auto bench = BenchTier::Open(o, block);
    if (!bench.ok()) return fail("cannot open the tier in " + o.dir, bench.status());
    NvmeTier& tier = (*bench)->tier();
    // Fill most of the file so random reads span it, as fio's do.
    const uint64_t blocks = o.file_bytes / RecordBytes(block, 4096) * 3 / 4;
    Measured fill = WriteBlocks(tier, block, o.queue_depth, 1e9, 0, blocks);
    std::vector<BlockKey> resident;
    for (uint64_t k = 0; k < blocks; ++k) {
      if (tier.Find(BlockKey{0xbe4c, k})) resident.push_back(BlockKey{0xbe4c, k});
    }
    std::shuffle(resident.begin(), resident.end(), std::mt19937_64(42));
    Row random{"randread", block};
    random.iops = true;
    for (uint32_t round = 0; round < o.rounds; ++round) {
      RunRound(
          round, random, [&] { return ReadBlocks(tier, resident, block, o.queue_depth, o.seconds); },
          [&] { return RunFio(o, "randread", block); });
    }
    random.tier_rounds.front().errors += fill.errors;
    rows.push_back(random);
  }

  std::printf(
      "NVMe tier (in-process NvmeTier on %s, %s I/O, %u ring(s), queue depth %u, %s file) beside fio\n"
      "(io_uring, O_DIRECT, same directory, block size and depth, %.0f s each), measured in this run:\n\n",
      o.dir.c_str(), kind.c_str(), o.io_threads, o.queue_depth, Size(o.file_bytes).c_str(), o.seconds);
  if (o.rounds > 1) {
    std::printf(
        "Each case ran %u rounds, tier and fio back to back (alternating which goes first); medians below,\n"
        "the ratio being the median of the rounds' ratios:\n\n",
        o.rounds);
  }
  for (const Row& r : rows) PrintRow(r);
  std::printf(
      "\n  write     sequential appends of whole blocks (staging copy, 4 KiB header, RocksDB index entry;\n"
      "            the block's xxh3 handed over as the engine does when it demotes) vs fio --rw=write\n"
      "  read      whole blocks in write order (header + payload verified, copied out) vs fio --rw=read\n"
      "  randread  whole blocks in random order over 3/4 of the file vs fio --rw=randread\n\n");
  bool seq_met = true, rand_met = true, any = false;
  for (const Row& r : rows) {
    if (!r.fio_ran()) continue;
    any = true;
    if (r.iops)
      rand_met = rand_met && r.Ratio() >= 0.7;
    else
      seq_met = seq_met && r.Ratio() >= 0.8;
  }
  std::printf("Goals\n  sequential >= 0.8x fio: %s\n  random >= 0.7x fio: %s\n",
              any ? (seq_met ? "met" : "NOT MET") : "n/a", any ? (rand_met ? "met" : "NOT MET") : "n/a");
  if (!o.json_path.empty()) WriteJson(o.json_path, o, kind, rows);
  return 0;
}

}  // namespace kvtier::tools
