// Status and errors of the Python binding: every non-ok kvtier::Status a
// call returns becomes a Python exception of the class for its code
// (kvtier.NotFoundError, ...; all derive from kvtier.Error), carrying
// `.code` (the stable status name, "not_found") and `.message`. Per-item
// outcomes of batch calls are kvtier.Status objects instead.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <utility>

#include "kvtier/result.h"
#include "kvtier/status.h"

namespace kvtier::python {

// Thrown inside the binding; translated to the Python class of its code.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)), what_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// A per-item outcome: ok, or the code and message; `value` is what an ok
// item returned (bytes copied), when it returns anything.
struct ItemStatus {
  Status status;
  std::optional<size_t> value;
};

// Registers kvtier.Error, its per-code subclasses, kvtier.Status and the
// exception translator in `m`.
void BindErrors(pybind11::module_& m);

}  // namespace kvtier::python
