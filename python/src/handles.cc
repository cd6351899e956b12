#include "python/src/handles.h"

#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>
#include <utility>

#include "python/src/bind.h"

namespace kvtier::python {
namespace py = pybind11;

namespace {

ItemStatus Item(kvtier::Status s) { return ItemStatus{std::move(s), std::nullopt}; }

std::vector<ItemStatus> Items(std::vector<kvtier::Status> statuses) {
  std::vector<ItemStatus> out;
  out.reserve(statuses.size());
  for (auto& s : statuses) out.push_back(Item(std::move(s)));
  return out;
}

[[noreturn]] void ThrowReleased(const char* what) {
  throw StatusError(FailedPrecondition(std::string(what) + " already ended"));
}

// Waits for the daemon with the GIL released; only when nothing in Python
// still holds the state's memory (no view of it is alive).
template <typename State, typename Fn>
void EndNowOrDefer(std::shared_ptr<State>& state, Fn end_now) {
  std::shared_ptr<State> mine = std::move(state);
  if (mine.use_count() == 1) {
    kvtier::Status s;
    {
      py::gil_scoped_release unlocked;
      s = end_now(*mine);
    }
    ThrowIfError(s);
  }
  // Otherwise a consumer's buffer still holds it: the handle's destructor
  // ends it (without waiting) when that buffer goes.
}

// A writable handle publishes nothing while a view of it (which could still
// write) is alive: the handle's own reference is then not the only one.
template <typename State>
void RefuseWhileViewed(const std::shared_ptr<State>& state, const char* what) {
  if (state.use_count() > 1) {
    throw StatusError(FailedPrecondition(std::string("cannot ") + what +
                                         ": a view of it is still alive (a memoryview, or a numpy array or tensor "
                                         "made from one); delete it first"));
  }
}

}  // namespace

// ---- BlockView ----

PyBlockView::PyBlockView(BlockView view)
    : key_(view.key()), lease_(view.lease()), checksum_(view.checksum()), size_(view.data().size()) {
  state_ = std::make_shared<PinState>(PinState{std::move(view)});
}

py::object PyBlockView::Data() {
  if (!state_) ThrowReleased("view");
  return ExportView(state_, state_->view.data(), /*readonly=*/true);
}

uintptr_t PyBlockView::Address() const {
  if (!state_) ThrowReleased("view");
  return reinterpret_cast<uintptr_t>(state_->view.data().data());
}

void PyBlockView::Release() {
  if (!state_) return;
  EndNowOrDefer(state_, [](PinState& s) { return s.view.Release(); });
}

// ---- Reservation ----

PyReservation::PyReservation(Reservation r) {
  for (const WritableBlock& b : r.blocks()) {
    statuses_.push_back(b.status);
    sizes_.push_back(b.data.size());
  }
  state_ = std::make_shared<ReservationState>(ReservationState{std::move(r)});
}

void PyReservation::CheckOpen() const {
  if (!state_) ThrowReleased("reservation");
}

void PyReservation::CheckIndex(size_t i) const {
  if (i >= sizes_.size()) throw py::index_error("block index out of range");
}

ItemStatus PyReservation::Status(size_t i) const {
  CheckIndex(i);
  return Item(statuses_[i]);
}

py::object PyReservation::Data(size_t i) {
  CheckOpen();
  CheckIndex(i);
  ThrowIfError(statuses_[i]);
  return ExportView(state_, state_->reservation.blocks()[i].data, /*readonly=*/false);
}

void PyReservation::SetChecksum(size_t i, uint64_t checksum) {
  CheckOpen();
  CheckIndex(i);
  state_->reservation.blocks()[i].checksum = checksum;
}

std::vector<ItemStatus> PyReservation::Commit() {
  CheckOpen();
  RefuseWhileViewed(state_, "commit the reservation");
  std::shared_ptr<ReservationState> mine = std::move(state_);
  std::vector<kvtier::Status> out;
  {
    py::gil_scoped_release unlocked;
    out = mine->reservation.Commit();
  }
  return Items(std::move(out));
}

void PyReservation::Abort() {
  if (!state_) return;
  // Aborting while a consumer can still write is harmless: nothing is
  // published, and the space returns when the consumer lets go.
  EndNowOrDefer(state_, [](ReservationState& s) { return s.reservation.Abort(); });
}

// ---- LayerSave ----

PyLayerSave::PyLayerSave(LayerSave save)
    : size_(save.size()), layers_(save.layer_count()), layer_bytes_(save.layer_bytes()) {
  state_ = std::make_shared<SaveState>(SaveState{std::move(save)});
}

LayerSave& PyLayerSave::save() const {
  if (!state_) ThrowReleased("layer save");
  return state_->save;
}

ItemStatus PyLayerSave::Status(size_t i) const {
  if (i >= size_) throw py::index_error("block index out of range");
  return Item(save().status(i));
}

py::object PyLayerSave::LayerSpan(size_t block, uint32_t layer) {
  if (block >= size_ || layer >= layers_) throw py::index_error("block or layer out of range");
  ThrowIfError(save().status(block));
  return ExportView(state_, save().LayerSpan(block, layer), /*readonly=*/false);
}

void PyLayerSave::SaveLayer(uint32_t layer, const py::object& sources) {
  LayerSave& s = save();
  HeldBuffers held(sources, /*writable=*/false);
  std::vector<std::span<const std::byte>> spans = held.readable();
  kvtier::Status st;
  {
    py::gil_scoped_release unlocked;
    st = s.SaveLayer(layer, spans);
  }
  ThrowIfError(st);
}

void PyLayerSave::LayerWritten(uint32_t layer) { ThrowIfError(save().LayerWritten(layer)); }

void PyLayerSave::PublishToPeers(bool free_when_taken) { ThrowIfError(save().PublishToPeers(free_when_taken)); }

uint32_t PyLayerSave::LayersSaved() const { return save().layers_saved(); }

std::vector<ItemStatus> PyLayerSave::Finish() {
  save();
  RefuseWhileViewed(state_, "finish the save");
  std::optional<Result<std::vector<kvtier::Status>>> r;
  {
    py::gil_scoped_release unlocked;
    r.emplace(state_->save.FinishSave());
  }
  std::vector<kvtier::Status> out = ValueOrThrow(std::move(*r));  // a missing layer keeps the save open
  state_.reset();
  return Items(std::move(out));
}

void PyLayerSave::Abort() {
  if (!state_) return;
  EndNowOrDefer(state_, [](SaveState& s) { return s.save.Abort(); });
}

// ---- LayerLoad ----

PyLayerLoad::PyLayerLoad(std::shared_ptr<LoadState> state)
    : state_(std::move(state)),
      size_(state_->load.size()),
      layers_(state_->load.layer_count()),
      layer_bytes_(state_->load.layer_bytes()),
      source_(state_->load.source()),
      plan_(state_->load.plan()) {}

LayerLoad& PyLayerLoad::load() const {
  if (!state_) ThrowReleased("layer load");
  return state_->load;
}

uint32_t PyLayerLoad::LayersReady() const { return load().layers_ready(); }

ItemStatus PyLayerLoad::Status(size_t i) const {
  if (i >= size_) throw py::index_error("block index out of range");
  return Item(load().status(i));
}

bool PyLayerLoad::Done() const { return load().done(); }

size_t PyLayerLoad::UsablePrefix() const { return load().usable_prefix(); }

void PyLayerLoad::WaitLayer(uint32_t layer) {
  LayerLoad& l = load();
  kvtier::Status s;
  {
    py::gil_scoped_release unlocked;
    s = l.WaitLayer(layer);
  }
  ThrowIfError(s);
}

void PyLayerLoad::WaitAll() {
  LayerLoad& l = load();
  kvtier::Status s;
  {
    py::gil_scoped_release unlocked;
    s = l.WaitAll();
  }
  ThrowIfError(s);
}

py::object PyLayerLoad::LayerSpan(size_t block, uint32_t layer) {
  std::span<const std::byte> span = ValueOrThrow(load().TryLayerSpan(block, layer));
  return ExportView(state_, span, /*readonly=*/true);
}

void PyLayerLoad::End() {
  if (!state_) return;
  EndNowOrDefer(state_, [](LoadState& s) { return s.load.End(); });
}

// ---- bindings ----

namespace {

template <typename T>
void ContextManager(py::class_<T>& c, void (T::*end)()) {
  c.def("__enter__", [](py::object self) {
     return self;
   }).def("__exit__", [end](T& self, py::handle, py::handle, py::handle) {
    (self.*end)();
    return false;
  });
}

}  // namespace

void BindHandles(py::module_& m) {
  BindExports(m);

  // For adapters that gather many small pieces (SGLang's layer_first host
  // pools): one call, one C++ loop, the GIL released while it copies.
  m.def(
      "_copy_pieces",
      [](const std::vector<std::tuple<uintptr_t, uintptr_t, size_t>>& moves) {
        py::gil_scoped_release unlocked;
        for (const auto& [dst, src, nbytes] : moves) {
          std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes);
        }
      },
      py::arg("moves"),
      "Copies each (dst, src, nbytes) of raw addresses, in order, with the GIL released. Internal: the caller "
      "keeps every range valid and writable (dst) for the call.");

