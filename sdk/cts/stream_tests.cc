// Streams, events, host callbacks and stream memory operations.
#include "cts.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

namespace hetmesh::cts {
namespace {

// A 32-bit flag in pinned memory the host can set: the way tests hold a stream back.
struct HostFlag {
  Buffer memory;
  volatile uint32_t* word;
  explicit HostFlag(const Device& device)
      : memory(device.allocate(4096, MemoryKind::pinned_host)),
        word(static_cast<volatile uint32_t*>(memory.data())) {
    *word = 0;
  }
  void set(uint32_t value) {
    std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word)).store(value, std::memory_order_release);
  }
  void* address() const { return memory.data(); }
};

constexpr hm_capabilities kMemops = HM_CAP_STREAM_MEMOPS | HM_CAP_PINNED_HOST_MEMORY;

TEST_P(DeviceTest, StreamLifecycle) {
  HM_RULE("HM-R27");
  hm_stream stream = nullptr;
  HM_ASSERT_OK(device(), api().stream_create(index(), HM_STREAM_NON_BLOCKING, &stream));
  ASSERT_NE(stream, nullptr);
  HM_EXPECT_STATUS(device(), HM_OK, api().stream_query(stream));
  HM_EXPECT_STATUS(device(), HM_OK, api().stream_synchronize(stream, 0));
  HM_EXPECT_STATUS(device(), HM_OK, api().stream_destroy(stream));
}

TEST_P(DeviceTest, StreamRejectsBadArguments) {
  HM_RULE("HM-R12");
  hm_stream stream = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().stream_create(index(), 0x80, &stream));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().stream_create(index(), 0, nullptr));
  HM_RULE("HM-R13");
  uint8_t a = 0, b = 0;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().memcpy_async(nullptr, &a, &b, 1));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().stream_synchronize(nullptr, 0));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().stream_query(nullptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().event_query(nullptr));
  HM_RULE("HM-R12");
  hm_event event = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().event_create(index(), 0x80, &event));
}

TEST_P(DeviceTest, StreamExecutesInOrder) {
  HM_RULE("HM-R27");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  Stream stream = device().create_stream();
  const uint64_t size = 1 << 16;
  Buffer chain[4] = {device().allocate(size), device().allocate(size), device().allocate(size),
                     device().allocate(size)};
  auto* host = static_cast<uint8_t*>(host_buffer(size));
  auto* out = static_cast<uint8_t*>(host_buffer(size));
  fill_pattern(host, size, 42);
  stream.copy(chain[0].data(), host, size);
  for (int i = 1; i < 4; ++i)
    stream.copy(chain[i].data(), chain[i - 1].data(), size);
  stream.copy(out, chain[3].data(), size);
  stream.synchronize();
  EXPECT_EQ(find_mismatch(out, size, 42), -1);
}

TEST_P(DeviceTest, EventNeverRecordedIsComplete) {
  HM_RULE("HM-R29");
  Event event = device().create_event();
  HM_EXPECT_STATUS(device(), HM_OK, api().event_query(event.native()));
  HM_EXPECT_STATUS(device(), HM_OK, api().event_synchronize(event.native(), 0));
}

TEST_P(DeviceTest, EventCompletesAfterRecordedWork) {
  HM_RULE("HM-R29");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  Stream stream = device().create_stream();
  Event event = device().create_event();
  const uint64_t size = 4 << 20;
  Buffer buffer = device().allocate(size);
  auto* host = static_cast<uint8_t*>(host_buffer(size));
  stream.fill(buffer.data(), 0x3c, size);
  stream.copy(host, buffer.data(), size);
  HM_ASSERT_OK(device(), api().event_record(event.native(), stream.native()));
  HM_ASSERT_OK(device(), api().event_synchronize(event.native(), HM_TIMEOUT_INFINITE));
  HM_EXPECT_STATUS(device(), HM_OK, api().event_query(event.native()));
  EXPECT_EQ(host[size - 1], 0x3c) << "event completed before the work it captured";
}

