#include "tiers/peer/ucx_node.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <future>
#include <utility>

#include "common/logging.h"

namespace kvtier {

Status UcxError(const std::string& what, ucs_status_t status) {
  return Unavailable("UCX: " + what + ": " + ucs_status_string(status));
}

Result<std::unique_ptr<UcxNode>> UcxNode::Start(const Options& options) {
  std::unique_ptr<UcxNode> node(new UcxNode(options));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = node->options_.name.c_str();
  if (ucs_status_t s = ucp_init(&params, nullptr, &node->context_); s != UCS_OK) return UcxError("ucp_init", s);
  ucp_worker_params_t worker{};
  worker.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucs_status_t s = ucp_worker_create(node->context_, &worker, &node->worker_); s != UCS_OK) {
    return UcxError("ucp_worker_create", s);
  }
  if (ucs_status_t s = ucp_worker_get_efd(node->worker_, &node->worker_fd_); s != UCS_OK) {
    return UcxError("ucp_worker_get_efd", s);
  }
  node->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (node->wake_fd_ < 0) return Unavailable(std::string("eventfd: ") + std::strerror(errno));
  node->thread_ = std::thread([n = node.get()] { n->Loop(); });
  return node;
}

void UcxNode::Stop() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

UcxNode::~UcxNode() {
  Stop();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool UcxNode::Post(std::function<void()> task) {
  {
    MutexLock lock(mu_);
    if (stopping_) return false;
    posted_.push_back(std::move(task));
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  return true;
}

void UcxNode::Run(const std::function<void()>& task) {
  std::promise<void> ran;
  if (!Post([&] {
        task();
        ran.set_value();
      })) {
    return;
  }
  ran.get_future().wait();
}

bool UcxNode::RunPosted() {
  std::vector<std::function<void()>> tasks;
  bool stopping = false;
  {
    MutexLock lock(mu_);
    tasks.swap(posted_);
    stopping = stopping_;
  }
  for (auto& task : tasks) task();
  return !stopping;
}

namespace {

struct SentAm {
  std::vector<std::byte> bytes;
};

void AmSent(void* request, ucs_status_t, void* user_data) {
  delete static_cast<SentAm*>(user_data);
  ucp_request_free(request);
}

// A rendezvous message's bytes on their way in.
struct ArrivingAm {
  std::vector<std::byte> bytes;
  const UcxNode::AmHandler* handler = nullptr;
  ucp_ep_h reply_ep = nullptr;
};

void AmArrived(void* request, ucs_status_t status, size_t length, void* user_data) {
  std::unique_ptr<ArrivingAm> in(static_cast<ArrivingAm*>(user_data));
  if (status == UCS_OK) (*in->handler)(in->reply_ep, std::span(in->bytes).first(std::min(length, in->bytes.size())));
  ucp_request_free(request);
}

}  // namespace

void UcxNode::SendAm(ucp_ep_h ep, unsigned id, std::vector<std::byte> message, bool reply) {
  auto* sent = new SentAm{std::move(message)};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = AmSent;
  param.user_data = sent;
  param.flags = reply ? UCP_AM_SEND_FLAG_REPLY : 0;
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, nullptr, 0, sent->bytes.data(), sent->bytes.size(), &param);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) delete sent;  // done inline, or failed (the endpoint reports it)
}

Status UcxNode::OnAm(unsigned id, AmHandler handler) {
  auto receiver = std::make_unique<AmReceiver>(AmReceiver{this, std::move(handler)});
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                     UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.flags = UCP_AM_FLAG_WHOLE_MSG;
  param.arg = receiver.get();
  param.cb = [](void* arg, const void*, size_t, void* data, size_t length,
                const ucp_am_recv_param_t* p) -> ucs_status_t {
    auto* r = static_cast<AmReceiver*>(arg);
    const ucp_ep_h reply = (p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? p->reply_ep : nullptr;
    if ((p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      r->handler(reply, std::span(static_cast<const std::byte*>(data), length));
      return UCS_OK;
    }
    auto* in = new ArrivingAm{std::vector<std::byte>(length), &r->handler, reply};
    ucp_request_param_t recv{};
    recv.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    recv.cb.recv_am = AmArrived;
    recv.user_data = in;
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(r->node->worker_, data, in->bytes.data(), length, &recv);
    if (req == nullptr) {
      std::unique_ptr<ArrivingAm> done(in);
      r->handler(reply, in->bytes);
    } else if (UCS_PTR_IS_ERR(req)) {
      delete in;
    }
    return UCS_OK;
  };
  if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &param); s != UCS_OK) {
    return UcxError("ucp_worker_set_am_recv_handler", s);
  }
  am_[id] = std::move(receiver);
  return Status::Ok();
}

ucs_status_t UcxNode::WaitRequest(ucs_status_ptr_t request) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  ucs_status_t status;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) ucp_worker_progress(worker_);
  ucp_request_free(request);
  return status;
}

void UcxNode::Loop() {
  pthread_setname_np(pthread_self(), ("kvtier-" + options_.name).substr(0, 15).c_str());
  const int tick_ms = static_cast<int>(std::max<int64_t>(options_.tick.count(), 1));
  for (;;) {
    while (ucp_worker_progress(worker_) != 0) {
    }
    const bool running = RunPosted();
    if (tick_) tick_();
    if (!running) break;
    // Arming fails with BUSY while events wait: progress again first.
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int n = ::poll(fds, 2, armed == UCS_OK ? tick_ms : 1);
    if (n > 0 && (fds[1].revents & POLLIN) != 0) {
      uint64_t count = 0;
      (void)!::read(wake_fd_, &count, sizeof(count));
    }
  }
  if (on_stop_) on_stop_();
  // What closing started (endpoints flushing) ends here.
  for (int i = 0; i < 1000 && ucp_worker_progress(worker_) != 0; ++i) {
  }
}

}  // namespace kvtier
