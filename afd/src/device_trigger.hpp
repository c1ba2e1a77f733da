// What both engines' device-triggered mode shares (docs/device-triggered.md): the words a stream
// writes and waits on, the thread that watches them, and the log of what the device triggered.
//
// A captured graph replays the values it captured, so every word goes back to its armed state
// within one round trip: a doorbell is rung by the stream (non-zero) and cleared by the engine when
// it takes the ring; a flag is raised by the engine (1) and lowered by the stream right after it
// waited on it (enqueue_wait writes 0 behind its wait). A stream rings a micro-batch's doorbell
// only after it passed that micro-batch's previous wait, so the engine never raises a flag the
// stream has yet to lower.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/device.hpp>
#include <hetmesh/core/spin.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace hetmesh::afd {

// `count` 32-bit words in the device's pinned (device-mapped) host memory, all 0.
class DeviceWords {
 public:
  DeviceWords(const Device& device, int count);
  uint32_t* at(int i) const { return reinterpret_cast<uint32_t*>(buffer_.data()) + i; }
  uint32_t load(int i) const {
    return std::atomic_ref<uint32_t>(*at(i)).load(std::memory_order_acquire);
  }
  void store(int i, uint32_t value) const {
    std::atomic_ref<uint32_t>(*at(i)).store(value, std::memory_order_release);
  }

 private:
  HostBuffer buffer_;
};

// Refuses what a device-triggered call cannot do, naming `what` (the call): an engine whose device
// has no stream memory operations (`has_words` false; `otherwise`, when given, says what works
// instead), or a stream of another device.
void check_trigger_stream(const Device& device, bool has_words, const Stream& stream,
                          const char* what, const char* otherwise = nullptr);
// Refuses a micro-batch outside 0..micro_batches-1, naming `what`.
void check_micro_batch(int mb, int micro_batches, const char* what);

// The stream's half of a flag: hold the stream until the engine raises the word, then lower it
// for the next round trip (two memory operations, both captured by a graph).
void enqueue_flag_wait(const Stream& stream, const DeviceWords& words, int i);

// What the device triggered and how it ended, for DeviceTrips. Thread-safe.
class DeviceTripLog {
 public:
  static constexpr size_t kMaxFailures = 64;
  void rung() { count(&DeviceTrips::rung); }
  void completed() { count(&DeviceTrips::completed); }
  void failed(std::string why);
  // A ring answered at once as failed: both counts under one lock, so no reader sees one alone.
  void ring_failed(std::string why);
  void ended(const std::string& why);
  // The counts, the engine's end, and the failures since the last take.
  DeviceTrips take();

 private:
  void count(uint64_t DeviceTrips::*field);
  std::mutex mutex_;
  DeviceTrips trips_;
  std::deque<std::string> failures_;
};

// What a turn of a doorbell thread found: a ring it took (or a flag it raised), none but one
// expected soon (a round trip of the device in flight, a batch held for its answer), or nothing.
enum class Turn { worked, expecting, idle };

// The thread that watches an engine's doorbells: runs `step` until stopped. It spins while a ring
// is expected or within kRingWindow of the last work, on a machine with the cores for it
// (SpinPolicy), and otherwise polls with sleeps that grow to 50 us: a doorbell is a word in host
// memory, and nothing wakes a sleeper when a stream writes it. The window is a step's, not a
// round trip's: a step's layers ring a few hundred microseconds apart (the layer's compute between
// them), and a thread that slept after SpinPolicy::kSpin (200 us) was asleep at every ring: 50 us
// more per layer on the H200. Between steps (the host's own work) it sleeps.
class DoorbellThread {
 public:
  static constexpr std::chrono::milliseconds kRingWindow{10};
  DoorbellThread(const char* name, int cpu, std::function<Turn()> step);
  ~DoorbellThread();
  DoorbellThread(const DoorbellThread&) = delete;
  DoorbellThread& operator=(const DoorbellThread&) = delete;
  void stop();

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace hetmesh::afd
