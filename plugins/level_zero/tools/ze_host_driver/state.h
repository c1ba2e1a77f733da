// The objects of the host stand-in driver and the helpers every entry point uses: the guard that
// keeps exceptions inside, handle registries (a handle is valid only while registered), devices,
// the allocation table, events and immediate command lists. One header: the files beside it each
// implement one group of entry points over these types.
#pragma once

#include "ze_driver_calls.h"

#include <level_zero/ze_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace hetmesh_ze {

// ---- entry-point helpers ------------------------------------------------------------------------

// Runs an entry point's body; no exception crosses the C boundary.
template <class F>
ze_result_t guarded(F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  } catch (...) {
    return ZE_RESULT_ERROR_UNKNOWN;
  }
}

// Live objects by handle. A handle is the object's address; a pointer that is not registered (never
// created, already destroyed, or garbage) is refused without being dereferenced. The shared_ptr a
// lookup returns keeps the object alive for the caller even if another thread destroys it.
template <class T>
class Registry {
 public:
  void* add(std::shared_ptr<T> object) {
    void* key = object.get();
    std::lock_guard lock(mutex_);
    objects_.emplace(key, std::move(object));
    return key;
  }
  std::shared_ptr<T> get(const void* handle) const {
    if (handle == nullptr) return nullptr;
    std::lock_guard lock(mutex_);
    auto it = objects_.find(handle);
    return it == objects_.end() ? nullptr : it->second;
  }
  std::shared_ptr<T> remove(const void* handle) {
    std::lock_guard lock(mutex_);
    auto it = objects_.find(handle);
    if (it == objects_.end()) return nullptr;
    auto object = std::move(it->second);
    objects_.erase(it);
    return object;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const void*, std::shared_ptr<T>> objects_;
};

// Looks a handle up: INVALID_NULL_HANDLE for null, INVALID_ARGUMENT for one not registered.
template <class T>
ze_result_t lookup(const Registry<T>& registry, const void* handle, std::shared_ptr<T>& out) {
  if (handle == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  out = registry.get(handle);
  return out ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

uint64_t now_ns();  // the devices' global timer: steady_clock, 1 ns per tick

// ---- driver, devices, contexts (driver_devices.cc)
// ------------------------------------------------

inline constexpr uint64_t kDeviceMemoryBytes = 16ull << 30;  // reported per device
inline constexpr uint32_t kComputeOrdinal = 0;
inline constexpr uint32_t kCopyOrdinal = 1;
inline constexpr uint32_t kQueueGroupCount = 2;
inline constexpr size_t kMaxFillPatternSize = 128;

struct Device {
  uint32_t index = 0;
  std::string name;
  std::atomic<uint64_t> allocated_bytes{0};  // device allocations made here (page-rounded)
};

struct Context {
  uint64_t serial = 0;
};

// The driver's single handle, valid after zeInit; null before.
ze_driver_handle_t driver_handle();
bool is_driver(ze_driver_handle_t handle);
// Returns the device behind a handle, or null for one that is not a device of this driver.
Device* to_device(ze_device_handle_t handle);
ze_result_t check_device(ze_device_handle_t handle, Device*& out);
Registry<Context>& contexts();
ze_result_t check_context(ze_context_handle_t handle);

// ---- memory (memory.cc, ipc.cc)
// -------------------------------------------------------------------

enum class AllocKind { kDevice, kHost, kIpcImported };

// One allocation. Device memory (and imported IPC memory) is a memfd mapped twice: `base`, the
// address handed out, is PROT_NONE; `rw` is the driver's own writable view. Host memory is plain
// memory and `rw == base`. Unmapped (freed) when the last reference goes: the table's, or a pending
// command's.
struct Allocation {
  AllocKind kind = AllocKind::kHost;
  std::byte* base = nullptr;
  std::byte* rw = nullptr;
  size_t size = 0;    // as requested
  size_t mapped = 0;  // page-rounded length of each view
  int fd = -1;        // the memfd (device, imported); -1 for host memory
  Device* device = nullptr;
  const void* context = nullptr;
  uint64_t serial = 0;      // unique in this process; part of the memfd's name
  bool exportable = false;  // allocated with a dma-buf export descriptor
  ~Allocation();
};

// What an address range resolves to for the driver's own threads: the writable address, and the
// allocation (if any) kept alive while a command uses it. Plain host memory, not allocated through
// the driver, resolves to itself.
struct Span {
  std::byte* rw = nullptr;
  std::shared_ptr<Allocation> alloc;
};

// The allocation containing `ptr` (anywhere inside it), or null.
std::shared_ptr<Allocation> find_allocation(const void* ptr);
// Resolves [ptr, ptr + size): INVALID_NULL_POINTER for null, INVALID_ARGUMENT for a range that runs
// past the end of its allocation or into one from outside.
ze_result_t resolve(const void* ptr, size_t size, Span& out);
void register_allocation(std::shared_ptr<Allocation> alloc);
std::shared_ptr<Allocation> unregister_allocation(const void* base);
size_t page_size();
// Maps `length` bytes of `fd` with `prot`, aligned to `alignment` (0: page). Null on failure.
std::byte* map_view(int fd, size_t length, int prot, size_t alignment);
uint64_t next_serial();
// A random number drawn once per process (ipc.cc), and the name of a memfd: the exporting
// process's nonce and the allocation's serial, so an IPC handle names one allocation of one
// process life.
uint64_t process_nonce();
std::string memfd_name(uint64_t nonce, uint64_t serial);

// ---- events (events.cc)
// ---------------------------------------------------------------------------

struct EventPool {
  const void* context = nullptr;
  uint32_t count = 0;
  ze_event_pool_flags_t flags = 0;
  std::mutex mutex;
  std::vector<bool> in_use;  // an index holds at most one live event
  uint32_t live = 0;
};

struct Event {
  std::shared_ptr<EventPool> pool;
  uint32_t index = 0;

  void signal();
  void reset();
  bool signaled();
  // Waits until signaled: false when `deadline` passes first or `stop` becomes true.
  bool wait(std::chrono::steady_clock::time_point deadline, const std::atomic<bool>* stop);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool signaled_ = false;
};

Registry<EventPool>& event_pools();
Registry<Event>& events();
// Resolves an optional signal event and a wait list, as every append takes them.
ze_result_t event_args(ze_event_handle_t signal, uint32_t num_waits, const ze_event_handle_t* waits,
                       std::shared_ptr<Event>& signal_out,
                       std::vector<std::shared_ptr<Event>>& waits_out);

// ---- immediate command lists (command_lists.cc)
// --------------------------------------------------

// A command's work; returns false when it gave up because the list is being abandoned.
using Operation = std::function<bool(const std::atomic<bool>& stop)>;

struct Command {
  std::vector<std::shared_ptr<Event>> waits;
  Operation op;  // may be empty (barrier, wait, signal)
  std::shared_ptr<Event> signal;
};

// An immediate command list: its own worker thread runs the appended commands in order.
struct CommandList {
  Device* device = nullptr;
  const void* context = nullptr;
  uint32_t ordinal = 0;
  bool synchronous = false;

  ze_result_t submit(Command command);  // asynchronous unless the list is synchronous
  void run();                           // the worker thread's loop
  // Waits up to `timeout` for every submitted command to finish; true if they did.
  bool drain(std::chrono::milliseconds timeout);
  // Tells the worker to stop: it drops the commands not yet started and gives up waits.
  void request_stop();

  std::atomic<bool> stop{false};
  std::thread worker;

 private:
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Command> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
};

Registry<CommandList>& command_lists();
ze_result_t check_list(ze_command_list_handle_t handle, std::shared_ptr<CommandList>& out);

}  // namespace hetmesh_ze
