// The verbs transport's progress threads, one of each per transport.
//
// CompletionPoller ("hm-verbs-poll", pinnable): polls every link's send and receive CQs while no
// caller of poll() does, spinning for the SpinWindow (common/spin_window.hpp) after the last
// completion, then arming the CQs and blocking on the completion channel; and handles the device's
// asynchronous events.
//
// DeliveryThread ("hm-verbs-stage"): copies staged writes from the registered host mirror to the
// device, in arrival order; a notification that arrives behind a staged copy queues behind it, so
// notifications keep their order (VerbsShared::deliver decides).
#pragma once

#include "verbs/verbs_shared.hpp"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace hetmesh::detail {

class CompletionPoller {
 public:
  // Starts the thread; `shared->channel` and `shared->wake` must exist.
  explicit CompletionPoller(std::shared_ptr<VerbsShared> shared);
  ~CompletionPoller() { stop(); }
  CompletionPoller(const CompletionPoller&) = delete;
  CompletionPoller& operator=(const CompletionPoller&) = delete;
  // Stops and joins the thread; idempotent.
  void stop();

 private:
  void pin();
  void run();
  void handle_async_events(const std::vector<std::shared_ptr<VerbsLink>>& links);

  std::shared_ptr<VerbsShared> shared_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

class DeliveryThread {
 public:
  explicit DeliveryThread(std::shared_ptr<VerbsShared> shared);
  ~DeliveryThread() { stop(); }
  DeliveryThread(const DeliveryThread&) = delete;
  DeliveryThread& operator=(const DeliveryThread&) = delete;
  // Stops and joins the thread, leaving what is queued; idempotent.
  void stop();

 private:
  void run();

  std::shared_ptr<VerbsShared> shared_;
  std::thread thread_;
};

}  // namespace hetmesh::detail
