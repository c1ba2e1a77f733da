#include "verbs/verbs_progress.hpp"

#include "verbs/verbs_link.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/spin.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cstring>
#include <thread>

namespace hetmesh::detail {
namespace {

using Clock = std::chrono::steady_clock;

// A blocked poller wakes this often, so that stop() never waits long.
constexpr int kBlockMs = 100;
// While spinning, look at the device's asynchronous events this often.
constexpr auto kAsyncCheck = std::chrono::milliseconds(10);

}  // namespace

void VerbsShared::deliver(VerbsDelivery delivery) {
  std::lock_guard lock(delivery_mutex);
  if (delivery_pending == 0 && !delivery.region) {
    // Nothing queued ahead of it: raise the notification from the poller right away.
    TransportEvent note{TransportEvent::Type::notification, delivery.link->id()};
    note.value = delivery.value;
    events.push(std::move(note));
    return;
  }
  deliveries.push_back(std::move(delivery));
  ++delivery_pending;
  delivery_ready.notify_one();
}

CompletionPoller::CompletionPoller(std::shared_ptr<VerbsShared> shared)
    : shared_(std::move(shared)), thread_(start_thread("hm-verbs-poll", [this] { run(); })) {}

void CompletionPoller::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  shared_->wake_poller();
  shared_->unpark_poller();
  thread_.join();
}

void CompletionPoller::pin() {
  int cpu = shared_->options.poller_cpu;
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0)
    log(LogLevel::warn, "verbs: cannot pin the completion poller to CPU {}: {}", cpu,
        std::strerror(rc));
  else
    log(LogLevel::info, "verbs: completion poller pinned to CPU {}", cpu);
}

int VerbsShared::progress_locked(ibv_wc* wcs) {
  if (uint64_t now_version = links_version; now_version != progress_version) {
    std::lock_guard lock(links_mutex);
    progress_links = links;
    progress_version = links_version;
  }
  int n = 0;
  for (auto& link : progress_links)
    n += link->poll(wcs);
  if (n > 0) spin.completed(Clock::now());
  return n;
}

// Polls the completion queues while no caller of poll() does; spins for the SpinWindow after the
// last completion (for ever when busy), then arms the CQs and blocks on the completion channel,
// kBlockMs at a time so that stop() never waits long. While callers spin on the queues it stays
// parked (two spinning threads on a small machine take each other's core, and the rxe kernel
// work's).
void CompletionPoller::run() {
  pin();
  ibv_wc wcs[2 * kPollBatch];
  SpinYield yield;
  auto async_checked = Clock::now();
  for (uint64_t round = 0; !stopping_; ++round) {
    const bool parked = shared_->callers_polling.load(std::memory_order_relaxed) > 0;
    if (parked) {
      std::unique_lock lock(shared_->park_mutex);
      shared_->parked.wait_for(lock, SpinWindow::kMaxSpin, [&] {
        return stopping_ || shared_->callers_polling.load(std::memory_order_relaxed) == 0;
      });
    }
    if ((parked || round % 256 == 0) && Clock::now() - async_checked > kAsyncCheck) {
      std::lock_guard lock(shared_->progress_mutex);
      handle_async_events(shared_->progress_links);
      async_checked = Clock::now();
    }
    if (parked) continue;
    int n = 0;
    bool no_links = false;
    {
      std::lock_guard lock(shared_->progress_mutex);
      n = shared_->progress_locked(wcs);
      no_links = shared_->progress_links.empty();
    }
    auto now = Clock::now();
    if (n > 0 || (!no_links && now < shared_->spin.spin_until())) {
      yield(now);
      cpu_relax();
      continue;
    }
    {
      std::lock_guard lock(shared_->progress_mutex);
      for (auto& link : shared_->progress_links)
        link->arm();
      n = shared_->progress_locked(wcs);  // what arrived before the CQs were armed
    }
    if (n > 0) continue;
    pollfd fds[3] = {{shared_->channel->fd, POLLIN, 0},
                     {shared_->wake.get(), POLLIN, 0},
                     {shared_->context->context()->async_fd, POLLIN, 0}};
    ::poll(fds, 3, kBlockMs);
    if (fds[2].revents != 0) {
      std::lock_guard lock(shared_->progress_mutex);
      handle_async_events(shared_->progress_links);
    }
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    while (ibv_get_cq_event(shared_->channel, &cq, &context) == 0)
      ibv_ack_cq_events(cq, 1);
    uint64_t count;
    while (read(shared_->wake.get(), &count, sizeof count) > 0) {
    }
  }
}

// A QP or CQ error fails its connection, a fatal device error fails them all; the rest are logged.
void CompletionPoller::handle_async_events(const std::vector<std::shared_ptr<VerbsLink>>& links) {
  ibv_async_event event;
  while (ibv_get_async_event(shared_->context->context(), &event) == 0) {
    std::string what = fmt::format("asynchronous event on {}: {}", shared_->context->name(),
                                   ibv_event_type_str(event.event_type));
    switch (event.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
        for (auto& link : links)
          if (link->qp() == event.element.qp) link->fail(what);
        break;
      case IBV_EVENT_CQ_ERR:
        for (auto& link : links)
          if (link->owns(event.element.cq)) link->fail(what);
        break;
      case IBV_EVENT_DEVICE_FATAL:
        for (auto& link : links)
          link->fail(what);
        break;
      default:
        break;
    }
    log(event.event_type == IBV_EVENT_COMM_EST ? LogLevel::debug : LogLevel::warn, "verbs: {}",
        what);
    ibv_ack_async_event(&event);
  }
}

DeliveryThread::DeliveryThread(std::shared_ptr<VerbsShared> shared)
    : shared_(std::move(shared)), thread_(start_thread("hm-verbs-stage", [this] { run(); })) {}

void DeliveryThread::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(shared_->delivery_mutex);
    shared_->delivery_stopping = true;
  }
  shared_->delivery_ready.notify_all();
  thread_.join();
}

// Staged copies (and the notifications behind them), in arrival order.
void DeliveryThread::run() {
  for (;;) {
    VerbsDelivery d;
    {
      std::unique_lock lock(shared_->delivery_mutex);
      shared_->delivery_ready.wait(
          lock, [&] { return shared_->delivery_stopping || !shared_->deliveries.empty(); });
      if (shared_->delivery_stopping) return;
      d = std::move(shared_->deliveries.front());
      shared_->deliveries.pop_front();
    }
    bool ok = !d.region || d.link->finish_staged(d);
    std::lock_guard lock(shared_->delivery_mutex);
    if (ok && d.notify && !d.link->closed()) {
      TransportEvent note{TransportEvent::Type::notification, d.link->id()};
      note.value = d.value;
      shared_->events.push(std::move(note));
    }
    --shared_->delivery_pending;
  }
}

}  // namespace hetmesh::detail
