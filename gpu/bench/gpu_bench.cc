// kvtier_gpu_bench: what layer-wise copies through LayerCopier achieve,
// each figure next to its ceiling measured in the same run (one plain
// cudaMemcpy of the same bytes), and how much of a layer-wise load hides
// behind compute compared with the preload formula (docs/POLICIES.md).
//
//   kvtier_gpu_bench [--layers=36] [--blocks=32] [--block-mib=32] [--reps=5] [--device=0]
//   kvtier_gpu_bench --probe     (only says which device it would use, or why none)
//
// A batch is `blocks` KV blocks of `block-mib` MiB, each `layers` equal
// layers (the default: 36 layers of ~0.9 MiB, 1 GiB in all). Host side:
// block-major, as blocks sit in the arena; device side: layer-major, as an
// engine's paged KV is laid out per layer, in a DevicePool. A layer is one
// CopyLayerParts of `blocks` pieces. Times are the best of `reps`.
// Exit: 0 done, 1 a CUDA call failed, 2 no CUDA device (the reason printed).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/bench/busy_kernel.h"
#include "gpu/device_pool.h"
#include "gpu/device_probe.h"
#include "gpu/host_registration.h"
#include "gpu/layer_copier.h"

#if defined(__SANITIZE_ADDRESS__)
// The CUDA driver maps memory in ASan's shadow gap (see tests/gpu).
extern "C" const char* __asan_default_options() { return "protect_shadow_gap=0"; }
#endif

namespace kvtier::gpu::bench {
namespace {

struct Options {
  uint32_t layers = 36;
  uint32_t blocks = 32;
  uint64_t block_mib = 32;
  int reps = 5;
  int device = 0;
  bool probe_only = false;
};

void Die(const std::string& what) {
  std::fprintf(stderr, "kvtier_gpu_bench: %s\n", what.c_str());
  std::exit(1);
}
void Check(const Status& s) {
  if (!s.ok()) Die(s.ToString());
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}

bool ParseOptions(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--probe") {
      o.probe_only = true;
      continue;
    }
    const auto eq = arg.find('=');
    if (eq == std::string::npos) return false;
    const std::string key = arg.substr(0, eq);
    const long value = std::strtol(arg.c_str() + eq + 1, nullptr, 10);
    if (value <= 0 && key != "--device") return false;
    if (key == "--layers")
      o.layers = static_cast<uint32_t>(value);
    else if (key == "--blocks")
      o.blocks = static_cast<uint32_t>(value);
    else if (key == "--block-mib")
      o.block_mib = static_cast<uint64_t>(value);
    else if (key == "--reps")
      o.reps = static_cast<int>(value);
    else if (key == "--device")
      o.device = static_cast<int>(value);
    else
      return false;
  }
  return true;
}

double Ms(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The best of `reps` runs after one warm-up.
double BestMs(int reps, const std::function<void()>& run) {
  run();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) best = std::min(best, Ms(run));
  return best;
}

double GBps(uint64_t bytes, double ms) { return static_cast<double>(bytes) / (ms * 1e6); }

// docs/POLICIES.md (preload planning): layers to preload so that compute never stalls.
uint32_t LayersToPreload(uint32_t layers, double t_read, double t_comp) {
  if (t_read <= t_comp) return 1;
  return static_cast<uint32_t>(std::ceil(layers - (layers - 1) * t_comp / t_read));
}

class Bench {
 public:
  explicit Bench(const Options& o) : o_(o) {
    layer_bytes_ = ((o.block_mib << 20) / o.layers) & ~uint64_t{4095};
    if (layer_bytes_ == 0) Die("blocks too small for that many layers");
    span_bytes_ = layer_bytes_ * o.blocks;
    total_bytes_ = span_bytes_ * o.layers;
  }
  void Setup();
  void CopyThroughput();
  void HiddenFraction(double comp_over_read);

 private:
  using Pieces = std::vector<std::vector<LayerCopier::Piece>>;
  std::byte* Device(uint64_t range, uint32_t layer, uint32_t block) {
    return static_cast<std::byte*>(pool_->At(range)) + layer * span_bytes_ + block * layer_bytes_;
  }
  std::byte* Host(uint32_t layer, uint32_t block) {
    return host_->span().data() + (uint64_t{block} * o_.layers + layer) * layer_bytes_;
  }
  Pieces MakePieces(CopyKind kind);
  void EnqueueLayer(const Pieces& pieces, uint32_t layer, CopyKind kind) {
    Check(copier_->CopyLayerParts(layer, pieces[layer], kind));
  }
  void Compare(const char* name, const Pieces& pieces, CopyKind kind, void* dst, const void* src,
               cudaMemcpyKind plain_kind);
  void Compute(uint32_t layer, long long cycles) {
    const int e = LaunchLayerCompute(compute_, Device(kv_, layer, 0), layer_bytes_, o_.blocks, cycles, sink_);
    Check(static_cast<cudaError_t>(e), "kernel launch");
  }
  double CyclesPerMs();

