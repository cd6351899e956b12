#include "tools/stress/stress_workload.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "tools/stress/stress_ops.h"

namespace kvtier::tools {

using stress_ops::Clock;
using stress_ops::IsRefusal;
using stress_ops::NsSince;

namespace {

std::discrete_distribution<size_t> KindDistribution(const WorkloadMix& mix) {
  return std::discrete_distribution<size_t>(mix.weights.begin(), mix.weights.end());
}

}  // namespace

Result<WorkloadMix> ParseMix(std::string_view text) {
  WorkloadMix mix;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return InvalidArgument("--mix: '" + std::string(item) + "' is not kind=weight");
    auto kind = ParseOpKind(item.substr(0, eq));
    if (!kind) return InvalidArgument("--mix: unknown kind '" + std::string(item.substr(0, eq)) + "'");
    const std::string number(item.substr(eq + 1));
    char* end = nullptr;
    const unsigned long w = std::strtoul(number.c_str(), &end, 10);
    if (number.empty() || *end != '\0' || w > 1000000) {
      return InvalidArgument("--mix: bad weight '" + number + "'");
    }
    mix.weights[static_cast<size_t>(*kind)] = static_cast<uint32_t>(w);
  }
  uint64_t total = 0;
  for (uint32_t w : mix.weights) total += w;
  if (total == 0) return InvalidArgument("--mix: every weight is 0");
  return mix;
}

std::string MixToString(const WorkloadMix& mix) {
  std::string out;
  for (size_t i = 0; i < kOpKinds; ++i) {
    if (!out.empty()) out += ',';
    out += std::string(OpKindName(static_cast<OpKind>(i))) + "=" + std::to_string(mix.weights[i]);
  }
  return out;
}

StressWorker::StressWorker(const KeySpace& space, Client& client, const WorkloadMix& mix, uint64_t seed, uint32_t index,
                           const std::atomic<bool>& stop, const std::atomic<bool>& killed)
    : space_(space),
      client_(client),
      stop_(stop),
      killed_(killed),
      kinds_(KindDistribution(mix)),
      rng_(seed ^ (0x9e3779b97f4a7c15ull * (index + 1))),
      index_(index) {
  uint64_t largest = 0;
  size_t chain_blocks = 0;
  for (const auto& ns : space_.namespaces()) {
    largest = std::max(largest, ns.shape.block_bytes());
    for (const auto& chain : ns.chains) chain_blocks = std::max(chain_blocks, chain.size());
  }
  buffer_bytes_ = largest + 4096;
  buffers_.assign(chain_blocks, std::vector<std::byte>(buffer_bytes_));
}

void StressWorker::Run() {
  while (!stop_.load(std::memory_order_relaxed)) {
    RunOne(static_cast<OpKind>(kinds_(rng_)));
  }
}

