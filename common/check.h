// KVTIER_CHECK: aborts with a message when an invariant is broken. Errors
// that callers can cause are Status values, never checks.
#pragma once

#include <cstdio>
#include <cstdlib>

#define KVTIER_CHECK(cond, msg)                                                              \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
