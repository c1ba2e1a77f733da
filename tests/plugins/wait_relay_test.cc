// The plugin kit's wait relay (hetmesh/plugin_kit/wait_relay.hpp, which knows no runtime): the
// ABI's wait conditions, and the relay against a fake runtime whose "stream" is a gate word the
// test reads. The rocm plugin runs HM_WAIT_GEQ through it (HIP's GEQ is not cyclic); the Level Zero
// plugin runs GEQ, AND and NOR through it.
#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using hm::kit::gpu::wait_condition_holds;
using hm::kit::gpu::WaitRelay;

// ---- the conditions ----

TEST(WaitConditionHolds, GeqIsCyclicAsTheAbiDefinesIt) {
  EXPECT_TRUE(wait_condition_holds(5, 5, HM_WAIT_GEQ));
  EXPECT_TRUE(wait_condition_holds(6, 5, HM_WAIT_GEQ));
  EXPECT_FALSE(wait_condition_holds(4, 5, HM_WAIT_GEQ));
  EXPECT_TRUE(wait_condition_holds(1, 0xfffffffe, HM_WAIT_GEQ));  // wrapped past 2^32: after
  EXPECT_TRUE(wait_condition_holds(2, 0xfffffffe, HM_WAIT_GEQ));
  EXPECT_TRUE(wait_condition_holds(0, 0xffffffff, HM_WAIT_GEQ));
  EXPECT_FALSE(wait_condition_holds(0xfffffffe, 2, HM_WAIT_GEQ));  // unsigned >=, cyclically behind
  EXPECT_FALSE(wait_condition_holds(0xfffffffd, 0xfffffffe, HM_WAIT_GEQ));
  EXPECT_FALSE(wait_condition_holds(0xfffffff0, 5, HM_WAIT_GEQ));  // just before the wrap
  EXPECT_TRUE(wait_condition_holds(5 + 0x7fffffffu, 5, HM_WAIT_GEQ));
  EXPECT_FALSE(wait_condition_holds(5 + 0x80000000u, 5, HM_WAIT_GEQ));
}

TEST(WaitConditionHolds, EqIsEquality) {
  EXPECT_TRUE(wait_condition_holds(7, 7, HM_WAIT_EQ));
  EXPECT_TRUE(wait_condition_holds(0, 0, HM_WAIT_EQ));
  EXPECT_TRUE(wait_condition_holds(0xffffffff, 0xffffffff, HM_WAIT_EQ));
  EXPECT_FALSE(wait_condition_holds(8, 7, HM_WAIT_EQ));
  EXPECT_FALSE(wait_condition_holds(6, 7, HM_WAIT_EQ));
  EXPECT_FALSE(wait_condition_holds(7 + 0x80000000u, 7, HM_WAIT_EQ));
}

// AND: (word & value) != 0, any one common bit.
TEST(WaitConditionHolds, AndNeedsACommonBit) {
  EXPECT_TRUE(wait_condition_holds(0b0110, 0b0011, HM_WAIT_AND));  // one bit of two
  EXPECT_TRUE(wait_condition_holds(0b0011, 0b0011, HM_WAIT_AND));
  EXPECT_TRUE(wait_condition_holds(0x80000000, 0x80000001, HM_WAIT_AND));
  EXPECT_FALSE(wait_condition_holds(0b0100, 0b0011, HM_WAIT_AND));
  EXPECT_FALSE(wait_condition_holds(0xffffffff, 0, HM_WAIT_AND));
  EXPECT_FALSE(wait_condition_holds(0, 0xffffffff, HM_WAIT_AND));
}

// NOR: ~(word | value) != 0, a bit clear in both.
TEST(WaitConditionHolds, NorNeedsABitClearInBoth) {
  EXPECT_TRUE(wait_condition_holds(0, 0, HM_WAIT_NOR));
  EXPECT_TRUE(wait_condition_holds(0xfffe0000, 0x0000ffff, HM_WAIT_NOR));  // bit 16 clear in both
  EXPECT_TRUE(wait_condition_holds(0x7fffffff, 0, HM_WAIT_NOR));
  EXPECT_FALSE(wait_condition_holds(0xffff0000, 0x0000ffff, HM_WAIT_NOR));
  EXPECT_FALSE(wait_condition_holds(0xffffffff, 0, HM_WAIT_NOR));
  EXPECT_FALSE(wait_condition_holds(0, 0xffffffff, HM_WAIT_NOR));
}

TEST(WaitConditionHolds, AnUnknownConditionNeverHolds) {
  for (int32_t condition : {-1, 4, 5, 100}) {
    EXPECT_FALSE(wait_condition_holds(0, 0, condition)) << condition;
    EXPECT_FALSE(wait_condition_holds(1, 1, condition)) << condition;
    EXPECT_FALSE(wait_condition_holds(0xffffffff, 1, condition)) << condition;
  }
}

// ---- the relay ----

