// WaitFor: polls a condition that another thread makes true, for tests
// that cannot wait on an event (a tier's background work that signals
// nothing the test can see).
#pragma once

#include <chrono>
#include <thread>

namespace kvtier::testing {

// Whether `pred` became true within `timeout`, polled every millisecond.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace kvtier::testing
