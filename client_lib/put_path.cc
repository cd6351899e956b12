#include "client_lib/put_path.h"

#include "proto/wire.h"

namespace kvtier::internal {

std::vector<WritableBlock> ToWritable(const Connection& conn, std::span<const BlockKey> keys,
                                      const v1::Response& response) {
  std::vector<WritableBlock> blocks(keys.size());
  const auto& slots = response.reserve().slots();
  for (size_t i = 0; i < keys.size(); ++i) {
    blocks[i].key = keys[i];
    if (static_cast<int>(i) >= slots.size()) {
      blocks[i].status = ProtocolError("Reserve response has fewer slots than keys");
      continue;
    }
    const auto& slot = slots[static_cast<int>(i)];
    blocks[i].status = wire::FromProto(slot.status());
    if (!blocks[i].status.ok()) continue;
    auto span = conn.Slot(slot.offset(), slot.length());
    if (!span.ok())
      blocks[i].status = span.status();
    else
      blocks[i].data = *span;
  }
  return blocks;
}

bool BuildCommit(NamespaceId ns, const std::vector<WritableBlock>& blocks, v1::Request& request, uint32_t layer_count,
                 uint64_t block_bytes) {
  auto* body = request.mutable_commit();
  body->set_ns(ns);
  bool all_checksums = true;
  bool all_layers = true;
  for (const WritableBlock& b : blocks) {
    if (!b.status.ok()) continue;
    wire::AppendKey(b.key, body->mutable_keys());
    body->add_sizes(b.data.size());
    if (b.checksum.has_value())
      body->add_checksums(*b.checksum);
    else
      all_checksums = false;
    // Only blocks of several layers carry them (in key order).
    if (layer_count <= 1 || b.data.size() != block_bytes) continue;
    if (b.layer_checksums.size() != layer_count) {
      all_layers = false;
      continue;
    }
    body->mutable_layer_checksums()->Add(b.layer_checksums.begin(), b.layer_checksums.end());
  }
  // The wire takes one checksum per key or none: the daemon hashes them all.
  if (!all_checksums) body->clear_checksums();
  if (!all_layers) body->clear_layer_checksums();
  return body->keys_size() > 0;
}

v1::Request BuildAbort(NamespaceId ns, const std::vector<WritableBlock>& blocks) {
  v1::Request request;
  request.mutable_abort()->set_ns(ns);
  for (const auto& b : blocks) {
    if (b.status.ok()) wire::AppendKey(b.key, request.mutable_abort()->mutable_keys());
  }
  return request;
}

std::vector<Status> MergeCommit(const std::vector<WritableBlock>& blocks, const Result<v1::Response>& committed,
                                bool already_is_ok) {
  std::vector<Status> out;
  int next = 0;
  for (const auto& b : blocks) {
    if (!b.status.ok()) {
      bool benign = already_is_ok && b.status.code() == StatusCode::kAlreadyExists;
      out.push_back(benign ? Status::Ok() : b.status);
      continue;
    }
    if (!committed.ok()) {
      out.push_back(committed.status());
    } else if (next >= committed->commit().statuses_size()) {
      out.push_back(ProtocolError("Commit response has fewer statuses than blocks"));
    } else {
      out.push_back(wire::FromProto(committed->commit().statuses(next)));
    }
    ++next;
  }
  return out;
}

}  // namespace kvtier::internal
