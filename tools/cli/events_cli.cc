#include "tools/cli/events_cli.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "common/kv_event_forms.h"
#include "common/logging.h"
#include "kvtier/client.h"
#include "tools/cli/block_listing.h"
#include "subscriber/event_index.h"
#include "subscriber/event_source.h"
#include "subscriber/kv_event_batch.h"

namespace kvtier::tools {
using events::DecodeKvEventBatch;
using events::EventSource;
using events::IndexRebuilder;
using events::KvEvent;
using events::KvEventKind;
using events::KvEventKindName;
using events::SeqPayload;

namespace {

constexpr int kDone = 0, kFailed = 1, kUsage = 2, kUnreachable = 3;
// How long one wait for the stream lasts: the stop conditions are checked
// at least this often.
constexpr auto kPollStep = std::chrono::milliseconds(100);
// The SUB socket's join takes a moment (ZeroMQ's slow joiner): what is
// published before it completes is not delivered, so a rebuild waits (at
// most this long) for the publisher to take the subscription before its
// snapshot (a batch lost anyway is replayed as a gap).
constexpr auto kJoinWait = std::chrono::seconds(10);

volatile std::sig_atomic_t g_stop = 0;
extern "C" void OnStopSignal(int) { g_stop = 1; }

int Fail(int code, const std::string& why) {
  std::fprintf(stderr, "kvtier events: %s\n", why.c_str());
  return code;
}

int ExitFor(const Status& s) { return s.code() == StatusCode::kUnavailable ? kUnreachable : kFailed; }

// The daemon's default endpoint `file` beside `socket_path`, as
// daemon/setup/events_setup.cc derives it (per tenant: NAME before .sock).
std::string Derived(const std::string& socket_path, const std::string& file, const std::string& tenant) {
  const std::string dir = std::filesystem::path(socket_path).parent_path().string();
  const std::string name = tenant.empty() ? file : file.substr(0, file.size() - 5) + "-" + tenant + ".sock";
  return "ipc://" + (dir.empty() ? std::string(".") : dir) + "/" + name;
}

// The endpoints the daemon tells this caller at Hello (its tenant's), when
// neither endpoint nor --tenant is given and the daemon answers; else
// empty (an operator's connection is told none: --tenant names one).
EventsEndpoints AskedEndpoints(const EventsOptions& options) {
  if (!options.tenant.empty() || (!options.endpoint.empty() && !options.replay_endpoint.empty())) return {};
  ClientOptions o;
  o.socket_path = options.socket_path;
  o.client_name = "kvtier-events";
  o.use_directory = false;
  o.prefault_arena = false;  // an admin command never touches the arena
  o.reconnect = false;
  auto client = Client::Connect(o);
  return client.ok() ? (*client)->events_endpoints() : EventsEndpoints{};
}

std::string EventJson(int64_t seq, double ts, const KvEvent& e) {
  char number[64];
  std::snprintf(number, sizeof number, "%.6f", ts);
  std::string out = "{\"seq\":" + std::to_string(seq) + ",\"ts\":" + number + ",\"kind\":\"" +
                    std::string(KvEventKindName(e.kind)) + "\"";
  if (e.kind != KvEventKind::kCleared) {
    out += ",\"medium\":\"" + std::string(MediumName(e.tier)) + "\",\"tier\":\"" + std::string(TierName(e.tier)) +
           "\",\"namespace\":\"" + e.ns.ToHex() + "\",\"keys\":[";
    for (size_t i = 0; i < e.keys.size(); ++i) out += (i > 0 ? ",\"" : "\"") + e.keys[i].ToHex() + "\"";
    out += "]";
    if (e.kind == KvEventKind::kStored) out += ",\"parent\":" + (e.parent ? "\"" + e.parent->ToHex() + "\"" : "null");
  }
  return out + "}";
}

std::string EventText(int64_t seq, double ts, const KvEvent& e) {
  char head[96];
  std::snprintf(head, sizeof head, "%lld %.6f %s", static_cast<long long>(seq), ts,
                std::string(KvEventKindName(e.kind)).c_str());
  std::string out = head;
  if (e.kind == KvEventKind::kCleared) return out + " (forget everything this daemon said)";
  out += " " + std::string(MediumName(e.tier)) + " ns=" + e.ns.ToHex();
  if (e.kind == KvEventKind::kStored) out += " parent=" + (e.parent ? e.parent->ToHex() : std::string("-"));
  out += " keys=" + std::to_string(e.keys.size());
  for (size_t i = 0; i < e.keys.size(); ++i) out += (i > 0 ? "," : " ") + e.keys[i].ToHex();
  return out;
}

// Whether --count or --seconds (or a signal) says stop.
class StopRule {
 public:
  explicit StopRule(const EventsOptions& o)
      : count_(o.count),
        timed_(o.seconds > 0),
        deadline_(std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                         std::chrono::duration<double>(timed_ ? o.seconds : 0.0))) {}
  void Counted(size_t events) { seen_ += events; }
  bool Done() const {
    return g_stop != 0 || (count_ > 0 && seen_ >= count_) || (timed_ && std::chrono::steady_clock::now() >= deadline_);
  }
  // How long the next wait may last.
  std::chrono::milliseconds Wait() const {
    if (!timed_) return kPollStep;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
    return std::clamp(left, std::chrono::milliseconds(0), std::chrono::milliseconds(kPollStep));
  }
  uint64_t remaining() const { return count_ > seen_ ? count_ - seen_ : 0; }
  bool counts() const { return count_ > 0; }

