// The rocm plugin, wherever it is built. It must load on every machine: without ROCm or an AMD GPU
// (CI: no /dev/kfd) it reports zero devices with the reason in last_error and answers every slot
// with a clean error; with GPUs it describes them. hetmesh-cts covers the devices themselves.
//
// The plugin's HM_WAIT_GEQ relay (plugins/rocm/rocm_geq_relay.hpp, which knows no HIP) is tested
// here too, against a fake runtime whose "stream" is a gate word the test reads.
#include "rocm_geq_relay.hpp"
#include "test_support.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace hetmesh {
namespace {

std::shared_ptr<Plugin> load_rocm() {
  std::string refusal;
  auto plugin = load_plugin_file(test::plugin_path("rocm"), "", &refusal);
  EXPECT_NE(plugin, nullptr) << "the rocm plugin was refused: " << refusal;
  return plugin;
}

bool amd_gpu_node_present() {
  return access("/dev/kfd", F_OK) == 0;
}

bool hip_runtime_present() {
  return dlopen("libamdhip64.so.5", RTLD_LAZY | RTLD_LOCAL) != nullptr ||
         dlopen("libamdhip64.so", RTLD_LAZY | RTLD_LOCAL) != nullptr;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RocmPlugin, LoadsAndNegotiatesTheAbi) {
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  EXPECT_EQ(rocm->name(), "rocm");
  EXPECT_TRUE(contains(rocm->version(), "+hip")) << rocm->version();
  EXPECT_EQ(rocm->api().struct_size, sizeof(hm_device_plugin_api));
  EXPECT_EQ(rocm->api().abi_major, static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MAJOR));
  EXPECT_EQ(rocm->negotiated_abi_minor(), static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MINOR));
  EXPECT_GE(rocm->device_count(), 0);
  // Every optional slot but get_extension is implemented.
  const hm_device_plugin_api& api = rocm->api();
  EXPECT_TRUE(api.shutdown && api.host_register && api.host_unregister && api.stream_add_callback &&
              api.event_elapsed_ms && api.stream_write_value32 && api.stream_wait_value32 &&
              api.ipc_export && api.ipc_open && api.ipc_close && api.dmabuf_export &&
              api.dmabuf_release);
  EXPECT_EQ(api.get_extension, nullptr);
}

TEST(RocmPlugin, WithoutAnAmdGpuReportsZeroDevicesAndWhy) {
  if (amd_gpu_node_present()) GTEST_SKIP() << "this machine has /dev/kfd (an AMD GPU driver)";
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  const hm_device_plugin_api& api = rocm->api();
  EXPECT_EQ(rocm->device_count(), 0);
  int32_t count = -1;
  ASSERT_EQ(api.device_count(&count), HM_OK);
  EXPECT_EQ(count, 0);
  const std::string reason = api.last_error();
  EXPECT_TRUE(contains(reason, "no ROCm")) << "last_error: " << reason;
  if (hip_runtime_present()) {
    EXPECT_TRUE(contains(reason, "hipGetDeviceCount failed with hipErrorNoDevice"))
        << "last_error: " << reason;
    EXPECT_TRUE(contains(reason, "/dev/kfd does not exist")) << "last_error: " << reason;
  } else {
    EXPECT_TRUE(contains(reason, "libamdhip64 not found")) << "last_error: " << reason;
  }
}

// Every slot that takes a device index refuses one that does not exist, naming the slot.
TEST(RocmPlugin, SlotsRefuseADeviceThatDoesNotExist) {
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  const hm_device_plugin_api& api = rocm->api();
  const int32_t count = rocm->device_count();
  for (int32_t device : {count, count + 1, -1, INT32_MAX, INT32_MIN}) {
    SCOPED_TRACE("device " + std::to_string(device));
    auto expect_refused = [&](hm_status status, const char* slot) {
      EXPECT_EQ(status, HM_ERR_INVALID_ARGUMENT) << slot;
      const std::string error = api.last_error();
      EXPECT_TRUE(contains(
          error, std::string(slot) + ": device " + std::to_string(device) + " does not exist"))
          << slot << ": " << error;
    };
    hm_device_properties props{};
    props.struct_size = sizeof props;
    expect_refused(api.device_properties(device, &props), "device_properties");
    void* ptr = nullptr;
    expect_refused(api.mem_alloc(device, 64, HM_MEM_DEVICE, &ptr), "mem_alloc");
    expect_refused(api.mem_alloc(device, 64, HM_MEM_PINNED_HOST, &ptr), "mem_alloc");
    EXPECT_EQ(ptr, nullptr);
    hm_stream stream = nullptr;
    expect_refused(api.stream_create(device, 0, &stream), "stream_create");
    EXPECT_EQ(stream, nullptr);
    hm_event event = nullptr;
    expect_refused(api.event_create(device, 0, &event), "event_create");
    EXPECT_EQ(event, nullptr);
    hm_ipc_handle handle{};
    expect_refused(api.ipc_open(device, &handle, &ptr), "ipc_open");
  }
}

