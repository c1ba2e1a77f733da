/*
 * hetmesh device-plugin ABI, version 1.
 *
 * A device plugin is a shared object named libhetmesh-device-<name>.so that exports exactly one
 * symbol, hm_device_plugin_v1 (HM_DEVICE_PLUGIN_ENTRY_V1). It returns a function table. The core
 * supplies networking, protocol and scheduling; a plugin supplies memory, streams and events for
 * one kind of accelerator.
 *
 * Rules that hold for the whole header:
 *
 *  - C99, no C++ types. No exception, longjmp or abort() ever crosses this boundary: a plugin
 *    reports every failure as an hm_status and never terminates the host process.
 *  - Every call returns an hm_status. On failure the plugin stores a human-readable message that
 *    last_error() returns on the same thread (thread-local), naming the call and the cause.
 *  - Versioning. The table and every argument struct begin with `size_t struct_size`. New table
 *    slots and new struct fields are only ever appended. A table slot at an offset past the
 *    plugin's struct_size is absent. A callee accepts any argument struct whose struct_size is at
 *    least the size it was compiled with (HM_*_SIZE_V1), and fills or reads only what it knows.
 *    The major version changes only if something is removed, reordered or retyped; the host then
 *    refuses the plugin. The effective minor is min(host minor, plugin minor).
 *  - Two-step start. hm_device_plugin_v1() must be cheap and side-effect free: it must not start a
 *    driver, spawn threads or allocate device resources. The host calls initialize() at most once,
 *    before any other slot except last_error. Enumerating plugins therefore never wakes a GPU.
 *  - Optional operations are gated by capability bits (hm_capability). An optional slot is either
 *    NULL or returns HM_ERR_NOT_SUPPORTED for devices whose capability bit is clear. A set bit is a
 *    promise that the operation works; the conformance kit (hetmesh-cts) checks both directions.
 *  - Thread safety. Unless a function says otherwise, every slot may be called concurrently from
 *    any thread. Operations on one stream are ordered by the stream, not by the caller's thread.
 *  - Ownership. Handles (hm_stream, hm_event) and allocations belong to the caller from the call
 *    that creates them until the call that destroys them. The host never dlclose()s a plugin.
 */
#ifndef HETMESH_DEVICE_PLUGIN_H_
#define HETMESH_DEVICE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HM_DEVICE_PLUGIN_ABI_MAJOR 1
/* Minor 1 added HM_MEM_IPC_MAPPED_HOST. */
#define HM_DEVICE_PLUGIN_ABI_MINOR 1

/* The one exported symbol of a v1 plugin; a future v2 plugin may export both. */
#define HM_DEVICE_PLUGIN_ENTRY_V1 "hm_device_plugin_v1"

/* File name pattern the loader searches for: libhetmesh-device-<name>.so */
#define HM_DEVICE_PLUGIN_PREFIX "libhetmesh-device-"

#if defined(__GNUC__)
#define HM_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define HM_PLUGIN_EXPORT
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes. Values are stable forever; new codes are appended.                            */
/* ------------------------------------------------------------------------------------------ */
typedef int32_t hm_status;
enum {
  HM_OK = 0,
  HM_ERR_INVALID_ARGUMENT = 1, /* a bad pointer, size, flag, index or struct_size */
  HM_ERR_NOT_SUPPORTED = 2,    /* the device lacks the capability, or the slot is optional */
  HM_ERR_OUT_OF_MEMORY = 3,    /* device or host memory exhausted */
  HM_ERR_DEVICE_LOST = 4,      /* the device or driver failed; the device is unusable */
  HM_ERR_NOT_READY = 5,        /* query: the work has not completed yet (not a failure) */
  HM_ERR_TIMEOUT = 6,          /* a wait with a finite timeout expired */
  HM_ERR_INVALID_HANDLE = 7,   /* a stream, event or pointer this plugin does not own */
  HM_ERR_UNINITIALIZED = 8,    /* called before initialize() succeeded */
  HM_ERR_BACKEND = 9,          /* the vendor runtime returned an error; see last_error */
  HM_ERR_INTERNAL = 10         /* a bug in the plugin */
};

