/*
 * hetmesh device-plugin ABI, version 1.
 *
 * A device plugin is a shared object named libhetmesh-device-<name>.so that exports exactly one
 * symbol, hm_device_plugin_v1 (HM_DEVICE_PLUGIN_ENTRY_V1). It returns a function table. The core
 * supplies networking, protocol and scheduling; a plugin supplies memory, streams and events for
 * one kind of accelerator. C99, no C++ types.
 *
 * THE RULES. Each rule has an id, HM-R<n>. A comment below that states a rule in detail names its
 * id, a failing check of the conformance kit (hetmesh-cts) prints the id of the rule it checks,
 * and docs/writing-a-plugin.md tables the rules with their checks. Ids are stable: a rule is never
 * renumbered, and a new rule takes the next free number whatever its group.
 *
 * Conventions of the function table: an out-parameter has the comment `out` before its name (an
 * out struct still carries the caller's struct_size). Each slot's comment ends with "Returns:",
 * the statuses particular to it (HM-R14 lists those any slot may return), and "Gated by:", the
 * capability bit that gates it, or "Required" or "Optional" for a slot that no bit gates.
 *
 * Loading and negotiation
 *  HM-R1  One entry symbol per ABI major: a v1 plugin exports hm_device_plugin_v1 and nothing else
 *         (a future v2 plugin may export both). The host dlopen()s it with RTLD_NOW | RTLD_LOCAL
 *         and never dlclose()s it.
 *  HM-R2  The entry point is cheap, idempotent, thread-safe and side-effect free: it starts no
 *         driver, spawns no thread and allocates no device resource. It returns a table with
 *         static storage duration, or NULL if the plugin cannot serve this ABI at all.
 *  HM-R3  The table begins with struct_size, abi_major and abi_minor, then name ([a-z0-9_]{1,32},
 *         used in selectors) and version. The host refuses a plugin whose abi_major differs from
 *         its own; the effective minor is min(host minor, plugin minor).
 *  HM-R4  The table's struct_size is sizeof(hm_device_plugin_api) as the plugin was built. A slot
 *         at an offset past it is absent (NULL to the host). A table shorter than
 *         HM_DEVICE_PLUGIN_API_MIN_SIZE, or with a required slot NULL, is refused.
 *  HM-R5  Append only: table slots, struct fields, status codes, capability bits and memory kinds
 *         are only ever appended, and values never change. The major changes only if something is
 *         removed, reordered or retyped.
 *  HM-R6  Every argument struct begins with size_t struct_size, set by the caller. The callee
 *         accepts any struct_size at least the HM_*_SIZE_V1 it was built with, reads or fills only
 *         the fields it knows, and answers HM_ERR_INVALID_ARGUMENT to a smaller one.
 *  HM-R7  Two-step start: the host calls initialize(host) at most once, before any other slot but
 *         last_error, and only initialize starts the driver, so enumerating plugins never wakes a
 *         GPU. `host` stays valid until the process exits. A plugin that finds no device succeeds,
 *         reports device_count 0 and says why in last_error.
 *  HM-R8  Plugin options ("key=value;..." in hm_host_api.options) are valid only during
 *         initialize. An unknown key fails initialize with HM_ERR_INVALID_ARGUMENT naming the key.
 *  HM-R9  shutdown (optional) is called at most once, at exit, after the host destroyed everything
 *         it created; afterwards the host calls only last_error.
 *
 * Errors
 *  HM-R10 Every slot but last_error returns an hm_status. No exception, longjmp or abort() crosses
 *         this boundary: a plugin reports every failure as a status and never terminates the host
 *         process.
 *  HM-R11 After a failure, last_error() returns on the same thread (thread-local) a human-readable
 *         message naming the call and the cause. It never returns NULL ("" if there is no error),
 *         its string stays valid until the next call into the plugin on that thread, and it may be
 *         called before initialize. A success need not clear it: the message means something only
 *         right after a failure, or after initialize / device_count reported zero devices.
 *  HM-R12 HM_ERR_INVALID_ARGUMENT: a bad pointer, size, flag, kind, condition, device index or
 *         struct_size. That includes a pointer that is not memory of this plugin (or not the base
 *         address) where the slot needs it to be: mem_free, host_unregister, ipc_export,
 *         ipc_close, dmabuf_export, the stream memops.
 *  HM-R13 HM_ERR_INVALID_HANDLE: a stream or event that is NULL or was not made by this plugin.
 *         NULL is never a valid handle: there is no implicit default stream.
 *  HM-R14 Besides the statuses its "Returns:" lists, any slot may fail with HM_ERR_UNINITIALIZED
 *         (before initialize succeeded), HM_ERR_OUT_OF_MEMORY (host memory), HM_ERR_DEVICE_LOST,
 *         HM_ERR_BACKEND (the vendor runtime's error, named in last_error) or HM_ERR_INTERNAL.
 *         HM_ERR_NOT_READY is an answer, not a failure; HM_ERR_TIMEOUT comes only from a wait with
 *         a finite timeout.
 *
 * Devices, capabilities, threads
 *  HM-R15 device_properties: name and vendor are not empty; dlpack_device_type is DLPack's
 *         DLDeviceType code (HM_DLPACK_*); pci_bus_id is "DDDD:BB:DD.F" or ""; numa_node is -1 or
 *         more; memory_alignment is a power of two; capabilities holds only bits defined here.
 *  HM-R16 Capabilities are per device, one bit per optional operation ("Gated by:"). A set bit is
 *         a promise that the operation works on that device, so its slot is not NULL.
 *  HM-R17 For a device whose bit is clear, the gated slot is NULL or returns HM_ERR_NOT_SUPPORTED;
 *         the host treats a NULL optional slot as HM_ERR_NOT_SUPPORTED.
 *  HM-R18 HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY: host code may read and write device memory
 *         through the pointer mem_alloc returned. Without it, the host never dereferences device
 *         memory (it may crash).
 *  HM-R19 Thread safety: unless a slot says otherwise, every slot may be called concurrently from
 *         any thread. Operations on one stream are ordered by the stream, not by the caller's
 *         thread.
 *  HM-R20 Ownership: handles (hm_stream, hm_event) and allocations belong to the caller from the
 *         call that creates them until the call that destroys them; a destroyed handle is not used
 *         again. An asynchronous operation returns once enqueued, and the caller keeps its buffers
 *         alive and unchanged until the stream has reached it.
 *
 * Memory
 *  HM-R21 mem_alloc allocates size > 0 bytes of HM_MEM_DEVICE (gated by HM_CAP_DEVICE_MEMORY) or
 *         HM_MEM_PINNED_HOST (HM_CAP_PINNED_HOST_MEMORY), aligned to memory_alignment; more than
 *         the device has is HM_ERR_OUT_OF_MEMORY.
 *  HM-R22 Pinned host memory is page-locked host memory that host code reads and writes and the
 *         plugin's copies and stream memops use.
 *  HM-R23 mem_free takes a base address mem_alloc returned, or NULL (a no-op); anything else,
 *         an interior pointer included, is HM_ERR_INVALID_ARGUMENT. The caller ensures no stream
 *         still uses the memory.
 *  HM-R24 pointer_query describes any pointer, interior ones included: kind, owning device, and
 *         base and size of the containing allocation, the size being the one requested (mem_alloc,
 *         host_register) or exported (ipc_open), not a rounded one. A pointer the plugin does not
 *         own is an answer, not an error: HM_OK with HM_MEM_UNKNOWN, device -1, base NULL, size 0.
 *  HM-R25 memcpy_async copies in any direction between device memory of any device of this
 *         plugin, pinned, registered and plain host memory; memset_async sets exactly its range to
 *         (uint8_t)value. Both return once enqueued and complete in stream order; size 0 is a
 *         no-op.
 *  HM-R26 host_register (HM_CAP_HOST_REGISTER) page-locks existing host memory until
 *         host_unregister of the same base: pointer_query then reports HM_MEM_REGISTERED_HOST, and
 *         the plugin's copies and stream memops use it.
 *
 * Streams and events
 *  HM-R27 stream_create takes HM_STREAM_* flags (another bit is HM_ERR_INVALID_ARGUMENT), and the
 *         work enqueued on one stream runs in order.
 *  HM-R28 stream_query and event_query never block: HM_OK when the work is complete, else
 *         HM_ERR_NOT_READY. stream_synchronize and event_synchronize block until it is, or until
 *         timeout_ns passed (HM_ERR_TIMEOUT; the work continues); HM_TIMEOUT_INFINITE waits
 *         forever.
 *  HM-R29 event_record captures the work enqueued so far on the stream, and the event completes
 *         when that work does. Re-recording replaces the capture. An event never recorded counts
 *         as complete (event_query, event_synchronize, stream_wait_event). event_create takes
 *         HM_EVENT_* flags (another bit is HM_ERR_INVALID_ARGUMENT).
 *  HM-R30 stream_wait_event: work enqueued on the stream afterwards waits for the event's current
 *         capture, without blocking the host; the event may belong to another device of the same
 *         plugin.
 *  HM-R31 stream_add_callback (HM_CAP_HOST_CALLBACK) runs fn(user_data) on a plugin thread once
 *         the prior work on the stream completes, in stream order; later work waits for it to
 *         return. fn must not call into the plugin.
 *  HM-R32 event_elapsed_ms (HM_CAP_EVENT_TIMING) gives the milliseconds between two completed
 *         events, HM_ERR_NOT_READY while either is pending; an event created with
 *         HM_EVENT_DISABLE_TIMING is HM_ERR_INVALID_ARGUMENT.
 *
 * Stream memory operations (HM_CAP_STREAM_MEMOPS)
 *  HM-R33 The word of a stream memop is 4-byte aligned and lies in device, pinned or registered
 *         memory of this plugin (HM_ERR_INVALID_ARGUMENT otherwise); flags are 0. No compute unit
 *         is used where the hardware allows it.
 *  HM-R34 stream_write_value32 stores the value in stream order with release semantics: the prior
 *         work on the stream is visible before the word changes.
 *  HM-R35 stream_wait_value32 holds later work on the stream until the word satisfies the
 *         condition (HM_WAIT_GEQ is cyclic), without blocking the host; anyone may write the word:
 *         another process, the host, a NIC, another stream. The condition is judged from when the
 *         stream reaches the wait: its own earlier work (a write resetting the word) comes first.
 *
 * IPC and dma-buf
 *  HM-R36 ipc_export (HM_CAP_IPC) describes the device or pinned allocation from mem_alloc that
 *         contains ptr as plain bytes, valid while the exporter keeps the allocation. A plugin
 *         may also export device memory another user of its runtime allocated in this process
 *         (pointer_query's HM_MEM_DEVICE: a framework's tensors), as the whole allocation
 *         pointer_query reports; HM_ERR_NOT_SUPPORTED where the runtime cannot share it. Other
 *         memory is HM_ERR_INVALID_ARGUMENT.
 *  HM-R37 ipc_open, in another process on the same host, maps the whole exported allocation and
 *         returns its base; each process then sees the other's writes, and pointer_query reports
 *         HM_MEM_IPC_MAPPED (or HM-R38's kind). A malformed handle, or one this plugin did not
 *         export, is HM_ERR_INVALID_ARGUMENT; a handle exported by the same process may be
 *         HM_ERR_NOT_SUPPORTED. ipc_close takes the base ipc_open returned. Opening one
 *         allocation again may return the same base; each ipc_open then needs its ipc_close, and
 *         the mapping lasts until the last.
 *  HM-R38 pointer_query reports an ipc_open mapping by the kind of memory exported: a peer's
 *         pinned host memory is HM_MEM_IPC_MAPPED_HOST (since minor 1: host code may read and
 *         write it) to a host of minor >= 1, and HM_MEM_IPC_MAPPED to an older host; a peer's
 *         device memory is HM_MEM_IPC_MAPPED always, even where host code could address it
 *         (HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY tells that). A plugin that claims minor 1
 *         answers minor 1's kinds.
 *  HM-R39 dmabuf_export (HM_CAP_DMABUF_EXPORT) gives (fd, offset, length) for [ptr, ptr+size) of
 *         device memory: the importer maps [offset, offset+length) of fd, and the plugin owns the
 *         fd until dmabuf_release.
 *  HM-R40 dma-buf ranges may need page alignment: a plugin may refuse a ptr or size that is not a
 *         multiple of the page size with HM_ERR_INVALID_ARGUMENT.
 *
 * Extensions
 *  HM-R41 get_extension (optional) answers a plugin-owned, immutable table, valid until exit, that
 *         begins with hm_extension_header; HM_ERR_NOT_SUPPORTED if the name is unknown or its
 *         version is below min_version.
 */
