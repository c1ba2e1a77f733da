#include "dtype.hpp"

#include <cmath>

namespace hetmesh::demo {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t to_bf16(float f) {
  uint32_t u = bits(f);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
  return from_bits(uint32_t{h} << 16);
}

// fp8 e4m3 (OCP "fn": no infinities, max 448), round to nearest even, saturating.
uint8_t to_fp8(float f) {
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (std::isnan(f)) return 0x7f;
  if (a >= 448.0f) return sign | 0x7e;
  if (a < std::ldexp(1.0f, -10)) return sign;  // below half the smallest subnormal (2^-9)
  int exponent;
  std::frexp(a, &exponent);              // a = m * 2^exponent, m in [0.5, 1)
  int e = std::max(exponent - 1, -6);    // unbiased exponent of the leading bit; subnormals at -6
  float step = std::ldexp(1.0f, e - 3);  // 3 mantissa bits
  float q = std::nearbyint(a / step) * step;  // FE_TONEAREST: ties to even
  if (q >= 448.0f) return sign | 0x7e;
  int qe;
  std::frexp(q, &qe);
  int biased = qe - 1 + 7;
  if (biased <= 0)  // subnormal: mantissa counts 2^-9 steps
    return sign | static_cast<uint8_t>(std::lround(q / std::ldexp(1.0f, -9)));
  uint8_t mantissa = static_cast<uint8_t>(std::lround((q / std::ldexp(1.0f, qe - 1) - 1.0f) * 8));
  return sign | static_cast<uint8_t>(biased << 3) | mantissa;
}

float from_fp8(uint8_t v) {
  float sign = (v & 0x80) ? -1.0f : 1.0f;
  int biased = (v >> 3) & 0xf;
  int mantissa = v & 7;
  if (biased == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + mantissa / 8.0f, biased - 7);
}

uint16_t to_fp16(float f) {
  uint32_t u = bits(f);
  uint32_t sign = (u >> 16) & 0x8000;
  float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00);
  if (a < std::ldexp(1.0f, -25)) return static_cast<uint16_t>(sign);
  int exponent;
  std::frexp(a, &exponent);
  int e = std::max(exponent - 1, -14);
  float step = std::ldexp(1.0f, e - 10);
  float q = std::nearbyint(a / step) * step;
  int qe;
  std::frexp(q, &qe);
  int biased = qe - 1 + 15;
  if (biased <= 0) return static_cast<uint16_t>(sign | std::lround(q / std::ldexp(1.0f, -24)));
  if (biased >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  uint32_t mantissa =
      static_cast<uint32_t>(std::lround((q / std::ldexp(1.0f, qe - 1) - 1.0f) * 1024));
  return static_cast<uint16_t>(sign | (biased << 10) | mantissa);
}

float from_fp16(uint16_t h) {
  float sign = (h & 0x8000) ? -1.0f : 1.0f;
  int biased = (h >> 10) & 0x1f;
  int mantissa = h & 0x3ff;
  if (biased == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (biased == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(1.0f + mantissa / 1024.0f, biased - 15);
}

}  // namespace

void store(Dtype t, void* base, size_t index, float value) {
  switch (t) {
    case Dtype::fp32:
      static_cast<float*>(base)[index] = value;
      return;
    case Dtype::bf16:
      static_cast<uint16_t*>(base)[index] = to_bf16(value);
      return;
    case Dtype::fp16:
      static_cast<uint16_t*>(base)[index] = to_fp16(value);
      return;
    case Dtype::fp8:
      static_cast<uint8_t*>(base)[index] = to_fp8(value);
      return;
    case Dtype::int32:
    case Dtype::int64:
      return;  // the hidden states are never integers (job_config.hpp)
  }
}

float load(Dtype t, const void* base, size_t index) {
  switch (t) {
    case Dtype::fp32:
      return static_cast<const float*>(base)[index];
    case Dtype::bf16:
      return from_bf16(static_cast<const uint16_t*>(base)[index]);
    case Dtype::fp16:
      return from_fp16(static_cast<const uint16_t*>(base)[index]);
    case Dtype::fp8:
      return from_fp8(static_cast<const uint8_t*>(base)[index]);
    case Dtype::int32:
    case Dtype::int64:
      break;  // the hidden states are never integers (job_config.hpp)
  }
  return 0;
}

}  // namespace hetmesh::demo
