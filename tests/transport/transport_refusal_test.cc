// What TransportTest's connections refuse: a write outside either region (and the connection
// survives it), and region descriptors or endpoints that are not the peer's or not well formed.
#include "transport_support.hpp"

#include <hetmesh/core/error.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace hetmesh {
namespace {

using namespace transport_test;

TEST_P(TransportTest, WriteOutsideEitherRegionIsRefused) {
  auto refused = [&](uint64_t src_offset, uint64_t dst_offset, uint64_t length) {
    try {
      connection_->write(*local_->region, src_offset, *remote_, dst_offset, length, 1, 1);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT) << e.what();
      EXPECT_NE(std::string(e.what()).find("outside"), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused(0, kRegionSize - 10, 11));
  EXPECT_TRUE(refused(kRegionSize - 10, 0, 11));
  EXPECT_TRUE(refused(0, kRegionSize + 1, 0));
  EXPECT_TRUE(refused(0, 1, UINT64_MAX));
  // The connection survives a refused write.
  write(2);
  await_notification(2);
  expect_echo(2);
}

TEST_P(TransportTest, ImportRefusesForeignOrMalformedDescriptors) {
  EXPECT_THROW(connection_->import_region(local_->region->describe()), Error)
      << "imported our own region as the peer's";
  EXPECT_THROW(connection_->import_region({'n', 'o', 'p', 'e'}), Error);
  if (!GetParam().rails.empty()) {
    // A rails descriptor cut short, or naming more rails than it has: refused before any rail's
    // transport reads its part.
    RegionDescriptor cut(peer_region_.begin(), peer_region_.end() - 1);
    EXPECT_THROW(connection_->import_region(cut), Error);
    RegionDescriptor more = peer_region_;
    more[8] = 3;  // the count, after the 8-byte magic
    EXPECT_THROW(connection_->import_region(more), Error);
    ASSERT_NO_THROW(connection_->import_region(peer_region_));
    EXPECT_THROW(local_->transport->connect({'{', '}'}, std::chrono::milliseconds(100)), Error);
    return;
  }
  // The peer's own descriptor with a number that does not fit its field, is negative or is not
  // an integer: refused, never wrapped or truncated into a plausible value.
  auto valid = nlohmann::json::parse(peer_region_.begin(), peer_region_.end());
  ASSERT_NO_THROW(connection_->import_region(peer_region_));
  for (auto [key, bad] : {std::pair<const char*, nlohmann::json>{"size", -1},
                          {"size", 1.5},
                          {"size", "64"},
                          {"region", (uint64_t{1} << 32) + 5},
                          {"region", -1}}) {
    nlohmann::json d = valid;
    d[key] = bad;
    std::string text = d.dump();
    EXPECT_THROW(connection_->import_region({text.begin(), text.end()}), Error) << text;
  }
  EXPECT_THROW(local_->transport->connect({'{', '}'}, std::chrono::milliseconds(100)), Error);
}

}  // namespace
}  // namespace hetmesh
