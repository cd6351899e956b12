// The bench's stand-in for a layer's attention/MLP work: a kernel that
// touches the layer's KV (one word per block, so it truly depends on the
// copy) and then spins for a given number of SM clock cycles.
#pragma once

#include <cstdint>

#include "gpu/cuda_handles.h"

namespace kvtier::gpu::bench {

// Enqueues on `stream` a grid of `blocks` CUDA blocks of 32 threads; block
// b reads the word at layer + b * block_stride_bytes + 8 * thread, spins
// `cycles` cycles and writes a result to sink[b] (device memory of at
// least `blocks` words). Returns the launch's cudaError_t as an int.
int LaunchLayerCompute(StreamHandle stream, const void* layer, uint64_t block_stride_bytes, uint32_t blocks,
                       long long cycles, unsigned long long* sink);

}  // namespace kvtier::gpu::bench
