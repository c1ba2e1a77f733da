// The hex codec (core/hex.hpp): round trips, and a decoder that refuses what is not hex with a
// message naming the field. Uppercase digits decode too; the encoder writes lowercase.
#include <hetmesh/core/hex.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <array>

namespace hetmesh {
namespace {

using test::error_of;

TEST(HexTest, EncodesLowercaseTwoDigitsAByte) {
  EXPECT_EQ(to_hex(std::vector<uint8_t>{0x00, 0x0f, 0xa5, 0xff}), "000fa5ff");
  EXPECT_EQ(to_hex(std::vector<uint8_t>{}), "");
}

TEST(HexTest, RoundTripsEveryByte) {
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i)
    all[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(from_hex(to_hex(all), "all bytes"), all);
  EXPECT_EQ(from_hex("", "nothing"), std::vector<uint8_t>{});
}

TEST(HexTest, AcceptsUppercase) {
  EXPECT_EQ(from_hex("A5fF", "mixed case"), (std::vector<uint8_t>{0xa5, 0xff}));
}

TEST(HexTest, RefusesOddLength) {
  std::string what =
      error_of([] { from_hex("abc", "the 'handle' field"); }, HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(what, "the 'handle' field: odd-length hex (3 digits)");
}

TEST(HexTest, RefusesANonHexCharacterWithTheCallersStatus) {
  std::string what = error_of([] { from_hex("0g", "rank 3 region x", kStatusProtocolError); },
                              kStatusProtocolError);
  EXPECT_EQ(what, "rank 3 region x: not hex (character 'g' at 1)");
  what = error_of([] { from_hex(std::string("0\n", 2), "line"); }, HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(what, "line: not hex (character 0x0a at 1)");
  // Whatever strtoul would take around a number is refused too.
  error_of([] { from_hex(" 1", "space"); }, HM_ERR_INVALID_ARGUMENT);
  error_of([] { from_hex("+1", "sign"); }, HM_ERR_INVALID_ARGUMENT);
}

TEST(HexTest, DecodesIntoAFixedSizeBuffer) {
  std::array<uint8_t, 3> out{};
  from_hex("010203", out, "handle");
  EXPECT_EQ(out, (std::array<uint8_t, 3>{1, 2, 3}));
  std::string what = error_of([&] { from_hex("0102", out, "handle"); }, HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(what, "handle: 4 hex digits, not 6");
}

}  // namespace
}  // namespace hetmesh
