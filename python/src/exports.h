// Zero-copy views of arena memory handed to Python, and how they end.
//
// Every view is a memoryview over an _ArenaBuffer that holds a shared_ptr
// to the state of the handle owning the memory (a pin, a reservation, a
// layer load), so the memory stays valid while anything in Python can
// still reach it: the memoryview itself, a numpy array made from it (which
// holds a buffer export), or a tensor from torch.frombuffer (which holds
// only a reference to the memoryview and a raw pointer). For that last
// reason a handle never releases the memoryviews it handed out: a released
// memoryview would leave such a tensor pointing at memory the daemon may
// reuse. Instead, ending a handle drops the handle's own reference; the
// handle object then refuses new views (FailedPreconditionError), and the
// state, hence the pin, lives until the last view and consumer are gone
// (read-only handles), or the end is refused while they live (writable
// handles: a commit must not publish bytes that can still change).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <span>

namespace kvtier::python {

struct ArenaBuffer {
  std::shared_ptr<void> owner;  // keeps the handle's state, hence the memory, alive
  std::byte* data = nullptr;
  size_t size = 0;
  bool readonly = true;
};

// A memoryview of `bytes`, kept alive (with the handle state) by `owner`.
pybind11::object ExportView(std::shared_ptr<void> owner, std::span<const std::byte> bytes, bool readonly);

void BindExports(pybind11::module_& m);  // registers _ArenaBuffer

}  // namespace kvtier::python
