// The embedded TCP store's wire protocol (store_wire.hpp): encoding, and decoding that checks
// every field before it is trusted.
#include "store_wire.hpp"

#include <hetmesh/core/rendezvous.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace hetmesh::store_wire {
namespace {

void put_u16(uint8_t* p, uint16_t v) {
  for (int i = 0; i < 2; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t get_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = v << 8 | p[i];
  return v;
}

void check_common(const uint8_t* raw) {
  if (get_u32(raw) != kMagic)
    throw Malformed(fmt::format("bad magic 0x{:08x} (expected 0x{:08x})", get_u32(raw), kMagic));
  if (raw[4] != kVersion)
    throw Malformed(fmt::format("protocol version {} (this build speaks {})", raw[4], kVersion));
  if (get_u16(raw + 6) != 0) throw Malformed("reserved header bits are set");
}

}  // namespace

void put_hello_head(uint8_t* p) {
  put_u32(p, kHelloMagic);
  p[4] = kVersion;
  p[5] = p[6] = p[7] = 0;
}

void check_hello_head(const uint8_t* p) {
  if (get_u32(p) != kHelloMagic)
    throw Malformed(
        fmt::format("the connection did not open with the store's hello (0x{:08x}): a "
                    "client of another version, or not a store client",
                    get_u32(p)));
  if (p[4] != kVersion)
    throw Malformed(
        fmt::format("hello of protocol version {} (this build speaks {})", p[4], kVersion));
  if (p[5] != 0 || p[6] != 0 || p[7] != 0) throw Malformed("reserved hello bits are set");
}

const char* op_name(uint8_t op) {
  switch (op) {
    case kSet:
      return "set";
    case kGet:
      return "get";
    case kTryGet:
      return "try_get";
    case kAdd:
      return "add";
    case kErase:
      return "erase";
    default:
      return "unknown op";
  }
}

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = v << 8 | p[i];
  return v;
}

std::vector<uint8_t> encode_i64(int64_t v) {
  std::vector<uint8_t> out(8);
  put_u64(out.data(), static_cast<uint64_t>(v));
  return out;
}

std::vector<uint8_t> encode_request(Op op, const std::string& key, size_t value_length) {
  std::vector<uint8_t> out(kRequestHeaderBytes + key.size());
  put_u32(&out[0], kMagic);
  out[4] = kVersion;
  out[5] = op;
  put_u16(&out[6], 0);
  put_u32(&out[8], static_cast<uint32_t>(key.size()));
  put_u32(&out[12], static_cast<uint32_t>(value_length));
  std::copy(key.begin(), key.end(), out.begin() + kRequestHeaderBytes);
  return out;
}

void put_reply_header(uint8_t* out, Status status, uint32_t value_length) {
  put_u32(&out[0], kMagic);
  out[4] = kVersion;
  out[5] = status;
  put_u16(&out[6], 0);
  put_u32(&out[8], value_length);
}

std::vector<uint8_t> encode_reply(Status status, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> out(kReplyHeaderBytes + value.size());
  put_reply_header(out.data(), status, static_cast<uint32_t>(value.size()));
  std::copy(value.begin(), value.end(), out.begin() + kReplyHeaderBytes);
  return out;
}

Frame decode_request(const uint8_t* raw) {
  check_common(raw);
  Frame f{raw[5], get_u32(raw + 8), get_u32(raw + 12)};
  if (f.code < kSet || f.code > kErase) throw Malformed(fmt::format("unknown op {}", f.code));
  if (f.key_length == 0 || f.key_length > KeyValueStore::kMaxKeyBytes)
    throw Malformed(
        fmt::format("key length {} is outside 1..{}", f.key_length, KeyValueStore::kMaxKeyBytes));
  size_t expected = f.code == kGet || f.code == kAdd ? 8 : 0;
  if (f.code == kSet ? f.value_length > KeyValueStore::kMaxValueBytes : f.value_length != expected)
    throw Malformed(fmt::format("{} with a value of {} bytes", op_name(f.code), f.value_length));
  return f;
}

Frame decode_reply(const uint8_t* raw) {
  check_common(raw);
  Frame f{raw[5], 0, get_u32(raw + 8)};
  if (f.code > kUnavailable) throw Malformed(fmt::format("unknown reply status {}", f.code));
  if (f.value_length > KeyValueStore::kMaxValueBytes)
    throw Malformed(fmt::format("reply value of {} bytes", f.value_length));
  return f;
}

}  // namespace hetmesh::store_wire