#ifndef HETMESH_DEVICE_PLUGIN_H_
#define HETMESH_DEVICE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* (HM-R3, HM-R5) */
#define HM_DEVICE_PLUGIN_ABI_MAJOR 1
/* Minor 1 added HM_MEM_IPC_MAPPED_HOST. */
#define HM_DEVICE_PLUGIN_ABI_MINOR 1

/* The one exported symbol of a v1 plugin; a future v2 plugin may export both (HM-R1). */
#define HM_DEVICE_PLUGIN_ENTRY_V1 "hm_device_plugin_v1"

/* File name pattern the loader searches for: libhetmesh-device-<name>.so */
#define HM_DEVICE_PLUGIN_PREFIX "libhetmesh-device-"

#if defined(__GNUC__)
#define HM_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define HM_PLUGIN_EXPORT
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes. Values are stable forever; new codes are appended (HM-R5, HM-R10, HM-R14).   */
/* ------------------------------------------------------------------------------------------ */
typedef int32_t hm_status;
enum {
  HM_OK = 0,
  HM_ERR_INVALID_ARGUMENT = 1, /* a bad pointer, size, flag, index or struct_size (HM-R12) */
  HM_ERR_NOT_SUPPORTED = 2,    /* the device lacks the capability, or the slot is optional */
  HM_ERR_OUT_OF_MEMORY = 3,    /* device or host memory exhausted */
  HM_ERR_DEVICE_LOST = 4,      /* the device or driver failed; the device is unusable */
  HM_ERR_NOT_READY = 5,        /* query: the work has not completed yet (not a failure) */
  HM_ERR_TIMEOUT = 6,          /* a wait with a finite timeout expired */
  HM_ERR_INVALID_HANDLE = 7,   /* a stream or event this plugin does not own (HM-R13) */
  HM_ERR_UNINITIALIZED = 8,    /* called before initialize() succeeded */
  HM_ERR_BACKEND = 9,          /* the vendor runtime returned an error; see last_error */
  HM_ERR_INTERNAL = 10         /* a bug in the plugin */
};

