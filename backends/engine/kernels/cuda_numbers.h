// The 16-bit activation dtypes in CUDA kernel files: storage as bit patterns, widened exactly, narrowed with
// round-to-nearest-even (also compiled as host C++ under the warp-emulation shim).
#pragma once

#include <cstdint>

#include "cuda_launch.h"

namespace gptoss {

// Storage of the 16-bit activation dtypes (bit patterns; converted with round-to-nearest-even).
struct Half {
  uint16_t bits;
};
struct BFloat {
  uint16_t bits;
};

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(BFloat v) { return __uint_as_float(static_cast<uint32_t>(v.bits) << 16); }
__device__ __forceinline__ float ToFloat(Half v) {
  const uint32_t sign = (static_cast<uint32_t>(v.bits) & 0x8000u) << 16;
  const uint32_t exponent = (v.bits >> 10) & 0x1Fu, mantissa = v.bits & 0x3FFu;
  if (exponent == 0x1F) return __uint_as_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -magnitude : magnitude;
  }
  return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ BFloat FromFloat<BFloat>(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return BFloat{0x7FC0};
  u += 0x7FFFu + ((u >> 16) & 1u);
  return BFloat{static_cast<uint16_t>(u >> 16)};
}
template <>
__device__ __forceinline__ Half FromFloat<Half>(float v) {
  uint32_t f = __float_as_uint(v);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint32_t out;
  if (f >= (143u << 23)) {  // overflow to infinity, or NaN
    out = f > 0x7F800000u ? 0x7E00u : 0x7C00u;
  } else if (f < (113u << 23)) {  // subnormal or zero: let the float adder round
    const uint32_t magic = 126u << 23;
    out = __float_as_uint(__uint_as_float(f) + __uint_as_float(magic)) - magic;
  } else {
    const uint32_t odd = (f >> 13) & 1u;
    f += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu + odd;
    out = f >> 13;
  }
  return Half{static_cast<uint16_t>(out | (sign >> 16))};
}

}  // namespace gptoss
