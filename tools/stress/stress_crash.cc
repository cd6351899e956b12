#include "tools/stress/stress_crash.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "kvtier/client.h"
#include "support/fd_store.h"
#include "support/servers.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct Acked {
  NamespaceId ns = 0;
  BlockKey key;
};

// What a checkpoint acknowledged: blocks in the NVMe tier with their
// index entries written.
struct Checkpoint {
  std::vector<Acked> acked;
  std::vector<Acked> host_acked;  // --keep-host: blocks in the host tier
  int64_t nvme_blocks = -1;       // the NVMe tier's blocks (every namespace's); -1: no checkpoint
  int64_t reclaims = -1;          // regions reclaimed since the daemon started
  // Keys the load erased after the checkpoint (they may be missing).
  std::set<std::pair<uint32_t, BlockKey>> erased_after;
};

// Counters that move while anything is still being written below the host
// tier, and the gauges that must be 0 when nothing is in flight.
constexpr const char* kMovingCounters[] = {"nvme.device.writes", "nvme.writes",          "nvme.reinserted",
                                           "nvme.erases",        "nvme.region_reclaims", "engine.demotions",
                                           "engine.promotions"};
constexpr const char* kInFlightGauges[] = {"engine.demoting_blocks", "engine.promoting_blocks"};

Result<std::map<std::string, int64_t>> CounterMap(Client& client) {
  auto stats = client.Stats();
  if (!stats.ok()) return stats.status();
  std::map<std::string, int64_t> out;
  for (const Counter& c : *stats) out[c.name] = c.value;
  return out;
}

int64_t Get(const std::map<std::string, int64_t>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? 0 : it->second;
}

std::vector<int64_t> Moving(const std::map<std::string, int64_t>& m) {
  std::vector<int64_t> out;
  for (const char* name : kMovingCounters) out.push_back(Get(m, name));
  return out;
}

bool InFlight(const std::map<std::string, int64_t>& m) {
  for (const char* name : kInFlightGauges) {
    if (Get(m, name) != 0) return true;
  }
  return false;
}

class CrashLoop {
 public:
  CrashLoop(const StressOptions& o, const KeySpace& space, const WorkloadMix& mix, const std::string& kvtierd,
            const std::string& dir, const std::string& toml, StressReport& report)
      : o_(o),
        space_(space),
        mix_(mix),
        kvtierd_(kvtierd),
        dir_(dir),
        toml_(toml),
        report_(report),
        crash_(report.crash),
        rng_(o.seed ^ 0xc0ffee) {}

  int Run() {
    const auto t0 = Clock::now();
    crash_.keep_host = o_.keep_host;
    if (o_.keep_host) {
      auto store = support::FdStore::Open(dir_ + "/notify.sock");
      if (!store.ok()) {
        Problem("--keep-host: cannot open the descriptor store: " + store.status().ToString());
        return 1;
      }
      store_ = std::move(*store);
    }
    Checkpoint previous;
    bool previous_strict = false;
    for (uint32_t cycle = 0; cycle <= o_.crash_cycles; ++cycle) {
      CrashCycle y;
      y.cycle = cycle;
      const auto start = Clock::now();
      auto server =
          support::StartKvtierd(kvtierd_, dir_, o_.arena_bytes, std::chrono::seconds(60), toml_, store_.get());
      y.start_ms = MsSince(start);
      if (!server.ok()) {
        Problem("cycle " + std::to_string(cycle) + ": kvtierd did not start: " + server.status().ToString());
        if (cycle == 0) return 1;
        break;
      }
      auto checker = Checker(server->socket_path);
      if (!checker.ok()) {
        Problem("cycle " + std::to_string(cycle) + ": cannot connect: " + checker.status().ToString());
        break;
      }
      ReadRecovery(**checker, y);
      if (o_.keep_host && cycle > 0) WaitAdopted(**checker, y);
      if (cycle > 0) Verify(**checker, y, previous, previous_strict);
      if (cycle == o_.crash_cycles) {  // the last start: stop it cleanly
        checker->reset();
        const std::string how = server->process.Stop();
        if (how != "exit status 0") Problem("the last kvtierd ended with " + how + " when stopped");
        crash_.cycles.push_back(y);
        break;
      }
      if (!Load(*server, **checker, y, previous, previous_strict)) {
        crash_.cycles.push_back(y);
        break;
      }
      crash_.cycles.push_back(y);
      std::fprintf(stderr, "kvtier stress: crash cycle %u: loaded %lld, verified %llu, %s checkpoint of %zu blocks\n",
                   cycle, static_cast<long long>(y.recovery_loaded), static_cast<unsigned long long>(y.verified),
                   previous_strict ? "strict" : "lenient", previous.acked.size());
    }
    crash_.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return 0;
  }

