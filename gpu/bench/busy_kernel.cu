#include "gpu/bench/busy_kernel.h"

#include <cuda_runtime.h>

namespace kvtier::gpu::bench {
namespace {

__global__ void LayerCompute(const unsigned char* layer, unsigned long long block_stride_bytes, long long cycles,
                             unsigned long long* sink) {
  const auto* word = reinterpret_cast<const unsigned long long*>(layer + blockIdx.x * block_stride_bytes) + threadIdx.x;
  unsigned long long acc = *word;
  const long long start = clock64();
  while (clock64() - start < cycles) acc = acc * 6364136223846793005ull + 1442695040888963407ull;
  if (threadIdx.x == 0) sink[blockIdx.x] = acc;
}

}  // namespace

int LaunchLayerCompute(StreamHandle stream, const void* layer, uint64_t block_stride_bytes, uint32_t blocks,
                       long long cycles, unsigned long long* sink) {
  LayerCompute<<<blocks, 32, 0, stream>>>(static_cast<const unsigned char*>(layer), block_stride_bytes, cycles, sink);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvtier::gpu::bench