TEST_P(DeviceTest, EventTimingMeasuresElapsedTime) {
  HM_RULE("HM-R16");
  HM_REQUIRE(HM_CAP_EVENT_TIMING, "event timing");
  ASSERT_NE(api().event_elapsed_ms, nullptr) << "capability set but slot is NULL";
  HM_RULE("HM-R32");
  Stream stream = device().create_stream();
  Event start = device().create_event(), end = device().create_event();
  start.record(stream);
  if (has(HM_CAP_DEVICE_MEMORY)) {
    Buffer buffer = device().allocate(1 << 20);
    stream.fill(buffer.data(), 1, 1 << 20);
    end.record(stream);
    end.synchronize();
  } else {
    end.record(stream);
    end.synchronize();
  }
  float ms = -1;
  HM_ASSERT_OK(device(), api().event_elapsed_ms(start.native(), end.native(), &ms));
  EXPECT_GE(ms, 0.0f);
}

// Elapsed time between events of which one is still pending is HM_ERR_NOT_READY, not a number.
TEST_P(DeviceTest, EventTimingOfAPendingEventIsNotReady) {
  HM_RULE("HM-R32");
  HM_REQUIRE(HM_CAP_EVENT_TIMING | kMemops, "event timing and stream memory operations");
  if (api().event_elapsed_ms == nullptr) GTEST_SKIP() << "slot is NULL (a failure of its own)";
  Stream stream = device().create_stream();
  Event start = device().create_event(), end = device().create_event();
  HostFlag flag(device());
  start.record(stream);
  stream.wait_value32(flag.address(), 1, HM_WAIT_EQ);
  end.record(stream);
  float ms = -1;
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_READY,
                   api().event_elapsed_ms(start.native(), end.native(), &ms));
  flag.set(1);
  stream.synchronize();
  HM_EXPECT_STATUS(device(), HM_OK, api().event_elapsed_ms(start.native(), end.native(), &ms));
}

TEST_P(DeviceTest, EventTimingNotSupportedWithoutCapability) {
  HM_RULE("HM-R17");
  if (has(HM_CAP_EVENT_TIMING)) GTEST_SKIP() << "device has event timing";
  if (api().event_elapsed_ms == nullptr) return;
  Stream stream = device().create_stream();
  Event a = device().create_event(), b = device().create_event();
  a.record(stream);
  b.record(stream);
  stream.synchronize();
  float ms = 0;
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                   api().event_elapsed_ms(a.native(), b.native(), &ms));
}

TEST_P(DeviceTest, EventTimingRejectsEventsWithoutTiming) {
  HM_RULE("HM-R32");
  HM_REQUIRE(HM_CAP_EVENT_TIMING, "event timing");
  if (api().event_elapsed_ms == nullptr) GTEST_SKIP() << "slot is NULL (a failure of its own)";
  Stream stream = device().create_stream();
  Event timed = device().create_event(), untimed = device().create_event(HM_EVENT_DISABLE_TIMING);
  timed.record(stream);
  untimed.record(stream);
  stream.synchronize();
  float ms = 0;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().event_elapsed_ms(timed.native(), untimed.native(), &ms));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().event_elapsed_ms(untimed.native(), timed.native(), &ms));
}

// A stream held back on a flag: its event is not ready, a finite wait times out, and setting
// the flag releases everything.
TEST_P(DeviceTest, BlockedStreamReportsNotReadyAndTimesOut) {
  HM_RULE("HM-R28");
  HM_REQUIRE(kMemops, "stream memory operations");
  HostFlag flag(device());
  Stream stream = device().create_stream();
  Event event = device().create_event();
  stream.wait_value32(flag.address(), 1, HM_WAIT_GEQ);
  event.record(stream);
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_READY, api().stream_query(stream.native()));
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_READY, api().event_query(event.native()));
  HM_EXPECT_STATUS(device(), HM_ERR_TIMEOUT, api().event_synchronize(event.native(), 2'000'000));
  HM_EXPECT_STATUS(device(), HM_ERR_TIMEOUT, api().stream_synchronize(stream.native(), 2'000'000));
  flag.set(1);
  HM_EXPECT_STATUS(device(), HM_OK, api().stream_synchronize(stream.native(), HM_TIMEOUT_INFINITE));
  HM_EXPECT_STATUS(device(), HM_OK, api().event_query(event.native()));
}