/* ------------------------------------------------------------------------------------------ */
/* Capabilities, one mask per device (hm_device_properties.capabilities).                     */
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
 * Without this bit the host must never dereference device memory (it may crash). */
#define HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY (1ull << 8)
/* memcpy_async between two devices of this plugin (peer copy) works without host staging. */
#define HM_CAP_PEER_COPY (1ull << 9)

/* DLPack device type codes (dlpack.h DLDeviceType), so tensors can later cross into frameworks. */
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
 */
typedef struct hm_stream_s* hm_stream;
typedef struct hm_event_s* hm_event;

/* ------------------------------------------------------------------------------------------ */
/* Host services handed to initialize().                                                      */
/* ------------------------------------------------------------------------------------------ */
enum { HM_LOG_ERROR = 0, HM_LOG_WARN = 1, HM_LOG_INFO = 2, HM_LOG_DEBUG = 3 };

typedef struct hm_host_api {
  size_t struct_size; /* HM_HOST_API_SIZE_V1 or larger */
  uint32_t abi_major; /* the host's ABI version */
  uint32_t abi_minor;
  /* Log sink. Thread-safe; may be called from any plugin thread until the process exits.
   * `message` is copied before the call returns. */
  void (*log)(void* log_context, int32_t level, const char* message);
  void* log_context;
  /* Plugin options from the host's config as "key=value" pairs separated by ';' (NULL or "" when
   * none). Valid only during initialize(); copy what you keep. Unknown keys should fail
   * initialize() with HM_ERR_INVALID_ARGUMENT naming the key. */
  const char* options;
} hm_host_api;
#define HM_HOST_API_SIZE_V1 (offsetof(hm_host_api, options) + sizeof(const char*))

/* ------------------------------------------------------------------------------------------ */
/* Devices.                                                                                   */
/* ------------------------------------------------------------------------------------------ */
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
   * Reported only to a host of minor >= 1; older hosts get HM_MEM_IPC_MAPPED. */
  HM_MEM_IPC_MAPPED_HOST = 5
} hm_memory_kind;

typedef struct hm_pointer_info {
  size_t struct_size; /* set by the caller: HM_POINTER_INFO_SIZE_V1 or larger */
  int32_t kind;       /* hm_memory_kind */
  int32_t device;     /* owning device index, -1 for HM_MEM_UNKNOWN */
  void* base;         /* start of the allocation that contains the pointer */
  uint64_t size;      /* size of that allocation in bytes */
} hm_pointer_info;
#define HM_POINTER_INFO_SIZE_V1 (offsetof(hm_pointer_info, size) + sizeof(uint64_t))

/* Opaque IPC handle: plain bytes that may be sent to another process on the same host. */
#define HM_IPC_HANDLE_BYTES 128
typedef struct hm_ipc_handle {
  uint8_t bytes[HM_IPC_HANDLE_BYTES];
} hm_ipc_handle;

/* A dma-buf for a device range: the importer (e.g. ibv_reg_dmabuf_mr) maps [offset, offset+length)
 * of fd. The fd is owned by the plugin until dmabuf_release(). */
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
#define HM_EVENT_DISABLE_TIMING 1u /* cheaper; event_elapsed_ms is then invalid */

#define HM_TIMEOUT_INFINITE UINT64_MAX

