// Result<T>: a value or a non-ok Status. Standard library only.
#pragma once

#include <cstdlib>
#include <cstdio>
#include <optional>
#include <utility>

#include "kvtier/status.h"

namespace kvtier {

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) {
      std::fprintf(stderr, "kvtier: Result constructed from an ok Status\n");
      std::abort();
    }
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // Precondition: ok(). Aborts otherwise (a broken invariant, not an error).
  T& value() & {
    Check();
    return *value_;
  }
  const T& value() const& {
    Check();
    return *value_;
  }
  T&& value() && {
    Check();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void Check() const {
    if (!value_) {
      std::fprintf(stderr, "kvtier: value() of a failed Result: %s\n", status_.ToString().c_str());
      std::abort();
    }
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace kvtier
