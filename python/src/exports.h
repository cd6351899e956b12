// Zero-copy views of arena memory handed to Python, and how they end.
//
// Every view is a memoryview over an _ArenaBuffer that holds a shared_ptr
// to the handle owning the memory (a pin, a reservation, a layer load), so
// the memory stays valid while anything in Python can still reach it: a
// numpy array or a tensor made from the view keeps the buffer, hence the
// handle, alive. ExportList remembers the memoryviews it handed out; when
// the handle is released it releases them, so using one afterwards raises
// ValueError ("operation forbidden on released memoryview object"). A
// consumer that still holds the memory (np.frombuffer(view), a tensor)
// keeps the handle alive instead: read-only handles then end when the last
// such consumer goes; writable ones refuse to commit (see StillShared).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace kvtier::python {

struct ArenaBuffer {
  std::shared_ptr<void> owner;  // keeps the handle, hence the memory, alive
  std::byte* data = nullptr;
  size_t size = 0;
  bool readonly = true;
};

class ExportList {
 public:
  // A memoryview of `bytes`, kept alive by `owner`.
  pybind11::object Export(std::shared_ptr<void> owner, std::span<const std::byte> bytes, bool readonly);
  // Releases every memoryview handed out; returns how many could not be
  // released because something (a tensor's buffer) still exports them.
  size_t ReleaseAll();

 private:
  std::vector<pybind11::object> views_;
};

void BindExports(pybind11::module_& m);  // registers _ArenaBuffer

}  // namespace kvtier::python