 private:
  const uint64_t count_;
  const bool timed_;
  const std::chrono::steady_clock::time_point deadline_;
  uint64_t seen_ = 0;
};

int Tail(EventSource& source, const EventsOptions& options) {
  StopRule stop(options);
  std::optional<int64_t> last;  // the previous batch's seq
  while (!stop.Done()) {
    auto next = source.Next(stop.Wait());
    if (!next.ok()) return Fail(ExitFor(next.status()), next.status().ToString());
    if (!next->has_value()) continue;
    const SeqPayload& got = **next;
    // A tail replays nothing: it says what a subscriber would have to mend.
    if (last && got.seq <= *last) {
      std::fprintf(stderr, "kvtier events: sequence numbers went back (%lld after %lld): another run of kvtierd\n",
                   static_cast<long long>(got.seq), static_cast<long long>(*last));
    } else if (last && got.seq > *last + 1) {
      std::fprintf(stderr, "kvtier events: batches %lld to %lld lost (a subscriber replays them)\n",
                   static_cast<long long>(*last + 1), static_cast<long long>(got.seq - 1));
    }
    last = got.seq;
    auto batch = DecodeKvEventBatch(got.payload);
    if (!batch.ok()) {  // said, and skipped: a tail goes on
      std::fprintf(stderr, "kvtier events: batch %lld does not decode: %s\n", static_cast<long long>(got.seq),
                   batch.status().ToString().c_str());
      continue;
    }
    for (const KvEvent& e : batch->events) {
      if (stop.counts() && stop.remaining() == 0) break;
      const std::string line = options.json ? EventJson(got.seq, batch->ts, e) : EventText(got.seq, batch->ts, e);
      std::printf("%s\n", line.c_str());
      stop.Counted(1);
    }
    std::fflush(stdout);
  }
  return kDone;
}

int Rebuild(EventSource& source, const EventsOptions& options) {
  StopRule stop(options);
  IndexRebuilder index(source);
  if (Status s = source.WaitSubscribed(kJoinWait); !s.ok()) return Fail(ExitFor(s), "subscribing: " + s.ToString());
  if (Status s = index.Resync(); !s.ok()) return Fail(ExitFor(s), "snapshot: " + s.ToString());
  // Until told to stop; then what has arrived meanwhile, so that the index
  // is as of the moment it stops.
  bool draining = false;
  for (;;) {
    if (!draining && stop.Done()) draining = true;
    auto next = source.Next(draining ? std::chrono::milliseconds(0) : stop.Wait());
    if (!next.ok()) return Fail(ExitFor(next.status()), next.status().ToString());
    if (!next->has_value()) {
      if (draining) break;
      continue;
    }
    auto applied = index.OnStream(**next);
    if (!applied.ok()) return Fail(ExitFor(applied.status()), applied.status().ToString());
    stop.Counted(*applied);
  }
  if (index.restarts() > 0) {
    std::fprintf(stderr, "kvtier events: the daemon restarted %d time(s); the index is its latest run's\n",
                 index.restarts());
  }
  PrintBlocks(index.Blocks(), options.json);
  return kDone;
}

}  // namespace

CLI::App* AddEventsCommand(CLI::App& app, EventsOptions& options) {
  options.socket_path = ClientOptions().socket_path;
  CLI::App* sub = app.add_subcommand(
      "events", "Tail a kvtierd's KV events, or rebuild the index a router would from a snapshot and the stream");
  sub->add_option("--socket", options.socket_path, "kvtierd socket (the events endpoints are beside it)")
      ->capture_default_str();
  sub->add_option(
      "--endpoint", options.endpoint,
      "The PUB endpoint (default: the one kvtierd tells at connect, else ipc://<socket dir>/kvtierd-events.sock)");
  sub->add_option("--replay-endpoint", options.replay_endpoint,
                  "The replay endpoint (default: as --endpoint, kvtierd-events-replay.sock)");
  sub->add_option("--tenant", options.tenant, "A tenant's sockets (kvtierd-events-<tenant>.sock, ...)");
  sub->add_flag("--json", options.json, "One JSON object per event (--rebuild: the index as `ls --blocks --json`)");
  sub->add_option("--count", options.count, "Stop after N events (0: never)");
  sub->add_option("--seconds", options.seconds, "Stop after S seconds (0: never)")->check(CLI::NonNegativeNumber);
  sub->add_flag("--rebuild", options.rebuild,
                "Rebuild the index from a snapshot and the stream; print it at the end as `ls --blocks` does");
  return sub;
}

int RunEvents(const EventsOptions& options) {
  if (!options.tenant.empty() && options.tenant.find_first_of("/\\") != std::string::npos) {
    return Fail(kUsage, "--tenant " + options.tenant + ": a tenant name has no slash");
  }
  EventsEndpoints told = AskedEndpoints(options);
  if (told.publish.empty()) {
    told = {Derived(options.socket_path, "kvtierd-events.sock", options.tenant),
            Derived(options.socket_path, "kvtierd-events-replay.sock", options.tenant)};
  }
  const std::string endpoint = !options.endpoint.empty() ? options.endpoint : told.publish;
  const std::string replay = !options.replay_endpoint.empty() ? options.replay_endpoint : told.replay;
  auto source = EventSource::Open(endpoint, replay);
  if (!source.ok()) return Fail(kUnreachable, source.status().ToString());
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  return options.rebuild ? Rebuild(**source, options) : Tail(**source, options);
}

}  // namespace kvtier::tools
