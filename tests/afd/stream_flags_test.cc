// The stream flags (afd/stream_flags.hpp) on asic_stub, whose streams are threads and whose device
// memory the host cannot touch: a stream held on a notice until the host raises it; flag waits
// that hold a stream until a host word reaches a value in device memory, their sites taken back
// (many more waits than sites); release() letting every waiting stream go; the refusals.
#include <hetmesh/afd/stream_flags.hpp>
#include <hetmesh/core/plugin.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace hetmesh::afd {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr Timeout kHangGuard = std::chrono::seconds(60);  // only a hung stream reaches it

uint32_t load(const Buffer& word, int i = 0) {
  return std::atomic_ref<uint32_t>(static_cast<uint32_t*>(word.data())[i])
      .load(std::memory_order_acquire);
}

int64_t* int64s(const Buffer& buffer) {
  return static_cast<int64_t*>(buffer.data());
}

// Waits (bounded) until `done` holds; false if it never did.
template <typename Done>
bool eventually(Done done) {
  const auto until = std::chrono::steady_clock::now() + kHangGuard;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

class StreamFlagsTest : public ::testing::Test {
 protected:
  Device device = PluginRegistry::load().device("asic_stub:0");
  Buffer marks = device.allocate(64, MemoryKind::pinned_host);  // what the stream got past
};

TEST_F(StreamFlagsTest, AStreamWaitsOnANoticeUntilTheHostRaisesIt) {
  StreamFlags flags(device, 4);
  Stream stream = device.create_stream();
  const int notice = flags.notice();
  for (uint32_t value = 1; value <= 3; ++value) {
    flags.enqueue_notice_wait(notice, value, stream);
    stream.write_value32(marks.data(), value);
  }
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(load(marks), 0u) << "the stream passed a notice nobody raised";
  flags.raise_notice(notice, 2);  // lets two waits go, not the third
  ASSERT_TRUE(eventually([&] { return load(marks) == 2; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(load(marks), 2u);
  flags.raise_notice(notice, 3);
  stream.synchronize(kHangGuard);
  EXPECT_EQ(load(marks), 3u);
}

// Every wait gets a value of its own in device memory, copied there in stream order; the host
// raises the flag one step at a time and checks that the stream never got past a wait early.
// 200 waits through 4 sites: each is taken back once the stream passed it.
TEST_F(StreamFlagsTest, FlagWaitsHoldTheStreamUntilTheHostWordReachesTheDeviceValue) {
  constexpr int kWaits = 200;
  StreamFlags flags(device, 4);
  Stream stream = device.create_stream();
  Buffer values = device.allocate(8 * kWaits, MemoryKind::pinned_host);
  Buffer seq = device.allocate(8);  // device memory: the host cannot read it
  Buffer flag = device.allocate(8, MemoryKind::pinned_host);
  std::atomic<int> enqueued{0};
  std::thread host([&] {
    for (int i = 1; i <= kWaits; ++i) {
      if (!eventually([&] { return enqueued.load() >= i; })) return;
      if (load(marks) > static_cast<uint32_t>(i - 1)) {
        ADD_FAILURE() << "the stream passed wait " << i << " before the flag reached it";
        return;
      }
      std::atomic_ref<int64_t>(*int64s(flag)).store(i, std::memory_order_release);
      if (!eventually([&] { return load(marks) >= static_cast<uint32_t>(i); })) {
        ADD_FAILURE() << "the stream stayed at wait " << i << " with the flag there";
        return;
      }
    }
  });
  struct Joined {  // the host thread is joined however the test ends (a failed ASSERT too)
    std::thread& thread;
    ~Joined() {
      if (thread.joinable()) thread.join();
    }
  } joined{host};
  for (int i = 1; i <= kWaits; ++i) {
    int64s(values)[i - 1] = i;
    stream.copy(seq.data(), int64s(values) + i - 1, 8);
    ASSERT_TRUE(eventually([&] {  // a free site: the host's pace bounds the waits in flight
      try {
        flags.enqueue_flag_wait(int64s(flag), seq.data(), stream, true);
        return true;
      } catch (const Error& e) {
        return e.status() != HM_ERR_OUT_OF_MEMORY ? throw : false;
      }
    }));
    stream.write_value32(marks.data(), static_cast<uint32_t>(i));
    enqueued.store(i);
  }
  host.join();
  stream.synchronize(kHangGuard);
  EXPECT_EQ(load(marks), static_cast<uint32_t>(kWaits));
}

TEST_F(StreamFlagsTest, ReleaseLetsEveryWaitingStreamGoAndRefusesLaterWaits) {
  StreamFlags flags(device, 4);
  Stream on_notice = device.create_stream();
  Stream on_flag = device.create_stream();
  Buffer seq = device.allocate(8);
  Buffer one = device.allocate(8, MemoryKind::pinned_host);
  Buffer flag = device.allocate(8, MemoryKind::pinned_host);
  *int64s(one) = 1;
  on_flag.copy(seq.data(), one.data(), 8);
  const int notice = flags.notice();
  flags.enqueue_notice_wait(notice, 5, on_notice);
  on_notice.write_value32(marks.data(), 1);
  flags.enqueue_flag_wait(int64s(flag), seq.data(), on_flag, false);
  on_flag.write_value32(static_cast<uint32_t*>(marks.data()) + 1, 1);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(load(marks, 0) + load(marks, 1), 0u) << "a stream passed before anyone let it";
  flags.release();
  on_notice.synchronize(kHangGuard);
  on_flag.synchronize(kHangGuard);
  EXPECT_EQ(load(marks, 0), 1u);
  EXPECT_EQ(load(marks, 1), 1u);
  try {
    flags.enqueue_notice_wait(notice, 6, on_notice);
    ADD_FAILURE() << "a wait after release() was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusClosed);
  }
}

TEST_F(StreamFlagsTest, RefusesWhatItCannotKeep) {
  StreamFlags flags(device, 2);
  Stream stream = device.create_stream();
  Buffer flag = device.allocate(16, MemoryKind::pinned_host);
  Buffer seq = device.allocate(8);
  flags.notice();
  flags.notice();
  try {
    flags.notice();
    ADD_FAILURE() << "a third notice of two was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_OUT_OF_MEMORY);
    EXPECT_THAT(e.what(), HasSubstr("all 2"));
  }
  try {
    flags.enqueue_flag_wait(
        reinterpret_cast<const int64_t*>(static_cast<uint8_t*>(flag.data()) + 4), seq.data(),
        stream, true);
    ADD_FAILURE() << "a misaligned flag was taken";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not 8-byte aligned"));
  }
  // The watcher reads the flag on the host: asic_stub's device memory, which the host cannot
  // touch, and plain heap the plugin does not know, are refused by name.
  Buffer on_device = device.allocate(16);
  const std::vector<int64_t> heap(2);
  for (const int64_t* stray : {static_cast<const int64_t*>(int64s(on_device)), heap.data()}) {
    try {
      flags.enqueue_flag_wait(stray, seq.data(), stream, true);
      ADD_FAILURE() << "a flag the host cannot read was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT);
      EXPECT_THAT(e.what(), HasSubstr("is not host memory that asic_stub:0 writes"));
    }
  }
  // A wait the stream refused gives its site back: the next wait takes it.
  StreamFlags one(device, 1);
  EXPECT_THROW(one.enqueue_flag_wait(int64s(flag), nullptr, stream, true), Error);
  int64s(flag)[0] = 0;
  stream.fill(seq.data(), 0, 8);
  one.enqueue_flag_wait(int64s(flag), seq.data(), stream, true);
  stream.synchronize(kHangGuard);
  try {
    flags.raise_notice(7, 1);
    ADD_FAILURE() << "a notice that does not exist was raised";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("7 is no notice"));
  }
}

}  // namespace
}  // namespace hetmesh::afd
