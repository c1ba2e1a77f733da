// The level_zero plugin's stream memory operations for the kit's GPU layer
// (hetmesh/plugin_kit/gpu_memops.hpp has the slots): writes as 4-byte copies in stream order;
// HM_WAIT_EQ through Intel's experimental zexCommandListAppendWaitOnMemory, and HM_WAIT_GEQ
// (cyclic), AND and NOR through the kit's wait relay (hetmesh/plugin_kit/wait_relay.hpp), whose
// gates the stream waits on with zexCommandListAppendWaitOnMemory64 GREATER_THAN_EQUAL.
#include "level_zero_slots.hpp"

#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace hm::level_zero {
namespace {

using hm::kit::gpu::WaitRelay;

// Waits and writes reach host memory (pinned, another process's, a NIC's) as well as the device's.
constexpr zex_mem_action_scope_flags_t kScope =
    ZEX_MEM_ACTION_SCOPE_FLAG_DEVICE | ZEX_MEM_ACTION_SCOPE_FLAG_HOST;

// The relay's runtime side: gate words in host memory of the driver's context, the ticket wait,
// and reading words in device memory.
class ZeRelayBackend final : public WaitRelay::Backend {
 public:
  explicit ZeRelayBackend(Driver& driver) : driver_(driver) {}
  ~ZeRelayBackend() override {
    const Loader& z = hm::kit::gpu::state_pointer<State>()->ze;
    for (auto& [device, reader] : readers_) {
      (void)z.zeCommandListDestroy(reader.list);
      reader.done.reset();
    }
    if (slots_ != nullptr) (void)z.zeMemFree(driver_.context, slots_);
  }

  void* allocate_gates(size_t bytes) override {
    ze_host_mem_alloc_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
    void* chunk = nullptr;
    HM_ZE(zeMemAllocHost, driver_.context, &desc, bytes, sizeof(uint64_t), &chunk);
    std::memset(chunk, 0, bytes);
    return chunk;
  }

  void free_gates(void* chunk) override {
    (void)ze().zeMemFree(driver_.context, chunk);  // at shutdown: nothing is left to report it to
  }

  // The ticket, 8 bytes, from the host slot of a fresh pool event as write_value32 does (the
  // pool reuses the event, and so the slot, only once the copy signaled it).
  void signal_arrival(void* stream, uint64_t* arrival, uint64_t ticket) override {
    Queue& q = *static_cast<Queue*>(stream);
    MarkRef mark = driver_.events->acquire();
    std::atomic_ref<uint64_t>(*mark->timestamp).store(ticket, std::memory_order_release);
    std::lock_guard lock(q.mutex);
    fence(q);  // the stream's earlier work completed before it says it arrived
    check(ze().zeCommandListAppendMemoryCopy(q.list, arrival, mark->timestamp, sizeof(uint64_t),
                                             mark->event, 0, nullptr),
          "zeCommandListAppendMemoryCopy");
    q.unfenced = true;
    q.dirty = true;
  }

  // Tickets never reach 2^63, so the unsigned compare is the relay's.
  void wait_for_ticket(void* stream, uint64_t* gate, uint64_t ticket) override {
    Queue& q = *static_cast<Queue*>(stream);
    zex_wait_on_mem_desc_t desc{ZEX_WAIT_ON_MEMORY_FLAG_GREATER_THAN_EQUAL, kScope};
    std::lock_guard lock(q.mutex);
    check(driver_.sync.wait_on_memory64(q.list, &desc, gate, ticket, nullptr),
          "zexCommandListAppendWaitOnMemory64");
    q.dirty = true;
  }

  // Device memory is not host-addressable: a 4-byte copy into host memory on a list of the relay's
  // own, then a wait for it. Watcher thread only.
  bool read_device_word(const WaitRelay::Word& word, uint32_t* value) override {
    try {
      Reader& reader = reader_for(word.device);
      const Loader& z = ze();
      check(z.zeCommandListAppendMemoryCopy(reader.list, slot(word.device), word.address,
                                            sizeof(uint32_t), reader.done->event, 0, nullptr),
            "zeCommandListAppendMemoryCopy");
      check(z.zeEventHostSynchronize(reader.done->event, UINT64_MAX), "zeEventHostSynchronize");
      check(z.zeEventHostReset(reader.done->event), "zeEventHostReset");
      *value = std::atomic_ref<uint32_t>(*slot(word.device)).load(std::memory_order_acquire);
      return true;
    } catch (const hm::kit::Failure& failure) {
      if (!read_failure_logged_) {
        read_failure_logged_ = true;
        log(HM_LOG_ERROR, "the wait relay cannot read the device word at " +
                              std::to_string(reinterpret_cast<uintptr_t>(word.address)) + ": " +
                              failure.message + " (the stream waiting on it stays blocked)");
      }
      return false;
    }
  }

