#include "tools/bench/bench_startup.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "kvtier/client.h"
#include "support/process.h"
#include "support/servers.h"
#include "support/temp_dir.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The ceiling: an arena of `bytes` made resident and locked at once, as
// kvtierd did before it served. Seconds, or a negative value when a call
// failed (the machine cannot hold it).
double SyncFaultIn(uint64_t bytes, bool& locked) {
  const auto t0 = Clock::now();
  const int fd = ::memfd_create("kvtier-bench-arena", MFD_CLOEXEC);
  if (fd < 0) return -1;
  double seconds = -1;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0) {
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base != MAP_FAILED) {
      locked = ::mlock(base, bytes) == 0;
      seconds = Since(t0);
      ::munmap(base, bytes);
    }
  }
  ::close(fd);
  return seconds;
}

int64_t Stat(Client& client, const std::string& name) {
  auto stats = client.Stats();
  if (!stats.ok()) return -1;
  for (const Counter& c : *stats) {
    if (c.name == name) return c.value;
  }
  return -1;
}

struct Row {
  uint64_t arena_bytes = 0;
  double serve_s = 0, allocated_s = 0, warm_s = 0, sync_s = 0;
  bool locked = false, sync_locked = false, warmed = true;
};

}  // namespace

void AddStartupBenchOptions(CLI::App& app, StartupBenchOptions& o) {
  app.add_option("--kvtierd", o.kvtierd_path,
                 "kvtierd binary to start (default: the kvtierd of this build or install)");
  app.add_option("--arena-bytes", o.arena_bytes, "Arena sizes, one private kvtierd each (e.g. 1GiB,4GiB)")
      ->transform(CLI::AsSizeValue(false))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--allocate-at-start", o.allocate_at_start_bytes,
                 "host.allocate_at_start_bytes of the daemons (e.g. 1GiB; 0: the whole arena before serving)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--json", o.json_path, "Also write the figures as JSON here");
}

int RunStartupBench(const StartupBenchOptions& o) {
  const std::string path = o.kvtierd_path.empty() ? support::DefaultKvtierdPath() : o.kvtierd_path;
  std::vector<Row> rows;
  for (uint64_t bytes : o.arena_bytes) {
    Row row;
    row.arena_bytes = bytes;
    row.sync_s = SyncFaultIn(bytes, row.sync_locked);
    if (row.sync_s < 0) {
      std::fprintf(stderr, "kvtier bench startup: this machine cannot make %llu bytes resident\n",
                   static_cast<unsigned long long>(bytes));
      return 1;
    }
    auto dir = support::MakeTempDir("kvtier-bench-startup");
    if (!dir.ok()) {
      std::fprintf(stderr, "kvtier bench startup: %s\n", dir.status().ToString().c_str());
      return 1;
    }
    const auto t0 = Clock::now();
    auto started =
        support::StartKvtierd(path, *dir, bytes, std::chrono::seconds(120), "[events]\nenabled = false\n", nullptr,
                              o.allocate_at_start_bytes > 0  // an older kvtierd lacks the key
                                  ? "allocate_at_start_bytes = " + std::to_string(o.allocate_at_start_bytes) + "\n"
                                  : std::string());
    if (!started.ok()) {
      std::fprintf(stderr, "kvtier bench startup: cannot start kvtierd: %s\n", started.status().ToString().c_str());
      support::RemoveTree(*dir);
      return 1;
    }
    row.serve_s = Since(t0);
    ClientOptions co;
    co.socket_path = started->socket_path;
    co.client_name = "kvtier-bench-startup";
    co.prefault_arena = false;
    auto client = Client::Connect(co);
    if (!client.ok()) {
      std::fprintf(stderr, "kvtier bench startup: %s\n", client.status().ToString().c_str());
      support::RemoveTree(*dir);
      return 1;
    }
    const int64_t capacity = Stat(**client, "host.arena.capacity_bytes");
    // A kvtierd that allocates its whole arena before it serves has no
    // host.arena.allocated_bytes; one that also warms it first no warm_bytes.
    row.allocated_s = row.serve_s;
    if (Stat(**client, "host.arena.warm_bytes") < 0) {
      row.warm_s = row.serve_s;
    } else {
      // Until warm; a warm-up that stops moving for 10 s (or stats that fail) ended short.
      const int64_t allocated_at_serve = Stat(**client, "host.arena.allocated_bytes");
      bool allocated = allocated_at_serve < 0 || allocated_at_serve >= capacity;
      int64_t last = -1;
      auto moved = Clock::now();
      for (int64_t warm = 0; (warm = Stat(**client, "host.arena.warm_bytes")) < capacity;) {
        if (warm < 0 || Since(moved) > 10) {
          row.warmed = false;
          break;
        }
        if (!allocated && Stat(**client, "host.arena.allocated_bytes") >= capacity) {
          allocated = true;
          row.allocated_s = Since(t0);
        }
        if (warm != last) moved = Clock::now();
        last = warm;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      row.warm_s = Since(t0);
      if (!allocated) row.allocated_s = row.warm_s;
    }
    row.locked = Stat(**client, "host.arena.locked") == 1;
    client->reset();
    started->process.Stop();
    support::RemoveTree(*dir);
    rows.push_back(row);
  }

  std::printf("kvtier bench startup: kvtierd %s (host.lock_memory best_effort, host.allocate_at_start_bytes %llu)\n",
              path.c_str(), static_cast<unsigned long long>(o.allocate_at_start_bytes));
  std::printf("  %10s %9s %11s %9s %15s %14s %8s\n", "arena", "serve s", "allocated s", "warm s", "ceiling sync s",
              "serve/ceiling", "locked");
  for (const Row& r : rows) {
    std::printf("  %8.1f G %9.3f %11.3f %9.3f %15.3f %13.3fx %8s\n", static_cast<double>(r.arena_bytes) / (1 << 30),
                r.serve_s, r.allocated_s, r.warm_s, r.sync_s, r.serve_s / r.sync_s, r.locked ? "yes" : "no");
  }
  std::printf(
      "  serve: exec to the first Hello answered; allocated: until host.arena.allocated_bytes reached the arena's\n"
      "  size (the host tier can hand out all of it); warm: until host.arena.warm_bytes did;\n"
      "  ceiling: memfd + fallocate + MAP_POPULATE + mlock of that size in this process (what start-up waited for).\n");
  bool all_warmed = true;
  for (const Row& r : rows) {
    if (!r.warmed) {
      std::fprintf(stderr, "kvtier bench startup: the %.1f GiB arena's warm-up stopped short (see the daemon's log)\n",
                   static_cast<double>(r.arena_bytes) / (1 << 30));
      all_warmed = false;
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream json(o.json_path);
    json << "{\"bench\": \"startup\", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      json << (i ? ", " : "") << "{\"arena_bytes\": " << r.arena_bytes << ", \"serve_s\": " << r.serve_s
           << ", \"allocated_s\": " << r.allocated_s << ", \"warm_s\": " << r.warm_s
           << ", \"ceiling_sync_s\": " << r.sync_s << ", \"ceiling_locked\": " << (r.sync_locked ? "true" : "false")
           << ", \"locked\": " << (r.locked ? "true" : "false") << ", \"warmed\": " << (r.warmed ? "true" : "false")
           << "}";
    }
    json << "]}\n";
    if (!json) {
      std::fprintf(stderr, "kvtier bench startup: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
  }
  return all_warmed ? 0 : 1;
}

}  // namespace kvtier::tools
