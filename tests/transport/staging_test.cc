// The bounce buffer a transport stages a device region through (tcp, libfabric without device
// memory) outlives every copy that uses it. A read's sink or a write's source that throws (the
// peer was lost mid-write) leaves the next, or the last, piece's copy running; the region may go
// at once after. The asic_stub engine moves its bytes when a copy's time is up, and here a copy
// takes 100 ms: a buffer freed before then is a crash (or, under ASan, a use after free) every
// time, where the copies in flight are waited for.
#include "common/staging.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/plugin.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

namespace hetmesh::detail {
namespace {

constexpr uint64_t kSize = 4 * HostAccess::kPiece;

Device slow_stub() {
  ::setenv("HETMESH_ASIC_STUB_COPY_LATENCY_US", "100000", 1);
  return PluginRegistry::load().device("asic_stub:0");
}

TEST(Staging, ARegionGoneMidReadWaitsForTheCopyStillFillingItsBuffer) {
  Device device = slow_stub();
  Buffer memory = device.allocate(kSize);
  auto access = std::make_unique<HostAccess>(device, memory.data(), kSize);
  ASSERT_FALSE(access->direct()) << "asic_stub memory is not host-addressable: it must be staged";
  int pieces = 0;
  EXPECT_THROW(access->read(0, kSize,
                            [&](const uint8_t*, uint64_t) {
                              ++pieces;
                              throw Error(kStatusPeerLost, "the peer went mid-read");
                            }),
               Error);
  EXPECT_EQ(pieces, 1);  // the second piece's copy was under way when the sink threw
  access.reset();
  EXPECT_TRUE(device.create_stream().ready());  // still here: nothing freed was written
}

TEST(Staging, ARegionGoneMidWriteWaitsForTheCopyStillReadingItsBuffer) {
  Device device = slow_stub();
  Buffer memory = device.allocate(kSize);
  auto access = std::make_unique<HostAccess>(device, memory.data(), kSize);
  int pieces = 0;
  EXPECT_THROW(access->write(0, kSize,
                             [&](uint8_t*, uint64_t) {
                               if (++pieces == 2) throw Error(kStatusPeerLost, "the peer went");
                             }),
               Error);
  EXPECT_EQ(pieces, 2);  // the first piece's copy was under way when the source threw
  access.reset();
  EXPECT_TRUE(device.create_stream().ready());
}

}  // namespace
}  // namespace hetmesh::detail
