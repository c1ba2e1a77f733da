// The fabric transport's completion queue: what each completion means (a write or a message sent,
// a message received, a failure), and which thread reads the queue.
//
// The progress thread reads it, except while a caller of poll() waits for an event: that caller
// then reads the queue itself (spinning first where FabricShared::may_spin, then sleeping in
// fi_cq_sread) and handles what it reads, so that what arrives reaches it with one thread wake-up
// instead of two (the progress thread's, then the poller's). On two CPUs, where neither thread
// spins, that took an 8-byte one-way latency over tcp from 60-80 us to about 40
// (docs/benchmarks.md). The progress thread steps aside meanwhile (FabricShared::pollers), looking
// in every millisecond, and keeps to failing stalled peers.
#pragma once

#include "fabric/fabric_shared.hpp"

#include <rdma/fi_eq.h>

#include <chrono>
#include <vector>

namespace hetmesh::detail {

class FabricCompletions {
 public:
  static constexpr int kBatch = 16;

  explicit FabricCompletions(FabricShared& shared) : shared_(shared) {}

  // Handles what fi_cq_read or fi_cq_sread returned (`n` entries, or an error such as
  // -FI_EAVAIL); true if there was anything. Caller holds progress_mutex.
  bool reap_locked(ssize_t n, fi_cq_data_entry* entries);

  // Transport::poll: the events queued, else waits up to `timeout` for the first, reading the
  // queue itself where it can take it over from the progress thread (timeouts of 1 ms or more,
  // on a provider whose queue can be waited on; shorter waits are the event queue's).
  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout);

 private:
  bool take_over(FabricShared::Clock::time_point deadline);
  size_t read_until(std::vector<TransportEvent>& out, FabricShared::Clock::time_point deadline);
  bool read(int wait_ms);
  void finish_locked(FabricOp* op, const std::string* error);
  void failed_locked(const fi_cq_err_entry& error);
  void message_locked(uint32_t slot, uint64_t bytes);
  void data_locked(uint64_t data);
  void warn_once(const std::string& what);

  FabricShared& shared_;
  FabricShared::Clock::time_point last_warning_{};  // under progress_mutex
};

}  // namespace hetmesh::detail
