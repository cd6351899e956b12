// The GPU tests' main: gtest, or the child half of ipc_test.cc when the
// first argument is --ipc-child.
#include <gtest/gtest.h>

#include <cstring>

#include "common/sanitizers.h"

namespace kvtier::gpu {
int RunIpcChild(int argc, char** argv);
}  // namespace kvtier::gpu

#if KVTIER_ASAN
// The CUDA driver maps memory where ASan keeps its protected shadow gap;
// without this, the first CUDA call on a machine with a GPU fails (out of
// memory). ASAN_OPTIONS from the environment still apply on top.
extern "C" const char* __asan_default_options() { return "protect_shadow_gap=0"; }
#endif

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--ipc-child") == 0) {
    return kvtier::gpu::RunIpcChild(argc - 2, argv + 2);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
