// The parts of the kvtier Python module, one per file (python/src/*.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace kvtier::python {

void BindKeys(pybind11::module_& m);     // keys.cc
void BindClient(pybind11::module_& m);   // client.cc
void BindHandles(pybind11::module_& m);  // handles.cc: views, reservations, layer save/load

}  // namespace kvtier::python
