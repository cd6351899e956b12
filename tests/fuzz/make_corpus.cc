// fuzz_corpus_seeds DIR: writes the binary seeds of the fuzz corpora under
// DIR (tests/fuzz/corpus): DIR/request_handler/*.bin, request streams
// (tests/fuzz/request_stream.h) that walk every request type through
// its common paths, built with the client library's request builders
// (proto/wire.h) so they are what a real client sends; and
// DIR/frame_reader/*.bin, those frames cut into chunks, large, oversized
// and over-budget frames (frame_reader_fuzz.cc's input). The text seeds
// (configs, traces) are committed as written. Run by tests/fuzz/make_corpus.sh.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "proto/wire.h"
#include "tests/fuzz/request_stream.h"

namespace kvtier::fuzz {
namespace {

constexpr uint64_t kBlockBytes = kFuzzBlockBytes;

BlockKey Key(uint64_t i) { return BlockKey{0xfeed, i}; }

std::vector<BlockKey> Keys(uint64_t first, uint64_t count) {
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < count; ++i) keys.push_back(Key(first + i));
  return keys;
}

// Numbers requests 2, 4, 6...: even ids go to the tenant's connection.
class Stream {
 public:
  Stream& Add(v1::Request r) {
    r.set_id(next_id_);
    next_id_ += 2;
    requests_.push_back(std::move(r));
    return *this;
  }
  // An odd id: the operator's connection (with kOperatorConnection).
  Stream& AddOperator(v1::Request r) {
    r.set_id(next_id_ + 1);
    next_id_ += 2;
    requests_.push_back(std::move(r));
    return *this;
  }
  // An empty frame (an empty Request serializes to no bytes): the
  // connection's timer with every reservation expired.
  Stream& Timer() {
    requests_.emplace_back();
    return *this;
  }
  std::string Encode(uint8_t flags) const { return EncodeRequestStream(flags, requests_); }