  const Options o_;
  uint64_t layer_bytes_ = 0, span_bytes_ = 0, total_bytes_ = 0;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<PinnedBuffer> host_;
  std::unique_ptr<LayerCopier> copier_;
  uint64_t kv_ = 0, kv2_ = 0;  // pool offsets: the KV the engine computes on, a second copy for D2D
  cudaStream_t compute_ = nullptr;
  unsigned long long* sink_ = nullptr;
  Pieces h2d_, d2h_, d2d_;
  double h2d_layer_ms_ = 0;  // per layer, layer-wise
};

void Bench::Setup() {
  std::printf("batch: %u blocks x %u layers x %.1f KiB = %.1f MiB per layer, %.2f GiB in all\n", o_.blocks, o_.layers,
              layer_bytes_ / 1024.0, span_bytes_ / 1048576.0, total_bytes_ / 1073741824.0);
  auto pool = DevicePool::Create(2 * total_bytes_ + (1 << 20), o_.device);
  Check(pool.status());
  pool_ = std::move(*pool);
  auto kv = pool_->Allocate(total_bytes_);
  auto kv2 = pool_->Allocate(total_bytes_);
  Check(kv.status());
  Check(kv2.status());
  kv_ = kv->offset;
  kv2_ = kv2->offset;
  auto host = PinnedBuffer::Allocate(total_bytes_);
  Check(host.status());
  host_ = std::move(*host);
  std::memset(host_->span().data(), 0x11, host_->span().size());
  auto copier = LayerCopier::Create(o_.layers, LayerCopierOptions{o_.device, false});
  Check(copier.status());
  copier_ = std::move(*copier);
  Check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  Check(cudaMalloc(&sink_, o_.blocks * sizeof(unsigned long long)), "cudaMalloc(sink)");
  h2d_ = MakePieces(CopyKind::kHostToDevice);
  d2h_ = MakePieces(CopyKind::kDeviceToHost);
  d2d_ = MakePieces(CopyKind::kDeviceToDevice);
}

Bench::Pieces Bench::MakePieces(CopyKind kind) {
  Pieces pieces(o_.layers);
  for (uint32_t l = 0; l < o_.layers; ++l) {
    for (uint32_t b = 0; b < o_.blocks; ++b) {
      switch (kind) {
        case CopyKind::kHostToDevice:
          pieces[l].push_back({Device(kv_, l, b), Host(l, b), layer_bytes_});
          break;
        case CopyKind::kDeviceToHost:
          pieces[l].push_back({Host(l, b), Device(kv_, l, b), layer_bytes_});
          break;
        default:
          pieces[l].push_back({Device(kv2_, l, b), Device(kv_, l, b), layer_bytes_});
          break;
      }
    }
  }
  return pieces;
}

void Bench::Compare(const char* name, const Pieces& pieces, CopyKind kind, void* dst, const void* src,
                    cudaMemcpyKind plain_kind) {
  const double plain_ms = BestMs(o_.reps, [&] { Check(cudaMemcpy(dst, src, total_bytes_, plain_kind), "cudaMemcpy"); });
  const double layered_ms = BestMs(o_.reps, [&] {
    for (uint32_t l = 0; l < o_.layers; ++l) EnqueueLayer(pieces, l, kind);
    Check(copier_->SynchronizeAll());
  });
  if (kind == CopyKind::kHostToDevice) h2d_layer_ms_ = layered_ms / o_.layers;
  std::printf("%-4s layer-wise %7.2f GB/s (%6.3f ms/layer) | one cudaMemcpy %7.2f GB/s | ratio %.3f\n", name,
              GBps(total_bytes_, layered_ms), layered_ms / o_.layers, GBps(total_bytes_, plain_ms),
              plain_ms / layered_ms);
}

void Bench::CopyThroughput() {
  std::printf("\ncopies (best of %d; ratio = layer-wise / plain cudaMemcpy throughput):\n", o_.reps);
  Compare("H2D", h2d_, CopyKind::kHostToDevice, pool_->At(kv_), host_->span().data(), cudaMemcpyHostToDevice);
  Compare("D2H", d2h_, CopyKind::kDeviceToHost, host_->span().data(), pool_->At(kv_), cudaMemcpyDeviceToHost);
  Compare("D2D", d2d_, CopyKind::kDeviceToDevice, pool_->At(kv2_), pool_->At(kv_), cudaMemcpyDeviceToDevice);
}

