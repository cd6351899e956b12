#include "daemon/server/metrics_server.h"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/read_until.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/streambuf.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <list>
#include <memory>
#include <thread>

#include "common/logging.h"
#include "common/retry_scheduler.h"

namespace kvtier {
namespace {

constexpr size_t kMaxRequestHead = 8192;
constexpr auto kRequestTimeout = std::chrono::seconds(5);
constexpr size_t kMaxConnections = 32;
constexpr uint64_t kAcceptPauseMs = 100;

std::string Response(int code, std::string_view reason, std::string_view content_type, const std::string& body,
                     bool head_only, std::string_view extra_header = {}) {
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + std::string(reason) + "\r\n";
  out += "Content-Type: " + std::string(content_type) + "\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += "Connection: close\r\n";
  if (!extra_header.empty()) out += std::string(extra_header) + "\r\n";
  out += "\r\n";
  if (!head_only) out += body;
  return out;
}

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

std::string_view TrimSpaces(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Equal bytes, in time that depends on `expected`'s length only.
bool ConstantTimeEquals(std::string_view presented, std::string_view expected) {
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

}  // namespace

bool HasBearerToken(std::string_view head, std::string_view token) {
  bool found = false;
  size_t at = head.find("\r\n");
  while (at != std::string_view::npos) {
    const size_t start = at + 2;
    const size_t end = head.find("\r\n", start);
    const std::string_view line = head.substr(start, end == std::string_view::npos ? end : end - start);
    at = end;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !EqualsIgnoringCase(line.substr(0, colon), "authorization")) continue;
    const std::string_view value = TrimSpaces(line.substr(colon + 1));
    if (value.size() < 7 || !EqualsIgnoringCase(value.substr(0, 7), "bearer ")) return false;
    if (found) return false;  // two Authorization headers: refused, whatever they say
    found = ConstantTimeEquals(TrimSpaces(value.substr(7)), token);
    if (!found) return false;
  }
  return found;
}

struct MetricsServer::State {
  // One open connection. `idle` until its request head is read; `listed`
  // while it is in `open` (CloseOldestIdle takes it out).
  struct Open {
    asio::ip::tcp::socket socket;
    bool idle = true;
    bool listed = true;
  };
  using OpenList = std::list<std::shared_ptr<Open>>;

  MetricsOptions options;
  Render render;
  // Every open connection, oldest first (only the io thread touches it).
  // Declared before io: coroutines destroyed with io take themselves out.
  OpenList open;
  uint16_t port = 0;
  asio::io_context io{1};
  asio::ip::tcp::acceptor acceptor{io};
  std::thread thread;
  SystemClock system_clock;
  // Ends the pause after a failed accept, on the options' clock; declared
  // after io, so it stops (running a pause still waiting) while io lives.
  std::unique_ptr<RetryScheduler> pause;

