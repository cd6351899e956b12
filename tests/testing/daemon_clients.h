// Helpers of the tests that run kvtierd as a child (DaemonProcess) and
// talk to it as a client: connect with TestNamespace(), wait for a
// counter, read the daemon's log for a failure message.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/client.h"
#include "tests/testing/daemon_process.h"

namespace kvtier::testing {

// A client of `daemon` with TestNamespace() registered; null (and a test
// failure) when it cannot connect.
std::unique_ptr<Client> ConnectTo(const DaemonProcess& daemon);

// Polls `name` in `client`'s Stats until it reaches `at_least`, for at
// most `within`.
bool WaitForCounter(Client& client, const std::string& name, int64_t at_least,
                    std::chrono::seconds within = std::chrono::seconds(10));

// Everything `daemon` has logged so far.
std::string LogOf(const DaemonProcess& daemon);

}  // namespace kvtier::testing
