// The embedded TCP store's wire protocol, version 2: frame layout, encoding and checked decoding.
//
// Every integer is little-endian. Each connection first proves the job's secret, both ways
// (job_secret.hpp), before a request is read:
//   server:  u32 magic "HMKA" | u8 version | 3 zero | server nonce (32)
//   client:  u32 magic "HMKA" | u8 version | 3 zero | client nonce (32)
//            | HMAC(secret, "hetmesh store client" | server nonce | client nonce)
//   server:  u8 verdict (0 accepted, 1 refused) | HMAC(secret, "hetmesh store server" | client
//            nonce | server nonce), zeros when refused
// Then a client sends requests and reads one reply to each, in order, on one connection.
//   request:  u32 magic "HMKV" | u8 version | u8 op | u16 zero | u32 key_len | u32 value_len
//             | key | value
//   reply:    u32 magic "HMKV" | u8 version | u8 status | u16 zero | u32 value_len | value
// Ops and their request values: set (the value), get (u64 wait in ms), try_get (none),
// add (i64 delta), erase (none). Replies: ok with the value (get, try_get), the new counter as
// i64 (add) or nothing; not_found (try_get); timeout (get); refused with a reason text (add on a
// value that is not a counter, or an overflow); full with a reason text (a set or add past the
// store's caps); unavailable with a reason text (the store's host could not serve the request at
// all: no thread could start to serve it), after which the store closes the connection, the
// request unread.
// `unavailable` was added within version 2, not as a version 3: it is sent only where the store
// could otherwise send nothing, and a client that predates it reads it as a bad reply ("unknown
// reply status 5") at once, where it would have waited out its deadline; every other exchange is
// unchanged, so clients and stores of either build still work together.
// Keys are 1..4096 bytes, values at most 16 MiB. A decoder never trusts a length before checking
// it: a frame that breaks any rule throws Malformed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hetmesh::store_wire {

constexpr uint32_t kMagic = 0x564b4d48;  // "HMKV" as little-endian bytes
constexpr uint8_t kVersion = 2;
constexpr uint32_t kHelloMagic = 0x414b4d48;  // "HMKA"
constexpr size_t kNonceBytes = 32;
constexpr size_t kChallengeBytes = 8 + kNonceBytes;
constexpr size_t kAnswerBytes = 8 + kNonceBytes + 32;
constexpr size_t kVerdictBytes = 1 + 32;
inline constexpr const char* kClientLabel = "hetmesh store client";
inline constexpr const char* kServerLabel = "hetmesh store server";
constexpr size_t kRequestHeaderBytes = 16;
constexpr size_t kReplyHeaderBytes = 12;

enum Op : uint8_t { kSet = 1, kGet = 2, kTryGet = 3, kAdd = 4, kErase = 5 };
// kFull: a set or add refused by the store's caps (StoreLimits), with the reason as the value.
// kUnavailable: the request was not served (the reason as the value); the connection ends after it.
enum Status : uint8_t {
  kOk = 0,
  kNotFound = 1,
  kTimedOut = 2,
  kRefused = 3,
  kFull = 4,
  kUnavailable = 5
};

// Longest server-side wait of a get; keeps deadlines far from overflow.
constexpr std::chrono::milliseconds kMaxWait{24LL * 3600 * 1000};

// "set", "get", ...; "unknown op" for any other value.
const char* op_name(uint8_t op);

void put_u64(uint8_t* p, uint64_t v);
uint64_t get_u64(const uint8_t* p);
// An i64 value (add's delta and its reply) as 8 bytes.
std::vector<uint8_t> encode_i64(int64_t v);

// A request or reply header: the two share magic, version and value_len.
struct Frame {
  uint8_t code = 0;  // op of a request, status of a reply
  uint32_t key_length = 0;
  uint32_t value_length = 0;
};

// A request's header and key (its value follows on the wire).
std::vector<uint8_t> encode_request(Op op, const std::string& key, size_t value_length);
// A whole reply.
std::vector<uint8_t> encode_reply(Status status, const std::vector<uint8_t>& value);
// A reply's header alone (kReplyHeaderBytes at `out`): for a reply sent without allocating.
void put_reply_header(uint8_t* out, Status status, uint32_t value_length);

// A peer broke the protocol; the message says how.
class Malformed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The 8 bytes that open a challenge or an answer; checks them (Malformed).
void put_hello_head(uint8_t* p);
void check_hello_head(const uint8_t* p);

// Checks a received header (kRequestHeaderBytes or kReplyHeaderBytes of it) and its lengths.
Frame decode_request(const uint8_t* raw);
Frame decode_reply(const uint8_t* raw);

}  // namespace hetmesh::store_wire
