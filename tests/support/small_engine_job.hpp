// The small AFD job the engine tests share, and its F's answer: every output byte is its input
// byte + the F's rank + 1, so an A can check each F's partial result.
#pragma once

#include <hetmesh/afd/engine.hpp>

#include <chrono>
#include <cstdint>

namespace hetmesh::test {

// Every bound of these jobs: far beyond what a loaded machine takes, so a pause is no hang.
inline constexpr std::chrono::milliseconds kSmallJobTimeout{60000};

// 2 micro-batches of 8 tokens x hidden 32 in 2-byte elements, top_k 2.
inline afd::EngineSpec small_spec(int attention, int ffn, TransportKind kind) {
  afd::EngineSpec s;
  s.attention = attention;
  s.ffn = ffn;
  s.micro_batches = 2;
  s.tokens = 8;
  s.hidden = 32;
  s.top_k = 2;
  s.a2f_bytes = 2;
  s.f2a_bytes = 2;
  s.timeout = kSmallJobTimeout;
  s.heartbeat = kSmallJobTimeout;
  s.transport.kind = kind;
  return s;
}

// F's answer into part.output (its slot, or a buffer of the test's).
inline void answer_plus_rank(const afd::EngineSpec& spec, const afd::Batch::FromAttention& part) {
  const auto* in = static_cast<const uint8_t*>(part.tokens_data());
  auto* out = static_cast<uint8_t*>(part.output);
  for (uint64_t i = 0; i < uint64_t{part.tokens} * spec.hidden * spec.f2a_bytes; ++i)
    out[i] = static_cast<uint8_t>(in[i] + spec.rank + 1);
}

}  // namespace hetmesh::test
