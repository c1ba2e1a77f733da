// The plugin kit's allocation table (plugin_kit/allocation_table.hpp): what contains an address,
// what a range lies inside, and what a range shares a byte with (host_register refuses those).
#include <hetmesh/plugin_kit/allocation_table.hpp>

#include <gtest/gtest.h>

#include <cstdint>

namespace {

struct Entry {
  uint64_t size = 0;
};

const void* at(uintptr_t address) {
  return reinterpret_cast<const void*>(address);
}

TEST(AllocationTable, FindsTheAllocationContainingAnAddressAndNoOther) {
  hm::kit::AllocationTable<Entry> table;
  table.insert(at(0x1000), Entry{0x100});
  EXPECT_FALSE(table.find(at(0xfff)));
  ASSERT_TRUE(table.find(at(0x10ff)));
  EXPECT_EQ(table.find(at(0x10ff))->base, 0x1000u);
  EXPECT_FALSE(table.find(at(0x1100)));
  EXPECT_TRUE(table.find_range(at(0x1080), 0x80));
  EXPECT_FALSE(table.find_range(at(0x1080), 0x81));
}

// A range that starts before an allocation and ends inside or past it, or that lies inside one,
// overlaps it; one that ends where an allocation starts, or starts where one ends, does not.
TEST(AllocationTable, ARangeOverlapsEveryAllocationItSharesAByteWith) {
  hm::kit::AllocationTable<Entry> table;
  table.insert(at(0x2000), Entry{0x100});
  EXPECT_TRUE(table.overlaps(at(0x1000), 0x2000));  // contains it whole
  EXPECT_TRUE(table.overlaps(at(0x1f00), 0x101));   // ends in its first byte
  EXPECT_TRUE(table.overlaps(at(0x20ff), 0x10));    // starts in its last byte
  EXPECT_TRUE(table.overlaps(at(0x2010), 0x10));    // inside it
  EXPECT_FALSE(table.overlaps(at(0x1f00), 0x100));  // ends where it starts
  EXPECT_FALSE(table.overlaps(at(0x2100), 0x100));  // starts where it ends
  EXPECT_FALSE(hm::kit::AllocationTable<Entry>().overlaps(at(0x2000), 0x100));
}

}  // namespace
