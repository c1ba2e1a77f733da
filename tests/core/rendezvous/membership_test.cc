// Membership: epochs that count up with each start of an instance, what it published following
// its epoch, and the member log that announces replacements (checked like a peer's bytes).
#include <hetmesh/core/membership.hpp>

#include "rendezvous_support.hpp"
#include "test_support.hpp"

#include <gtest/gtest.h>

#include <optional>

namespace hetmesh {
namespace {

using namespace rendezvous_test;
using test::LogCapture;

TEST_P(RendezvousStore, CloneIsAClientOfItsOwn) {
  store_->set("k", {7});
  const std::string described = store_->describe();
  auto clone = store_->clone();
  store_.reset();  // the clone outlives the client it came from
  EXPECT_EQ(clone->try_get("k"), Bytes{7});
  EXPECT_EQ(clone->describe(), described);
}

// Each start of an instance is a new epoch; what it published lives under that epoch, its
// predecessor's goes, and only a replacement is announced.
TEST_P(RendezvousStore, EpochsCountUpAndBlobsFollowTheirEpoch) {
  Membership first(*store_, "job", "ffn", 1);
  EXPECT_EQ(first.join({{"endpoint", bytes("one")}}), 1u);
  Membership reader(*store_, "job", "attention", 0);
  EXPECT_EQ(reader.current_epoch("ffn", 1, milliseconds(100)), 1u);
  EXPECT_EQ(reader.fetch("ffn", 1, 1, "endpoint", milliseconds(100)), bytes("one"));
  MemberWatch watch(*store_, "job", milliseconds(1000));
  EXPECT_EQ(watch.next(milliseconds(20)), std::nullopt);  // a first start is no replacement

  Membership second(*store_, "job", "ffn", 1);
  EXPECT_EQ(second.join({{"endpoint", bytes("two")}}), 2u);
  EXPECT_EQ(reader.current_epoch("ffn", 1, milliseconds(100)), 2u);
  EXPECT_EQ(reader.fetch("ffn", 1, 2, "endpoint", milliseconds(100)), bytes("two"));
  EXPECT_EQ(store_->try_get("job/ffn/1/e1/endpoint"), std::nullopt);  // the dead one's is gone
  auto announced = watch.next(milliseconds(1000));
  ASSERT_TRUE(announced.has_value());
  EXPECT_EQ(announced->role, "ffn");
  EXPECT_EQ(announced->rank, 1);
  EXPECT_EQ(announced->epoch, 2u);
  EXPECT_EQ(watch.next(milliseconds(20)), std::nullopt);
}

// The member log's bytes are checked like a peer's: a malformed entry is skipped, and an entry
// claimed but never written (its writer died in between) holds up the next only for the patience.
TEST_P(RendezvousStore, MemberWatchSkipsMalformedAndUnwrittenEntries) {
  LogCapture logs;
  store_->add("job/members", 1);
  store_->set("job/members/1", bytes("ffn one 2"));
  store_->add("job/members", 1);  // entry 2: claimed, never written
  store_->add("job/members", 1);
  store_->set("job/members/3", bytes("attention 3 4"));
  MemberWatch watch(*store_, "job", milliseconds(200));
  EXPECT_EQ(watch.next(milliseconds(50)), std::nullopt);  // entry 1, malformed
  auto start = Clock::now();
  std::optional<Incarnation> next;
  while (!next && since(start) < kWait)
    next = watch.next(milliseconds(50));
  ASSERT_TRUE(next.has_value());
  EXPECT_GE(since(start), milliseconds(200));  // waited out the patience for entry 2
  EXPECT_EQ(next->role, "attention");
  EXPECT_EQ(next->rank, 3);
  EXPECT_EQ(next->epoch, 4u);
  EXPECT_TRUE(logs.saw("member log entry 1 is malformed")) << logs.all();
  EXPECT_TRUE(logs.saw("member log entry 2 was claimed but never written")) << logs.all();
}

TEST(RendezvousMembers, ParsesOnlyExactEntries) {
  auto ok = parse_member_entry("attention 12 3");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->role, "attention");
  EXPECT_EQ(ok->rank, 12);
  EXPECT_EQ(ok->epoch, 3u);
  for (const char* bad : {"", "ffn", "ffn 1", "ffn 1 1", "ffn 1 0", "gpu 1 2", "ffn -1 2",
                          "ffn 1 -2", "ffn 1 2 ", " ffn 1 2", "ffn  1 2", "ffn 1 2 3", "ffn x 2",
                          "ffn 1 99999999999999999999", "ffn 99999999999 2", "ffn 1 +2"})
    EXPECT_EQ(parse_member_entry(bad), std::nullopt) << "'" << bad << "'";
}

}  // namespace
}  // namespace hetmesh
