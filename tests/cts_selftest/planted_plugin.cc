// A correct plugin with one vendor bug planted on demand: what the conformance kit must catch.
//
// libhetmesh-device-planted.so forwards every slot to the real asic_stub plugin (its path is built
// in: HETMESH_PLANTED_BASE), so without a bug it is conformant. HM_TEST_PLANT=<bug> swaps one
// behaviour for a small, realistic mistake, each named and described in kBugs below: the kit's
// self-test (cts_selftest.cc) runs the whole kit once per bug and checks that the verdict is NOT
// CONFORMANT, with the test and ABI rule it expects to catch the bug. An unknown bug name fails
// initialize, so a typo cannot pass as a caught bug.
#include <hetmesh/device_plugin.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

const hm_device_plugin_api* g_base = nullptr;  // asic_stub's table

std::mutex g_mutex;  // guards the bookkeeping below (but see racy_allocation_table)
std::unordered_map<hm_event, int32_t> g_event_device;
std::unordered_map<hm_stream, int32_t> g_stream_device;
std::set<hm_event> g_recorded;

int32_t device_of(const void* ptr) {
  hm_pointer_info info{};
  info.struct_size = sizeof info;
  return g_base->pointer_query(ptr, &info) == HM_OK ? info.device : -1;
}

// Handles' devices, kept so a bug can tell a cross-device call from a local one.
hm_status stream_create(int32_t device, uint32_t flags, hm_stream* stream) {
  hm_status s = g_base->stream_create(device, flags, stream);
  if (s == HM_OK) {
    std::lock_guard lock(g_mutex);
    g_stream_device[*stream] = device;
  }
  return s;
}
hm_status event_create(int32_t device, uint32_t flags, hm_event* event) {
  hm_status s = g_base->event_create(device, flags, event);
  if (s == HM_OK) {
    std::lock_guard lock(g_mutex);
    g_event_device[*event] = device;
  }
  return s;
}
hm_status event_destroy(hm_event event) {
  {
    std::lock_guard lock(g_mutex);
    g_event_device.erase(event);
    g_recorded.erase(event);
  }
  return g_base->event_destroy(event);
}

[[noreturn]] void hang_forever() {
  for (;;)
    std::this_thread::sleep_for(std::chrono::hours(1));
}

// The off-by-one: an index equal to the count passes the check and lands on the last device.
int32_t last_device_at_count(int32_t device) {
  int32_t count = 0;
  g_base->device_count(&count);
  return device == count && count > 0 ? count - 1 : device;
}

// A wait for a word on the host: what a plugin without stream memops hardware might do.
struct PlainWait {
  const volatile uint32_t* word;
  uint32_t value;
};
void wait_plain_geq(void* arg) {
  auto* w = static_cast<PlainWait*>(arg);
  while (*w->word < w->value)  // the bug: not (int32_t)(*word - value) >= 0
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  delete w;
}

// A word stored, or waited for, by the host through the address a stream memop was given: right for
// pinned memory, a crash for device memory the host cannot address (a GPU's; asic_stub's).
struct HostWord {
  uint32_t* address;
  uint32_t value;
};
void store_on_host(void* arg) {
  auto* w = static_cast<HostWord*>(arg);
  std::atomic_ref<uint32_t>(*w->address).store(w->value, std::memory_order_release);
  delete w;
}
void wait_eq_on_host(void* arg) {
  auto* w = static_cast<HostWord*>(arg);
  while (std::atomic_ref<uint32_t>(*w->address).load(std::memory_order_acquire) != w->value)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  delete w;
}
bool aligned_word(const void* address) {
  return reinterpret_cast<uintptr_t>(address) % 4 == 0;
}

