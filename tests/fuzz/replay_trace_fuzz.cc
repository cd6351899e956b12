// Fuzzes the replay's trace reader (tools/replay/replay_trace.h): Mooncake-form
// JSONL, plain or in the converted ShareGPT form (every line names its
// "session"). The input's first byte picks the block size and the form;
// the rest is the file, handed to ReadMooncakeTrace through a memfd
// (/proc/self/fd/N), so nothing touches the disk.
//
// A trace that reads must hold what the header promises: every request's
// blocks fit its input_length (each block holds at least one token), block
// ids and conversations carry the trace's namespace, arrival times are
// whole milliseconds, and with require_session every request has a
// conversation.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/replay/replay_trace.h"

namespace {

[[noreturn]] void Fail(const char* what, size_t request) {
  std::fprintf(stderr, "replay_trace_fuzz: request %zu: %s\n", request, what);
  std::abort();
}

// The memfd every input is written to, made once.
int TraceFd() {
  static const int fd = [] {
    const int made = memfd_create("replay-trace-fuzz", MFD_CLOEXEC);
    if (made < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    return made;
  }();
  return fd;
}

void WriteAll(int fd, const uint8_t* data, size_t size) {
  if (ftruncate(fd, 0) != 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // Block sizes from 1 token (many blocks per request) to 512 (the default).
  static constexpr uint32_t kBlockTokens[] = {1, 2, 16, 512};
  const uint32_t block_tokens = kBlockTokens[data[0] & 3];
  const bool require_session = (data[0] & 4) != 0;
  const uint64_t trace_index = (data[0] >> 3) & 7;
  const int fd = TraceFd();
  WriteAll(fd, data + 1, size - 1);

  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto trace = kvtier::tools::ReadMooncakeTrace(path, block_tokens, trace_index, require_session);
  if (!trace.ok()) return 0;
  const uint64_t ns = 0x7a6e'0000'0000'0000ull | trace_index;
  for (size_t i = 0; i < trace->requests.size(); ++i) {
    const kvtier::tools::TraceRequest& r = trace->requests[i];
    if (r.arrival_us % 1000 != 0) Fail("arrival time is not whole milliseconds", i);
    if (require_session && r.session == 0) Fail("no session in the ShareGPT form", i);
    if (r.session != 0 && r.session >> 48 != trace_index) Fail("a session outside the trace's namespace", i);
    for (size_t b = 0; b < r.blocks.size(); ++b) {
      if (r.blocks[b].hi != ns) Fail("block id outside the trace's namespace", i);
      if (kvtier::tools::BlockTokens(r, b, block_tokens) == 0) Fail("a block past input_length", i);
    }
  }
  return 0;
}