  py::class_<PyBlockView> view(m, "BlockView",
                               "A block pinned in the daemon's arena (Client.pin). `data` is a read-only "
                               "memoryview of its bytes. After release() the view gives no more data "
                               "(FailedPreconditionError); memoryviews already taken, and arrays or "
                               "tensors made from them, keep the pin until they are gone.");
  view.def_property_readonly("ok", [](const PyBlockView&) { return true; })
      .def_property_readonly("key", &PyBlockView::key)
      .def_property_readonly("lease", &PyBlockView::lease)
      .def_property_readonly("checksum", &PyBlockView::checksum)
      .def_property_readonly("released", &PyBlockView::released)
      .def_property_readonly("data", &PyBlockView::Data)
      .def_property_readonly("_address", &PyBlockView::Address,
                             "Internal: the pinned bytes' address, valid while this view is unreleased.")
      .def("__len__", &PyBlockView::size)
      .def("release", &PyBlockView::Release,
           "Unpins the block (waits for the daemon) unless a memoryview taken from `data` (or an array "
           "or tensor made from one) is still alive; then the pin ends when the last of them goes.");
  ContextManager(view, &PyBlockView::Release);

  py::class_<PyReservation> res(m, "Reservation",
                                "Arena space reserved for blocks (Client.reserve): write data(i) in "
                                "place, then commit(). Leaving the `with` block uncommitted aborts.");
  res.def("__len__", &PyReservation::size)
      .def("status", &PyReservation::Status, py::arg("block"))
      .def("data", &PyReservation::Data, py::arg("block"), "A writable memoryview of block i's space.")
      .def("set_checksum", &PyReservation::SetChecksum, py::arg("block"), py::arg("xxh3_64"))
      .def("commit", &PyReservation::Commit, "Publishes every ok block; one Status per block.")
      .def("abort", &PyReservation::Abort);
  ContextManager(res, &PyReservation::Abort);