// The lost-update table of racy_allocation_table: copied, changed and put back with no lock.
std::vector<std::pair<void*, uint64_t>>* g_table = new std::vector<std::pair<void*, uint64_t>>;
void table_update(void* base, uint64_t size, bool add) {
  auto* next = new std::vector<std::pair<void*, uint64_t>>(*g_table);
  if (add)
    next->emplace_back(base, size);
  else
    std::erase_if(*next, [&](const auto& e) { return e.first == base; });
  // Another thread's update lands here and is overwritten: a window wide enough that the storm's
  // threads meet in it even on a loaded 2-core machine, where a yield alone sometimes missed.
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  g_table = next;  // the old table leaks: a lost entry, never a crash
}

// last_error_shared's one message, written by whichever thread failed last.
std::string g_shared_error;
hm_status remember_shared(hm_status s) {
  if (s != HM_OK && s != HM_ERR_NOT_READY) {
    std::lock_guard lock(g_mutex);
    g_shared_error = g_base->last_error();
  }
  return s;
}

struct Bug {
  const char* name;
  const char* breaks;  // what a vendor got wrong
  void (*plant)(hm_device_plugin_api& t);
};

// Each bug replaces one or two slots; the lambdas call the real slot for everything else.
const Bug kBugs[] = {
    {"event_rerecord_ignored", "event_record of an event recorded before keeps the old capture",
     [](hm_device_plugin_api& t) {
       t.event_record = [](hm_event event, hm_stream stream) -> hm_status {
         std::lock_guard lock(g_mutex);
         if (!g_recorded.insert(event).second) return HM_OK;
         return g_base->event_record(event, stream);
       };
     }},
    {"elapsed_in_microseconds", "event_elapsed_ms answers microseconds",
     [](hm_device_plugin_api& t) {
       t.event_elapsed_ms = [](hm_event a, hm_event b, float* ms) -> hm_status {
         hm_status s = g_base->event_elapsed_ms(a, b, ms);
         if (s == HM_OK) *ms *= 1000.0f;
         return s;
       };
     }},
    {"elapsed_of_pending_ok", "event_elapsed_ms answers OK (0 ms) while an event is pending",
     [](hm_device_plugin_api& t) {
       t.event_elapsed_ms = [](hm_event a, hm_event b, float* ms) -> hm_status {
         hm_status s = g_base->event_elapsed_ms(a, b, ms);
         if (s == HM_ERR_NOT_READY && ms != nullptr) {
           *ms = 0;
           return HM_OK;
         }
         return s;
       };
     }},
    {"event_query_always_ok", "event_query answers OK for an event still pending",
     [](hm_device_plugin_api& t) {
       t.event_query = [](hm_event event) -> hm_status {
         hm_status s = g_base->event_query(event);
         return s == HM_ERR_NOT_READY ? HM_OK : s;
       };
     }},
    {"copy_past_end", "memcpy_async moves whole 8-byte words, past the end of an odd-sized range",
     [](hm_device_plugin_api& t) {
       t.memcpy_async = [](hm_stream s, void* dst, const void* src, uint64_t size) -> hm_status {
         return g_base->memcpy_async(s, dst, src, size == 0 ? 0 : (size + 7) / 8 * 8);
       };
     }},
    {"fill_past_end", "memset_async sets one byte more than asked",
     [](hm_device_plugin_api& t) {
       t.memset_async = [](hm_stream s, void* dst, int32_t value, uint64_t size) -> hm_status {
         return g_base->memset_async(s, dst, value, size == 0 ? 0 : size + 1);
       };
     }},
    {"peer_copy_dropped", "HM_CAP_PEER_COPY claimed, but a copy between two devices does nothing",
     [](hm_device_plugin_api& t) {
       t.memcpy_async = [](hm_stream s, void* dst, const void* src, uint64_t size) -> hm_status {
         int32_t to = device_of(dst), from = device_of(src);
         if (to >= 0 && from >= 0 && to != from) return HM_OK;
         return g_base->memcpy_async(s, dst, src, size);
       };
     }},
    {"write_value_low_16_bits", "stream_write_value32 stores only the low 16 bits",
     [](hm_device_plugin_api& t) {
       t.stream_write_value32 = [](hm_stream s, void* address, uint32_t value,
                                   uint32_t flags) -> hm_status {
         return g_base->stream_write_value32(s, address, value & 0xffffu, flags);
       };
     }},
    {"write_value_at_enqueue", "stream_write_value32 stores at once, before the prior work",
     [](hm_device_plugin_api& t) {
       t.stream_write_value32 = [](hm_stream s, void* address, uint32_t value,
                                   uint32_t flags) -> hm_status {
         hm_status st = g_base->stream_write_value32(s, address, value, flags);
         if (st == HM_OK)  // the kit's flags are pinned memory, which the host may write
           std::atomic_ref<uint32_t>(*static_cast<uint32_t*>(address)).store(value);
         return st;
       };
     }},
    {"write_value_through_device_pointer",
     "stream_write_value32 stores through the pointer on the host, in device memory too",
     [](hm_device_plugin_api& t) {
       t.stream_write_value32 = [](hm_stream s, void* address, uint32_t value,
                                   uint32_t flags) -> hm_status {
         if (flags != 0 || !aligned_word(address))
           return g_base->stream_write_value32(s, address, value, flags);
         return g_base->stream_add_callback(s, store_on_host,
                                            new HostWord{static_cast<uint32_t*>(address), value});
       };
     }},
    {"wait_value_through_device_pointer",
     "stream_wait_value32 (EQ) polls the word through the pointer on the host, in device memory "
     "too",
     [](hm_device_plugin_api& t) {
       t.stream_wait_value32 = [](hm_stream s, const void* address, uint32_t value,
                                  int32_t condition, uint32_t flags) -> hm_status {
         if (condition != HM_WAIT_EQ || flags != 0 || !aligned_word(address))
           return g_base->stream_wait_value32(s, address, value, condition, flags);
         return g_base->stream_add_callback(
             s, wait_eq_on_host,
             new HostWord{static_cast<uint32_t*>(const_cast<void*>(address)), value});
       };
     }},
    {"geq_not_cyclic", "HM_WAIT_GEQ compares plainly (never passes across the 32-bit wrap)",
     [](hm_device_plugin_api& t) {
       t.stream_wait_value32 = [](hm_stream s, const void* address, uint32_t value,
                                  int32_t condition, uint32_t flags) -> hm_status {
         if (condition != HM_WAIT_GEQ || device_of(address) < 0)
           return g_base->stream_wait_value32(s, address, value, condition, flags);
         return g_base->stream_add_callback(
             s, wait_plain_geq,
             new PlainWait{static_cast<const volatile uint32_t*>(address), value});
       };
     }},
    {"ipc_interior_refused", "ipc_export refuses a pointer inside an allocation",
     [](hm_device_plugin_api& t) {
       t.ipc_export = [](void* ptr, hm_ipc_handle* handle) -> hm_status {
         hm_pointer_info info{};
         info.struct_size = sizeof info;
         if (g_base->pointer_query(ptr, &info) == HM_OK && info.base != ptr)
           return HM_ERR_INVALID_ARGUMENT;
         return g_base->ipc_export(ptr, handle);
       };
     }},
    {"ipc_device_memory_as_host", "a peer's device memory, IPC-opened, is reported host memory",
     [](hm_device_plugin_api& t) {
       t.pointer_query = [](const void* ptr, hm_pointer_info* info) -> hm_status {
         hm_status s = g_base->pointer_query(ptr, info);
         if (s == HM_OK && info->kind == HM_MEM_IPC_MAPPED) info->kind = HM_MEM_IPC_MAPPED_HOST;
         return s;
       };
     }},
    {"ipc_host_kind_to_old_host", "HM_MEM_IPC_MAPPED_HOST is reported to a host of ABI minor 0",
     [](hm_device_plugin_api& t) {
       t.initialize = [](const hm_host_api* host) -> hm_status {
         if (host == nullptr) return g_base->initialize(host);
         static hm_host_api newer = *host;  // the host's minor is ignored
         newer.abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR;
         return g_base->initialize(&newer);
       };
     }},
    {"free_of_foreign_ok", "mem_free answers OK for a pointer it never gave out",
     [](hm_device_plugin_api& t) {
       t.mem_free = [](void* ptr) -> hm_status {
         hm_status s = g_base->mem_free(ptr);
         return s == HM_ERR_INVALID_ARGUMENT ? HM_OK : s;
       };
     }},
    {"alloc_null_out_ok", "mem_alloc answers OK when its out-pointer is NULL",
     [](hm_device_plugin_api& t) {
       t.mem_alloc = [](int32_t device, uint64_t size, int32_t kind, void** ptr) -> hm_status {
         if (ptr == nullptr) return HM_OK;
         return g_base->mem_alloc(device, size, kind, ptr);
       };
     }},
    {"null_stream_ok", "memcpy_async takes a NULL stream as an implicit default stream",
     [](hm_device_plugin_api& t) {
       t.memcpy_async = [](hm_stream s, void* dst, const void* src, uint64_t size) -> hm_status {
         if (s == nullptr) return HM_OK;
         return g_base->memcpy_async(s, dst, src, size);
       };
     }},
    {"event_bad_device_ok", "event_create puts an out-of-range device's event on device 0",
     [](hm_device_plugin_api& t) {
       t.event_create = [](int32_t device, uint32_t flags, hm_event* event) -> hm_status {
         int32_t count = 0;
         g_base->device_count(&count);
         return event_create(device < 0 || device >= count ? 0 : device, flags, event);
       };
     }},
    {"callback_at_enqueue", "stream_add_callback runs the function at once, not in stream order",
     [](hm_device_plugin_api& t) {
       t.stream_add_callback = [](hm_stream s, hm_host_fn fn, void* user_data) -> hm_status {
         if (s == nullptr) return HM_ERR_INVALID_HANDLE;
         if (fn == nullptr) return HM_ERR_INVALID_ARGUMENT;
         fn(user_data);
         return HM_OK;
       };
     }},
    {"last_error_shared", "one last_error message for the whole process, not one per thread",
     [](hm_device_plugin_api& t) {
       t.mem_free = [](void* ptr) { return remember_shared(g_base->mem_free(ptr)); };
       t.mem_alloc = [](int32_t device, uint64_t size, int32_t kind, void** ptr) {
         return remember_shared(g_base->mem_alloc(device, size, kind, ptr));
       };
       t.device_properties = [](int32_t device, hm_device_properties* props) {
         return remember_shared(g_base->device_properties(device, props));
       };
       t.last_error = []() -> const char* { return g_shared_error.c_str(); };
     }},
    {"last_error_stale", "last_error keeps a thread's first message after later failures",
     [](hm_device_plugin_api& t) {
       t.last_error = []() -> const char* {
         thread_local std::string first;
         if (first.empty()) first = g_base->last_error();
         return first.c_str();
       };
     }},
    {"dmabuf_whole_allocation", "dmabuf_export describes the whole allocation, not the range",
     [](hm_device_plugin_api& t) {
       t.dmabuf_export = [](const void* ptr, uint64_t size, hm_dmabuf* out) -> hm_status {
         hm_pointer_info info{};
         info.struct_size = sizeof info;
         if (g_base->pointer_query(ptr, &info) != HM_OK || info.base == nullptr)
           return g_base->dmabuf_export(ptr, size, out);
         return g_base->dmabuf_export(info.base, info.size, out);
       };
     }},
    {"unknown_option_accepted", "initialize ignores plugin options it does not know",
     [](hm_device_plugin_api& t) {
       t.initialize = [](const hm_host_api* host) -> hm_status {
         if (host == nullptr) return g_base->initialize(host);
         static hm_host_api without = *host;
         without.options = "";
         return g_base->initialize(&without);
       };
     }},
    {"entry_starts_thread", "the entry point starts a thread (a driver's watchdog)",
     [](hm_device_plugin_api&) {
       std::thread([] {
         for (;;)
           std::this_thread::sleep_for(std::chrono::hours(1));
       }).detach();
     }},
    {"cross_device_wait_dropped", "stream_wait_event on another device's event does nothing",
     [](hm_device_plugin_api& t) {
       t.stream_wait_event = [](hm_stream stream, hm_event event) -> hm_status {
         {
           std::lock_guard lock(g_mutex);
           auto s = g_stream_device.find(stream);
           auto e = g_event_device.find(event);
           if (s != g_stream_device.end() && e != g_event_device.end() && s->second != e->second)
             return HM_OK;
         }
         return g_base->stream_wait_event(stream, event);
       };
     }},
    {"finite_sync_waits_forever", "stream_synchronize ignores a finite timeout on pending work",
     [](hm_device_plugin_api& t) {
       t.stream_synchronize = [](hm_stream stream, uint64_t timeout_ns) -> hm_status {
         if (stream != nullptr && g_base->stream_query(stream) == HM_ERR_NOT_READY)
           timeout_ns = HM_TIMEOUT_INFINITE;
         return g_base->stream_synchronize(stream, timeout_ns);
       };
     }},
    {"false_host_addressable", "claims HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY for memory it is not",
     [](hm_device_plugin_api& t) {
       t.device_properties = [](int32_t device, hm_device_properties* props) -> hm_status {
         hm_status s = g_base->device_properties(device, props);
         if (s == HM_OK) props->capabilities |= HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY;
         return s;
       };
     }},
    {"racy_allocation_table", "an allocation table updated without a lock loses entries",
     [](hm_device_plugin_api& t) {
       t.mem_alloc = [](int32_t device, uint64_t size, int32_t kind, void** ptr) -> hm_status {
         hm_status s = g_base->mem_alloc(device, size, kind, ptr);
         if (s == HM_OK) table_update(*ptr, size, true);
         return s;
       };
       t.mem_free = [](void* ptr) -> hm_status {
         hm_status s = g_base->mem_free(ptr);
         if (s == HM_OK && ptr != nullptr) table_update(ptr, 0, false);
         return s;
       };
       // The plugin answers from its own table: a lost entry is memory it no longer knows.
       t.pointer_query = [](const void* ptr, hm_pointer_info* info) -> hm_status {
         hm_status s = g_base->pointer_query(ptr, info);
         if (s != HM_OK || info->kind != HM_MEM_DEVICE) return s;
         for (const auto& [base, size] : *g_table)
           if (base == info->base) return s;
         *info = hm_pointer_info{info->struct_size, HM_MEM_UNKNOWN, -1, nullptr, 0};
         return s;
       };
     }},
    {"pointer_query_of_foreign_crashes", "pointer_query dereferences a pointer it does not own",
     [](hm_device_plugin_api& t) {
       t.pointer_query = [](const void* ptr, hm_pointer_info* info) -> hm_status {
         hm_status s = g_base->pointer_query(ptr, info);
         if (s == HM_OK && info->kind == HM_MEM_UNKNOWN) std::raise(SIGSEGV);
         return s;
       };
     }},
    {"copy_drops_last_byte", "memcpy_async copies one byte less than asked (an off-by-one length)",
     [](hm_device_plugin_api& t) {
       t.memcpy_async = [](hm_stream s, void* dst, const void* src, uint64_t size) -> hm_status {
         return g_base->memcpy_async(s, dst, src, size > 1 ? size - 1 : size);
       };
     }},
    {"every_wait_hangs", "no wait ever returns (a driver whose completion interrupt never comes)",
     [](hm_device_plugin_api& t) {
       t.stream_synchronize = [](hm_stream, uint64_t) -> hm_status { hang_forever(); };
       t.event_synchronize = [](hm_event, uint64_t) -> hm_status { hang_forever(); };
     }},
    {"exit_hangs", "the runtime's exit handler never returns (a driver that waits for lost work)",
     [](hm_device_plugin_api& t) {
       t.initialize = [](const hm_host_api* host) -> hm_status {
         std::atexit([] { hang_forever(); });
         return g_base->initialize(host);
       };
     }},
    {"device_index_at_count", "every slot that takes a device checks `device > count`, not `>=`",
     [](hm_device_plugin_api& t) {
       t.device_properties = [](int32_t device, hm_device_properties* props) -> hm_status {
         return g_base->device_properties(last_device_at_count(device), props);
       };
       t.mem_alloc = [](int32_t device, uint64_t size, int32_t kind, void** ptr) -> hm_status {
         return g_base->mem_alloc(last_device_at_count(device), size, kind, ptr);
       };
       t.stream_create = [](int32_t device, uint32_t flags, hm_stream* stream) -> hm_status {
         return stream_create(last_device_at_count(device), flags, stream);
       };
       t.event_create = [](int32_t device, uint32_t flags, hm_event* event) -> hm_status {
         return event_create(last_device_at_count(device), flags, event);
       };
       t.ipc_open = [](int32_t device, const hm_ipc_handle* handle, void** ptr) -> hm_status {
         return g_base->ipc_open(last_device_at_count(device), handle, ptr);
       };
     }},
    {"ipc_pinned_kind_of_minor_0",
     "claims ABI minor 1 but maps a peer's pinned memory as minor 0 did (HM_MEM_IPC_MAPPED)",
     [](hm_device_plugin_api& t) {
       t.pointer_query = [](const void* ptr, hm_pointer_info* info) -> hm_status {
         hm_status s = g_base->pointer_query(ptr, info);
         if (s == HM_OK && info->kind == HM_MEM_IPC_MAPPED_HOST) info->kind = HM_MEM_IPC_MAPPED;
         return s;
       };
     }},
    {"extension_ignores_min_version", "get_extension answers whatever version is asked for",
     [](hm_device_plugin_api& t) {
       t.get_extension = [](const char* name, uint32_t, const void** table) -> hm_status {
         return g_base->get_extension(name, 1, table);
       };
     }},
};