 private:
  void Problem(std::string line) {
    std::fprintf(stderr, "kvtier stress: %s\n", line.c_str());
    if (crash_.problems.size() < 64) crash_.problems.push_back(std::move(line));
  }

  Result<std::unique_ptr<Client>> Checker(const std::string& socket_path) {
    ClientOptions options;
    options.socket_path = socket_path;
    options.client_name = "kvtier-stress-checker";
    options.namespaces = space_.Descriptors();
    options.use_directory = false;  // lookups see every tier
    options.reconnect = false;
    return Client::Connect(options);
  }

  void ReadRecovery(Client& client, CrashCycle& y) {
    auto counters = CounterMap(client);
    if (!counters.ok()) return Problem("cycle " + std::to_string(y.cycle) + ": Stats: " + counters.status().ToString());
    y.recovery_loaded = Get(*counters, "nvme.recovery_loaded");
    y.recovery_dropped_stale = Get(*counters, "nvme.recovery_dropped_stale");
    y.recovery_dropped_corrupt = Get(*counters, "nvme.recovery_dropped_corrupt");
    if (y.recovery_dropped_stale > 0 || y.recovery_dropped_corrupt > 0) {
      ++crash_.repairs;
      Problem("cycle " + std::to_string(y.cycle) +
              ": the NVMe index needed repair on open: " + std::to_string(y.recovery_dropped_stale) + " stale and " +
              std::to_string(y.recovery_dropped_corrupt) + " corrupt entries dropped");
    }
    if (Get(*counters, "nvme.index_failures") > 0) Problem("cycle " + std::to_string(y.cycle) + ": index failures");
  }

