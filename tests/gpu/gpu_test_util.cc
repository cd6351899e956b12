#include "tests/gpu/gpu_test_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace kvtier::testing {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void FillPattern(uint64_t seed, std::span<std::byte> out) {
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t word = SplitMix(seed * 0x100000001b3ull + i / 8);
    std::memcpy(out.data() + i, &word, std::min<size_t>(8, out.size() - i));
  }
}

bool MatchesPattern(uint64_t seed, std::span<const std::byte> bytes) {
  std::vector<std::byte> expected(bytes.size());
  FillPattern(seed, expected);
  return std::memcmp(expected.data(), bytes.data(), bytes.size()) == 0;
}

std::string StreamGate::Close(gpu::StreamHandle stream) {
  open_.store(false, std::memory_order_release);
  const cudaError_t e = cudaLaunchHostFunc(stream, &StreamGate::Spin, this);
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

void StreamGate::Spin(void* self) {
  // A host function may block its stream (not call CUDA): spin until open.
  auto* gate = static_cast<StreamGate*>(self);
  while (!gate->open_.load(std::memory_order_acquire)) std::this_thread::yield();
}

}  // namespace kvtier::testing
