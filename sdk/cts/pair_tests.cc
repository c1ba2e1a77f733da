// Every ordered pair of devices, across plugins too: data, ordering and flags must cross between
// them, through host staging where they share nothing else.
#include "cts.hpp"
#include "ipc_peer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace hetmesh::cts {
namespace {

// Host memory both devices can copy to and from: pinned on `owner` when it has it.
Buffer staging_for(const Device& owner, uint64_t size, std::vector<uint8_t>* fallback) {
  if (owner.has(HM_CAP_PINNED_HOST_MEMORY)) return owner.allocate(size, MemoryKind::pinned_host);
  fallback->resize(size);
  return Buffer();
}

void* data_of(Buffer& buffer, std::vector<uint8_t>& fallback) {
  return buffer ? buffer.data() : static_cast<void*>(fallback.data());
}

MemoryKind scratch_kind(const Device& d) {
  return d.has(HM_CAP_DEVICE_MEMORY) ? MemoryKind::device : MemoryKind::pinned_host;
}

TEST_P(PairTest, CopyThroughHostStaging) {
  HM_RULE("HM-R25");
  const uint64_t size = (2 << 20) + 333;
  std::vector<uint8_t> fallback_a, fallback_b;
  Buffer stage_a = staging_for(a(), size, &fallback_a);
  Buffer stage_b = staging_for(b(), size, &fallback_b);
  void* host_a = data_of(stage_a, fallback_a);
  void* host_b = data_of(stage_b, fallback_b);
  Buffer on_a = a().allocate(size, scratch_kind(a()));
  Buffer on_b = b().allocate(size, scratch_kind(b()));
  Stream stream_a = a().create_stream(), stream_b = b().create_stream();

  fill_pattern(host_a, size, 99);
  stream_a.copy(on_a.data(), host_a, size);  // host -> a
  stream_a.synchronize();
  std::memset(host_a, 0, size);
  stream_a.copy(host_a, on_a.data(), size);  // a -> staging
  stream_a.synchronize();
  stream_b.copy(on_b.data(), host_a, size);  // staging -> b
  stream_b.copy(host_b, on_b.data(), size);  // b -> host
  stream_b.synchronize();
  EXPECT_EQ(find_mismatch(host_b, size, 99), -1);
}

// HM_CAP_PEER_COPY: one memcpy_async moves device memory of a straight into device memory of b,
// every byte, and none around it.
TEST_P(PairTest, PeerCopyMovesEveryByteBetweenDevices) {
  HM_RULE("HM-R16");
  if (!same_plugin()) GTEST_SKIP() << "peer copy is between devices of one plugin";
  hm_capabilities need = HM_CAP_PEER_COPY | HM_CAP_DEVICE_MEMORY;
  if (!a().has(need) || !b().has(need)) GTEST_SKIP() << "a device lacks peer copy";
  HM_RULE("HM-R25");
  const uint64_t size = (1 << 20) + 77, guard = 64;
  std::vector<uint8_t> fallback_a, fallback_b;
  Buffer stage_a = staging_for(a(), size, &fallback_a);
  Buffer stage_b = staging_for(b(), size + 2 * guard, &fallback_b);
  auto* host_a = static_cast<uint8_t*>(data_of(stage_a, fallback_a));
  auto* host_b = static_cast<uint8_t*>(data_of(stage_b, fallback_b));
  Buffer on_a = a().allocate(size), on_b = b().allocate(size + 2 * guard);
  Stream stream_a = a().create_stream(), stream_b = b().create_stream();
  fill_pattern(host_a, size, 31);
  stream_a.copy(on_a.data(), host_a, size);
  stream_b.fill(on_b.data(), 0x5e, size + 2 * guard);
  stream_b.synchronize();
  stream_a.copy(static_cast<uint8_t*>(on_b.data()) + guard, on_a.data(), size);  // the peer copy
  stream_a.synchronize();
  stream_b.copy(host_b, on_b.data(), size + 2 * guard);
  stream_b.synchronize();
  EXPECT_EQ(find_mismatch(host_b + guard, size, 31), -1) << "the peer copy's bytes differ";
  for (uint64_t i = 0; i < guard; ++i) {
    ASSERT_EQ(host_b[i], 0x5e) << "the peer copy wrote before its destination";
    ASSERT_EQ(host_b[guard + size + i], 0x5e) << "the peer copy wrote past its destination";
  }
}

TEST_P(PairTest, IpcBetweenDevicesOfOnePlugin) {
  HM_RULE("HM-R37");
  if (!same_plugin()) GTEST_SKIP() << "IPC handles are plugin-specific";
  hm_capabilities need = HM_CAP_IPC | HM_CAP_DEVICE_MEMORY;
  if (!a().has(need) || !b().has(need)) GTEST_SKIP() << "a device lacks IPC";
  expect_ipc_round_trip(a(), b());
}

// Work on b must not start before an event on a. Within one plugin the stream waits on the event;
// across plugins the host waits on it, the only ordering two drivers share.
TEST_P(PairTest, EventOnOneDeviceOrdersWorkOnAnother) {
  HM_RULE("HM-R30");
  if (!a().has(HM_CAP_STREAM_MEMOPS | HM_CAP_PINNED_HOST_MEMORY))
    GTEST_SKIP() << a().selector() << " cannot hold a stream back (no stream memops)";
  Buffer gate = a().allocate(4096, MemoryKind::pinned_host);
  auto* gate_word = static_cast<uint32_t*>(gate.data());
  *gate_word = 0;
  const uint64_t size = 1 << 20;
  std::vector<uint8_t> fallback;
  Buffer result_stage = staging_for(b(), size, &fallback);
  auto* result = static_cast<uint8_t*>(data_of(result_stage, fallback));
  std::vector<uint8_t> source(size);
  fill_pattern(source.data(), size, 5);
  std::memset(result, 0, size);
  Buffer on_b = b().allocate(size, scratch_kind(b()));

  Stream stream_a = a().create_stream(), stream_b = b().create_stream();
  Event done_on_a = a().create_event(HM_EVENT_DISABLE_TIMING);
  stream_a.wait_value32(gate_word, 1, HM_WAIT_GEQ);
  done_on_a.record(stream_a);
  EXPECT_FALSE(done_on_a.ready());
  if (same_plugin()) {
    stream_b.wait(done_on_a);
    stream_b.copy(on_b.data(), source.data(), size);
    stream_b.copy(result, on_b.data(), size);
    // Long enough for b's copies to finish, had they not waited.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(stream_b.ready()) << "b's work did not wait for a's event";
    EXPECT_EQ(std::count(result, result + size, 0), static_cast<std::ptrdiff_t>(size))
        << "b's copy wrote its result before a's event completed";
    std::atomic_ref<uint32_t>(*gate_word).store(1);
    stream_b.synchronize(std::chrono::seconds(60));
  } else {
    EXPECT_THROW(done_on_a.synchronize(std::chrono::milliseconds(2)), Error);
    std::atomic_ref<uint32_t>(*gate_word).store(1);
    done_on_a.synchronize(std::chrono::seconds(60));
    stream_b.copy(on_b.data(), source.data(), size);
    stream_b.copy(result, on_b.data(), size);
    stream_b.synchronize(std::chrono::seconds(60));
  }
  EXPECT_EQ(find_mismatch(result, size, 5), -1);
}

// a's stream writes a flag that b's stream waits on. Within a plugin the flag lives in a's pinned
// memory; across plugins it must be memory b knows too, so b registers a's pinned page.
TEST_P(PairTest, StreamFlagWriteAndWaitBetweenDevices) {
  HM_RULE("HM-R35");
  const hm_capabilities memops = HM_CAP_STREAM_MEMOPS | HM_CAP_PINNED_HOST_MEMORY;
  if (!a().has(memops) || !b().has(memops)) GTEST_SKIP() << "a device lacks stream memops";
  if (!same_plugin() && !b().has(HM_CAP_HOST_REGISTER))
    GTEST_SKIP() << b().selector() << " cannot register " << a().selector() << "'s memory";
  Buffer flag_page = a().allocate(4096, MemoryKind::pinned_host);
  auto* flag = static_cast<uint32_t*>(flag_page.data());
  *flag = 0;
  bool registered = false;
  if (!same_plugin()) {
    HM_RULE("HM-R16");
    ASSERT_NE(b().api().host_register, nullptr) << "capability set but slot is NULL";
    HM_RULE("HM-R26");
    ASSERT_EQ(b().api().host_register(flag_page.data(), 4096), HM_OK) << b().api().last_error();
    registered = true;
    HM_RULE("HM-R35");
  }
  Buffer marker_page = b().allocate(4096, MemoryKind::pinned_host);
  auto* marker = static_cast<uint32_t*>(marker_page.data());
  *marker = 0;
  Buffer gate_page = a().allocate(4096, MemoryKind::pinned_host);
  auto* gate = static_cast<uint32_t*>(gate_page.data());
  *gate = 0;

  Stream stream_a = a().create_stream(), stream_b = b().create_stream();
  stream_b.wait_value32(flag, 42, HM_WAIT_EQ);
  stream_b.write_value32(marker, 1);
  stream_a.wait_value32(gate, 1, HM_WAIT_GEQ);
  stream_a.write_value32(flag, 42);
  EXPECT_FALSE(stream_b.ready());
  EXPECT_EQ(std::atomic_ref<uint32_t>(*marker).load(), 0u);
  std::atomic_ref<uint32_t>(*gate).store(1);
  stream_b.synchronize(std::chrono::seconds(60));
  EXPECT_EQ(std::atomic_ref<uint32_t>(*marker).load(), 1u);
  stream_a.synchronize(std::chrono::seconds(60));
  if (registered) {
    EXPECT_EQ(b().api().host_unregister(flag_page.data()), HM_OK);
  }
}

TEST_P(PairTest, AllocFreeStormOnBothDevices) {
  HM_RULE("HM-R19");
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const Device& d = t % 2 == 0 ? a() : b();
      try {
        for (int i = 0; i < 60; ++i) {
          uint64_t size = 1 + static_cast<uint64_t>((t * 131 + i * 4099) % 100000);
          Buffer buffer = d.allocate(size, scratch_kind(d));
          if (d.query(buffer.data()).base != buffer.data()) ++failures;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << d.selector() << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(failures.load(), 0);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PairTest);
INSTANTIATE_TEST_SUITE_P(Pair, PairTest, testing::ValuesIn(pair_params()), pair_name);

}  // namespace
}  // namespace hetmesh::cts
