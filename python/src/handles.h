// The Python objects that own daemon resources: a pinned block (BlockView),
// a zero-copy reservation, a layer-wise save and a layer-wise load. Each
// holds its kvtier handle in a shared state that its exported views share
// (python/src/exports.h), so no view outlives the memory it shows.
//
// Ending a read-only handle (BlockView.release, LayerLoad.end) ends it at
// once (and waits for the daemon) when no view of it is alive; otherwise it
// ends when the last view, or array or tensor made from one, goes. Either
// way the handle gives no new views afterwards. Ending a writable handle
// (commit, finish) is refused with FailedPreconditionError while a view is
// alive, since bytes written after the commit would be published corrupt.
// All are context managers and are thread-compatible (one thread at a time).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <vector>

#include "kvtier/client.h"
#include "python/src/convert.h"
#include "python/src/errors.h"
#include "python/src/exports.h"

namespace kvtier::python {

struct PinState {
  BlockView view;
};

class PyBlockView {
 public:
  explicit PyBlockView(BlockView view);
  pybind11::object Data();
  // The address of the pinned bytes, for the binding's internal copy calls
  // (_copy_pieces): valid while this view is unreleased; the caller keeps it
  // alive for as long as it uses the address. FailedPrecondition once released.
  uintptr_t Address() const;
  void Release();
  const BlockKey& key() const { return key_; }
  uint64_t lease() const { return lease_; }
  uint64_t checksum() const { return checksum_; }
  size_t size() const { return size_; }
  bool released() const { return state_ == nullptr; }

 private:
  std::shared_ptr<PinState> state_;
  BlockKey key_;
  uint64_t lease_ = 0, checksum_ = 0;
  size_t size_ = 0;
};

struct ReservationState {
  Reservation reservation;
};

class PyReservation {
 public:
  explicit PyReservation(Reservation r);
  size_t size() const { return sizes_.size(); }
  ItemStatus Status(size_t i) const;
  pybind11::object Data(size_t i);
  void SetChecksum(size_t i, uint64_t checksum);
  std::vector<ItemStatus> Commit();
  void Abort();

 private:
  void CheckOpen() const;
  void CheckIndex(size_t i) const;
  std::shared_ptr<ReservationState> state_;
  std::vector<kvtier::Status> statuses_;
  std::vector<size_t> sizes_;
};

struct SaveState {
  LayerSave save;
};

class PyLayerSave {
 public:
  explicit PyLayerSave(LayerSave save);
  size_t size() const { return size_; }
  uint32_t layer_count() const { return layers_; }
  uint64_t layer_bytes() const { return layer_bytes_; }
  ItemStatus Status(size_t i) const;
  pybind11::object LayerSpan(size_t block, uint32_t layer);
  void SaveLayer(uint32_t layer, const pybind11::object& sources);
  void LayerWritten(uint32_t layer);
  void PublishToPeers(bool free_when_taken);
  uint32_t LayersSaved() const;
  std::vector<ItemStatus> Finish();
  void Abort();

 private:
  LayerSave& save() const;
  std::shared_ptr<SaveState> state_;
  size_t size_ = 0;
  uint32_t layers_ = 0;
  uint64_t layer_bytes_ = 0;
};

struct LoadState {
  LayerLoad load;
  HeldBuffers dst;  // the copy mode's buffers, held until the load ends
};

class PyLayerLoad {
 public:
  explicit PyLayerLoad(std::shared_ptr<LoadState> state);
  size_t size() const { return size_; }
  uint32_t layer_count() const { return layers_; }
  uint64_t layer_bytes() const { return layer_bytes_; }
  Tier source() const { return source_; }
  std::optional<PreloadPlan> plan() const { return plan_; }
  uint32_t LayersReady() const;
  ItemStatus Status(size_t i) const;
  bool Done() const;
  size_t UsablePrefix() const;
  void WaitLayer(uint32_t layer);
  void WaitAll();
  pybind11::object LayerSpan(size_t block, uint32_t layer);
  void End();
  bool ended() const { return state_ == nullptr; }

 private:
  LayerLoad& load() const;
  std::shared_ptr<LoadState> state_;
  size_t size_ = 0;
  uint32_t layers_ = 0;
  uint64_t layer_bytes_ = 0;
  Tier source_ = Tier::kNone;
  std::optional<PreloadPlan> plan_;
};

}  // namespace kvtier::python