void StressWorker::RunOne(OpKind kind) {
  const uint64_t errors_before = tally_.errors_total() + tally_.after_kill;
  switch (kind) {
    case OpKind::kPut:
      Put();
      break;
    case OpKind::kReserve:
      Reserve();
      break;
    case OpKind::kSave:
      Save();
      break;
    case OpKind::kGet:
      Get();
      break;
    case OpKind::kPin:
      PinViews();
      break;
    case OpKind::kLookup:
      Lookup();
      break;
    case OpKind::kErase: {
      const Pick pick = PickPrefix();
      const size_t from = rng_() % pick.keys.size();
      EraseKeys(pick, pick.chain.subspan(from, pick.keys.size() - from));
      break;
    }
    case OpKind::kLoad:
      Load();
      break;
    case OpKind::kLayers:
      GetLayers();
      break;
    case OpKind::kHint:
      Hint();
      break;
  }
  // A daemon that is gone fails every call at once: do not spin on it.
  if (tally_.errors_total() + tally_.after_kill != errors_before) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

StressWorker::Pick StressWorker::PickPrefix() {
  Pick pick;
  pick.ns = static_cast<NamespaceId>(rng_() % space_.namespaces().size());
  pick.space = &space_.namespaces()[pick.ns];
  // Chain c with probability ~ the square of a uniform draw: low chains hot.
  const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
  const size_t chains = pick.space->chains.size();
  const size_t c = std::min(chains - 1, static_cast<size_t>(u * u * static_cast<double>(chains)));
  pick.chain = pick.space->chains[c];
  pick.keys = pick.chain.first(1 + rng_() % pick.chain.size());
  return pick;
}

std::span<std::byte> StressWorker::Buffer(size_t i, uint64_t bytes) {
  return std::span<std::byte>(buffers_[i]).first(std::min(bytes, buffer_bytes_));
}

void StressWorker::Error(OpKind kind, const Status& status) {
  if (killed_.load(std::memory_order_relaxed)) {
    ++tally_.after_kill;
    return;
  }
  tally_.AddError(kind, status);
}

void StressWorker::Count(OpKind kind, const Status& status) {
  KindTally& t = tally_.of(kind);
  if (status.ok()) {
    ++t.ok;
  } else if (status.code() == StatusCode::kNotFound) {
    ++t.misses;
  } else if (IsRefusal(status.code())) {
    ++t.refused;
  } else {
    Error(kind, status);
  }
}

void StressWorker::Violate(OpKind kind, const Pick& pick, const BlockKey& key, std::string what) {
  tally_.AddViolation(kind, pick.space->descriptor.model_id, key, std::move(what));
}

void StressWorker::CheckRead(OpKind kind, const Pick& pick, const BlockKey& key, uint32_t first, uint32_t last,
                             std::span<const std::byte> got) {
  const ValueCheck check = CheckLayers(pick.space->shape, key, first, last, got);
  if (check.ok()) {
    ++tally_.of(kind).ok;
  } else {
    Violate(kind, pick, key, std::string(MismatchName(check.mismatch)) + ": " + check.detail);
  }
}

void StressWorker::EraseKeys(const Pick& pick, std::span<const BlockKey> keys) {
  KindTally& t = tally_.of(OpKind::kErase);
  ++t.ops;
  t.blocks += keys.size();
  if (record_erases_) {
    for (const BlockKey& k : keys) tally_.erased.emplace_back(pick.ns, k);
  }
  const auto t0 = Clock::now();
  auto erased = client_.Erase(pick.ns, keys);
  t.latency.Add(NsSince(t0));
  if (!erased.ok()) return Error(OpKind::kErase, erased.status());
  if (*erased > keys.size()) {
    return Violate(OpKind::kErase, pick, keys[0],
                   "Erase of " + std::to_string(keys.size()) + " keys erased " + std::to_string(*erased));
  }
  t.ok += *erased;
  t.misses += keys.size() - *erased;
}

void StressWorker::Hint() {
  const Pick pick = PickPrefix();
  KindTally& t = tally_.of(OpKind::kHint);
  ++t.ops;
  const uint64_t sessions = 1 + uint64_t{index_} * 16;  // this client's four conversations
  const uint64_t r = rng_() % 10;
  const auto t0 = Clock::now();
  Status s;
  if (r < 6 && queued_.size() < 32) {
    const uint64_t request = next_request_++;
    const uint64_t session = rng_() % 3 == 0 ? 0 : sessions + rng_() % 4;
    t.blocks += pick.keys.size();
    s = client_.Enqueue(request, pick.ns, pick.keys, Clock::now() + std::chrono::milliseconds(rng_() % 50), session);
    if (s.ok()) queued_.push_back(request);
  } else if (r < 9 && !queued_.empty()) {
    const uint64_t request = queued_.front();
    queued_.pop_front();
    s = rng_() % 2 == 0 ? client_.Started(request) : client_.Finished(request);
  } else {
    const uint64_t session = sessions + rng_() % 4;
    s = rng_() % 2 == 0 ? client_.OpenSession(session) : client_.CloseSession(session);
  }
  t.latency.Add(NsSince(t0));
  Count(OpKind::kHint, s);
}

Result<std::unique_ptr<StressLoad>> StressLoad::Connect(const std::string& socket_path, const KeySpace& space,
                                                        uint32_t clients, bool reconnect) {
  std::unique_ptr<StressLoad> load(new StressLoad(space));
  for (uint32_t i = 0; i < clients; ++i) {
    ClientOptions options;
    options.socket_path = socket_path;
    options.client_name = "kvtier-stress-" + std::to_string(i);
    options.namespaces = space.Descriptors();
    options.use_directory = i % 2 == 0;
    options.reconnect = reconnect;
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    load->clients_.push_back(std::move(*client));
  }
  return load;
}

StressLoad::~StressLoad() {
  StressTally ignored;
  Stop(ignored);
}

void StressLoad::Start(const WorkloadMix& mix, uint64_t seed, bool record_erases) {
  stop_ = false;
  for (uint32_t i = 0; i < clients_.size(); ++i) {
    workers_.push_back(std::make_unique<StressWorker>(space_, *clients_[i], mix, seed, i, stop_, killed_));
    if (record_erases) workers_.back()->RecordErases();
  }
  for (auto& worker : workers_) threads_.emplace_back([w = worker.get()] { w->Run(); });
}

void StressLoad::Stop(StressTally& into) {
  stop_ = true;
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (const auto& w : workers_) into.Merge(w->tally());
  workers_.clear();
}

}  // namespace kvtier::tools
