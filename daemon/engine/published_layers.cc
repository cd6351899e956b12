#include "daemon/engine/published_layers.h"

#include <algorithm>
#include <memory>
#include <string>

#include "daemon/engine/namespace_registry.h"
#include "daemon/engine/writer.h"

namespace kvtier {

PublishedLayers::PublishedLayers(FindReserved find, LayerCount layer_count, size_t max_blocks)
    : find_(std::move(find)), layer_count_(std::move(layer_count)), max_blocks_(std::max<size_t>(max_blocks, 1)) {}

PublishedLayers::PublishedLayers(const Writer& writer, const NamespaceRegistry& namespaces)
    : PublishedLayers(
          [&writer](ConnectionId w, const NamespaceFingerprint& ns, const BlockKey& key) -> std::optional<Reserved> {
            auto r = writer.Reserved(w, ns, key);
            if (!r) return std::nullopt;
            return Reserved{r->first, r->second};
          },
          [&namespaces](const NamespaceFingerprint& ns, uint64_t size) {
            return namespaces.LayoutOf(ns, size).layer_count;
          }) {}

std::vector<Status> PublishedLayers::Publish(ConnectionId writer, const NamespaceFingerprint& ns,
                                             std::span<const BlockKey> keys, uint32_t first, uint32_t end,
                                             std::span<const uint64_t> layer_checksums, bool free_when_taken) {
  std::vector<Status> out(keys.size());
  if (end <= first || layer_checksums.size() != keys.size() * (end - first)) {
    const Status bad = InvalidArgument("PublishLayers: " + std::to_string(layer_checksums.size()) +
                                       " checksums for layers [" + std::to_string(first) + ", " + std::to_string(end) +
                                       ") of " + std::to_string(keys.size()) + " blocks");
    std::fill(out.begin(), out.end(), bad);
    return out;
  }
  std::vector<BlockKey> published;
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    // The reservation is looked up with no lock of ours held (it takes a shard's).
    std::optional<Reserved> reserved = find_(writer, ns, key);
    if (!reserved) {
      out[i] = InvalidArgument("PublishLayers: block " + key.ToHex() + " is not reserved by this connection");
      continue;
    }
    const uint32_t layers = layer_count_(ns, reserved->size);
    if (end > layers) {
      out[i] = InvalidArgument("PublishLayers: layer " + std::to_string(end - 1) + " of a block of " +
                               std::to_string(layers) + " layers");
      continue;
    }
    MutexLock lock(mu_);
    auto [it, added] = entries_.try_emplace(key);
    Entry& e = it->second;
    if (added || e.writer != writer || e.partial.offset != reserved->extent.offset) {
      e = Entry{writer, Partial{ns, reserved->extent.offset, reserved->size, layers, {}}};
      if (added) order_.push_back(key);
    }
    if (first != e.partial.layer_checksums.size()) {
      out[i] = InvalidArgument("PublishLayers: block " + key.ToHex() + " has layers [0, " +
                               std::to_string(e.partial.layer_checksums.size()) + ") published, not [0, " +
                               std::to_string(first) + ")");
      continue;
    }
    const auto sums = layer_checksums.subspan(i * (end - first), end - first);
    e.partial.layer_checksums.insert(e.partial.layer_checksums.end(), sums.begin(), sums.end());
    // Marked before any reader can see these layers, so that its Taken finds the mark.
    MarkHandoff(writer, ns, key, e.partial.offset, free_when_taken);
    published.push_back(key);
  }
  std::shared_ptr<Listener> listener;
  {
    MutexLock lock(mu_);
    while (entries_.size() > max_blocks_ && !order_.empty()) {
      entries_.erase(order_.front());
      order_.pop_front();
    }
    if (order_.size() > 2 * entries_.size() + 1024) {
      std::erase_if(order_, [this](const BlockKey& k) {
        mu_.AssertHeld();
        return !entries_.contains(k);
      });
    }
    while (handoffs_.size() > max_blocks_ && !handoff_order_.empty()) {
      auto it = handoffs_.find(handoff_order_.front());
      if (it != handoffs_.end()) DropMark(it);
      handoff_order_.pop_front();
    }
    if (handoff_order_.size() > 2 * handoffs_.size() + 1024) {
      std::erase_if(handoff_order_, [this](const BlockKey& k) {
        mu_.AssertHeld();
        return !handoffs_.contains(k);
      });
    }
    listener = listener_;
  }
  if (listener != nullptr && *listener) {
    for (const BlockKey& key : published) (*listener)(key);
  }
  return out;
}