/* ------------------------------------------------------------------------------------------ */
/* Capabilities, one mask per device (hm_device_properties.capabilities). A set bit promises    */
/* the operation works (HM-R16); with the bit clear its slot is NULL or NOT_SUPPORTED (HM-R17). */
/* ------------------------------------------------------------------------------------------ */
typedef uint64_t hm_capabilities;
#define HM_CAP_DEVICE_MEMORY (1ull << 0)      /* mem_alloc(HM_MEM_DEVICE) */
#define HM_CAP_PINNED_HOST_MEMORY (1ull << 1) /* mem_alloc(HM_MEM_PINNED_HOST) */
#define HM_CAP_HOST_REGISTER (1ull << 2)      /* host_register / host_unregister */
#define HM_CAP_IPC (1ull << 3)                /* ipc_export / ipc_open / ipc_close */
#define HM_CAP_DMABUF_EXPORT (1ull << 4)      /* dmabuf_export / dmabuf_release */
#define HM_CAP_STREAM_MEMOPS (1ull << 5)      /* stream_write_value32 / stream_wait_value32 */
#define HM_CAP_HOST_CALLBACK (1ull << 6)      /* stream_add_callback */
#define HM_CAP_EVENT_TIMING (1ull << 7)       /* event_elapsed_ms */
/* Device memory may be read and written by host code through the pointer mem_alloc returned.
 * Without this bit the host must never dereference device memory (it may crash). (HM-R18) */
