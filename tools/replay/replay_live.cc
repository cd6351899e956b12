#include "tools/replay/replay_live.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "kvtier/client.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// One run's client, trace and tallies; a request's steps are Find (its
// lookup) and Keep (its pins, new blocks and releases).
class LiveRun {
 public:
  LiveRun(Client& client, const Trace& trace, const LiveOptions& options)
      : client_(client), trace_(trace), o_(options), warm_(Warm(trace, options)) {}

  // Step 1: the lookup of request `r`'s chain; its hit is counted when it
  // is measured.
  Status Find(size_t r) {
    const TraceRequest& req = trace_.requests[r];
    const auto t0 = Clock::now();
    auto found = client_.Lookup(0, req.blocks);
    if (!found.ok()) return Failed(r, "lookup", found.status());
    if (r < warm_) return Status::Ok();
    result_.lookup_us.push_back(MicrosSince(t0));
    ++result_.requests;
    result_.blocks += req.blocks.size();
    result_.tokens += req.input_tokens;
    result_.hit_blocks += found->prefix_blocks;
    for (size_t i = 0; i < found->prefix_blocks; ++i) {
      result_.hit_tokens += BlockTokens(req, i, trace_.block_tokens);
      const Tier tier = i < found->tiers.size() ? found->tiers[i] : Tier::kNone;
      ++result_.tier_hits[tier == Tier::kHost ? kHostTier : tier == Tier::kNvme ? kNvmeTier : kRemoteTier];
    }
    return Status::Ok();
  }

  // Steps 2-5 for request `r`: pins, reservations, commits, releases.
  Status Keep(size_t r) {
    const TraceRequest& req = trace_.requests[r];
    const std::vector<BlockKey>& keys = req.blocks;
    // Read what is resident; reserve the rest root first while it fits.
    std::vector<Result<BlockView>> views;
    if (o_.settle) {
      for (const BlockKey& key : keys) {
        views.push_back(std::move(client_.Pin(0, {&key, 1}).front()));
        o_.settle();
      }
    } else {
      views = client_.Pin(0, keys);
    }
    std::vector<std::pair<size_t, Reservation>> reserved;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (views[i].ok()) continue;
      const uint64_t size = BlockTokens(req, i, trace_.block_tokens) * o_.bytes_per_token;
      if (size == 0) continue;
      auto reservation = client_.Reserve(0, {&keys[i], 1}, {&size, 1});
      if (o_.settle) o_.settle();
      if (!reservation.ok()) return Failed(r, "reserve", reservation.status());
      WritableBlock& block = reservation->blocks()[0];
      if (block.status.code() == StatusCode::kNoSpace) {
        ++result_.not_kept;
        break;  // the prefix that fits is kept
      }
      if (block.status.code() == StatusCode::kAlreadyExists) continue;  // another client wrote it meanwhile
      if (!block.status.ok()) return Failed(r, "reserve", block.status);
      std::memset(block.data.data(), static_cast<int>((i * 31 + r) & 0xff), block.data.size());
      reserved.emplace_back(i, std::move(*reservation));
    }
    for (size_t k = reserved.size(); k-- > 0;) {
      for (const Status& s : reserved[k].second.Commit()) {
        if (!s.ok()) return Failed(r, "commit", s);
      }
      if (o_.settle) o_.settle();
      ++result_.put_blocks;
      result_.put_bytes += reserved[k].second.blocks()[0].data.size();
    }
    for (size_t i = keys.size(); i-- > 0;) {
      if (!views[i].ok()) continue;
      if (Status s = views[i]->Release(); !s.ok()) return Failed(r, "release", s);
    }
    return Status::Ok();
  }

  // A scheduled queue hint: request `r` (its id r + 1) queued at `at_us`,
  // expected at `start_us`, or leaving the queue.
  Status Enqueue(size_t r, uint64_t at_us, uint64_t start_us) {
    const TraceRequest& req = trace_.requests[r];
    const auto start_in = std::chrono::microseconds(static_cast<int64_t>(start_us - std::min(start_us, at_us)));
    Status s = client_.Enqueue(r + 1, 0, req.blocks, start_in, req.session);
    return s.ok() ? s : Failed(r, "enqueue", s);
  }
  Status Dequeue(size_t r) {
    Status s = client_.Started(r + 1);
    return s.ok() ? s : Failed(r, "dequeue", s);
  }

  bool measured(size_t r) const { return r >= warm_; }
  LiveResult& result() { return result_; }

 private:
  static size_t Warm(const Trace& trace, const LiveOptions& o) {
    return static_cast<size_t>(std::floor(o.warmup * double(trace.requests.size())));
  }
  static Status Failed(size_t r, const char* step, const Status& s) {
    return IoError("request " + std::to_string(r + 1) + ": " + step + ": " + s.ToString());
  }

  Client& client_;
  const Trace& trace_;
  const LiveOptions& o_;
  const size_t warm_;
  LiveResult result_;
};

