// The kvtier._kvtier extension module; python/kvtier/__init__.py re-exports it.
#include <pybind11/pybind11.h>

#include "python/src/bind.h"
#include "python/src/errors.h"

PYBIND11_MODULE(_kvtier, m) {
  m.doc() = "kvtier client binding (libkvtier_client): keys, lookups, zero-copy views, layer-wise I/O.";
  kvtier::python::BindErrors(m);
  kvtier::python::BindKeys(m);
  kvtier::python::BindHandles(m);
  kvtier::python::BindClient(m);
}
