#include "tools/replay/replay_live.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "kvtier/client.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

}  // namespace

Result<LiveResult> ReplayLive(const Trace& trace, const LiveOptions& o) {
  if (o.bytes_per_token == 0) return InvalidArgument("live mode needs --bytes-per-token (payload sizes)");
  if (!(o.warmup >= 0 && o.warmup < 1)) return InvalidArgument("warm-up fraction must be in [0, 1)");
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
  Client& client = **connected;

  LiveResult result;
  const size_t n = trace.requests.size();
  const auto warm = static_cast<size_t>(std::floor(o.warmup * double(n)));
  const auto started = Clock::now();
  for (size_t r = 0; r < n; ++r) {
    const TraceRequest& req = trace.requests[r];
    const std::vector<BlockKey>& keys = req.blocks;
    const bool measured = r >= warm;
    const auto t0 = Clock::now();
    auto found = client.Lookup(0, keys);
    if (!found.ok()) return IoError("request " + std::to_string(r + 1) + ": lookup: " + found.status().ToString());
    const double lookup_us = MicrosSince(t0);
    uint64_t hit_tokens = 0;
    std::array<uint64_t, kSimTiers> tier_hits{};
    for (size_t i = 0; i < found->prefix_blocks; ++i) {
      hit_tokens += BlockTokens(req, i, trace.block_tokens);
      const Tier tier = i < found->tiers.size() ? found->tiers[i] : Tier::kNone;
      ++tier_hits[tier == Tier::kHost ? kHostTier : tier == Tier::kNvme ? kNvmeTier : kRemoteTier];
    }
    // Read what is resident; reserve the rest root first while it fits.
    std::vector<Result<BlockView>> views;
    if (o.settle) {
      for (const BlockKey& key : keys) {
        views.push_back(std::move(client.Pin(0, {&key, 1}).front()));
        o.settle();
      }
    } else {
      views = client.Pin(0, keys);
    }
    std::vector<std::pair<size_t, Reservation>> reserved;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (views[i].ok()) continue;
      const uint64_t size = BlockTokens(req, i, trace.block_tokens) * o.bytes_per_token;
      if (size == 0) continue;
      auto reservation = client.Reserve(0, {&keys[i], 1}, {&size, 1});
      if (o.settle) o.settle();
      if (!reservation.ok()) {
        return IoError("request " + std::to_string(r + 1) + ": reserve: " + reservation.status().ToString());
      }
      WritableBlock& block = reservation->blocks()[0];
      if (block.status.code() == StatusCode::kNoSpace) {
        ++result.not_kept;
        break;  // the prefix that fits is kept
      }
      if (block.status.code() == StatusCode::kAlreadyExists) continue;  // another client wrote it meanwhile
      if (!block.status.ok()) {
        return IoError("request " + std::to_string(r + 1) + ": reserve: " + block.status.ToString());
      }
      std::memset(block.data.data(), static_cast<int>((i * 31 + r) & 0xff), block.data.size());
      reserved.emplace_back(i, std::move(*reservation));
    }
    for (size_t k = reserved.size(); k-- > 0;) {
      for (const Status& s : reserved[k].second.Commit()) {
        if (!s.ok()) return IoError("request " + std::to_string(r + 1) + ": commit: " + s.ToString());
      }
      if (o.settle) o.settle();
      ++result.put_blocks;
      result.put_bytes += reserved[k].second.blocks()[0].data.size();
    }
    for (size_t i = keys.size(); i-- > 0;) {
      if (!views[i].ok()) continue;
      if (Status s = views[i]->Release(); !s.ok()) {
        return IoError("request " + std::to_string(r + 1) + ": release: " + s.ToString());
      }
    }
    if (measured) {
      ++result.requests;
      result.blocks += keys.size();
      result.tokens += req.input_tokens;
      result.hit_blocks += found->prefix_blocks;
      result.hit_tokens += hit_tokens;
      for (int t = 0; t < kSimTiers; ++t) result.tier_hits[t] += tier_hits[t];
      result.lookup_us.push_back(lookup_us);
      result.request_us.push_back(MicrosSince(t0));
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return result;
}

}  // namespace kvtier::tools