// The simulator's schedule, step by step: the daemon's clock moved to each
// step's time first (LiveOptions::at), its background work waited for
// after it (settle).
Status FollowSchedule(LiveRun& run, const LiveOptions& o) {
  std::unordered_map<size_t, Clock::time_point> since;  // started requests: their lookup's time
  for (const ScheduleEvent& e : o.schedule) {
    if (o.at) o.at(e.at_us);
    Status s = Status::Ok();
    switch (e.kind) {
      case ScheduleEvent::Kind::kEnqueue:
        s = run.Enqueue(e.request, e.at_us, e.start_us);
        break;
      case ScheduleEvent::Kind::kDequeue:
        s = run.Dequeue(e.request);
        break;
      case ScheduleEvent::Kind::kStart:
        since[e.request] = Clock::now();
        s = run.Find(e.request);
        break;
      case ScheduleEvent::Kind::kCommit:
        s = run.Keep(e.request);
        if (s.ok() && run.measured(e.request)) run.result().request_us.push_back(MicrosSince(since[e.request]));
        since.erase(e.request);
        break;
    }
    if (!s.ok()) return s;
    if (o.settle) o.settle();
  }
  return Status::Ok();
}

}  // namespace

Result<LiveResult> ReplayLive(const Trace& trace, const LiveOptions& o) {
  if (o.bytes_per_token == 0) return InvalidArgument("live mode needs --bytes-per-token (payload sizes)");
  if (!(o.warmup >= 0 && o.warmup < 1)) return InvalidArgument("warm-up fraction must be in [0, 1)");
  for (const ScheduleEvent& e : o.schedule) {
    if (e.request >= trace.requests.size()) return InvalidArgument("the schedule names a request not in the trace");
  }
  NamespaceDescriptor ns;
  ns.model_id = "kvtier-replay";
  ns.model_revision = "live";
  ns.kv_dtype = "bf16";
  ns.block_tokens = trace.block_tokens;
  ns.layer_count = 1;
  ns.kv_layout = "layer_major_kv";
  ns.bytes_per_token_per_layer = o.bytes_per_token;
  ClientOptions options;
  options.socket_path = o.socket_path;
  options.client_name = "kvtier-replay";
  options.namespaces = {ns};
  options.use_directory = false;  // every call in order through the daemon (the sim's order)
  auto connected = Client::Connect(options);
  if (!connected.ok()) return connected.status();

  LiveRun run(**connected, trace, o);
  const auto started = Clock::now();
  if (!o.schedule.empty()) {
    if (Status s = FollowSchedule(run, o); !s.ok()) return s;
  } else {
    for (size_t r = 0; r < trace.requests.size(); ++r) {
      const auto t0 = Clock::now();
      if (Status s = run.Find(r); !s.ok()) return s;
      if (Status s = run.Keep(r); !s.ok()) return s;
      if (run.measured(r)) run.result().request_us.push_back(MicrosSince(t0));
    }
  }
  LiveResult result = std::move(run.result());
  result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return result;
}

}  // namespace kvtier::tools