hm_status refuse_unknown_bug(const hm_host_api*) {
  return HM_ERR_INVALID_ARGUMENT;
}
const char* unknown_bug_error() {
  return "planted: HM_TEST_PLANT names no bug this plugin knows";
}

hm_device_plugin_api make_table() {
  hm_device_plugin_api t{};
  void* base = dlopen(HETMESH_PLANTED_BASE, RTLD_NOW | RTLD_LOCAL);
  auto entry =
      base ? reinterpret_cast<hm_device_plugin_entry_fn>(dlsym(base, HM_DEVICE_PLUGIN_ENTRY_V1))
           : nullptr;
  g_base = entry ? entry() : nullptr;
  if (g_base == nullptr) return t;  // struct_size 0: the host refuses the table
  std::memcpy(&t, g_base, sizeof t);
  t.name = "planted";
  t.stream_create = stream_create;
  t.event_create = event_create;
  t.event_destroy = event_destroy;
  if (const char* bug = std::getenv("HM_TEST_PLANT"); bug != nullptr && *bug != '\0') {
    const Bug* found = nullptr;
    for (const Bug& b : kBugs)
      if (std::strcmp(b.name, bug) == 0) found = &b;
    if (found == nullptr) {
      t.initialize = refuse_unknown_bug;
      t.last_error = unknown_bug_error;
    } else {
      found->plant(t);
    }
  }
  return t;
}

}  // namespace

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = make_table();
  return &table;
}