// Slots that take a stream or event refuse NULL; memory slots answer about foreign memory.
TEST(RocmPlugin, SlotsRefuseMissingHandlesAndForeignMemory) {
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  const hm_device_plugin_api& api = rocm->api();
  uint8_t a = 0, b = 0;
  uint32_t word = 0;
  float ms = 0;
  EXPECT_EQ(api.memcpy_async(nullptr, &a, &b, 1), HM_ERR_INVALID_HANDLE);
  EXPECT_TRUE(contains(api.last_error(), "memcpy_async: stream is NULL")) << api.last_error();
  EXPECT_EQ(api.memset_async(nullptr, &a, 0, 1), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_destroy(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_synchronize(nullptr, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_query(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_add_callback(
                nullptr, [](void*) {}, nullptr),
            HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_write_value32(nullptr, &word, 1, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_wait_value32(nullptr, &word, 1, HM_WAIT_GEQ, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_destroy(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_record(nullptr, nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_query(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_TRUE(contains(api.last_error(), "event_query: event is NULL")) << api.last_error();
  EXPECT_EQ(api.event_synchronize(nullptr, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_wait_event(nullptr, nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_elapsed_ms(nullptr, nullptr, &ms), HM_ERR_INVALID_HANDLE);

  EXPECT_EQ(api.mem_free(nullptr), HM_OK);
  EXPECT_EQ(api.mem_free(&a), HM_ERR_INVALID_ARGUMENT);
  std::vector<uint8_t> heap(8192);
  hm_pointer_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(api.pointer_query(heap.data() + 7, &info), HM_OK);
  EXPECT_EQ(info.kind, HM_MEM_UNKNOWN);
  EXPECT_EQ(info.device, -1);
  EXPECT_EQ(info.base, nullptr);
  info.struct_size = sizeof(size_t);
  EXPECT_EQ(api.pointer_query(heap.data(), &info), HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.host_unregister(heap.data()), HM_ERR_INVALID_ARGUMENT);
  hm_ipc_handle handle{};
  EXPECT_EQ(api.ipc_export(heap.data(), &handle), HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.ipc_close(heap.data()), HM_ERR_INVALID_ARGUMENT);
  hm_dmabuf dmabuf{};
  dmabuf.struct_size = sizeof dmabuf;
  EXPECT_EQ(api.dmabuf_export(heap.data(), 4096, &dmabuf), HM_ERR_INVALID_ARGUMENT);
  dmabuf.fd = -1;
  EXPECT_EQ(api.dmabuf_release(&dmabuf), HM_ERR_INVALID_ARGUMENT);
  if (rocm->device_count() == 0) {
    EXPECT_EQ(api.host_register(heap.data(), heap.size()), HM_ERR_NOT_SUPPORTED);
    EXPECT_TRUE(contains(api.last_error(), "host_register: no device to register memory with"))
        << api.last_error();
  }
}

TEST(RocmPlugin, RegistryListsItWithoutDevices) {
  if (amd_gpu_node_present()) GTEST_SKIP() << "this machine has /dev/kfd (an AMD GPU driver)";
  PluginLoadOptions options;
  options.explicit_paths = {test::plugin_path("rocm")};
  options.search = false;
  PluginRegistry registry = PluginRegistry::load(options);
  ASSERT_EQ(registry.plugins().size(), 1u)
      << (registry.refused().empty() ? "" : registry.refused()[0].reason);
  EXPECT_EQ(registry.plugins()[0]->name(), "rocm");
  EXPECT_TRUE(registry.devices().empty());
  EXPECT_THROW(registry.device("rocm:0"), Error);
}

// Loading and initialize() in a throwaway process (hetmesh-plugin-probe, as isolated loading and
// hetmesh-cts do it) neither hang nor crash. The probe's stderr is shown on failure: under the
// sanitizers it holds their report.
TEST(RocmPlugin, InitializesInAnIsolatedProbe) {
  ProcessResult r = run_process({test::probe_path(), test::plugin_path("rocm")},
                                std::chrono::milliseconds(30000));
  EXPECT_FALSE(r.timed_out) << "the probe hung";
  EXPECT_EQ(r.signal, 0) << r.describe() << "\n" << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.describe() << "; stdout: " << r.out << "\n" << r.err;
  EXPECT_EQ(r.out, "ok rocm\n") << r.err;
}

TEST(RocmPlugin, DescribesEachGpu) {
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  int32_t count = 0;
  ASSERT_EQ(rocm->api().device_count(&count), HM_OK);
  if (count == 0) GTEST_SKIP() << "no AMD GPU here: " << rocm->api().last_error();
  for (int32_t i = 0; i < rocm->device_count(); ++i) {
    Device device(rocm, i);
    const hm_device_properties& p = device.properties();
    EXPECT_STREQ(p.vendor, "AMD");
    EXPECT_EQ(p.dlpack_device_type, HM_DLPACK_ROCM);
    EXPECT_GT(p.total_memory, 0u);
    EXPECT_EQ(p.memory_alignment, 256u);
    EXPECT_TRUE(device.has(HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_HOST_CALLBACK |
                           HM_CAP_EVENT_TIMING | HM_CAP_IPC));
    EXPECT_FALSE(device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY));
    EXPECT_NE(p.pci_bus_id[0], '\0');
  }
}

// ---- the HM_WAIT_GEQ relay ----

using hm::rocm::cyclic_geq;
using hm::rocm::CyclicWaitRelay;

TEST(RocmCyclicWait, GeqIsCyclicAsTheAbiDefinesIt) {
  EXPECT_TRUE(cyclic_geq(5, 5));
  EXPECT_TRUE(cyclic_geq(6, 5));
  EXPECT_FALSE(cyclic_geq(4, 5));
  EXPECT_TRUE(cyclic_geq(1, 0xfffffffe));  // wrapped past 2^32: after
  EXPECT_FALSE(cyclic_geq(0xfffffffd, 0xfffffffe));
  EXPECT_FALSE(cyclic_geq(0xfffffff0, 5));  // just before the wrap: still behind 5
  EXPECT_TRUE(cyclic_geq(5 + 0x7fffffffu, 5));
  EXPECT_FALSE(cyclic_geq(5 + 0x80000000u, 5));
}

// A runtime without a GPU: gates in host memory, and a "stream wait" that only records the ticket
// the stream would wait for. Device words live in `device_memory`.
class FakeBackend final : public CyclicWaitRelay::Backend {
 public:
  void* allocate_gates(size_t bytes) override {
    void* chunk = std::aligned_alloc(64, bytes);
    std::memset(chunk, 0, bytes);
    ++chunks_allocated;
    return chunk;
  }
  void free_gates(void* chunk) override { std::free(chunk); }
  void wait_for_ticket(void*, uint64_t*, uint64_t ticket) override {
    if (fail_next_wait.exchange(false)) throw std::runtime_error("stream wait refused");
    last_ticket = ticket;
  }
  bool read_device_word(const CyclicWaitRelay::Word& word, uint32_t* value) override {
    *value = std::atomic_ref<const uint32_t>(*word.address).load();
    ++device_reads;
    return true;
  }

  std::atomic<uint64_t> last_ticket{0};
  std::atomic<bool> fail_next_wait{false};
  std::atomic<int> device_reads{0};
  int chunks_allocated = 0;
};

struct Relay {
  FakeBackend* backend = new FakeBackend;
  CyclicWaitRelay relay{std::unique_ptr<CyclicWaitRelay::Backend>(backend)};

  // Enqueues a wait and returns the ticket the stream waits for.
  uint64_t wait(uint64_t* gate, const uint32_t* word, uint32_t value, bool host = true) {
    relay.enqueue(nullptr, gate, CyclicWaitRelay::Word{word, 0, host}, value);
    return backend->last_ticket.load();
  }
};

bool is_open(const uint64_t* gate, uint64_t ticket) {
  return std::atomic_ref<const uint64_t>(*gate).load(std::memory_order_acquire) >= ticket;
}

// True once the gate opens for `ticket`, false if it stays closed for `within`.
bool opens(const uint64_t* gate, uint64_t ticket, std::chrono::milliseconds within) {
  auto deadline = std::chrono::steady_clock::now() + within;
  while (!is_open(gate, ticket)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

void store(uint32_t* word, uint32_t value) {
  std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release);
}

constexpr std::chrono::milliseconds kStaysClosed{30};
constexpr std::chrono::milliseconds kOpensWithin{10000};  // a hang guard, not a latency bound

TEST(RocmCyclicWait, OpensOnceTheWordPassesTheValueAcrossTheWrap) {
  Relay r;
  uint32_t word = 0xfffffffd;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 0xfffffffe);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed)) << "opened while the word was behind";
  store(&word, 1);  // unsigned 1 < 0xfffffffe, but cyclically after it
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
}

TEST(RocmCyclicWait, ABehindWordNearTheWrapKeepsTheGateClosed) {
  Relay r;
  uint32_t word = 0xfffffff0;  // unsigned >= 5, cyclically 21 behind it
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 5);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed));
  store(&word, 5);
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
}

TEST(RocmCyclicWait, AStreamsWaitsOpenInOrder) {
  Relay r;
  uint32_t first = 0, second = 0;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t t1 = r.wait(gate, &first, 1);
  uint64_t t2 = r.wait(gate, &second, 1);
  ASSERT_GT(t2, t1);
  store(&second, 1);  // the later wait's condition alone opens nothing
  EXPECT_FALSE(opens(gate, t1, kStaysClosed));
  store(&first, 1);
  EXPECT_TRUE(opens(gate, t2, kOpensWithin));
}

TEST(RocmCyclicWait, StreamsHaveIndependentGates) {
  Relay r;
  uint32_t a = 0, b = 0;
  uint64_t* gate_a = r.relay.acquire_gate();
  uint64_t* gate_b = r.relay.acquire_gate();
  ASSERT_NE(gate_a, gate_b);
  uint64_t ta = r.wait(gate_a, &a, 3);
  uint64_t tb = r.wait(gate_b, &b, 3);
  store(&b, 3);
  EXPECT_TRUE(opens(gate_b, tb, kOpensWithin));
  EXPECT_FALSE(is_open(gate_a, ta));
  store(&a, 4);
  EXPECT_TRUE(opens(gate_a, ta, kOpensWithin));
}

TEST(RocmCyclicWait, DeviceWordsAreReadThroughTheBackend) {
  Relay r;
  uint32_t device_word = 0;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &device_word, 2, /*host=*/false);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed));
  store(&device_word, 2);
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
  EXPECT_GT(r.backend->device_reads.load(), 0);
}

TEST(RocmCyclicWait, AReleasedGateIsReusedOnlyAfterItsWaitsOpen) {
  Relay r;
  uint32_t word = 0;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 1);
  r.relay.release_gate(gate);  // the stream is destroyed with a wait pending
  std::vector<uint64_t*> others;
  for (size_t i = 1; i < CyclicWaitRelay::kGateChunkBytes / sizeof(uint64_t); ++i)
    others.push_back(r.relay.acquire_gate());
  for (uint64_t* other : others)
    EXPECT_NE(other, gate);
  EXPECT_EQ(r.backend->chunks_allocated, 1);
  store(&word, 1);
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
  EXPECT_EQ(r.relay.acquire_gate(), gate) << "the drained gate went back to the pool";
  EXPECT_EQ(r.backend->chunks_allocated, 1);
}

TEST(RocmCyclicWait, ARefusedStreamWaitLeavesNothingPending) {
  Relay r;
  uint32_t word = 0;
  uint64_t* gate = r.relay.acquire_gate();
  r.backend->fail_next_wait = true;
  EXPECT_THROW(r.relay.enqueue(nullptr, gate, CyclicWaitRelay::Word{&word, 0, true}, 1),
               std::runtime_error);
  r.relay.release_gate(gate);
  EXPECT_EQ(r.relay.acquire_gate(), gate) << "a gate without pending waits is free at once";
}

}  // namespace
}  // namespace hetmesh
