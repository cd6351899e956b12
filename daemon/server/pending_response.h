// PendingResponse: hands a response produced on any thread (an NVMe
// completion) to a connection coroutine, or straight back when it was produced
// inline (TryTake: no suspension, no hop through the executor).
//
//   auto pending = std::make_shared<PendingResponse>();
//   handler.HandlePinAsync(request, [pending](v1::Response r) { pending->Complete(std::move(r)); });
//   if (auto now = pending->TryTake()) co_return std::move(*now);
//   co_await pending->Wait(executor);
//   v1::Response response = pending->Take();
//
// Thread-safe. Complete runs once; Wait is awaited once.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <functional>
#include <memory>
#include <optional>

#include "common/mutex.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier {

class PendingResponse : public std::enable_shared_from_this<PendingResponse> {
 public:
  void Complete(v1::Response response) EXCLUDES(mu_) {
    std::function<void()> resume;
    {
      MutexLock lock(mu_);
      response_ = std::move(response);
      resume = std::move(resume_);
    }
    if (resume) resume();
  }

  // An awaitable that completes once Complete has run (at once if it
  // already has), resuming on `executor`. Then Take() the response.
  // Deliberately not a coroutine itself: a plain async operation.
  asio::awaitable<void> Wait(asio::any_io_executor executor) {
    return asio::async_initiate<decltype(asio::use_awaitable), void()>(
        [self = shared_from_this(), executor](auto handler) {
          // The handler is move-only; std::function needs a copyable target.
          auto shared = std::make_shared<decltype(handler)>(std::move(handler));
          auto resume = [shared, executor] { asio::post(executor, [shared]() mutable { (*shared)(); }); };
          MutexLock lock(self->mu_);
          if (self->response_) {
            lock.Unlock();
            resume();
            return;
          }
          self->resume_ = std::move(resume);
        },
        asio::use_awaitable);
  }

  // The response if Complete has already run (inline completion: no need
  // to Wait), else nothing.
  std::optional<v1::Response> TryTake() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (!response_) return std::nullopt;
    return std::move(*response_);
  }

  // The response. Precondition: Complete has run (Wait finished).
  v1::Response Take() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return std::move(*response_);
  }

 private:
  Mutex mu_;
  std::optional<v1::Response> response_ GUARDED_BY(mu_);
  std::function<void()> resume_ GUARDED_BY(mu_);
};

}  // namespace kvtier
