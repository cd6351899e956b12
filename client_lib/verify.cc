#include "client_lib/verify.h"

#include <algorithm>
#include <string>

#include "common/checksum.h"
#include "proto/wire.h"

namespace kvtier::internal {

Status VerifyBlock(std::span<const std::byte> bytes, uint64_t checksum, const BlockKey& key) {
  if (BlockChecksum(bytes) == checksum) return Status::Ok();
  return Corruption("block " + key.ToHex() + ": its bytes do not match their checksum; reported, later reads miss");
}

Status VerifyLayers(std::span<const std::byte> bytes, std::span<const uint64_t> layer_checksums, uint32_t first_layer,
                    const BlockKey& key) {
  if (layer_checksums.empty() || bytes.size() % layer_checksums.size() != 0) {
    return Unimplemented("block " + key.ToHex() + ": kvtierd sent no checksum per layer read, so its layers " +
                         "cannot be verified (verify_checksums is on; an older kvtierd?)");
  }
  const size_t bad = FirstBadLayer(bytes, layer_checksums);
  if (bad == layer_checksums.size()) return Status::Ok();
  return Corruption("block " + key.ToHex() + ": layer " + std::to_string(first_layer + bad) +
                    " does not match its checksum; reported, later reads miss");
}

Status VerifyRangeInBlock(std::span<const std::byte> block, uint64_t range_offset, std::span<const std::byte> copy,
                          uint64_t checksum, const BlockKey& key) {
  if (range_offset > block.size() || copy.size() > block.size() - range_offset) {
    return ProtocolError("block " + key.ToHex() + ": the range read lies outside its block");
  }
  const std::span<const std::byte> pieces[] = {block.first(range_offset), copy,
                                               block.subspan(range_offset + copy.size())};
  if (ChecksumOfPieces(pieces) == checksum) return Status::Ok();
  return Corruption("block " + key.ToHex() + ": its bytes do not match their checksum; reported, later reads miss");
}

void ReportCorrupt(Connection& conn, uint32_t ns, std::vector<BlockKey> keys, Connection::Reader reader,
                   std::function<void()> then) {
  if (keys.empty()) return then();
  const size_t frames = (keys.size() + kReportKeysPerFrame - 1) / kReportKeysPerFrame;
  // Answers arrive in order on one connection: the last frame's answer
  // comes after the others'.
  for (size_t f = 0; f < frames; ++f) {
    const std::span<const BlockKey> part =
        std::span<const BlockKey>(keys)
            .subspan(f * kReportKeysPerFrame)
            .first(std::min(kReportKeysPerFrame, keys.size() - f * kReportKeysPerFrame));
    Connection::Done done = [](Result<v1::Response>) {};  // a failed report leaves the block to the next reader
    if (f + 1 == frames) done = [then = std::move(then)](Result<v1::Response>) { then(); };
    conn.Call(wire::MakeCorruptReport(ns, part), std::move(done),
              f + 1 == frames ? reader : Connection::Reader::kDetached);
  }
}

void ReportCorruptAndWait(Connection& conn, uint32_t ns, const BlockKey& key) {
  conn.CallSync(wire::MakeCorruptReport(ns, {&key, 1})).status().IgnoreError();  // the read fails either way
}

}  // namespace kvtier::internal
