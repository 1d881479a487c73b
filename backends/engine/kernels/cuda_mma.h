// Tensor-core tiles in the CUDA kernel files: mma.sync m16n8k16 with 16-bit inputs and float sums (under the
// host warp emulation, cuda_shim.h's Mma16816), and the packing of two floats into one input register.
//
// Fragment layouts are PTX's for m16n8k16 (.row.col): lane l is group g = l / 4 and thread t = l % 4 of it; A
// (16 x 16) holds rows {g, g + 8} at K {2t, 2t + 1} (registers 0, 1) and {2t + 8, 2t + 9} (registers 2, 3); B
// (16 x 8) column g at the same K (registers 0, 1); C rows {g, g + 8} (entries 0-1, 2-3), columns {2t, 2t + 1}.
// In a register the lower K (or column) is the low half.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda_numbers.h"

namespace gptoss {

template <typename T>
__device__ __forceinline__ uint32_t Pack(float low, float high) {
  return static_cast<uint32_t>(FromFloat<T>(low).bits) | (static_cast<uint32_t>(FromFloat<T>(high).bits) << 16);
}

// c += a b for one m16n8k16 tile.
template <typename T>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef GPTOSS_HOST_EMULATION
  emulation::Mma16816(std::is_same<T, BFloat>::value, c, a, b);
#else
  if constexpr (std::is_same<T, BFloat>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

}  // namespace gptoss
