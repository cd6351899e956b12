// CUDA IPC across processes (skipped without a device): the parent exports
// its pool and a layer event, a child (fork + exec of this binary in its
// --ipc-child mode, gpu_test_main.cc) opens both once, waits on the event
// on the GPU, reads what the parent copied and writes an answer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "gpu/device_mapping.h"
#include "gpu/device_pool.h"
#include "gpu/host_registration.h"
#include "gpu/ipc_event.h"
#include "gpu/layer_copier.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvtier::gpu {

constexpr size_t kIpcBytes = 1 << 20;
constexpr uint64_t kParentSeed = 0xface, kChildSeed = 0xbeef;

// The child: argv = mem handle hex, event handle hex, pool bytes, offset
// to read, offset to write. Exit 0 when it read the parent's bytes and
// wrote its own; a message on stderr and a distinct code otherwise.
int RunIpcChild(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "ipc child: expected 5 arguments, got %d\n", argc);
    return 10;
  }
  auto mem = HandleFromHex(argv[0]);
  auto event = HandleFromHex(argv[1]);
  if (!mem.ok() || !event.ok()) return 11;
  const uint64_t pool_bytes = std::stoull(argv[2]);
  const uint64_t read_at = std::stoull(argv[3]);
  const uint64_t write_at = std::stoull(argv[4]);
  auto mapping = DeviceMapping::Open(IpcMemHandle{*mem}, pool_bytes);
  if (!mapping.ok()) {
    std::fprintf(stderr, "ipc child: %s\n", mapping.status().ToString().c_str());
    return 12;
  }
  auto imported = ImportedEvent::Open(IpcEventHandle{*event});
  if (!imported.ok()) {
    std::fprintf(stderr, "ipc child: %s\n", imported.status().ToString().c_str());
    return 13;
  }
  auto host = PinnedBuffer::Allocate(kIpcBytes);
  if (!host.ok()) return 14;
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 15;
  // The parent recorded the event before it started us (its "message"),
  // so this wait refers to its copy, which it holds back for a while.
  if (!(*imported)->MakeStreamWait(stream).ok()) return 16;
  if (cudaMemcpyAsync((*host)->span().data(), *(*mapping)->At(read_at, kIpcBytes), kIpcBytes, cudaMemcpyDeviceToHost,
                      stream) != cudaSuccess) {
    return 17;
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess) return 18;
  if (!::kvtier::testing::MatchesPattern(kParentSeed, (*host)->span())) {
    std::fprintf(stderr, "ipc child: read the pool before the parent's copy arrived\n");
    return 19;
  }
  ::kvtier::testing::FillPattern(kChildSeed, (*host)->span());
  if (cudaMemcpy(*(*mapping)->At(write_at, kIpcBytes), (*host)->span().data(), kIpcBytes, cudaMemcpyHostToDevice) !=
      cudaSuccess) {
    return 20;
  }
  cudaStreamDestroy(stream);
  return 0;  // the mapping and the event close here, before the parent frees them
}

namespace {

TEST(IpcTest, AChildOpensThePoolAndALayerEventAndWaitsOnIt) {
  KVTIER_SKIP_WITHOUT_DEVICE();
  auto pool = DevicePool::Create(16 << 20);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  Result<DeviceRange> a = (*pool)->Allocate(kIpcBytes), b = (*pool)->Allocate(kIpcBytes);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(cudaMemset((*pool)->base(), 0, (*pool)->capacity_bytes()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto copier = LayerCopier::Create(1, LayerCopierOptions{0, /*interprocess_events=*/true});
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  auto src = PinnedBuffer::Allocate(kIpcBytes);
  ASSERT_TRUE(src.ok());
  ::kvtier::testing::FillPattern(kParentSeed, (*src)->span());
  ::kvtier::testing::StreamGate gate;  // after the copier: opens before it synchronizes
  ASSERT_EQ(gate.Close((*copier)->stream()), "");
  // Record first, then tell the other process (here: start it).
  ASSERT_TRUE(
      (*copier)->CopyLayer(0, (*pool)->At(a->offset), (*src)->span().data(), kIpcBytes, CopyKind::kHostToDevice).ok());
  Result<IpcMemHandle> mem = (*pool)->Export();
  Result<IpcEventHandle> event = (*copier)->ExportLayerEvent(0);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  ASSERT_TRUE(event.ok()) << event.status().ToString();

  std::vector<std::string> args = {"kvtier_gpu_tests",
                                   "--ipc-child",
                                   HandleToHex(mem->bytes),
                                   HandleToHex(event->bytes),
                                   std::to_string((*pool)->capacity_bytes()),
                                   std::to_string(a->offset),
                                   std::to_string(b->offset)};
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execv("/proc/self/exe", argv.data());  // CUDA is not usable in a forked child: start afresh
    _exit(127);
  }
  // Let the child open everything and issue its wait while the copy is
  // held back; the result must not depend on how long this takes.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  gate.Open();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child failed (its stderr says why)";
  std::vector<std::byte> answer(kIpcBytes);
  ASSERT_EQ(cudaMemcpy(answer.data(), (*pool)->At(b->offset), kIpcBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(::kvtier::testing::MatchesPattern(kChildSeed, answer));
}

}  // namespace
}  // namespace kvtier::gpu
