// The device-triggered mode's words, thread and log (device_trigger.hpp).
#include "device_trigger.hpp"

#include "comm_thread.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <chrono>

namespace hetmesh::afd {

DeviceWords::DeviceWords(const Device& device, int count)
    : buffer_(device, 4 * static_cast<uint64_t>(count)) {}

void check_trigger_stream(const Device& device, bool has_words, const Stream& stream,
                          const char* what, const char* otherwise) {
  if (!has_words)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("{}: {} has no stream memory operations{}", what, device.selector(),
                            otherwise ? fmt::format(" ({})", otherwise) : std::string()));
  if (!(stream.device() == device))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: a stream of {}, and this engine runs on {}", what,
                            stream.device().selector(), device.selector()));
}

void check_micro_batch(int mb, int micro_batches, const char* what) {
  if (mb < 0 || mb >= micro_batches)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{}: micro-batch {} does not exist (0..{})",
                                                     what, mb, micro_batches - 1));
}

void enqueue_flag_wait(const Stream& stream, const DeviceWords& words, int i) {
  stream.wait_value32(words.at(i), 1, HM_WAIT_EQ);
  stream.write_value32(words.at(i), 0);
}

void DeviceTripLog::count(uint64_t DeviceTrips::*field) {
  std::lock_guard lock(mutex_);
  ++(trips_.*field);
}

void DeviceTripLog::failed(std::string why) {
  std::lock_guard lock(mutex_);
  ++trips_.failed;
  if (failures_.size() == kMaxFailures) failures_.pop_front();
  failures_.push_back(std::move(why));
}

void DeviceTripLog::ring_failed(std::string why) {
  std::lock_guard lock(mutex_);
  ++trips_.rung;
  ++trips_.failed;
  if (failures_.size() == kMaxFailures) failures_.pop_front();
  failures_.push_back(std::move(why));
}

void DeviceTripLog::ended(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (trips_.ended.empty()) trips_.ended = why;
}

DeviceTrips DeviceTripLog::take() {
  std::lock_guard lock(mutex_);
  DeviceTrips out = trips_;
  out.failures.assign(failures_.begin(), failures_.end());
  failures_.clear();
  return out;
}

DoorbellThread::DoorbellThread(const char* name, int cpu, std::function<Turn()> step)
    : thread_(start_thread(name, [this, step = std::move(step)] {
        const SpinPolicy policy;
        constexpr auto kMaxSleep = std::chrono::microseconds(50);
        auto last_work = std::chrono::steady_clock::now();
        auto sleep = std::chrono::microseconds(1);
        while (!stopping_.load(std::memory_order_acquire)) {
          const Turn turn = step();
          if (turn != Turn::idle) {
            last_work = std::chrono::steady_clock::now();
            sleep = std::chrono::microseconds(1);
            if (turn == Turn::worked) continue;
          }
          if (policy.should_spin() && std::chrono::steady_clock::now() - last_work < kRingWindow) {
            cpu_relax();
            continue;
          }
          std::this_thread::sleep_for(sleep);
          sleep = std::min(sleep * 2, kMaxSleep);
        }
      })) {
  if (cpu >= 0) pin_thread(thread_, cpu, name);
}

DoorbellThread::~DoorbellThread() {
  stop();
}

void DoorbellThread::stop() {
  stopping_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

}  // namespace hetmesh::afd