TEST_P(DeviceTest, StreamWaitEventOrdersAnotherStream) {
  HM_RULE("HM-R30");
  HM_REQUIRE(kMemops, "stream memory operations");
  HostFlag flag(device());
  Stream producer = device().create_stream(), consumer = device().create_stream();
  Event ready = device().create_event(HM_EVENT_DISABLE_TIMING);
  auto* marker = static_cast<uint32_t*>(host_buffer(4096));
  marker[0] = 0;
  producer.wait_value32(flag.address(), 7, HM_WAIT_EQ);
  ready.record(producer);
  consumer.wait(ready);
  consumer.write_value32(marker, 0xfeed);
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_READY, api().stream_query(consumer.native()));
  EXPECT_EQ(std::atomic_ref<uint32_t>(marker[0]).load(), 0u) << "consumer ran before the event";
  flag.set(7);
  consumer.synchronize();
  EXPECT_EQ(std::atomic_ref<uint32_t>(marker[0]).load(), 0xfeedu);
}

TEST_P(DeviceTest, WaitValueConditions) {
  HM_RULE("HM-R35");
  HM_REQUIRE(kMemops, "stream memory operations");
  struct Case {
    hm_wait_condition condition;
    uint32_t value, unsatisfied, satisfied;
  };
  const Case cases[] = {
      {HM_WAIT_GEQ, 5, 4, 6},
      {HM_WAIT_GEQ, 0xfffffffe, 0xfffffffd, 1},  // cyclic: 1 is "after" 0xfffffffe
      {HM_WAIT_EQ, 9, 10, 9},
      {HM_WAIT_AND, 0x10, 0x0f, 0x30},
      {HM_WAIT_NOR, 0xffff0000, 0xffffffff, 0xfffff000},
  };
  for (const Case& c : cases) {
    HostFlag flag(device());
    flag.set(c.unsatisfied);
    auto* marker = static_cast<uint32_t*>(host_buffer(4096));
    marker[0] = 0;
    Stream stream = device().create_stream();
    stream.wait_value32(flag.address(), c.value, c.condition);
    stream.write_value32(marker, 1);
    EXPECT_EQ(api().stream_synchronize(stream.native(), 2'000'000), HM_ERR_TIMEOUT)
        << "condition " << c.condition << " value " << c.value << " passed on " << c.unsatisfied;
    flag.set(c.satisfied);
    stream.synchronize();
    EXPECT_EQ(std::atomic_ref<uint32_t>(marker[0]).load(), 1u);
  }
}

TEST_P(DeviceTest, WriteValueIsOrderedAfterPriorWork) {
  HM_RULE("HM-R34");
  HM_REQUIRE(kMemops | HM_CAP_DEVICE_MEMORY, "stream memory operations");
  const uint64_t size = 8 << 20;
  Buffer buffer = device().allocate(size);
  auto* host = static_cast<uint8_t*>(host_buffer(size + 4096));
  auto* flag = reinterpret_cast<uint32_t*>(host + size);
  *flag = 0;
  Stream stream = device().create_stream();
  stream.fill(buffer.data(), 0x6d, size);
  stream.copy(host, buffer.data(), size);
  stream.write_value32(flag, 1);
  // Poll the flag like a comm thread would: once it is 1, the copied data must be complete.
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // hang guard only
  while (std::atomic_ref<uint32_t>(*flag).load(std::memory_order_acquire) != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the flag was never written";
    std::this_thread::yield();
  }
  EXPECT_EQ(host[size - 1], 0x6d);
  EXPECT_EQ(host[0], 0x6d);
  stream.synchronize();
}

