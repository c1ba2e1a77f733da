// The hex codec (hex.hpp).
#include <hetmesh/core/hex.hpp>

#include <fmt/format.h>

#include <cctype>

namespace hetmesh {
namespace {

int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes text (of even length) into out (of half its length).
void decode(std::string_view text, uint8_t* out, std::string_view what, hm_status status) {
  for (size_t i = 0; i < text.size(); ++i) {
    int value = digit_value(text[i]);
    if (value < 0) {
      auto c = static_cast<unsigned char>(text[i]);
      std::string shown =
          std::isprint(c) ? fmt::format("'{}'", text[i]) : fmt::format("0x{:02x}", c);
      throw Error(status, fmt::format("{}: not hex (character {} at {})", what, shown, i));
    }
    if (i % 2 == 0)
      out[i / 2] = static_cast<uint8_t>(value << 4);
    else
      out[i / 2] = static_cast<uint8_t>(out[i / 2] | value);
  }
}

}  // namespace

std::string to_hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(2 * bytes.size(), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    text[2 * i] = kDigits[bytes[i] >> 4];
    text[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return text;
}

std::vector<uint8_t> from_hex(std::string_view text, std::string_view what, hm_status status) {
  if (text.size() % 2 != 0)
    throw Error(status, fmt::format("{}: odd-length hex ({} digits)", what, text.size()));
  std::vector<uint8_t> bytes(text.size() / 2);
  decode(text, bytes.data(), what, status);
  return bytes;
}

void from_hex(std::string_view text, std::span<uint8_t> out, std::string_view what,
              hm_status status) {
  if (text.size() != 2 * out.size())
    throw Error(status,
                fmt::format("{}: {} hex digits, not {}", what, text.size(), 2 * out.size()));
  decode(text, out.data(), what, status);
}

}  // namespace hetmesh
