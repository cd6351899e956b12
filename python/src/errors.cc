#include "python/src/errors.h"

#include <pybind11/stl.h>

#include <array>
#include <string>

namespace kvtier::python {
namespace py = pybind11;

namespace {

struct CodeClass {
  StatusCode code;
  const char* name;  // Python class name
  PyObject* extra;   // a builtin base besides kvtier.Error, or null
};

// Filled by BindErrors; index = StatusCode value. Module-lifetime objects.
std::array<PyObject*, 17> g_classes{};
PyObject* g_base = nullptr;

PyObject* ClassFor(StatusCode code) {
  auto i = static_cast<size_t>(code);
  if (i < g_classes.size() && g_classes[i] != nullptr) return g_classes[i];
  return g_base;
}

}  // namespace

void BindErrors(py::module_& m) {
  g_base = PyErr_NewExceptionWithDoc("kvtier.Error",
                                     "A kvtier call failed. `code` is the stable status name (\"not_found\"), "
                                     "`message` says why.",
                                     PyExc_RuntimeError, nullptr);
  m.add_object("Error", py::handle(g_base));
  const CodeClass classes[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {StatusCode::kNotFound, "NotFoundError", nullptr},
      {StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr},
      {StatusCode::kNoSpace, "NoSpaceError", nullptr},
      {StatusCode::kBusy, "BusyError", nullptr},
      {StatusCode::kIoError, "IoError", nullptr},
      {StatusCode::kCorruption, "CorruptionError", nullptr},
      {StatusCode::kProtocolError, "ProtocolError", nullptr},
      {StatusCode::kVersionMismatch, "VersionMismatchError", nullptr},
      {StatusCode::kUnavailable, "UnavailableError", PyExc_ConnectionError},
      {StatusCode::kPermissionDenied, "PermissionDeniedError", PyExc_PermissionError},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", nullptr},
      {StatusCode::kUnimplemented, "UnimplementedError", PyExc_NotImplementedError},
      {StatusCode::kInternal, "InternalError", nullptr},
      {StatusCode::kCancelled, "CancelledError", nullptr},
      {StatusCode::kTimedOut, "TimedOutError", PyExc_TimeoutError},
  };
  for (const CodeClass& c : classes) {
    std::string qualified = std::string("kvtier.") + c.name;
    py::object bases = c.extra != nullptr ? py::make_tuple(py::handle(g_base), py::handle(c.extra))
                                          : py::make_tuple(py::handle(g_base));
    PyObject* cls = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    py::setattr(cls, "code", py::str(std::string(StatusCodeName(c.code))));
    g_classes[static_cast<size_t>(c.code)] = cls;
    m.add_object(c.name, py::handle(cls));
  }

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyObject* cls = ClassFor(e.status().code());
      py::object exc =
          py::reinterpret_steal<py::object>(PyObject_CallFunction(cls, "s", e.status().ToString().c_str()));
      if (!exc) return;  // the call set its own error
      exc.attr("code") = py::str(std::string(StatusCodeName(e.status().code())));
      exc.attr("message") = py::str(e.status().message());
      PyErr_SetObject(cls, exc.ptr());
    }
  });

  py::class_<ItemStatus>(m, "Status",
                         "The outcome of one item of a batch call: `ok`, `code` (the stable "
                         "status name), `message`, and `value` (bytes copied) for ok reads.")
      .def_property_readonly("ok", [](const ItemStatus& s) { return s.status.ok(); })
      .def_property_readonly("code", [](const ItemStatus& s) { return std::string(StatusCodeName(s.status.code())); })
      .def_property_readonly("message", [](const ItemStatus& s) { return s.status.message(); })
      .def_property_readonly("value", [](const ItemStatus& s) { return s.value; })
      .def("__bool__", [](const ItemStatus& s) { return s.status.ok(); })
      .def(
          "raise_if_error", [](const ItemStatus& s) { ThrowIfError(s.status); },
          "Raises the kvtier.Error subclass of a failed item; nothing when ok.")
      .def("__repr__", [](const ItemStatus& s) {
        std::string r = "Status(" + s.status.ToString();
        if (s.value) r += ", value=" + std::to_string(*s.value);
        return r + ")";
      });
}

}  // namespace kvtier::python