#define HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY (1ull << 8)
/* memcpy_async between two devices of this plugin (peer copy) works without host staging. */
#define HM_CAP_PEER_COPY (1ull << 9)

/* DLPack device type codes (dlpack.h DLDeviceType), so tensors can later cross into frameworks.
 * (HM-R15) */
enum {
  HM_DLPACK_CPU = 1,
  HM_DLPACK_CUDA = 2,
  HM_DLPACK_CUDA_HOST = 3,
  HM_DLPACK_ROCM = 10,
  HM_DLPACK_ROCM_HOST = 11,
  HM_DLPACK_EXT_DEV = 12,
  HM_DLPACK_ONEAPI = 14
};

/* Opaque handles. Each belongs to one device of one plugin. NULL is never a valid handle: a slot
 * given a NULL stream or event returns HM_ERR_INVALID_HANDLE (there is no implicit default stream).
 * (HM-R13)
 */
typedef struct hm_stream_s* hm_stream;
typedef struct hm_event_s* hm_event;

/* ------------------------------------------------------------------------------------------ */
/* Host services handed to initialize().                                                      */
/* ------------------------------------------------------------------------------------------ */
enum { HM_LOG_ERROR = 0, HM_LOG_WARN = 1, HM_LOG_INFO = 2, HM_LOG_DEBUG = 3 };

typedef struct hm_host_api {
  size_t struct_size; /* HM_HOST_API_SIZE_V1 or larger (HM-R6) */
  uint32_t abi_major; /* the host's ABI version */
  uint32_t abi_minor;
  /* Log sink. Thread-safe; may be called from any plugin thread until the process exits.
   * `message` is copied before the call returns. (HM-R7) */
  void (*log)(void* log_context, int32_t level, const char* message);
  void* log_context;
  /* Plugin options from the host's config as "key=value" pairs separated by ';' (NULL or "" when
   * none). Valid only during initialize(); copy what you keep. Unknown keys must fail
   * initialize() with HM_ERR_INVALID_ARGUMENT naming the key. (HM-R8) */
  const char* options;
} hm_host_api;
#define HM_HOST_API_SIZE_V1 (offsetof(hm_host_api, options) + sizeof(const char*))

/* ------------------------------------------------------------------------------------------ */
/* Devices.                                                                                   */
/* ------------------------------------------------------------------------------------------ */
/* What device_properties fills (HM-R15). */
typedef struct hm_device_properties {
  size_t struct_size;         /* set by the caller: HM_DEVICE_PROPERTIES_SIZE_V1 or larger */
  char name[128];             /* e.g. "NVIDIA H200"; NUL-terminated */
  char vendor[64];            /* e.g. "NVIDIA"; NUL-terminated */
  int32_t dlpack_device_type; /* HM_DLPACK_* */
  char pci_bus_id[32];        /* "0000:19:00.0", or "" when the device is not a PCI device */
  int32_t numa_node;          /* -1 when unknown */
  uint64_t total_memory;      /* bytes of device memory, 0 when not meaningful */
  hm_capabilities capabilities;
  uint64_t memory_alignment; /* guaranteed alignment of mem_alloc results, a power of two */
} hm_device_properties;
#define HM_DEVICE_PROPERTIES_SIZE_V1 \
  (offsetof(hm_device_properties, memory_alignment) + sizeof(uint64_t))