  // The answer to one request head (the bytes up to the blank line).
  std::string Answer(std::string_view head) {
    const size_t line_end = head.find("\r\n");
    const std::string_view line = head.substr(0, line_end);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || !line.substr(sp2 + 1).starts_with("HTTP/1.")) {
      return Response(400, "Bad Request", "text/plain", "not an HTTP/1.x request line\n", false);
    }
    const std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    target = target.substr(0, target.find('?'));
    const bool head_only = method == "HEAD";
    if (method != "GET" && !head_only) {
      return Response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false, "Allow: GET, HEAD");
    }
    if (target == "/metrics") {
      MetricsView view = options.open_view;
      if (!options.bearer_token.empty()) {
        if (!HasBearerToken(head, options.bearer_token)) {
          return Response(401, "Unauthorized", "text/plain",
                          "this endpoint needs Authorization: Bearer <the token in metrics.bearer_token_file>\n",
                          head_only, "WWW-Authenticate: Bearer realm=\"kvtierd\"");
        }
        view = MetricsView::kAll;
      }
      return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render(view), head_only);
    }
    if (target == "/healthz") return Response(200, "OK", "text/plain", "ok\n", head_only);
    if (target == "/") {
      return Response(200, "OK", "text/plain", "kvtierd: metrics at /metrics, liveness at /healthz\n", head_only);
    }
    return Response(404, "Not Found", "text/plain", "no such page; try /metrics\n", head_only);
  }

  // Closes the oldest connection whose request head has not come yet;
  // false when every open connection is being answered.
  bool CloseOldestIdle() {
    for (auto it = open.begin(); it != open.end(); ++it) {
      if (!(*it)->idle) continue;
      asio::error_code ignored;
      (*it)->socket.close(ignored);  // its Serve sees the error and returns
      (*it)->listed = false;
      open.erase(it);
      return true;
    }
    return false;
  }

  asio::awaitable<void> Serve(std::shared_ptr<Open> connection, OpenList::iterator at) {
    struct Unlist {  // on every way out, coroutine destruction included
      OpenList& open;
      Open& connection;
      OpenList::iterator at;
      ~Unlist() {
        if (connection.listed) open.erase(at);
      }
    } unlist{open, *connection, at};
    asio::ip::tcp::socket& socket = connection->socket;
    asio::steady_timer deadline(io);
    deadline.expires_after(kRequestTimeout);
    deadline.async_wait([&socket](asio::error_code ec) {
      if (!ec) socket.close(ec);  // too slow: drop it
    });
    asio::streambuf buffer(kMaxRequestHead);
    asio::error_code ec;
    co_await asio::async_read_until(socket, buffer, "\r\n\r\n", asio::redirect_error(asio::use_awaitable, ec));
    connection->idle = false;
    std::string reply;
    if (ec == asio::error::not_found) {
      reply = Response(431, "Request Header Fields Too Large", "text/plain", "request head over 8 KiB\n", false);
    } else if (ec) {
      deadline.cancel();
      co_return;
    } else {
      const auto data = buffer.data();
      reply = Answer(std::string_view(static_cast<const char*>(data.data()), data.size()));
    }
    co_await asio::async_write(socket, asio::buffer(reply), asio::redirect_error(asio::use_awaitable, ec));
    socket.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    deadline.cancel();
  }

  asio::awaitable<void> Accept() {
    for (;;) {
      asio::error_code ec;
      auto socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
      if (ec) {
        // Out of descriptors and the like: pause instead of spinning, on
        // a timer only the pause's job ends (cancels), on this thread.
        spdlog::warn("metrics: accept failed: {}; pausing {} ms", ec.message(), kAcceptPauseMs);
        auto woken = std::make_shared<asio::steady_timer>(io, asio::steady_timer::time_point::max());
        if (!pause->RunAfter(kAcceptPauseMs * 1000,
                             [woken] { asio::post(woken->get_executor(), [woken] { woken->cancel(); }); })) {
          co_return;  // stopping
        }
        co_await woken->async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      if (open.size() >= kMaxConnections && !CloseOldestIdle()) {
        socket.close(ec);  // every one of them is being answered: this one waits for nothing
        continue;
      }
      auto connection = std::make_shared<Open>(Open{std::move(socket)});
      auto at = open.insert(open.end(), connection);
      asio::co_spawn(io, Serve(connection, at), asio::detached);
    }
  }
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsOptions& options, Render render) {
  auto state = std::make_unique<State>();
  state->options = options;
  state->render = std::move(render);
  asio::error_code ec;
  const asio::ip::address address = asio::ip::make_address(options.address, ec);
  if (ec) return InvalidArgument("metrics.address '" + options.address + "' is not an IP address");
  const asio::ip::tcp::endpoint endpoint(address, options.port);
  state->acceptor.open(endpoint.protocol(), ec);
  if (!ec) state->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) state->acceptor.bind(endpoint, ec);
  if (!ec) state->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return IoError("metrics endpoint: cannot listen on " + options.address + ":" + std::to_string(options.port) + ": " +
                   ec.message());
  }
  state->port = state->acceptor.local_endpoint().port();
  state->pause = std::make_unique<RetryScheduler>("metrics.accept_pause",
                                                  options.clock != nullptr ? *options.clock : state->system_clock, 1);
  asio::co_spawn(state->io, state->Accept(), asio::detached);
  State* raw = state.get();
  state->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(state)));
}

MetricsServer::MetricsServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

MetricsServer::~MetricsServer() {
  state_->io.stop();
  if (state_->thread.joinable()) state_->thread.join();
}

uint16_t MetricsServer::port() const { return state_->port; }
const std::string& MetricsServer::address() const { return state_->options.address; }

std::string MetricsServer::url() const {
  const std::string& a = state_->options.address;
  const std::string host = a.find(':') != std::string::npos ? "[" + a + "]" : a;
  return "http://" + host + ":" + std::to_string(state_->port) + "/metrics";
}

}  // namespace kvtier