 private:
  struct Reader {
    ze_command_list_handle_t list = nullptr;
    MarkRef done;
  };

  static constexpr size_t kMaxDevices = 512;  // one 4-byte slot per device in one allocation

  uint32_t* slot(int32_t device) { return static_cast<uint32_t*>(slots_) + device; }

  Reader& reader_for(int32_t device) {
    auto it = readers_.find(device);
    if (it != readers_.end()) return it->second;
    if (slots_ == nullptr) slots_ = allocate_gates(kMaxDevices * sizeof(uint32_t));
    const DeviceState& d = device_state(device);
    ze_command_queue_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
    // The copy-only group where there is one: on Intel's hardware, lists of one ordinal and index
    // share a ring, and a read queued behind a stream's relayed wait would wait for itself.
    desc.ordinal = d.copy_ordinal >= 0 ? static_cast<uint32_t>(d.copy_ordinal) : d.compute_ordinal;
    desc.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
    desc.priority = ZE_COMMAND_QUEUE_PRIORITY_NORMAL;
    Reader reader;
    HM_ZE(zeCommandListCreateImmediate, driver_.context, d.handle, &desc, &reader.list);
    reader.done = driver_.events->acquire();
    return readers_.emplace(device, std::move(reader)).first->second;
  }

  Driver& driver_;
  void* slots_ = nullptr;
  std::map<int32_t, Reader> readers_;  // watcher thread only: device -> list
  bool read_failure_logged_ = false;
};

WaitRelay& relay_for(Stream& s) {
  Driver& driver = *s.stream->driver;
  std::lock_guard lock(driver.relay_mutex);
  if (!driver.relay)
    driver.relay = std::make_unique<WaitRelay>(std::make_unique<ZeRelayBackend>(driver));
  if (s.gate == nullptr) s.gate = driver.relay->acquire_gate();
  return *driver.relay;
}

}  // namespace

// Exactly the 32-bit word: a 4-byte copy from the host slot of a fresh pool event, which the copy
// signals. zexCommandListAppendWriteToMemory cannot do it: compute-runtime writes its data with a
// post-sync "write immediate data" (PIPE_CONTROL, MI_FLUSH_DW on a copy engine), a QWord, so it
// would also zero the 4 bytes after the word (README.md, "Stream memory operations"). The pool
// hands the event out again only once it signaled, so the slot holds the value until the copy ran.
void Vendor::write_value32(Stream& s, void* address, const Memory&, uint32_t value) {
  Queue& q = *s.stream;
  MarkRef mark = q.driver->events->acquire();
  auto* slot = reinterpret_cast<uint32_t*>(mark->timestamp);
  std::atomic_ref<uint32_t>(*slot).store(value, std::memory_order_release);
  std::lock_guard lock(q.mutex);
  fence(q);  // release: the prior work completed before the word changes
  HM_ZE(zeCommandListAppendMemoryCopy, q.list, address, slot, sizeof(uint32_t), mark->event, 0,
        nullptr);
  q.unfenced = true;
  q.dirty = true;
}

void Vendor::wait_value32(Stream& s, const DeviceState&, const void* address, const Memory& m,
                          uint32_t value, int32_t condition, unsigned flags) {
  if (condition != HM_WAIT_EQ) {
    // Level Zero's compares are unsigned and have no AND or NOR: the relay.
    WaitRelay::Word word{static_cast<const uint32_t*>(address), m.device, m.host};
    relay_for(s).enqueue(s.stream, s.gate, word, value, condition);
    return;
  }
  Queue& q = *s.stream;
  zex_wait_on_mem_desc_t desc{flags, kScope};
  std::lock_guard lock(q.mutex);
  check(q.driver->sync.wait_on_memory(q.list, &desc, const_cast<void*>(address), value, nullptr),
        "zexCommandListAppendWaitOnMemory");
  q.dirty = true;
}

}  // namespace hm::level_zero
