// The plugin's process-wide state and the helpers every slot uses: the loaded Level Zero, the
// drivers (one context each) and devices, ze_result_t checks, the current-device scope, event
// pools, and the objects behind streams and events. plugins/level_zero/README.md explains the
// design.
#pragma once

#include "level_zero_loader.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/gpu_address.hpp>
#include <hetmesh/plugin_kit/gpu_handles.hpp>
#include <hetmesh/plugin_kit/gpu_state.hpp>
#include <hetmesh/plugin_kit/status.hpp>

#include <level_zero/ze_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hm::kit::gpu {
class WaitRelay;
}

namespace hm::level_zero {

using hm::kit::fail;
using hm::kit::guarded;
using hm::kit::gpu::Memory;

struct Driver;

// ---- native events ----
//
// A Mark is one ze_event_handle_t of a plugin event pool (host-visible, host scope), with an 8-byte
// slot of host memory for a global timestamp. Marks are handed out fresh (unsignaled) and come
// back when the last MarkRef drops; a returned mark is reused only once it has signaled, so a
// signal still pending on a stream never lands on its next use.
struct Mark;
using MarkRef = std::shared_ptr<Mark>;

struct Mark {
  ze_event_handle_t event = nullptr;
  uint64_t* timestamp = nullptr;
  // Events a stream waited on before this one's signal: passed once it signaled, released when
  // the pool reuses this one (so a stream that is only ever synchronized through events does not
  // hold them for good).
  std::vector<MarkRef> passed;
};

class EventPool;

class EventPool {
 public:
  static constexpr uint32_t kChunk = 64;  // events per ze_event_pool_handle_t

  explicit EventPool(Driver& driver) : driver_(driver) {}
  ~EventPool();  // destroys every event and pool (best effort: at shutdown)
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An unsignaled event of this driver's context.
  MarkRef acquire();

 private:
  void give_back(Mark* mark);
  void grow();  // one more zeEventPoolCreate of kChunk events (mutex_ held)

  Driver& driver_;
  std::mutex mutex_;
  std::vector<Mark*> fresh_;    // never signaled since creation or host reset
  std::deque<Mark*> returned_;  // released; reusable once signaled
  std::vector<std::unique_ptr<Mark>> marks_;
  std::vector<ze_event_pool_handle_t> pools_;
  std::vector<void*> stamps_;  // zeMemAllocHost chunks of timestamp slots
};

// ---- drivers and devices ----

struct Driver {
  ze_driver_handle_t handle = nullptr;
  ze_context_handle_t context = nullptr;
  MemorySync sync;             // both waits, or neither
  std::string no_memory_sync;  // why HM_CAP_STREAM_MEMOPS is clear, "" when it is set
  std::unique_ptr<EventPool> events;
  std::mutex relay_mutex;
  std::unique_ptr<hm::kit::gpu::WaitRelay> relay;  // started by the first relayed wait

  Driver();
  ~Driver();
};

struct DeviceState : hm::kit::gpu::Device {
  Driver* driver = nullptr;
  ze_device_handle_t handle = nullptr;
  uint32_t compute_ordinal = 0;  // the queue group every stream's immediate list uses
  int64_t copy_ordinal = -1;  // a copy-only group, if any: the wait relay reads device words there
  double timer_resolution_ns = 1.0;
  uint32_t timestamp_valid_bits = 64;
  std::string no_dmabuf;  // why HM_CAP_DMABUF_EXPORT is clear, "" when it is set
};

class Service;

struct State : hm::kit::gpu::State<DeviceState> {
  Loader ze;
  std::string api_version;     // "1.4"
  std::string driver_version;  // of the first driver
  std::vector<std::unique_ptr<Driver>> drivers;
  std::unique_ptr<Service> service;  // host callbacks and deferred stream destruction
  std::mutex service_mutex;