TEST_P(DeviceTest, StreamMemopsRejectMisalignedAddress) {
  HM_RULE("HM-R16");
  HM_REQUIRE(kMemops, "stream memory operations");
  ASSERT_TRUE(api().stream_write_value32 && api().stream_wait_value32)
      << "capability set but slot is NULL";
  HM_RULE("HM-R33");
  HostFlag flag(device());
  Stream stream = device().create_stream();
  HM_EXPECT_STATUS(
      device(), HM_ERR_INVALID_ARGUMENT,
      api().stream_write_value32(stream.native(), static_cast<char*>(flag.address()) + 1, 1, 0));
}

TEST_P(DeviceTest, StreamMemopsNotSupportedWithoutCapability) {
  HM_RULE("HM-R17");
  if (has(HM_CAP_STREAM_MEMOPS)) GTEST_SKIP() << "device has stream memory operations";
  Stream stream = device().create_stream();
  uint32_t word = 0;
  if (api().stream_write_value32 != nullptr)
    HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                     api().stream_write_value32(stream.native(), &word, 1, 0));
  if (api().stream_wait_value32 != nullptr)
    HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                     api().stream_wait_value32(stream.native(), &word, 0, HM_WAIT_GEQ, 0));
}

TEST_P(DeviceTest, HostCallbacksRunInStreamOrder) {
  HM_RULE("HM-R16");
  HM_REQUIRE(HM_CAP_HOST_CALLBACK, "host callbacks");
  ASSERT_NE(api().stream_add_callback, nullptr) << "capability set but slot is NULL";
  HM_RULE("HM-R31");
  struct Log {
    std::mutex mutex;
    std::vector<int> order;
  } log;
  struct Call {
    Log* log;
    int id;
  };
  Call calls[3] = {{&log, 1}, {&log, 2}, {&log, 3}};
  auto record = [](void* user) {
    auto* call = static_cast<Call*>(user);
    std::lock_guard lock(call->log->mutex);
    call->log->order.push_back(call->id);
  };
  Stream stream = device().create_stream();
  for (Call& call : calls)
    HM_ASSERT_OK(device(), api().stream_add_callback(stream.native(), record, &call));
  stream.synchronize();
  EXPECT_EQ(log.order, (std::vector<int>{1, 2, 3}));
  HM_RULE("HM-R12");
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().stream_add_callback(stream.native(), nullptr, nullptr));
}

