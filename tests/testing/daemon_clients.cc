#include "tests/testing/daemon_clients.h"

#include <thread>

#include <gtest/gtest.h>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {

std::unique_ptr<Client> ConnectTo(const DaemonProcess& daemon) {
  ClientOptions options;
  options.socket_path = daemon.socket_path();
  options.namespaces = {TestNamespace()};
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

bool WaitForCounter(Client& client, const std::string& name, int64_t at_least, std::chrono::seconds within) {
  for (auto end = std::chrono::steady_clock::now() + within; std::chrono::steady_clock::now() < end;) {
    if (StatsCounters(client)[name] >= at_least) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string LogOf(const DaemonProcess& daemon) { return ReadFile(daemon.log_path()); }

}  // namespace kvtier::testing