std::optional<PublishedLayers::Partial> PublishedLayers::Find(const NamespaceFingerprint& ns, const BlockKey& key) {
  Entry copy;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.partial.ns != ns) return std::nullopt;
    copy = it->second;
  }
  std::optional<Reserved> reserved = find_(copy.writer, ns, key);
  if (reserved && reserved->extent.offset == copy.partial.offset) return copy.partial;
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.writer == copy.writer && it->second.partial.offset == copy.partial.offset) {
    entries_.erase(it);
  }
  return std::nullopt;
}

void PublishedLayers::EndConnection(ConnectionId writer) {
  MutexLock lock(mu_);
  std::erase_if(entries_, [writer](const auto& entry) { return entry.second.writer == writer; });
  if (taken_reserved_.load(std::memory_order_relaxed) == 0) return;
  for (auto it = handoffs_.begin(); it != handoffs_.end();) {
    auto next = std::next(it);
    if (it->second.writer == writer && it->second.taken) DropMark(it);
    it = next;
  }
}

void PublishedLayers::MarkHandoff(ConnectionId writer, const NamespaceFingerprint& ns, const BlockKey& key,
                                  uint64_t offset, bool free_when_taken) {
  auto it = handoffs_.find(key);
  const bool same =
      it != handoffs_.end() && it->second.writer == writer && it->second.ns == ns && it->second.offset == offset;
  if (same) return;  // this save's own mark, taken or not
  // Another save of the key (another writer, or another reservation): an older mark is not its.
  if (it != handoffs_.end()) DropMark(it);
  if (!free_when_taken) return;
  handoffs_.emplace(key, Handoff{writer, ns, offset, false});
  marks_.fetch_add(1, std::memory_order_relaxed);
  handoff_order_.push_back(key);
}

void PublishedLayers::DropMark(std::unordered_map<BlockKey, Handoff>::iterator it) {
  if (it->second.taken) taken_reserved_.fetch_sub(1, std::memory_order_relaxed);
  marks_.fetch_sub(1, std::memory_order_relaxed);
  handoffs_.erase(it);
}

void PublishedLayers::Aborted(ConnectionId writer, std::span<const BlockKey> keys) {
  if (marks_.load(std::memory_order_relaxed) == 0) return;
  MutexLock lock(mu_);
  for (const BlockKey& key : keys) {
    auto it = handoffs_.find(key);
    if (it != handoffs_.end() && it->second.writer == writer) DropMark(it);
  }
}

std::vector<BlockKey> PublishedLayers::Taken(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  std::vector<BlockKey> now;
  for (const BlockKey& key : keys) {
    Handoff mark;
    {
      MutexLock lock(mu_);
      auto it = handoffs_.find(key);
      if (it == handoffs_.end() || it->second.ns != ns || it->second.taken) continue;
      mark = it->second;
    }
    // Still reserved? Looked up with no lock of ours held (it takes a shard's).
    const bool reserved = find_(mark.writer, ns, key).has_value();
    {
      MutexLock lock(mu_);
      auto it = handoffs_.find(key);
      // Marked again meanwhile (another save of the key): not the block this reader took.
      if (it == handoffs_.end() || it->second.taken || it->second.writer != mark.writer ||
          it->second.offset != mark.offset || it->second.ns != ns) {
        continue;
      }
      if (!reserved) {
        DropMark(it);
        now.push_back(key);
        continue;
      }
      it->second.taken = true;  // freed at its commit (Committed)
      taken_reserved_.fetch_add(1, std::memory_order_relaxed);
    }
    // A commit that ended the reservation before the mark said taken did not see it: free the block now.
    if (find_(mark.writer, ns, key).has_value()) continue;
    MutexLock lock(mu_);
    auto it = handoffs_.find(key);
    if (it == handoffs_.end() || !it->second.taken || it->second.writer != mark.writer ||
        it->second.offset != mark.offset) {
      continue;
    }
    DropMark(it);
    now.push_back(key);
  }
  return now;
}

std::vector<BlockKey> PublishedLayers::Committed(ConnectionId writer, const NamespaceFingerprint& ns,
                                                 std::span<const BlockKey> keys) {
  std::vector<BlockKey> taken;
  if (taken_reserved_.load(std::memory_order_relaxed) == 0) return taken;
  MutexLock lock(mu_);
  for (const BlockKey& key : keys) {
    auto it = handoffs_.find(key);
    if (it == handoffs_.end() || !it->second.taken || it->second.writer != writer || it->second.ns != ns) continue;
    DropMark(it);
    taken.push_back(key);
  }
  return taken;
}

void PublishedLayers::SetListener(Listener listener) {
  MutexLock lock(mu_);
  listener_ = std::make_shared<Listener>(std::move(listener));
}

size_t PublishedLayers::size() const {
  MutexLock lock(mu_);
  return entries_.size();
}

size_t PublishedLayers::handoffs() const {
  MutexLock lock(mu_);
  return handoffs_.size();
}

}  // namespace kvtier