  State();
  ~State();
};

// The state after initialize() succeeded; fails with HM_ERR_UNINITIALIZED before.
inline State& state() {
  return hm::kit::gpu::state<State>();
}

inline const Loader& ze() {
  return state().ze;
}

// Logs through the host's sink, prefixed "level_zero: ".
inline void log(int32_t level, const std::string& message) {
  hm::kit::gpu::log<State>("level_zero", level, message);
}

// The pNext of a device allocation made exportable as a dma-buf (Level Zero exports only memory
// allocated so).
inline ze_external_memory_export_desc_t dmabuf_exportable() {
  ze_external_memory_export_desc_t exportable{};
  exportable.stype = ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_DESC;
  exportable.flags = ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF;
  return exportable;
}

// Fails with the call's name and the ze_result_t's name.
void check(ze_result_t result, const char* call);

// For queries: true on ZE_RESULT_SUCCESS, false on ZE_RESULT_NOT_READY, else fails as check().
bool ready(ze_result_t result, const char* call);

// Calls a loader entry point and fails with its name and the ze_result_t's name.
#define HM_ZE(fn, ...) ::hm::level_zero::check(::hm::level_zero::ze().fn(__VA_ARGS__), #fn)

// The device's state; HM_ERR_INVALID_ARGUMENT for an index that is not a device.
DeviceState& device_state(int32_t device);

// Level Zero has no current device: every call names its device or context. The kit's slots make
// a device "current" for one call through this scope, and the vendor calls that take no device
// (alloc_device, create_stream, create_event, the IPC calls) read it: a thread-local index,
// restored afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  // The device of the innermost scope on this thread; fails if there is none.
  static int32_t current();

 private:
  int32_t previous_;
};

// ---- streams ----
//
// A stream is one immediate command list (asynchronous mode) on the device's compute queue group.
// Level Zero command lists are not thread-safe, and hm streams may be used from several threads:
// every append holds `mutex`.
struct Queue {
  int32_t device = 0;
  Driver* driver = nullptr;
  ze_command_list_handle_t list = nullptr;
  std::mutex mutex;
  bool unfenced = false;      // a copy, fill or write was appended since the last barrier
  bool dirty = false;         // work was appended since `marker` (or ever, without one)
  MarkRef marker;             // signaled once everything appended before it completed
  std::vector<MarkRef> held;  // events this list waits on: reused only after it passed the waits
};

// Appends a barrier if a copy, fill or write may still run (q.mutex held): Level Zero orders the
// commands of a list only through barriers and events, hm streams run their work one after the
// other.
void fence(Queue& q);

// Signals `mark` once everything appended so far completed (q.mutex held).
void signal_after_all(Queue& q, const Mark& mark);

// True once everything appended to `q` so far completed (a marker event, reused while nothing new
// was appended); releases the events the list waited on once it is.
bool queue_done(Queue& q);

// Blocks until everything appended to `q` so far completed.
void queue_synchronize(Queue& q);

// Destroys the list and frees `q` now if it is idle, else once its work completed (Service).
void queue_destroy(Queue* q);

struct Stream : hm::kit::gpu::Stream<Queue*> {
  uint64_t* gate = nullptr;  // the wait relay's gate word, on the first relayed wait
};

inline Stream& stream_of(hm_stream handle) {
  return hm::kit::gpu::stream_of<Stream>(handle);
}

// ---- events ----
//
// The native event of an hm_event on one device: the Mark of its latest record. Each record takes
// a fresh Mark, so re-recording never resets an event whose earlier signal may still be pending.
struct ZeEvent {
  int32_t device = 0;
  bool timing = true;
  std::mutex mutex;
  MarkRef current;  // the latest record's; null if never recorded on this device

  MarkRef latest() {
    std::lock_guard lock(mutex);
    return current;
  }
};

using Event = hm::kit::gpu::Event<ZeEvent*>;

// ---- the service thread ----
//
// One plugin thread that runs host callbacks (Level Zero has none: the stream signals `ready` and
// then waits on `release`; the thread sees `ready`, calls fn, host-signals `release`) and destroys
// lists whose work was still pending at stream_destroy.
class Service {
 public:
  Service();
  ~Service();  // stops the thread; callbacks and lists still pending are abandoned
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  void add_callback(MarkRef ready, MarkRef release, hm_host_fn fn, void* user_data);
  void add_dying(Queue* q);

 private:
  struct Callback {
    MarkRef ready;
    MarkRef release;
    hm_host_fn fn;
    void* user_data;
  };
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::deque<Callback> callbacks_;
  std::vector<Queue*> dying_;
  std::thread thread_;
};

Service& service();

}  // namespace hm::level_zero
