// TightDescriptorLimit: lowers this process's descriptor limit
// (RLIMIT_NOFILE) so that only a few more descriptors can be opened, for
// tests of what a listener does when accept() fails with EMFILE. The limit
// comes back at Restore or destruction. (Run such a test alone in its
// process, as ctest does: the limit is the whole process's.)
#pragma once

#include <sys/resource.h>
#include <unistd.h>

namespace kvtier::testing {

class TightDescriptorLimit {
 public:
  // Leaves room for `room` more descriptors than are open now (counted
  // from the lowest free descriptor number).
  explicit TightDescriptorLimit(int room) {
    if (::getrlimit(RLIMIT_NOFILE, &saved_) != 0) return;
    const int lowest_free = ::dup(STDERR_FILENO);
    if (lowest_free < 0) return;
    ::close(lowest_free);
    rlimit tight = saved_;
    tight.rlim_cur = static_cast<rlim_t>(lowest_free + room);
    lowered_ = ::setrlimit(RLIMIT_NOFILE, &tight) == 0;
  }
  ~TightDescriptorLimit() { Restore(); }
  TightDescriptorLimit(const TightDescriptorLimit&) = delete;
  TightDescriptorLimit& operator=(const TightDescriptorLimit&) = delete;

  // Whether the limit was lowered.
  bool ok() const { return lowered_; }
  // Puts the limit back; true when it is back (or was never lowered).
  bool Restore() {
    if (!lowered_) return true;
    lowered_ = ::setrlimit(RLIMIT_NOFILE, &saved_) != 0;
    return !lowered_;
  }

 private:
  rlimit saved_{};
  bool lowered_ = false;
};

}  // namespace kvtier::testing