 private:
  uint64_t next_id_ = 2;
  std::vector<v1::Request> requests_;
};

// Reserve + Commit of `keys` in namespace `ns`, whole blocks.
Stream& Put(Stream& s, uint32_t ns, const std::vector<BlockKey>& keys, bool chain = false) {
  const std::vector<uint64_t> sizes(keys.size(), kBlockBytes);
  s.Add(wire::MakeReserve(ns, keys, sizes, chain));
  return s.Add(wire::MakeCommit(ns, keys, sizes));
}

uint8_t Eviction(uint8_t index) { return static_cast<uint8_t>(index << kEvictionShift); }

void Write(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

void WriteRequestSeeds(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::vector<BlockKey> two = Keys(1, 2);
  const uint64_t leases[] = {0, 1};  // the first two granted (request_stream.h)
  {                                  // put, lookup, pin, release, erase, abort, an expired reservation
    Stream s;
    Put(s, 0, two).Add(wire::MakeLookup(0, two)).Add(wire::MakePin(0, two)).Add(wire::MakeRelease(leases));
    s.Add(wire::MakeReserve(0, Keys(7, 1), std::vector<uint64_t>{kBlockBytes})).Add(wire::MakeAbort(0, Keys(7, 1)));
    s.Add(wire::MakeReserve(0, Keys(8, 1), std::vector<uint64_t>{kBlockBytes})).Timer();
    s.Add(wire::MakeCommit(0, Keys(8, 1), std::vector<uint64_t>{kBlockBytes}));
    s.Add(wire::MakeErase(0, two)).Add(wire::MakeLookup(0, two));
    Write(dir, "put_pin_release.bin", s.Encode(0));
  }
  {  // a chain, layer pins, a layer-wise load with its plan, fire-and-forget release
    Stream s;
    const std::vector<BlockKey> chain = Keys(10, 3);
    s.Add(wire::MakeReserve(0, chain, std::vector<uint64_t>(3, kBlockBytes), true, Key(9)));
    s.Add(wire::MakeCommit(0, chain, std::vector<uint64_t>(3, kBlockBytes)));
    s.Add(wire::MakePinLayers(0, chain, 1, 3)).Add(wire::MakeReleaseNoReply(leases));
    s.Add(wire::MakeBeginLoad(0, chain, 50.0)).Add(wire::MakeEndLoad(1));
    s.Add(wire::MakePreloadPlan(2, 1024, 40.0, 4, 90.0));
    Write(dir, "chain_layers_load.bin", s.Encode(Eviction(2)));
  }
  {  // queue hints and usage reports under the queue-aware policy
    Stream s;
    Put(s, 1, Keys(20, 2), true);
    s.Add(wire::MakeSessionHint(5, true)).Add(wire::MakeEnqueue(1, 77, Keys(20, 3), 3000, 5));
    s.Add(wire::MakeRequestEvent(77, true)).Add(wire::MakeRequestEvent(77, false));
    s.Add(wire::MakeSessionHint(5, false));
    const std::pair<uint32_t, BlockKey> uses[] = {{1, Key(20)}, {1, Key(21)}, {0, Key(3)}};
    s.Add(wire::MakeUsageReport(uses, 4, 9, 2));
    Write(dir, "queue_hints_usage.bin", s.Encode(Eviction(5)));
  }
  {  // more puts than the arena holds: evictions
    Stream s;
    for (uint64_t i = 0; i < 10; ++i) Put(s, i % 2, Keys(100 + 4 * i, 4));
    s.Add(wire::MakePin(0, Keys(100, 4))).Add(wire::MakeLookup(1, Keys(136, 4)));
    Write(dir, "evictions.bin", s.Encode(Eviction(3)));
  }
  {  // the admin requests, from the tenant's connection and an operator's
    Stream s;
    const BlockKey fingerprint = FingerprintNamespace(FuzzNamespaces()[0]);
    Put(s, 0, two);
    s.Add(wire::MakeStats()).Add(wire::MakeListNamespaces()).Add(wire::MakeConfig()).Add(wire::MakeHealth());
    s.AddOperator(wire::MakeHold(fingerprint, two, 5)).AddOperator(wire::MakeStats());
    s.Add(wire::MakeHold(fingerprint, Keys(1, 1), 60'000)).AddOperator(wire::MakeUnhold(fingerprint, two));
    s.AddOperator(wire::MakeListNamespaces()).AddOperator(wire::MakeHealth());
    s.AddOperator(wire::MakeDrop(std::vector<BlockKey>{fingerprint}, "", ""));
    s.Add(wire::MakeDrop({}, "fuzz/model", "rev-2")).AddOperator(wire::MakeLookup(0, two));
    Write(dir, "admin_operator.bin", s.Encode(kOperatorConnection | Eviction(4)));
  }
  {  // the client's own Hello (no automatic one), then a second Hello
    Stream s;
    v1::Request hello;
    hello.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
    hello.mutable_hello()->set_client_name("seed");
    for (const NamespaceDescriptor& d : FuzzNamespaces()) wire::ToProto(d, hello.mutable_hello()->add_namespaces());
    s.Add(wire::MakeLookup(0, two)).Add(hello).Add(hello);
    Put(s, 1, two);
    Write(dir, "own_hello.bin", s.Encode(kSkipHello | Eviction(1)));
  }
  {  // a tenant limited to another model: its Hello is refused
    Stream s;
    s.Add(wire::MakeStats());
    Write(dir, "model_refused.bin", s.Encode(kModelAllowList));
  }
}

// frame_reader_fuzz's input (frame_reader_fuzz.cc): a header, then chunks.
class FrameInput {
 public:
  FrameInput(uint32_t max_frame_bytes, uint8_t budget_units) {
    bytes_ = {static_cast<char>(max_frame_bytes), static_cast<char>(max_frame_bytes >> 8),
              static_cast<char>(max_frame_bytes >> 16), static_cast<char>(budget_units)};
  }
  // `stream` to `reader` in chunks of `chunk` bytes.
  FrameInput& Chunks(int reader, const std::string& stream, size_t chunk) {
    for (size_t at = 0; at < stream.size(); at += chunk) {
      const std::string piece = stream.substr(at, chunk);
      Command(reader, piece.size());
      bytes_ += piece;
    }
    return *this;
  }
  // `length` copies of `byte` to `reader`.
  FrameInput& Run(int reader, size_t length, char byte) {
    Command(reader | 2, length);
    bytes_ += byte;
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  void Command(int flags, size_t length) {
    bytes_ += static_cast<char>(flags);
    bytes_ += static_cast<char>(length);
    bytes_ += static_cast<char>(length >> 8);
  }
  std::string bytes_;
};

std::string FrameHeader(uint32_t length) {
  uint8_t header[kFrameHeaderBytes];
  EncodeFrameHeader(length, header);
  return std::string(reinterpret_cast<const char*>(header), kFrameHeaderBytes);
}

void WriteFrameSeeds(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  // Real request frames, as a client pipelines them (the flags byte of a
  // request stream dropped).
  Stream s;
  Put(s, 0, Keys(1, 2)).Add(wire::MakeLookup(0, Keys(1, 2))).Add(wire::MakeStats()).Add(v1::Request{});
  const std::string frames = s.Encode(0).substr(1);
  Write(dir, "requests_whole.bin", FrameInput(kDefaultMaxFrameBytes, 0).Chunks(0, frames, 4096).bytes());
  Write(dir, "requests_split.bin",
        FrameInput(kDefaultMaxFrameBytes, 0).Chunks(0, frames, 7).Chunks(1, frames, 1).bytes());
  // A frame larger than the initial buffer: it grows (within a budget of
  // 64 units of 512 bytes) and shrinks back after.
  const uint32_t large = 3 * 4096;
  Write(dir, "large_frame.bin",
        FrameInput(kDefaultMaxFrameBytes, 64)
            .Chunks(0, FrameHeader(large), 4)
            .Run(0, large, 'x')
            .Chunks(0, frames, 64)
            .bytes());
  // Two connections' large frames, the second refused growth past 16 units.
  Write(dir, "budget_refused.bin",
        FrameInput(kDefaultMaxFrameBytes, 16)
            .Chunks(0, FrameHeader(large), 4)
            .Run(0, 6000, 'a')
            .Chunks(1, FrameHeader(large), 4)
            .Run(1, large, 'b')
            .Run(0, large, 'a')
            .bytes());
  // A frame over a 100-byte cap, after one under it.
  Write(dir, "oversized.bin",
        FrameInput(100, 0).Chunks(0, FrameHeader(3) + "abc" + FrameHeader(101), 5).Run(0, 101, 'z').bytes());
}

}  // namespace
}  // namespace kvtier::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  kvtier::fuzz::WriteRequestSeeds(root / "request_handler");
  kvtier::fuzz::WriteFrameSeeds(root / "frame_reader");
  return 0;
}