/* ------------------------------------------------------------------------------------------ */
/* Memory.                                                                                    */
/* ------------------------------------------------------------------------------------------ */
typedef enum hm_memory_kind {
  HM_MEM_UNKNOWN = 0,         /* pointer_query: not memory of this plugin (plain host memory) */
  HM_MEM_DEVICE = 1,          /* device memory */
  HM_MEM_PINNED_HOST = 2,     /* page-locked host memory, host-addressable, device-accessible */
  HM_MEM_REGISTERED_HOST = 3, /* host memory registered through host_register */
  HM_MEM_IPC_MAPPED = 4,      /* a peer's device memory opened through ipc_open */
  /* Since minor 1: a peer's pinned host memory opened through ipc_open, which host code may also
   * read and write (so a transport copies small things into it with memcpy, not a copy engine).
   * Reported only to a host of minor >= 1; older hosts get HM_MEM_IPC_MAPPED. (HM-R38) */
  HM_MEM_IPC_MAPPED_HOST = 5
} hm_memory_kind;

/* What pointer_query fills (HM-R24). */
typedef struct hm_pointer_info {
  size_t struct_size; /* set by the caller: HM_POINTER_INFO_SIZE_V1 or larger */
  int32_t kind;       /* hm_memory_kind */
  int32_t device;     /* owning device index, -1 for HM_MEM_UNKNOWN */
  void* base;         /* start of the allocation that contains the pointer */
  uint64_t size;      /* size of that allocation in bytes, as requested (not rounded) */
} hm_pointer_info;
#define HM_POINTER_INFO_SIZE_V1 (offsetof(hm_pointer_info, size) + sizeof(uint64_t))

/* Opaque IPC handle: plain bytes that may be sent to another process on the same host. */
#define HM_IPC_HANDLE_BYTES 128
typedef struct hm_ipc_handle {
  uint8_t bytes[HM_IPC_HANDLE_BYTES];
} hm_ipc_handle;

/* A dma-buf for a device range: the importer (e.g. ibv_reg_dmabuf_mr) maps [offset, offset+length)
 * of fd. The fd is owned by the plugin until dmabuf_release(). (HM-R39) */
typedef struct hm_dmabuf {
  size_t struct_size; /* set by the caller: HM_DMABUF_SIZE_V1 or larger */
  int32_t fd;
  uint64_t offset;
  uint64_t length;
} hm_dmabuf;
#define HM_DMABUF_SIZE_V1 (offsetof(hm_dmabuf, length) + sizeof(uint64_t))

/* ------------------------------------------------------------------------------------------ */
/* Streams, events and stream memory operations.                                             */
/* ------------------------------------------------------------------------------------------ */
#define HM_STREAM_DEFAULT 0u
#define HM_STREAM_NON_BLOCKING 1u /* does not synchronise with a vendor's legacy default stream */

#define HM_EVENT_DEFAULT 0u
#define HM_EVENT_DISABLE_TIMING 1u /* cheaper; event_elapsed_ms is then invalid (HM-R32) */

#define HM_TIMEOUT_INFINITE UINT64_MAX

/* stream_wait_value32 conditions, as CUDA's CU_STREAM_WAIT_VALUE_* and HIP's hipStreamWait*.
 * (HM-R35) */
typedef enum hm_wait_condition {
  HM_WAIT_GEQ = 0, /* (int32_t)(*addr - value) >= 0: cyclic, wraparound-safe */
  HM_WAIT_EQ = 1,  /* *addr == value */
  HM_WAIT_AND = 2, /* (*addr & value) != 0 */
  HM_WAIT_NOR = 3  /* ~(*addr | value) != 0 */
} hm_wait_condition;

typedef void (*hm_host_fn)(void* user_data);