// A runtime without a GPU: gates in host memory, and a "stream wait" that only records the ticket
// the stream would wait for. Device words are plain memory the fake reads, counting the reads.
class FakeBackend final : public WaitRelay::Backend {
 public:
  void* allocate_gates(size_t bytes) override {
    void* chunk = std::aligned_alloc(64, bytes);
    std::memset(chunk, 0, bytes);
    ++chunks_allocated;
    return chunk;
  }
  void free_gates(void* chunk) override { std::free(chunk); }
  // The fake stream reaches each wait at once, unless the test holds it back (arrive() lets it on).
  void signal_arrival(void*, uint64_t* arrival, uint64_t ticket) override {
    std::lock_guard lock(held_mutex);
    if (hold_arrivals) {
      held.emplace_back(arrival, ticket);
      return;
    }
    std::atomic_ref<uint64_t>(*arrival).store(ticket, std::memory_order_release);
  }
  void arrive() {
    std::lock_guard lock(held_mutex);
    for (auto [arrival, ticket] : held)
      std::atomic_ref<uint64_t>(*arrival).store(ticket, std::memory_order_release);
    held.clear();
  }
  void wait_for_ticket(void*, uint64_t*, uint64_t ticket) override {
    ++waits_enqueued;
    if (fail_next_wait.exchange(false)) hm::kit::fail(HM_ERR_BACKEND, "stream wait refused");
    last_ticket = ticket;
  }
  bool read_device_word(const WaitRelay::Word& word, uint32_t* value) override {
    *value = std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word.address)).load();
    ++device_reads;
    return true;
  }

  std::mutex held_mutex;
  bool hold_arrivals = false;
  std::vector<std::pair<uint64_t*, uint64_t>> held;
  std::atomic<uint64_t> last_ticket{0};
  std::atomic<bool> fail_next_wait{false};
  std::atomic<int> waits_enqueued{0};
  std::atomic<int> device_reads{0};
  int chunks_allocated = 0;
};

struct Relay {
  FakeBackend* backend = new FakeBackend;
  WaitRelay relay{std::unique_ptr<WaitRelay::Backend>(backend)};

  // Enqueues a wait and returns the ticket the stream waits for.
  uint64_t wait(uint64_t* gate, const uint32_t* word, uint32_t value,
                int32_t condition = HM_WAIT_GEQ, bool host = true) {
    relay.enqueue(nullptr, gate, WaitRelay::Word{word, 0, host}, value, condition);
    return backend->last_ticket.load();
  }
};

bool is_open(const uint64_t* gate, uint64_t ticket) {
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(gate)).load(std::memory_order_acquire) >=
         ticket;
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

TEST(WaitRelay, GeqOpensOnceTheWordPassesTheValueAcrossTheWrap) {
  Relay r;
  uint32_t word = 0xfffffffd;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 0xfffffffe);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed)) << "opened while the word was behind";
  store(&word, 1);  // unsigned 1 < 0xfffffffe, but cyclically after it
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
}

TEST(WaitRelay, GeqWithABehindWordNearTheWrapKeepsTheGateClosed) {
  Relay r;
  uint32_t word = 0xfffffff0;  // unsigned >= 5, cyclically 21 behind it
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 5);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed));
  store(&word, 5);
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
}

// A word past the value opens GEQ but not EQ: the wait keeps its own condition.
TEST(WaitRelay, EqOpensOnlyOnTheValue) {
  Relay r;
  uint32_t word = 0;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 7, HM_WAIT_EQ);
  store(&word, 8);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed)) << "EQ opened on a word past the value";
  store(&word, 7);
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
}

TEST(WaitRelay, AndOpensOnACommonBit) {
  Relay r;
  uint32_t word = 0b0100;  // unsigned and cyclically past the value, but no bit in common
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 0b0011, HM_WAIT_AND);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed)) << "AND opened without a common bit";
  store(&word, 0b0110);  // one of the value's two bits: enough
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
}

TEST(WaitRelay, NorOpensOnABitClearInBoth) {
  Relay r;
  uint32_t word = 0xffff0000;  // with the value, every bit is set
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 0x0000ffff, HM_WAIT_NOR);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed)) << "NOR opened with every bit set";
  store(&word, 0xfffe0000);  // bit 16 now clear in both (the word stays nonzero)
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
}

// Waits of different conditions pending at once, on one word: each opens by its own.
TEST(WaitRelay, EachWaitIsEvaluatedWithItsOwnCondition) {
  Relay r;
  uint32_t word = 0;
  uint64_t* geq = r.relay.acquire_gate();
  uint64_t* eq = r.relay.acquire_gate();
  uint64_t* bit_and = r.relay.acquire_gate();
  uint64_t* nor = r.relay.acquire_gate();
  uint64_t t_geq = r.wait(geq, &word, 3, HM_WAIT_GEQ);
  uint64_t t_eq = r.wait(eq, &word, 3, HM_WAIT_EQ);
  uint64_t t_and = r.wait(bit_and, &word, 0b1000, HM_WAIT_AND);
  uint64_t t_nor = r.wait(nor, &word, 0x7fffffff, HM_WAIT_NOR);  // bit 31 clear in both: opens
  EXPECT_TRUE(opens(nor, t_nor, kOpensWithin));
  store(&word, 4);  // GEQ 3 holds; EQ 3 and AND 0b1000 do not
  EXPECT_TRUE(opens(geq, t_geq, kOpensWithin));
  EXPECT_FALSE(opens(eq, t_eq, kStaysClosed));
  EXPECT_FALSE(is_open(bit_and, t_and));
  store(&word, 0b1000);
  EXPECT_TRUE(opens(bit_and, t_and, kOpensWithin));
  EXPECT_FALSE(is_open(eq, t_eq));
  store(&word, 3);
  EXPECT_TRUE(opens(eq, t_eq, kOpensWithin));
}