// A callback waits for the work before it, and the work after it waits for the callback to return
// (a plugin that calls fn at enqueue, or on a thread of its own, breaks both).
TEST_P(DeviceTest, HostCallbackRunsAfterPriorWorkAndHoldsLaterWork) {
  HM_RULE("HM-R31");
  HM_REQUIRE(HM_CAP_HOST_CALLBACK | kMemops, "host callbacks and stream memory operations");
  if (api().stream_add_callback == nullptr) GTEST_SKIP() << "slot is NULL (a failure of its own)";
  struct Gate {
    std::atomic<bool> ran{false}, release{false};
  } gate;
  auto callback = [](void* user) {
    auto* g = static_cast<Gate*>(user);
    g->ran = true;
    while (!g->release)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  HostFlag flag(device());
  auto* marker = static_cast<uint32_t*>(host_buffer(4096));
  marker[0] = 0;
  Stream stream = device().create_stream();
  stream.wait_value32(flag.address(), 1, HM_WAIT_EQ);
  HM_ASSERT_OK(device(), api().stream_add_callback(stream.native(), callback, &gate));
  stream.write_value32(marker, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(gate.ran) << "the callback ran before the work enqueued ahead of it";
  flag.set(1);
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // hang guard only
  while (!gate.ran && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(gate.ran) << "the callback never ran";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(std::atomic_ref<uint32_t>(marker[0]).load(), 0u)
      << "work after the callback ran before the callback returned";
  gate.release = true;
  stream.synchronize();
  EXPECT_EQ(std::atomic_ref<uint32_t>(marker[0]).load(), 1u);
}

TEST_P(DeviceTest, HostCallbacksNotSupportedWithoutCapability) {
  HM_RULE("HM-R17");
  if (has(HM_CAP_HOST_CALLBACK)) GTEST_SKIP() << "device has host callbacks";
  if (api().stream_add_callback == nullptr) return;
  Stream stream = device().create_stream();
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                   api().stream_add_callback(
                       stream.native(), [](void*) {}, nullptr));
}

TEST_P(DeviceTest, StreamAndEventStormFromManyThreads) {
  HM_RULE("HM-R19");
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      try {
        for (int i = 0; i < 50; ++i) {
          Stream stream = device().create_stream();
          Event event = device().create_event(HM_EVENT_DISABLE_TIMING);
          event.record(stream);
          event.synchronize(std::chrono::seconds(30));
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(failures.load(), 0);
}

// A write-value keeps all 32 bits: a plugin that truncates to 16 or 8 passes small values only.
TEST_P(DeviceTest, WriteValueKeepsAll32Bits) {
  HM_RULE("HM-R34");
  HM_REQUIRE(kMemops, "stream memory operations");
  auto* words = static_cast<uint32_t*>(host_buffer(4096));
  Stream stream = device().create_stream();
  const uint32_t values[] = {0xdeadbeefu, 0x80000001u, 0x00010000u, 0xffffffffu};
  for (size_t i = 0; i < 4; ++i) {
    words[i] = 0;
    stream.write_value32(&words[i], values[i]);
  }
  stream.synchronize();
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(std::atomic_ref<uint32_t>(words[i]).load(), values[i]) << "word " << i;
}

// The memory kinds HM-R33 lets a stream memop's word lie in, each as the test allocates it: device
// memory (which the host may be unable to touch: the word is read and set through copies),
// pinned host memory and, with HM_CAP_HOST_REGISTER, registered host memory.
struct MemopWord {
  const char* kind;
  Buffer buffer;
  std::vector<uint8_t> plain;
  std::optional<HostRegistration> registration;
  uint32_t* word = nullptr;
  bool host_readable = true;
};

std::vector<MemopWord> memop_words(const Device& device) {
  std::vector<MemopWord> words;
  if (device.has(HM_CAP_DEVICE_MEMORY)) {
    MemopWord w{"device memory"};
    w.buffer = device.allocate(4096);
    w.word = static_cast<uint32_t*>(w.buffer.data()) + 1;  // not the allocation's first word
    w.host_readable = false;
    words.push_back(std::move(w));
  }
  if (device.has(HM_CAP_PINNED_HOST_MEMORY)) {
    MemopWord w{"pinned host memory"};
    w.buffer = device.allocate(4096, MemoryKind::pinned_host);
    w.word = static_cast<uint32_t*>(w.buffer.data()) + 1;
    words.push_back(std::move(w));
  }
  if (device.has(HM_CAP_HOST_REGISTER)) {
    MemopWord w{"registered host memory"};
    w.plain.resize(3 * 4096);
    auto* page = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(w.plain.data()) + 4095) &
                                            ~uintptr_t{4095});
    w.registration.emplace(device, page, 4096);
    w.word = reinterpret_cast<uint32_t*>(page) + 1;
    words.push_back(std::move(w));
  }
  return words;
}

// The word's value, read in stream order on `stream` (through a copy for memory the host cannot
// read).
uint32_t read_word(const Stream& stream, const MemopWord& w, uint32_t* host) {
  stream.copy(host, w.word, 4);
  stream.synchronize();
  return std::atomic_ref<uint32_t>(*host).load();
}

// stream_write_value32 stores the value into every kind of memory HM-R33 allows, the device's own
// included: a plugin that stores through a device pointer the host cannot dereference crashes here
// (a GPU's device memory: the kit's asic_stub maps none of it for the host), one that writes
// pinned memory only leaves the word unchanged.
TEST_P(DeviceTest, WriteValueLandsInEveryKindOfMemoryItAccepts) {
  HM_RULE("HM-R33");
  HM_REQUIRE(HM_CAP_STREAM_MEMOPS, "stream memory operations");
  auto* host = static_cast<uint32_t*>(host_buffer(4096));
  Stream stream = device().create_stream();
  for (MemopWord& w : memop_words(device())) {
    stream.fill(w.word, 0, 4);
    HM_RULE("HM-R34");
    stream.write_value32(w.word, 0xc0ffee01u);
    EXPECT_EQ(read_word(stream, w, host), 0xc0ffee01u) << w.kind;
  }
}

// stream_wait_value32 holds a stream on a word in every kind of memory HM-R33 allows, and lets it
// go once another stream writes the word (a write the host cannot make into device memory).
TEST_P(DeviceTest, WaitValueHoldsOnEveryKindOfMemoryItAccepts) {
  HM_RULE("HM-R33");
  HM_REQUIRE(kMemops, "stream memory operations");
  auto* host = static_cast<uint32_t*>(host_buffer(4096));
  Stream waiter = device().create_stream();
  Stream writer = device().create_stream();
  for (MemopWord& w : memop_words(device())) {
    writer.fill(w.word, 0, 4);
    writer.synchronize();
    HostFlag marker(device());
    HM_RULE("HM-R35");
    waiter.wait_value32(w.word, 7, HM_WAIT_EQ);
    waiter.write_value32(marker.address(), 1);
    EXPECT_EQ(api().stream_synchronize(waiter.native(), 2'000'000), HM_ERR_TIMEOUT)
        << w.kind << ": the stream passed a wait on a word that is 0";
    writer.write_value32(w.word, 7);
    // A hang guard only: a stream that never sees the word fails here instead of the kit's bound.
    EXPECT_EQ(api().stream_synchronize(waiter.native(), 10'000'000'000), HM_OK)
        << w.kind << ": the stream never saw the word another stream wrote";
    EXPECT_EQ(*marker.word, 1u) << w.kind;
    EXPECT_EQ(read_word(writer, w, host), 7u) << w.kind;
  }
}

// A wait judges the word as the stream finds it when it gets there, for every condition: the
// stream's own earlier work (here a write that resets the word) is not overtaken. A plugin that
// judges a wait on the host as soon as it is enqueued (a relay for a condition its runtime lacks)
// lets the stream through on a value the stream was about to overwrite.
TEST_P(DeviceTest, AWaitJudgesTheWordAsTheStreamFindsIt) {
  HM_RULE("HM-R35");
  HM_REQUIRE(kMemops, "stream memory operations");
  struct Case {
    hm_wait_condition condition;
    const char* name;
    uint32_t value, before, reset, later;  // `before` and `later` satisfy the wait, `reset` not
  };
  const Case cases[] = {{HM_WAIT_GEQ, "GEQ", 5, 5, 1, 6},
                        {HM_WAIT_EQ, "EQ", 5, 5, 1, 5},
                        {HM_WAIT_AND, "AND", 1, 1, 0, 3},
                        {HM_WAIT_NOR, "NOR", 0, 0, 0xffffffffu, 0}};
  for (const Case& c : cases) {
    Stream stream = device().create_stream();
    HostFlag go(device()), word(device()), marker(device());
    word.set(c.before);
    stream.wait_value32(go.address(), 1, HM_WAIT_EQ);  // held until the host says go
    stream.write_value32(word.address(), c.reset);     // then the stream's own reset of the word
    stream.wait_value32(word.address(), c.value, c.condition);
    stream.write_value32(marker.address(), 1);
    go.set(1);
    // The stream's reset lands first (else the host's write below could come before it).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);  // a hang guard
    while (std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word.word)).load() != c.reset &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    ASSERT_EQ(*word.word, c.reset) << c.name << ": the stream's write never landed";
    EXPECT_EQ(api().stream_synchronize(stream.native(), 2'000'000), HM_ERR_TIMEOUT)
        << c.name << ": the stream passed a wait on a word its own earlier write had reset";
    EXPECT_EQ(*marker.word, 0u) << c.name;
    word.set(c.later);
    // A hang guard only.
    EXPECT_EQ(api().stream_synchronize(stream.native(), 10'000'000'000), HM_OK)
        << c.name << ": the stream never saw the word satisfy the wait";
    EXPECT_EQ(*marker.word, 1u) << c.name;
  }
}

// An event recorded again captures the new work: a plugin that keeps the first record's
// completion reports work as done while it is still blocked.
TEST_P(DeviceTest, EventRecordedAgainCapturesTheNewWork) {
  HM_RULE("HM-R29");
  HM_REQUIRE(kMemops, "stream memory operations (to hold a stream)");
  Stream stream = device().create_stream();
  Event event = device().create_event();
  HM_ASSERT_OK(device(), api().event_record(event.native(), stream.native()));
  HM_ASSERT_OK(device(), api().event_synchronize(event.native(), HM_TIMEOUT_INFINITE));
  HostFlag flag(device());
  flag.set(0);
  stream.wait_value32(flag.address(), 1, HM_WAIT_EQ);  // held until the flag says 1
  HM_ASSERT_OK(device(), api().event_record(event.native(), stream.native()));
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_READY, api().event_query(event.native()));
  HM_EXPECT_STATUS(device(), HM_ERR_TIMEOUT, api().event_synchronize(event.native(), 2'000'000));
  flag.set(1);
  HM_EXPECT_STATUS(device(), HM_OK, api().event_synchronize(event.native(), HM_TIMEOUT_INFINITE));
}

// Every event slot checks its arguments, not only some: a device index out of range, a NULL
// output, a NULL event or stream (a plugin that answered OK here would write or wait on garbage).
TEST_P(DeviceTest, EventSlotsRejectBadArguments) {
  HM_RULE("HM-R12");
  int32_t count = 0;
  HM_ASSERT_OK(device(), api().device_count(&count));
  hm_event event = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().event_create(count + 3, 0, &event));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().event_create(-1, 0, &event));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().event_create(index(), 0, nullptr));
  HM_RULE("HM-R13");
  Stream stream = device().create_stream();
  Event real = device().create_event();
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().event_record(nullptr, stream.native()));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().event_record(real.native(), nullptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().event_synchronize(nullptr, 0));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE,
                   api().stream_wait_event(stream.native(), nullptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE,
                   api().stream_wait_event(nullptr, real.native()));
}

