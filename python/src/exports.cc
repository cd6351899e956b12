#include "python/src/exports.h"

namespace kvtier::python {
namespace py = pybind11;

py::object ExportView(std::shared_ptr<void> owner, std::span<const std::byte> bytes, bool readonly) {
  py::object buffer =
      py::cast(ArenaBuffer{std::move(owner), const_cast<std::byte*>(bytes.data()), bytes.size(), readonly});
  py::object view = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(buffer.ptr()));
  if (!view) throw py::error_already_set();
  return view;
}

void BindExports(py::module_& m) {
  py::class_<ArenaBuffer>(m, "_ArenaBuffer", py::buffer_protocol(),
                          "Arena memory behind a kvtier view; keeps its pin or reservation alive.")
      .def_buffer([](ArenaBuffer& b) {
        return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size)}, {1}, b.readonly);
      })
      .def("__len__", [](const ArenaBuffer& b) { return b.size; });
}

}  // namespace kvtier::python
