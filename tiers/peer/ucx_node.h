// UcxNode: one UCX context and worker, and the one thread that drives them.
//
// Every UCX call of the peer tier and the peer server runs on this node's
// thread (the worker is made for a single thread): other threads hand it
// work with Post, and it runs that work between rounds of progress. It
// sleeps on the worker's event descriptor and its own eventfd, so an idle
// node costs nothing but a wake-up every tick (Options::tick).
//
// UCX picks the transport at run time (UCX_TLS: TCP, shared memory, cma,
// RDMA where present); the node asks for remote memory access (one-sided
// gets), active messages (the control requests) and wake-ups.
//
// Thread-safety: Post, Run and OnNodeThread from any thread; context() and
// worker() only on the node's thread (both are made for one thread). The
// destructor (any thread but the node's) stops the thread after running
// what was posted, then runs `on_stop` and destroys the worker and the
// context.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <ucp/api/ucp.h>

#include "common/mutex.h"
#include "kvtier/result.h"

namespace kvtier {

class UcxNode {
 public:
  struct Options {
    std::string name = "peer";  // the thread's name and log lines
    // How often `tick` runs while the node idles (deadlines are checked
    // there): a bound on how late a deadline is noticed.
    std::chrono::milliseconds tick{10};
  };
  static Result<std::unique_ptr<UcxNode>> Start(const Options& options);
  ~UcxNode();
  UcxNode(const UcxNode&) = delete;
  // Stops the thread as the destructor does (what was posted runs, then
  // `on_stop`), keeping the worker and the context until the destructor:
  // an owner whose `on_stop` uses the node calls it first. Not from the
  // node's thread; a second call does nothing.
  void Stop() EXCLUDES(mu_);
  UcxNode& operator=(const UcxNode&) = delete;

  // Runs `task` on the node's thread, after what was posted before it.
  // Dropped without running (false) once the node is stopping.
  bool Post(std::function<void()> task) EXCLUDES(mu_);
  // Installs what runs on the node's thread at least every options.tick
  // (and after each round of work); empty clears it. Node thread only.
  void SetTick(std::function<void()> tick) { tick_ = std::move(tick); }
  // Installs what runs on the node's thread once it has stopped taking
  // posts, before the worker goes: closing endpoints and listeners.
  // Node thread only.
  void SetOnStop(std::function<void()> on_stop) { on_stop_ = std::move(on_stop); }
  // Runs `task` on the node's thread and waits for it (not from the node's
  // thread): set-up such as registering memory. Does nothing once the
  // node is stopping.
  void Run(const std::function<void()>& task);
  bool OnNodeThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const std::string& name() const { return options_.name; }

  // Sends `message` as active message `id` on `ep`, keeping its bytes
  // until UCX is done with them; `reply` lets the receiver answer on its
  // endpoint for this one. A failure to send is the endpoint's error (its
  // error handler runs). Node thread only.
  void SendAm(ucp_ep_h ep, unsigned id, std::vector<std::byte> message, bool reply);
  // Installs what runs on the node's thread for each whole active message
  // `id` that arrives (also one sent by rendezvous, once its bytes are in):
  // the endpoint to answer on (null when the sender asked for none) and the
  // bytes, valid during the call. Node thread only; before any message.
  using AmHandler = std::function<void(ucp_ep_h reply_ep, std::span<const std::byte> message)>;
  Status OnAm(unsigned id, AmHandler handler);

  // Waits on the node's thread for `request` (a ucp *_nbx answer) to end,
  // progressing the worker meanwhile; its status. For teardown only.
  ucs_status_t WaitRequest(ucs_status_ptr_t request);

 private:
  explicit UcxNode(const Options& options) : options_(options) {}
  void Loop();
  // Runs the posted tasks; false once stopping.
  bool RunPosted() EXCLUDES(mu_);

  const Options options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1;  // the worker's event descriptor (owned by UCX)
  int wake_fd_ = -1;    // an eventfd Post writes
  Mutex mu_;
  std::vector<std::function<void()>> posted_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  struct AmReceiver {
    UcxNode* node = nullptr;
    AmHandler handler;
  };
  std::map<unsigned, std::unique_ptr<AmReceiver>> am_;  // node thread
  std::function<void()> tick_;                          // node thread
  std::function<void()> on_stop_;                       // node thread
  std::thread thread_;
};

// "UCX: <what>: <UCX's words>", as an Unavailable status.
Status UcxError(const std::string& what, ucs_status_t status);

}  // namespace kvtier