  py::class_<PyLayerSave> save(m, "LayerSave",
                               "A prefix saved layer by layer (Client.begin_save). Leaving the `with` "
                               "block unfinished aborts: nothing is published.");
  save.def("__len__", &PyLayerSave::size)
      .def_property_readonly("layer_count", &PyLayerSave::layer_count)
      .def_property_readonly("layer_bytes", &PyLayerSave::layer_bytes)
      .def_property_readonly("layers_saved", &PyLayerSave::LayersSaved)
      .def("status", &PyLayerSave::Status, py::arg("block"))
      .def("layer_span", &PyLayerSave::LayerSpan, py::arg("block"), py::arg("layer"))
      .def("save_layer", &PyLayerSave::SaveLayer, py::arg("layer"), py::arg("sources"),
           "Copies sources[i] (one buffer of layer_bytes per block) into layer `layer`.")
      .def("layer_written", &PyLayerSave::LayerWritten, py::arg("layer"))
      .def("publish_to_peers", &PyLayerSave::PublishToPeers, py::arg("free_when_taken") = false,
           "Publish the saved layers to this node's peers as they are saved, before finish_save commits them "
           "(a prefill node's layer-by-layer hand-off to a decode node). free_when_taken: each block leaves "
           "this node once a peer has read it whole.")
      .def("finish", &PyLayerSave::Finish, "Commits every ok block; one Status per block.")
      .def("abort", &PyLayerSave::Abort);
  ContextManager(save, &PyLayerSave::Abort);

  py::class_<PreloadPlan>(m, "PreloadPlan", "How many layers to hold before computing (kvtier/preload.h).")
      .def_readonly("layers_to_preload", &PreloadPlan::layers_to_preload)
      .def_readonly("buffer_bytes", &PreloadPlan::buffer_bytes)
      .def_readonly("read_bytes_per_s", &PreloadPlan::read_bytes_per_s)
      .def_readonly("read_us_per_layer", &PreloadPlan::read_us_per_layer)
      .def_readonly("stall_us", &PreloadPlan::stall_us)
      .def_readonly("total_us", &PreloadPlan::total_us)
      .def_readonly("recompute_instead", &PreloadPlan::recompute_instead);

  py::class_<PyLayerLoad> load(m, "LayerLoad",
                               "A prefix loading layer by layer (Client.begin_load). Leaving the `with` "
                               "block ends it.");
  load.def("__len__", &PyLayerLoad::size)
      .def_property_readonly("layer_count", &PyLayerLoad::layer_count)
      .def_property_readonly("layer_bytes", &PyLayerLoad::layer_bytes)
      .def_property_readonly("source", &PyLayerLoad::source)
      .def_property_readonly("plan", &PyLayerLoad::plan)
      .def_property_readonly("layers_ready", &PyLayerLoad::LayersReady)
      .def_property_readonly("done", &PyLayerLoad::Done)
      .def_property_readonly("usable_prefix", &PyLayerLoad::UsablePrefix)
      .def_property_readonly("ended", &PyLayerLoad::ended)
      .def("status", &PyLayerLoad::Status, py::arg("block"))
      .def("wait_layer", &PyLayerLoad::WaitLayer, py::arg("layer"))
      .def("wait_all", &PyLayerLoad::WaitAll)
      .def("layer_span", &PyLayerLoad::LayerSpan, py::arg("block"), py::arg("layer"),
           "Zero-copy: a read-only memoryview of layer `layer` of block `block`; it keeps the load's "
           "pins while it lives, also past end().")
      .def("end", &PyLayerLoad::End);
  ContextManager(load, &PyLayerLoad::End);
}

}  // namespace kvtier::python