  // One block read after a restart: true if byte-exact, false if missing;
  // a violation or an error is recorded.
  std::optional<bool> ReadBack(Client& client, CrashCycle& y, NamespaceId ns, const BlockKey& key) {
    const StressNamespace& space = space_.namespaces()[ns];
    buffer_.resize(space.shape.block_bytes());
    auto got = client.Get(ns, key, buffer_);
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kNotFound) return false;
      // Refused for room (a full, fragmented arena: a kept host tier
      // starts full) or a busy tier: an answer, not a fault; not checked.
      if (got.status().code() == StatusCode::kNoSpace || got.status().code() == StatusCode::kBusy) {
        ++crash_.verify_refused;
        return std::nullopt;
      }
      ++crash_.verify_errors;
      if (crash_.verify_errors <= 5) {
        Problem("cycle " + std::to_string(y.cycle) + ": read of " + key.ToHex() + ": " + got.status().ToString());
      }
      return std::nullopt;
    }
    const ValueCheck check = *got == buffer_.size() ? CheckBlock(space.shape, key, buffer_)
                                                    : ValueCheck{Mismatch::kLength, std::to_string(*got) + " bytes"};
    if (check.ok()) {
      ++y.verified;
      ++crash_.blocks_verified;
      return true;
    }
    ++y.violations;
    ++crash_.verify_violations;
    report_.tally.AddViolation(OpKind::kGet, space.descriptor.model_id, key,
                               "after restart " + std::to_string(y.cycle) + ": " +
                                   std::string(MismatchName(check.mismatch)) + ": " + check.detail);
    return std::nullopt;
  }

  // Where Lookup places `key` (kNone: a miss or an error).
  Tier TierOf(Client& client, NamespaceId ns, const BlockKey& key) {
    auto found = client.Lookup(ns, std::span<const BlockKey>(&key, 1));
    if (!found.ok() || found->prefix_blocks != 1 || found->tiers.size() != 1) return Tier::kNone;
    return found->tiers[0];
  }
  // Whether Lookup places `key` in the NVMe tier (and no higher).
  bool OnNvme(Client& client, NamespaceId ns, const BlockKey& key) { return TierOf(client, ns, key) == Tier::kNvme; }

  // --keep-host: waits until the restart has checked every kept block
  // (host.adopt.pending 0), and notes what it adopted.
  void WaitAdopted(Client& client, CrashCycle& y) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    for (;;) {
      auto counters = CounterMap(client);
      if (!counters.ok())
        return Problem("cycle " + std::to_string(y.cycle) + ": Stats: " + counters.status().ToString());
      if (Get(*counters, "host.adopt.pending") == 0) {
        y.host_adopted = Get(*counters, "host.adopt.blocks");
        y.host_adopt_corrupt = Get(*counters, "host.adopt.corrupt");
        crash_.host_adopt_corrupt += y.host_adopt_corrupt;
        if (y.host_adopt_corrupt > 0) {
          Problem("cycle " + std::to_string(y.cycle) + ": " + std::to_string(y.host_adopt_corrupt) +
                  " kept host blocks did not match their checksum");
        }
        return;
      }
      if (Clock::now() >= deadline) {
        return Problem("cycle " + std::to_string(y.cycle) + ": the kept host tier was not adopted within 30 s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // --keep-host: every block the host tier held at the checkpoint is a
  // host hit again (looked up before any read can promote or evict).
  void VerifyHost(Client& client, CrashCycle& y, const Checkpoint& previous, bool strict) {
    y.host_acked = previous.host_acked.size();
    crash_.host_acked += y.host_acked;
    for (const Acked& a : previous.host_acked) {
      if (TierOf(client, a.ns, a.key) == Tier::kHost) {
        ++y.host_survived;
        ++crash_.host_survived;
      } else if (!strict) {
        ++crash_.host_lost_but_reported;
      } else {
        ++crash_.host_violations;
        Problem("cycle " + std::to_string(y.cycle) + ": block " + a.key.ToHex() + " of " +
                space_.namespaces()[a.ns].descriptor.model_id +
                ", in the host tier when killed with no load after the checkpoint, is not a host hit after the "
                "restart");
      }
    }
  }

  void Verify(Client& client, CrashCycle& y, const Checkpoint& previous, bool strict) {
    if (o_.keep_host) VerifyHost(client, y, previous, strict);
    // Where blocks are before any read promotes them.
    for (NamespaceId ns = 0; ns < space_.namespaces().size(); ++ns) {
      for (const BlockKey& key : space_.namespaces()[ns].keys) y.nvme_resident += OnNvme(client, ns, key) ? 1 : 0;
    }
    y.strict = strict;
    y.acked = previous.acked.size();
    y.nvme_blocks_at_checkpoint = previous.nvme_blocks;
    y.reclaims_at_checkpoint = previous.reclaims;
    crash_.acked += y.acked;
    // Whether each acknowledged block is there is asked before any read:
    // a read promotes, and a promotion may evict and demote other blocks,
    // and the NVMe tier make room by dropping some (a kept host tier starts
    // full). Reads then check the bytes of those still there.
    std::vector<bool> present(previous.acked.size());
    for (size_t i = 0; i < previous.acked.size(); ++i) {
      present[i] = TierOf(client, previous.acked[i].ns, previous.acked[i].key) != Tier::kNone;
    }
    std::set<std::pair<uint32_t, BlockKey>> read;
    for (size_t i = 0; i < previous.acked.size(); ++i) {
      const Acked& a = previous.acked[i];
      read.emplace(a.ns, a.key);
      if (present[i]) {
        ++y.acked_survived;
        ++crash_.acked_survived;
        static_cast<void>(ReadBack(client, y, a.ns, a.key));  // byte-exact, or moved out by the reads since
        continue;
      }
      ++y.acked_missing;
      if (!strict) {
        ++crash_.lost_but_reported;
        if (previous.erased_after.count({a.ns, a.key}) != 0) {
          ++y.acked_missing_erased;
          ++crash_.lost_erased_by_load;
        }
      } else {
        ++crash_.durability_violations;
        Problem("cycle " + std::to_string(y.cycle) + ": block " + a.key.ToHex() + " of " +
                space_.namespaces()[a.ns].descriptor.model_id +
                ", acknowledged on NVMe before a kill with no load after, is gone");
      }
    }
    if (strict && previous.nvme_blocks >= 0 && y.recovery_loaded < previous.nvme_blocks) {
      ++crash_.durability_violations;
      Problem("cycle " + std::to_string(y.cycle) + ": the NVMe tier held " + std::to_string(previous.nvme_blocks) +
              " blocks when killed with no load after the checkpoint, and loaded " + std::to_string(y.recovery_loaded) +
              " on restart");
    }
    for (NamespaceId ns = 0; ns < space_.namespaces().size(); ++ns) {
      for (const BlockKey& key : space_.namespaces()[ns].keys) {
        if (read.count({ns, key}) != 0) continue;
        static_cast<void>(ReadBack(client, y, ns, key));  // counted in `y` and the report
      }
    }
  }

  // Waits until nothing moves below the host tier. Returns the counters
  // then, or an error (not quiet within 10 s, or Stats failed).
  Result<std::vector<int64_t>> WaitQuiet(Client& client) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    std::vector<int64_t> last;
    while (Clock::now() < deadline) {
      auto counters = CounterMap(client);
      if (!counters.ok()) return counters.status();
      std::vector<int64_t> now = Moving(*counters);
      if (!InFlight(*counters) && now == last) return now;
      last = std::move(now);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return Busy("the daemon did not settle within 10 s");
  }

  Result<Checkpoint> TakeCheckpoint(Client& client) {
    auto before = WaitQuiet(client);
    if (!before.ok()) return before.status();
    Checkpoint cp;
    for (NamespaceId ns = 0; ns < space_.namespaces().size(); ++ns) {
      for (const BlockKey& key : space_.namespaces()[ns].keys) {
        const Tier tier = TierOf(client, ns, key);
        if (tier == Tier::kNvme) cp.acked.push_back({ns, key});
        if (tier == Tier::kHost) cp.host_acked.push_back({ns, key});
      }
    }
    auto after = CounterMap(client);
    if (!after.ok()) return after.status();
    if (InFlight(*after) || Moving(*after) != *before) return Busy("the daemon moved blocks during the checkpoint");
    cp.nvme_blocks = Get(*after, "nvme.blocks");
    cp.reclaims = Get(*after, "nvme.region_reclaims");
    return cp;
  }

  double Uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }

  // Sleeps `seconds` while the daemon runs; false if it exited.
  bool Sleep(support::StartedServer& server, double seconds, uint32_t cycle) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (Clock::now() < deadline) {
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(10), deadline - Clock::now()));
      std::string how;
      if (server.process.Exited(&how)) {
        report_.daemon_died = true;
        report_.daemon_problem = "kvtierd exited on its own in cycle " + std::to_string(cycle) + " (" + how + ")";
        Problem(report_.daemon_problem + "; its log:\n" + support::FileTail(server.log_path));
        return false;
      }
    }
    return true;
  }

  // Load, checkpoint, maybe more load, kill -9. False if the cycle could
  // not go on (the daemon died, the clients could not connect).
  bool Load(support::StartedServer& server, Client& checker, CrashCycle& y, Checkpoint& previous,
            bool& previous_strict) {
    auto load = StressLoad::Connect(server.socket_path, space_, o_.clients, /*reconnect=*/false);
    if (!load.ok()) {
      Problem("cycle " + std::to_string(y.cycle) + ": cannot connect the clients: " + load.status().ToString());
      return false;
    }
    StressTally tally;
    const auto t0 = Clock::now();
    (*load)->Start(mix_, o_.seed + 2 * y.cycle);
    bool alive = Sleep(server, Uniform(0.1, 0.6) * o_.cycle_seconds, y.cycle);
    (*load)->Stop(tally);
    auto checkpoint = alive ? TakeCheckpoint(checker) : Result<Checkpoint>(Unavailable("daemon gone"));
    bool strict = checkpoint.ok() && rng_() % 3 == 0;
    if (alive && !checkpoint.ok()) {
      std::fprintf(stderr, "kvtier stress: cycle %u: no checkpoint (%s)\n", y.cycle,
                   checkpoint.status().ToString().c_str());
    }
    StressTally after_checkpoint;
    if (alive && !strict) {
      (*load)->Start(mix_, o_.seed + 2 * y.cycle + 1, /*record_erases=*/true);
      alive = Sleep(server, Uniform(0, 0.4) * o_.cycle_seconds, y.cycle);
    }
    (*load)->MarkKilled();
    const std::string how = server.process.Kill();
    (*load)->Stop(after_checkpoint);
    if (checkpoint.ok())
      checkpoint->erased_after.insert(after_checkpoint.erased.begin(), after_checkpoint.erased.end());
    after_checkpoint.erased.clear();
    tally.Merge(after_checkpoint);
    y.load_ms = MsSince(t0);
    y.ops = tally.ops_total();
    report_.tally.Merge(tally);
    if (!alive) return false;
    if (how != "killed by signal 9") {
      Problem("cycle " + std::to_string(y.cycle) + ": kvtierd ended with " + how + " before the kill");
      return false;
    }
    previous = checkpoint.ok() ? std::move(*checkpoint) : Checkpoint{};
    previous_strict = strict;
    return true;
  }

  const StressOptions& o_;
  const KeySpace& space_;
  const WorkloadMix& mix_;
  const std::string kvtierd_;
  const std::string dir_;
  const std::string toml_;
  StressReport& report_;
  CrashLoopReport& crash_;
  std::mt19937_64 rng_;
  std::vector<std::byte> buffer_;
  std::unique_ptr<support::FdStore> store_;  // --keep-host: what systemd's descriptor store would hold
};

}  // namespace

int RunCrashLoop(const StressOptions& options, const KeySpace& space, const WorkloadMix& mix,
                 const std::string& kvtierd, const std::string& dir, const std::string& extra_toml,
                 StressReport& report) {
  CrashLoop loop(options, space, mix, kvtierd, dir, extra_toml, report);
  const int code = loop.Run();
  double load_ms = 0;
  for (const CrashCycle& y : report.crash.cycles) load_ms += y.load_ms;
  report.seconds = load_ms / 1000.0;
  return code;
}

}  // namespace kvtier::tools