double Bench::CyclesPerMs() {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  constexpr long long kCycles = 20'000'000;
  std::vector<double> rates;
  for (int i = 0; i < 5; ++i) {
    Check(cudaEventRecord(start, compute_), "cudaEventRecord");
    Compute(0, kCycles);
    Check(cudaEventRecord(stop, compute_), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    rates.push_back(kCycles / ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

void Bench::HiddenFraction(double comp_over_read) {
  const uint32_t L = o_.layers;
  const auto cycles = static_cast<long long>(comp_over_read * h2d_layer_ms_ * CyclesPerMs());
  auto compute_only = [&] {
    for (uint32_t l = 0; l < L; ++l) Compute(l, cycles);
    Check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
  };
  // Load layer l, compute on it, and only then load l + 1.
  auto serial = [&] {
    for (uint32_t l = 0; l < L; ++l) {
      EnqueueLayer(h2d_, l, CopyKind::kHostToDevice);
      Check(copier_->MakeStreamWait(compute_, l));
      Compute(l, cycles);
      Check(copier_->WaitForStream(compute_));
    }
    Check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
  };
  // Load every layer as fast as the copies go; compute on l once l is in.
  auto pipelined = [&] {
    for (uint32_t l = 0; l < L; ++l) {
      EnqueueLayer(h2d_, l, CopyKind::kHostToDevice);
      Check(copier_->MakeStreamWait(compute_, l));
      Compute(l, cycles);
    }
    Check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
  };
  const double t_read = h2d_layer_ms_;
  const double t_comp = BestMs(o_.reps, compute_only) / L;
  const double serial_ms = BestMs(o_.reps, serial);
  const double pipelined_ms = BestMs(o_.reps, pipelined);
  const uint32_t n_pre = LayersToPreload(L, t_read, t_comp);
  const double predicted_ms = n_pre * t_read + L * t_comp;
  const double hidden = 1.0 - (pipelined_ms - L * t_comp) / (L * t_read);
  const double hidden_predicted = 1.0 - static_cast<double>(n_pre) / L;
  std::printf("\nhidden fraction, compute set to %.2f x t_read per layer:\n", comp_over_read);
  std::printf("  t_read %.3f ms/layer, t_comp %.3f ms/layer, %u layers -> n_pre %u (preload buffer %.1f MiB)\n", t_read,
              t_comp, L, n_pre, n_pre * span_bytes_ / 1048576.0);
  std::printf("  load-then-compute %.2f ms | pipelined %.2f ms | predicted %.2f ms (measured/predicted %.3f)\n",
              serial_ms, pipelined_ms, predicted_ms, pipelined_ms / predicted_ms);
  std::printf("  hidden fraction of the load: measured %.3f, predicted %.3f\n", hidden, hidden_predicted);
}

}  // namespace
}  // namespace kvtier::gpu::bench

int main(int argc, char** argv) {
  using namespace kvtier::gpu;
  bench::Options options;
  if (!bench::ParseOptions(argc, argv, options)) {
    std::fprintf(
        stderr,
        "usage: kvtier_gpu_bench [--layers=N] [--blocks=N] [--block-mib=N] [--reps=N] [--device=N] [--probe]\n");
    return 1;
  }
  kvtier::Result<int> devices = DeviceCount();
  if (!devices.ok()) {
    std::string why = devices.status().message();
    if (why.rfind("no device: ", 0) == 0) why.erase(0, std::strlen("no device: "));
    std::printf("no CUDA device: %s\n", why.c_str());
    return 2;
  }
  kvtier::Result<DeviceInfo> info = ProbeDevice(options.device);
  if (!info.ok()) {
    std::printf("no CUDA device: %s\n", info.status().ToString().c_str());
    return 2;
  }
  std::printf("device %d: %s (sm_%d%d), %.1f GiB, %.1f GiB free\n", info->ordinal, info->name.c_str(),
              info->compute_major, info->compute_minor, info->total_bytes / 1073741824.0,
              info->free_bytes / 1073741824.0);
  if (options.probe_only) return 0;
  bench::Bench bench(options);
  bench.Setup();
  bench.CopyThroughput();
  // The Qwen3-8B-like example of docs/POLICIES.md (30.9 ms of compute against a 48.3 ms read): the
  // read is slower, so n_pre layers must be in before compute starts.
  bench.HiddenFraction(30.9 / 48.3);
  // Compute slower than the read: all but the first layer's load hides.
  bench.HiddenFraction(1.5);
  return 0;
}
