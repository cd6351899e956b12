// What the C ABI's entry points (c_api*.cc, kvtier_c.h over
// kvtier::Client) share. Each entry point runs its body inside Guard,
// which clears the thread's error message and lets no exception cross the
// ABI, and turns a Status into its code with Report, keeping the message
// for kvtier_last_error. Private to client_lib.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/kvtier_c.h"

struct kvtier_client {
  std::unique_ptr<kvtier::Client> client;
};

struct kvtier_view {
  kvtier::BlockView view;
};

struct kvtier_reservation {
  kvtier::Reservation reservation;
  bool committed = false;
};

struct kvtier_layer_save {
  kvtier::LayerSave save;
};

struct kvtier_layer_load {
  kvtier::LayerLoad load;
};

namespace kvtier::c_abi {

// Owned by this thread; kvtier_last_error hands out its c_str().
extern thread_local std::string last_error;

inline int Code(const Status& s) { return static_cast<int>(s.code()); }

// Records `s` as this thread's error (if it is one) and returns its code.
int Report(const Status& s);

// InvalidArgument naming the NULL argument `what`, reported.
int Missing(const char* what);

// Runs one entry point: clears the error, maps any exception to Internal.
template <typename Body>
int Guard(Body&& body) noexcept {
  try {
    last_error.clear();
    return body();
  } catch (const std::exception& e) {
    return Report(Internal(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return Report(Internal("unexpected non-standard exception"));
  }
}

BlockKey ToKey(kvtier_key k);
kvtier_key ToC(const BlockKey& k);
kvtier_preload_plan ToC(const PreloadPlan& p);
std::vector<BlockKey> ToKeys(const kvtier_key* keys, size_t n);
// Zero / NULL fields of a later key version read as their defaults (kvtier_c.h).
NamespaceDescriptor ToDescriptor(const kvtier_namespace& c);

// InvalidArgument unless `ns` was registered by this client. Checked here
// so that batch calls can tell a bad call from per-key failures.
Status CheckNamespace(const kvtier_client& c, uint32_t ns);

// Writes per-key codes; the thread's message becomes the first failure's.
template <typename Outcome, typename StatusOf>
void ReportEach(const std::vector<Outcome>& outcomes, int* statuses, StatusOf status_of) {
  bool reported = false;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Status& s = status_of(outcomes[i]);
    statuses[i] = Code(s);
    if (!s.ok() && !reported) {
      last_error = "key " + std::to_string(i) + ": " + s.ToString();
      reported = true;
    }
  }
}

}  // namespace kvtier::c_abi
