// Temporary directories for the tools and the tests (kvtier_support).
#pragma once

#include <string>

#include "kvtier/result.h"

namespace kvtier::support {

// A fresh directory (mode 0700) under $TMPDIR, or /tmp when TMPDIR is unset
// or empty, named `prefix`XXXXXX. IoError (with mkdtemp's reason) if it
// cannot be made. Thread-safe.
Result<std::string> MakeTempDir(const std::string& prefix);

// Removes `path` and everything below it; best effort, errors are ignored (a
// leftover temporary directory is harmless). Thread-safe.
void RemoveTree(const std::string& path);

}  // namespace kvtier::support