TEST(WaitRelay, AStreamsWaitsOpenInOrder) {
  Relay r;
  uint32_t first = 0, second = 0;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t t1 = r.wait(gate, &first, 1);
  uint64_t t2 = r.wait(gate, &second, 1, HM_WAIT_EQ);
  ASSERT_GT(t2, t1);
  store(&second, 1);  // the later wait's condition alone opens nothing
  EXPECT_FALSE(opens(gate, t1, kStaysClosed));
  store(&first, 1);
  EXPECT_TRUE(opens(gate, t2, kOpensWithin));
}

TEST(WaitRelay, StreamsHaveIndependentGates) {
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

TEST(WaitRelay, DeviceWordsAreReadThroughTheBackend) {
  Relay r;
  uint32_t device_word = 0;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &device_word, 2, HM_WAIT_GEQ, /*host=*/false);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed));
  store(&device_word, 2);
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
  EXPECT_GT(r.backend->device_reads.load(), 0);
}

TEST(WaitRelay, AReleasedGateIsReusedOnlyAfterItsWaitsOpen) {
  Relay r;
  uint32_t word = 0;
  uint64_t* gate = r.relay.acquire_gate();
  uint64_t ticket = r.wait(gate, &word, 1);
  r.relay.release_gate(gate);  // the stream is destroyed with a wait pending
  std::vector<uint64_t*> others;
  for (size_t i = 1; i < WaitRelay::kGateChunkBytes / (2 * sizeof(uint64_t)); ++i)
    others.push_back(r.relay.acquire_gate());
  for (uint64_t* other : others)
    EXPECT_NE(other, gate);
  EXPECT_EQ(r.backend->chunks_allocated, 1);
  store(&word, 1);
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
  EXPECT_EQ(r.relay.acquire_gate(), gate) << "the drained gate went back to the pool";
  EXPECT_EQ(r.backend->chunks_allocated, 1);
}

// The condition is judged on the word as the stream finds it at the wait: its earlier work (here
// a write that resets the word) is not overtaken, as with a native stream wait (HM-R35).
TEST(WaitRelay, AWaitIsJudgedOnlyOnceTheStreamReachesIt) {
  Relay r;
  uint32_t word = 1;
  uint64_t* gate = r.relay.acquire_gate();
  r.backend->hold_arrivals = true;  // the stream is still busy with earlier work
  uint64_t ticket = r.wait(gate, &word, 1, HM_WAIT_AND);
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed)) << "judged before the stream got there";
  store(&word, 0);  // the stream's earlier write, then it arrives
  r.backend->arrive();
  EXPECT_FALSE(opens(gate, ticket, kStaysClosed)) << "opened on a value the stream overwrote";
  store(&word, 3);
  EXPECT_TRUE(opens(gate, ticket, kOpensWithin));
}

TEST(WaitRelay, ARefusedStreamWaitLeavesNothingPending) {
  Relay r;
  uint32_t word = 0;
  uint64_t* gate = r.relay.acquire_gate();
  r.backend->fail_next_wait = true;
  try {
    r.relay.enqueue(nullptr, gate, WaitRelay::Word{&word, 0, true}, 1, HM_WAIT_GEQ);
    ADD_FAILURE() << "the backend's refusal was not passed on";
  } catch (const hm::kit::Failure& failure) {
    EXPECT_EQ(failure.status, HM_ERR_BACKEND);
  }
  r.relay.release_gate(gate);
  EXPECT_EQ(r.relay.acquire_gate(), gate) << "a gate without pending waits is free at once";
}

TEST(WaitRelay, AnUnknownConditionIsRefusedBeforeTheStreamWaits) {
  Relay r;
  uint32_t word = 0;
  uint64_t* gate = r.relay.acquire_gate();
  for (int32_t condition : {-1, 4, 100}) {
    try {
      r.relay.enqueue(nullptr, gate, WaitRelay::Word{&word, 0, true}, 0, condition);
      ADD_FAILURE() << "condition " << condition << " was accepted";
    } catch (const hm::kit::Failure& failure) {
      EXPECT_EQ(failure.status, HM_ERR_INVALID_ARGUMENT) << condition;
      EXPECT_NE(failure.message.find(std::to_string(condition)), std::string::npos)
          << failure.message;
    }
  }
  EXPECT_EQ(r.backend->waits_enqueued.load(), 0) << "a stream waits for a ticket nothing opens";
  r.relay.release_gate(gate);
  EXPECT_EQ(r.relay.acquire_gate(), gate) << "the refused waits left the gate pending";
}

}  // namespace