/* stream_wait_value32 conditions, as CUDA's CU_STREAM_WAIT_VALUE_* and HIP's hipStreamWait*. */
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
  size_t struct_size;  /* sizeof(hm_device_plugin_api) the plugin was built with */
  uint32_t abi_major;  /* HM_DEVICE_PLUGIN_ABI_MAJOR */
  uint32_t abi_minor;  /* HM_DEVICE_PLUGIN_ABI_MINOR */
  const char* name;    /* short name used in selectors ("cpu" in "cpu:0"): [a-z0-9_]+ */
  const char* version; /* the plugin's own version, free text (e.g. "1.2.0+cuda13.0") */

  /* ---- lifecycle (required) ---- */

  /* Start the plugin: load the driver, count devices. Called at most once, before every other slot
   * except last_error. `host` stays valid until the process exits. A plugin with zero devices
   * (no GPU present) should succeed and report device_count 0; last_error may then explain why. */
  hm_status (*initialize)(const hm_host_api* host);

  /* The calling thread's last error message, or "" if none. Never NULL. The string stays valid
   * until the next call into the plugin on this thread. Callable before initialize(). */
  const char* (*last_error)(void);

  /* ---- devices (required) ---- */

  hm_status (*device_count)(int32_t* count);
  /* Fill `props` (whose struct_size the caller sets). */
  hm_status (*device_properties)(int32_t device, hm_device_properties* props);

  /* ---- memory (required) ---- */

  /* Allocate `size` > 0 bytes of `kind` (HM_MEM_DEVICE or HM_MEM_PINNED_HOST) on `device`; the
   * result is aligned to memory_alignment. Gated by HM_CAP_DEVICE_MEMORY / _PINNED_HOST_MEMORY.
   * The caller owns the memory until mem_free. */
  hm_status (*mem_alloc)(int32_t device, uint64_t size, int32_t kind, void** ptr);
  /* Free memory from mem_alloc. The caller ensures no stream still uses it. NULL is a no-op. */
  hm_status (*mem_free)(void* ptr);

  /* Describe any pointer, including one inside a larger allocation. A pointer this plugin does
   * not own gives HM_OK with kind HM_MEM_UNKNOWN and device -1: that is an answer, not an error. */
  hm_status (*pointer_query)(const void* ptr, hm_pointer_info* info);

  /* Copy `size` bytes on `stream`, in any direction: each side may be device memory of any
   * device of this plugin (peer needs HM_CAP_PEER_COPY), pinned or registered host memory, or
   * plain host memory. Returns once enqueued; the copy completes in stream order. The caller keeps
   * both buffers alive and unchanged until then. size 0 is a no-op. */
  hm_status (*memcpy_async)(hm_stream stream, void* dst, const void* src, uint64_t size);
  /* Set `size` bytes at dst to (uint8_t)value, in stream order. */
  hm_status (*memset_async)(hm_stream stream, void* dst, int32_t value, uint64_t size);

  /* ---- streams (required) ---- */

  hm_status (*stream_create)(int32_t device, uint32_t flags, hm_stream* stream);
  /* Destroy after the stream's pending work completes. Do not use the handle afterwards. */
  hm_status (*stream_destroy)(hm_stream stream);
  /* Block until all work enqueued so far on `stream` completes, or `timeout_ns` elapses
   * (HM_ERR_TIMEOUT; the work continues). HM_TIMEOUT_INFINITE waits forever. */
  hm_status (*stream_synchronize)(hm_stream stream, uint64_t timeout_ns);
  /* HM_OK when all work enqueued so far has completed, else HM_ERR_NOT_READY. Non-blocking. */
  hm_status (*stream_query)(hm_stream stream);

  /* ---- events (required) ---- */

  hm_status (*event_create)(int32_t device, uint32_t flags, hm_event* event);
  hm_status (*event_destroy)(hm_event event);
  /* Capture the work enqueued so far on `stream`; the event completes when that work does.
   * Re-recording replaces the previous capture. An event never recorded counts as complete. */
  hm_status (*event_record)(hm_event event, hm_stream stream);
  /* HM_OK if complete, HM_ERR_NOT_READY if not. Non-blocking. */
  hm_status (*event_query)(hm_event event);
  /* Block until complete or timeout_ns (HM_ERR_TIMEOUT). */
  hm_status (*event_synchronize)(hm_event event, uint64_t timeout_ns);
  /* Work enqueued on `stream` after this call waits for the event's current capture. The event
   * may belong to another device of the same plugin. Returns without blocking the host. */
  hm_status (*stream_wait_event)(hm_stream stream, hm_event event);

  /* ---- optional operations (NULL or HM_ERR_NOT_SUPPORTED when the capability is clear) ---- */

  /* Release plugin resources at process exit. After it returns, only last_error may be called.
   * Optional; the host calls it at most once, after destroying everything it created. */
  hm_status (*shutdown)(void);

  /* HM_CAP_HOST_REGISTER: page-lock existing host memory for fast copies and device access. The
   * caller keeps the memory mapped until host_unregister. */
  hm_status (*host_register)(void* ptr, uint64_t size);
  hm_status (*host_unregister)(void* ptr);

  /* HM_CAP_HOST_CALLBACK: run fn(user_data) on a plugin thread once prior work on `stream`
   * completes; later work waits for it to return. fn must not call into this plugin. */
  hm_status (*stream_add_callback)(hm_stream stream, hm_host_fn fn, void* user_data);

  /* HM_CAP_EVENT_TIMING: milliseconds between two completed events recorded without
   * HM_EVENT_DISABLE_TIMING. HM_ERR_NOT_READY if either has not completed. */
  hm_status (*event_elapsed_ms)(hm_event start, hm_event end, float* milliseconds);

  /* HM_CAP_STREAM_MEMOPS: in stream order, store `value` to the 32-bit word at `address` with
   * release semantics (prior work on the stream is visible first). `address` is 4-byte aligned
   * and lies in device, pinned or registered host memory of this plugin. No compute units are
   * used where the hardware allows it. flags: reserved, 0. */
  hm_status (*stream_write_value32)(hm_stream stream, void* address, uint32_t value,
                                    uint32_t flags);
  /* HM_CAP_STREAM_MEMOPS: later work on `stream` waits until the 32-bit word at `address`
   * satisfies `condition` (hm_wait_condition) against `value`. The host is not blocked. Another
   * process, the host, the NIC or another stream may write the word. flags: reserved, 0. */
  hm_status (*stream_wait_value32)(hm_stream stream, const void* address, uint32_t value,
                                   int32_t condition, uint32_t flags);

  /* HM_CAP_IPC: describe the allocation containing `ptr` (device or pinned memory from
   * mem_alloc) as bytes another process on this host can open. The handle stays valid while the
   * exporter keeps the allocation. */
  hm_status (*ipc_export)(void* ptr, hm_ipc_handle* handle);
  /* HM_CAP_IPC: map a peer process's allocation for use by `device`. Returns the mapped base of the
   * whole exported allocation; pointer_query then reports HM_MEM_IPC_MAPPED, or
   * HM_MEM_IPC_MAPPED_HOST where the mapping is also a host pointer. Opening a handle
   * exported by the same process may fail with HM_ERR_NOT_SUPPORTED (CUDA refuses it). */
  hm_status (*ipc_open)(int32_t device, const hm_ipc_handle* handle, void** ptr);
  hm_status (*ipc_close)(void* ptr);

  /* HM_CAP_DMABUF_EXPORT: export [ptr, ptr+size) of device memory as a dma-buf for an RDMA NIC or
   * another driver. ptr and size may need page alignment (HM_ERR_INVALID_ARGUMENT otherwise). The
   * plugin owns out->fd until dmabuf_release(out). */
  hm_status (*dmabuf_export)(const void* ptr, uint64_t size, hm_dmabuf* out);
  hm_status (*dmabuf_release)(const hm_dmabuf* dmabuf);

  /* Look up a named vendor extension, e.g. "hm.asic_stub.launch". On success *table points to a
   * plugin-owned, immutable table valid until exit, which begins with hm_extension_header.
   * HM_ERR_NOT_SUPPORTED if the name is unknown or its version is below min_version. */
  hm_status (*get_extension)(const char* name, uint32_t min_version, const void** table);
} hm_device_plugin_api;

/* Every extension table begins with this header. */
typedef struct hm_extension_header {
  size_t struct_size;
  uint32_t version;
} hm_extension_header;

/* The entry point every v1 plugin exports. Cheap, idempotent, thread-safe; returns a table with
 * static storage duration, or NULL if the plugin cannot serve this ABI at all. */
typedef const hm_device_plugin_api* (*hm_device_plugin_entry_fn)(void);
HM_PLUGIN_EXPORT const hm_device_plugin_api* hm_device_plugin_v1(void);

/* Size of the v1.0 table: slots past it are absent for the host of a v1.0 plugin. */
#define HM_DEVICE_PLUGIN_API_SIZE_V1_0 \
  (offsetof(hm_device_plugin_api, get_extension) + sizeof(void*))

/* The last required slot; a table shorter than this is refused. */
#define HM_DEVICE_PLUGIN_API_MIN_SIZE \
  (offsetof(hm_device_plugin_api, stream_wait_event) + sizeof(void*))

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HETMESH_DEVICE_PLUGIN_H_ */
