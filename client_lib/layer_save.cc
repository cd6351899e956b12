// LayerSave (include/kvtier/client.h): a reservation of whole blocks
// written layer by layer and committed at once.
#include <cstring>
#include <string>

#include "client_lib/connection.h"
#include "common/checksum.h"
#include "kvtier/client.h"
#include "proto/wire.h"

namespace kvtier {

Result<LayerSave> Client::BeginSave(NamespaceId ns, std::span<const BlockKey> keys, const ChainLinks& links) {
  const std::shared_ptr<internal::Connection> conn = Current();  // for the layout; Reserve asks again
  if (ns >= conn->namespaces().size()) {
    return InvalidArgument("namespace " + std::to_string(ns) + " was not registered at Connect");
  }
  const auto [layer_count, block_bytes] = conn->layout(ns);
  std::vector<uint64_t> sizes(keys.size(), block_bytes);
  auto reserved = Reserve(ns, keys, sizes, links);
  if (!reserved.ok()) return reserved.status();
  LayerSave save;
  save.reservation_ = std::move(*reserved);
  save.blocks_ = keys.size();
  save.layers_ = layer_count;
  save.layer_bytes_ = block_bytes / layer_count;
  save.saved_.assign(layer_count, false);
  save.layer_sums_ = conn->verify_checksums() && layer_count > 1;
  if (save.layer_sums_) {
    for (WritableBlock& b : save.reservation_.blocks()) {
      if (b.status.ok()) b.layer_checksums.assign(layer_count, 0);
    }
  }
  return save;
}

Status LayerSave::status(size_t block) const {
  if (block >= blocks_) return InvalidArgument("block " + std::to_string(block) + " is not in this save");
  return reservation_.blocks()[block].status;
}

std::span<std::byte> LayerSave::LayerSpan(size_t block, uint32_t layer) {
  if (ended_ || block >= blocks_ || layer >= layers_) return {};
  WritableBlock& b = reservation_.blocks()[block];
  if (!b.status.ok()) return {};
  return b.data.subspan(uint64_t{layer} * layer_bytes_, layer_bytes_);
}

Status LayerSave::SaveLayer(uint32_t layer, std::span<const std::span<const std::byte>> src) {
  if (ended_) return FailedPrecondition("the save was finished or aborted");
  if (layer >= layers_) {
    return InvalidArgument("layer " + std::to_string(layer) + " of a " + std::to_string(layers_) + "-layer block");
  }
  if (src.size() != blocks_) {
    return InvalidArgument("SaveLayer: " + std::to_string(src.size()) + " spans for " + std::to_string(blocks_) +
                           " blocks");
  }
  for (size_t i = 0; i < blocks_; ++i) {
    if (reservation_.blocks()[i].status.ok() && src[i].size() != layer_bytes_) {
      return InvalidArgument("SaveLayer: block " + std::to_string(i) + "'s layer is " + std::to_string(src[i].size()) +
                             " bytes, not " + std::to_string(layer_bytes_));
    }
  }
  for (size_t i = 0; i < blocks_; ++i) {
    std::span<std::byte> dst = LayerSpan(i, layer);
    if (dst.empty()) continue;
    if (layer_sums_) {
      reservation_.blocks()[i].layer_checksums[layer] = CopyWithChecksum(dst, src[i].first(dst.size()));
    } else {
      std::memcpy(dst.data(), src[i].data(), dst.size());
    }
  }
  saved_[layer] = true;
  PublishSaved();
  return Status::Ok();
}

Status LayerSave::LayerWritten(uint32_t layer) {
  if (ended_) return FailedPrecondition("the save was finished or aborted");
  if (layer >= layers_) {
    return InvalidArgument("layer " + std::to_string(layer) + " of a " + std::to_string(layers_) + "-layer block");
  }
  for (size_t i = 0; layer_sums_ && i < blocks_; ++i) {
    std::span<std::byte> bytes = LayerSpan(i, layer);
    if (!bytes.empty()) reservation_.blocks()[i].layer_checksums[layer] = BlockChecksum(bytes);
  }
  saved_[layer] = true;
  PublishSaved();
  return Status::Ok();
}

Status LayerSave::PublishToPeers(bool free_when_taken) {
  if (ended_) return FailedPrecondition("the save was finished or aborted");
  if (publish_) {
    if (free_when_taken != free_when_taken_) {
      return InvalidArgument("PublishToPeers: free_when_taken was " +
                             std::string(free_when_taken_ ? "set" : "not set") + " by the first call");
    }
    return Status::Ok();
  }
  publish_ = true;
  free_when_taken_ = free_when_taken;
  if (!layer_sums_) {
    // Layers saved so far are hashed in place; later ones as they are saved.
    layer_sums_ = layers_ > 1;
    for (WritableBlock& b : reservation_.blocks()) {
      if (!b.status.ok()) continue;
      b.layer_checksums.assign(layers_, 0);
      for (uint32_t l = 0; l < layers_; ++l) {
        if (saved_[l]) b.layer_checksums[l] = BlockChecksum(b.data.subspan(uint64_t{l} * layer_bytes_, layer_bytes_));
      }
    }
  }
  PublishSaved();
  return Status::Ok();
}

void LayerSave::PublishSaved() {
  if (!publish_ || reservation_.conn_ == nullptr) return;
  uint32_t end = published_;
  while (end < layers_ && saved_[end]) ++end;
  if (end == published_) return;
  std::vector<BlockKey> keys;
  std::vector<uint64_t> sums;
  for (const WritableBlock& b : reservation_.blocks()) {
    if (!b.status.ok()) continue;
    keys.push_back(b.key);
    for (uint32_t l = published_; l < end; ++l) {
      // A block of one layer has its whole checksum as its layer's.
      sums.push_back(layers_ > 1 ? b.layer_checksums[l] : BlockChecksum(b.data.first(layer_bytes_)));
    }
  }
  const uint32_t first = published_;
  published_ = end;
  if (keys.empty()) return;
  // Not waited for: a refusal (the daemon is older, or the save was dropped) costs the peers only the early read.
  reservation_.conn_->Call(
      wire::MakePublishLayers(reservation_.ns_, keys, first, end, sums, free_when_taken_), [](Result<v1::Response>) {},
      internal::Connection::Reader::kDetached);
}

uint32_t LayerSave::layers_saved() const {
  uint32_t n = 0;
  for (bool s : saved_) n += s ? 1 : 0;
  return n;
}

Result<std::vector<Status>> LayerSave::FinishSave() {
  if (ended_) return FailedPrecondition("the save was finished or aborted");
  for (uint32_t l = 0; l < layers_; ++l) {
    if (!saved_[l]) {
      return FailedPrecondition("layer " + std::to_string(l) + " of " + std::to_string(layers_) +
                                " was not saved; nothing was committed");
    }
  }
  ended_ = true;
  return reservation_.Commit();
}

Status LayerSave::Abort() {
  if (ended_) return Status::Ok();
  ended_ = true;
  return reservation_.Abort();
}

}  // namespace kvtier