// event_elapsed_ms is in milliseconds: a stream held for about 200 ms between two events reads
// between 50 ms and 20 s, three orders of magnitude around it (a plugin answering in
// microseconds or seconds is off by a thousand). Not a performance check: any machine holds this.
TEST_P(DeviceTest, EventTimingIsInMilliseconds) {
  HM_RULE("HM-R32");
  HM_REQUIRE(HM_CAP_EVENT_TIMING | kMemops, "event timing and stream memory operations");
  Stream stream = device().create_stream();
  Event start = device().create_event(), end = device().create_event();
  HostFlag flag(device());
  flag.set(0);
  HM_ASSERT_OK(device(), api().event_record(start.native(), stream.native()));
  stream.wait_value32(flag.address(), 1, HM_WAIT_EQ);
  HM_ASSERT_OK(device(), api().event_record(end.native(), stream.native()));
  HM_ASSERT_OK(device(), api().event_synchronize(start.native(), HM_TIMEOUT_INFINITE));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  flag.set(1);
  HM_ASSERT_OK(device(), api().event_synchronize(end.native(), HM_TIMEOUT_INFINITE));
  float ms = 0;
  HM_ASSERT_OK(device(), api().event_elapsed_ms(start.native(), end.native(), &ms));
  EXPECT_GE(ms, 50.0f) << "a stream held for 200 ms read " << ms << " ms";
  EXPECT_LE(ms, 20000.0f) << "a stream held for 200 ms read " << ms << " ms";
}

}  // namespace
}  // namespace hetmesh::cts