/* ------------------------------------------------------------------------------------------ */
/* The function table.                                                                        */
/* ------------------------------------------------------------------------------------------ */
typedef struct hm_device_plugin_api {
  size_t struct_size;  /* sizeof(hm_device_plugin_api) the plugin was built with (HM-R4) */
  uint32_t abi_major;  /* HM_DEVICE_PLUGIN_ABI_MAJOR (HM-R3) */
  uint32_t abi_minor;  /* HM_DEVICE_PLUGIN_ABI_MINOR */
  const char* name;    /* short name used in selectors ("cpu" in "cpu:0"): [a-z0-9_]{1,32} */
  const char* version; /* the plugin's own version, free text (e.g. "1.2.0+cuda13.0") */

  /* ---- lifecycle (required) ---- */

  /* Start the plugin: load the driver, count devices. Called at most once, before every other slot
   * except last_error. `host` stays valid until the process exits. A plugin with zero devices
   * (no GPU present) succeeds and reports device_count 0; last_error may then explain why.
   * (HM-R7, HM-R8)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (host NULL or too small, a second call, an unknown or
   * malformed option). Gated by: Required. */
  hm_status (*initialize)(const hm_host_api* host);

  /* The calling thread's last error message, or "" if none. Never NULL. The string stays valid
   * until the next call into the plugin on this thread. Callable before initialize(). (HM-R11)
   * Returns: the message (not a status). Gated by: Required. */
  const char* (*last_error)(void);

  /* ---- devices (required) ---- */

  /* The number of devices, 0 or more (HM-R7).
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (count NULL). Gated by: Required. */
  hm_status (*device_count)(int32_t* /* out */ count);
  /* Fill `props` (whose struct_size the caller sets). (HM-R6, HM-R15)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (no such device; props NULL or too small).
   * Gated by: Required. */
  hm_status (*device_properties)(int32_t device, hm_device_properties* /* out */ props);

  /* ---- memory (required) ---- */

  /* Allocate `size` > 0 bytes of `kind` (HM_MEM_DEVICE or HM_MEM_PINNED_HOST) on `device`; the
   * result is aligned to memory_alignment. The caller owns the memory until mem_free. (HM-R21)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (no such device, size 0, another kind, ptr NULL),
   * HM_ERR_NOT_SUPPORTED (the kind's bit is clear), HM_ERR_OUT_OF_MEMORY.
   * Gated by: HM_CAP_DEVICE_MEMORY / HM_CAP_PINNED_HOST_MEMORY, by kind (the slot is required). */
  hm_status (*mem_alloc)(int32_t device, uint64_t size, int32_t kind, void** /* out */ ptr);
  /* Free memory from mem_alloc. The caller ensures no stream still uses it. NULL is a no-op.
   * (HM-R23)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (not a base address mem_alloc returned).
   * Gated by: Required. */
  hm_status (*mem_free)(void* ptr);

  /* Describe any pointer, including one inside a larger allocation. A pointer this plugin does
   * not own gives HM_OK with kind HM_MEM_UNKNOWN and device -1: that is an answer, not an error.
   * (HM-R24)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (info NULL or too small). Gated by: Required. */
  hm_status (*pointer_query)(const void* ptr, hm_pointer_info* /* out */ info);

  /* Copy `size` bytes on `stream`, in any direction: each side may be device memory of any
   * device of this plugin (peer needs HM_CAP_PEER_COPY), pinned or registered host memory, or
   * plain host memory. Returns once enqueued; the copy completes in stream order. The caller keeps
   * both buffers alive and unchanged until then. size 0 is a no-op. (HM-R25, HM-R20)
   * Returns: HM_OK, HM_ERR_INVALID_HANDLE, HM_ERR_INVALID_ARGUMENT (dst or src NULL, a range that
   * overruns its allocation). Gated by: Required. */
  hm_status (*memcpy_async)(hm_stream stream, void* dst, const void* src, uint64_t size);
  /* Set `size` bytes at dst to (uint8_t)value, in stream order. (HM-R25)
   * Returns: HM_OK, HM_ERR_INVALID_HANDLE, HM_ERR_INVALID_ARGUMENT (dst NULL, a range that
   * overruns its allocation). Gated by: Required. */
  hm_status (*memset_async)(hm_stream stream, void* dst, int32_t value, uint64_t size);

  /* ---- streams (required) ---- */

  /* A stream on `device`; flags: HM_STREAM_*. (HM-R27)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (no such device, unknown flags, stream NULL).
   * Gated by: Required. */
  hm_status (*stream_create)(int32_t device, uint32_t flags, hm_stream* /* out */ stream);
  /* Destroy after the stream's pending work completes. Do not use the handle afterwards.
   * Returns: HM_OK, HM_ERR_INVALID_HANDLE. Gated by: Required. */
  hm_status (*stream_destroy)(hm_stream stream);
  /* Block until all work enqueued so far on `stream` completes, or `timeout_ns` elapses
   * (HM_ERR_TIMEOUT; the work continues). HM_TIMEOUT_INFINITE waits forever. (HM-R28)
   * Returns: HM_OK, HM_ERR_TIMEOUT, HM_ERR_INVALID_HANDLE. Gated by: Required. */
  hm_status (*stream_synchronize)(hm_stream stream, uint64_t timeout_ns);
  /* HM_OK when all work enqueued so far has completed, else HM_ERR_NOT_READY. Non-blocking.
   * (HM-R28)
   * Returns: HM_OK, HM_ERR_NOT_READY, HM_ERR_INVALID_HANDLE. Gated by: Required. */
  hm_status (*stream_query)(hm_stream stream);

  /* ---- events (required) ---- */

  /* An event of `device`; flags: HM_EVENT_*. (HM-R29)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (no such device, unknown flags, event NULL).
   * Gated by: Required. */
  hm_status (*event_create)(int32_t device, uint32_t flags, hm_event* /* out */ event);
  /* Returns: HM_OK, HM_ERR_INVALID_HANDLE. Gated by: Required. */
  hm_status (*event_destroy)(hm_event event);
  /* Capture the work enqueued so far on `stream`; the event completes when that work does.
   * Re-recording replaces the previous capture. An event never recorded counts as complete.
   * (HM-R29)
   * Returns: HM_OK, HM_ERR_INVALID_HANDLE. Gated by: Required. */
  hm_status (*event_record)(hm_event event, hm_stream stream);
  /* HM_OK if complete, HM_ERR_NOT_READY if not. Non-blocking. (HM-R28)
   * Returns: HM_OK, HM_ERR_NOT_READY, HM_ERR_INVALID_HANDLE. Gated by: Required. */
  hm_status (*event_query)(hm_event event);
  /* Block until complete or timeout_ns (HM_ERR_TIMEOUT). (HM-R28)
   * Returns: HM_OK, HM_ERR_TIMEOUT, HM_ERR_INVALID_HANDLE. Gated by: Required. */
  hm_status (*event_synchronize)(hm_event event, uint64_t timeout_ns);
  /* Work enqueued on `stream` after this call waits for the event's current capture. The event
   * may belong to another device of the same plugin. Returns without blocking the host. (HM-R30)
   * Returns: HM_OK, HM_ERR_INVALID_HANDLE. Gated by: Required. */
  hm_status (*stream_wait_event)(hm_stream stream, hm_event event);

  /* ---- optional operations (NULL or HM_ERR_NOT_SUPPORTED when the capability is clear) ---- */

  /* Release plugin resources at process exit. After it returns, only last_error may be called.
   * Optional; the host calls it at most once, after destroying everything it created. (HM-R9)
   * Returns: HM_OK. Gated by: Optional. */
  hm_status (*shutdown)(void);

  /* HM_CAP_HOST_REGISTER: page-lock existing host memory for fast copies and device access. The
   * caller keeps the memory mapped until host_unregister. (HM-R26)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (ptr NULL, size 0, a range overlapping memory the
   * plugin already knows), HM_ERR_NOT_SUPPORTED, HM_ERR_OUT_OF_MEMORY.
   * Gated by: HM_CAP_HOST_REGISTER. */
  hm_status (*host_register)(void* ptr, uint64_t size);
  /* Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (not a base address host_register took),
   * HM_ERR_NOT_SUPPORTED. Gated by: HM_CAP_HOST_REGISTER. */
  hm_status (*host_unregister)(void* ptr);

  /* HM_CAP_HOST_CALLBACK: run fn(user_data) on a plugin thread once prior work on `stream`
   * completes; later work waits for it to return. fn must not call into this plugin. (HM-R31)
   * Returns: HM_OK, HM_ERR_INVALID_HANDLE, HM_ERR_INVALID_ARGUMENT (fn NULL),
   * HM_ERR_NOT_SUPPORTED. Gated by: HM_CAP_HOST_CALLBACK. */
  hm_status (*stream_add_callback)(hm_stream stream, hm_host_fn fn, void* user_data);

  /* HM_CAP_EVENT_TIMING: milliseconds between two completed events recorded without
   * HM_EVENT_DISABLE_TIMING. HM_ERR_NOT_READY if either has not completed. (HM-R32)
   * Returns: HM_OK, HM_ERR_NOT_READY, HM_ERR_INVALID_HANDLE, HM_ERR_INVALID_ARGUMENT (milliseconds
   * NULL, an event created with HM_EVENT_DISABLE_TIMING), HM_ERR_NOT_SUPPORTED.
   * Gated by: HM_CAP_EVENT_TIMING. */
  hm_status (*event_elapsed_ms)(hm_event start, hm_event end, float* /* out */ milliseconds);

  /* HM_CAP_STREAM_MEMOPS: in stream order, store `value` to the 32-bit word at `address` with
   * release semantics (prior work on the stream is visible first). `address` is 4-byte aligned
   * and lies in device, pinned or registered host memory of this plugin. No compute units are
   * used where the hardware allows it. flags: reserved, 0. (HM-R33, HM-R34)
   * Returns: HM_OK, HM_ERR_INVALID_HANDLE, HM_ERR_INVALID_ARGUMENT (address misaligned or not
   * memory of this plugin, flags not 0), HM_ERR_NOT_SUPPORTED. Gated by: HM_CAP_STREAM_MEMOPS. */
  hm_status (*stream_write_value32)(hm_stream stream, void* address, uint32_t value,
                                    uint32_t flags);
  /* HM_CAP_STREAM_MEMOPS: later work on `stream` waits until the 32-bit word at `address`
   * satisfies `condition` (hm_wait_condition) against `value`. The host is not blocked. Another
   * process, the host, the NIC or another stream may write the word. flags: reserved, 0.
   * (HM-R33, HM-R35)
   * Returns: HM_OK, HM_ERR_INVALID_HANDLE, HM_ERR_INVALID_ARGUMENT (address misaligned or not
   * memory of this plugin, an unknown condition, flags not 0), HM_ERR_NOT_SUPPORTED.
   * Gated by: HM_CAP_STREAM_MEMOPS. */
  hm_status (*stream_wait_value32)(hm_stream stream, const void* address, uint32_t value,
                                   int32_t condition, uint32_t flags);

  /* HM_CAP_IPC: describe the allocation containing `ptr` (device or pinned memory from
   * mem_alloc, and perhaps device memory another user of the runtime allocated here) as bytes
   * another process on this host can open. The handle stays valid while the exporter keeps the
   * allocation. (HM-R36)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (ptr not in memory it exports, handle NULL),
   * HM_ERR_NOT_SUPPORTED (also: pinned memory, or another user's allocation, it cannot share).
   * Gated by: HM_CAP_IPC. */
  hm_status (*ipc_export)(void* ptr, hm_ipc_handle* /* out */ handle);
  /* HM_CAP_IPC: map a peer process's allocation for use by `device`. Returns the mapped base of the
   * whole exported allocation; pointer_query then reports HM_MEM_IPC_MAPPED, or
   * HM_MEM_IPC_MAPPED_HOST where the mapping is also a host pointer. Opening a handle
   * exported by the same process may fail with HM_ERR_NOT_SUPPORTED (CUDA refuses it).
   * (HM-R37, HM-R38)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (no such device, handle or ptr NULL, a malformed or
   * foreign handle, an exporter that is gone), HM_ERR_NOT_SUPPORTED, HM_ERR_OUT_OF_MEMORY.
   * Gated by: HM_CAP_IPC. */
  hm_status (*ipc_open)(int32_t device, const hm_ipc_handle* handle, void** /* out */ ptr);
  /* Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (not a base address ipc_open returned),
   * HM_ERR_NOT_SUPPORTED. Gated by: HM_CAP_IPC. (HM-R37) */
  hm_status (*ipc_close)(void* ptr);

  /* HM_CAP_DMABUF_EXPORT: export [ptr, ptr+size) of device memory as a dma-buf for an RDMA NIC or
   * another driver. ptr and size may need page alignment (HM_ERR_INVALID_ARGUMENT otherwise). The
   * plugin owns out->fd until dmabuf_release(out). (HM-R39, HM-R40)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (not device memory of this plugin, size 0, a range
   * not page-aligned or overrunning its allocation, out NULL or too small), HM_ERR_NOT_SUPPORTED
   * (also: the kernel or driver cannot export here). Gated by: HM_CAP_DMABUF_EXPORT. */
  hm_status (*dmabuf_export)(const void* ptr, uint64_t size, hm_dmabuf* /* out */ out);
  /* Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (dmabuf NULL or too small, its fd not open),
   * HM_ERR_NOT_SUPPORTED. Gated by: HM_CAP_DMABUF_EXPORT. (HM-R39) */
  hm_status (*dmabuf_release)(const hm_dmabuf* dmabuf);

  /* Look up a named vendor extension, e.g. "hm.asic_stub.launch". On success *table points to a
   * plugin-owned, immutable table valid until exit, which begins with hm_extension_header.
   * HM_ERR_NOT_SUPPORTED if the name is unknown or its version is below min_version. (HM-R41)
   * Returns: HM_OK, HM_ERR_INVALID_ARGUMENT (name or table NULL), HM_ERR_NOT_SUPPORTED.
   * Gated by: Optional. */
  hm_status (*get_extension)(const char* name, uint32_t min_version, const void** /* out */ table);
} hm_device_plugin_api;

/* Every extension table begins with this header. (HM-R41) */
typedef struct hm_extension_header {
  size_t struct_size;
  uint32_t version;
} hm_extension_header;

/* The entry point every v1 plugin exports. Cheap, idempotent, thread-safe; returns a table with
 * static storage duration, or NULL if the plugin cannot serve this ABI at all. (HM-R1, HM-R2) */
typedef const hm_device_plugin_api* (*hm_device_plugin_entry_fn)(void);
HM_PLUGIN_EXPORT const hm_device_plugin_api* hm_device_plugin_v1(void);

/* Size of the v1.0 table: slots past it are absent for the host of a v1.0 plugin. (HM-R4) */
#define HM_DEVICE_PLUGIN_API_SIZE_V1_0 \
  (offsetof(hm_device_plugin_api, get_extension) + sizeof(void*))

/* The last required slot; a table shorter than this is refused. (HM-R4) */
#define HM_DEVICE_PLUGIN_API_MIN_SIZE \
  (offsetof(hm_device_plugin_api, stream_wait_event) + sizeof(void*))

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HETMESH_DEVICE_PLUGIN_H_ */
