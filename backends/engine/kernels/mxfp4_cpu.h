// MXFP4 as the CPU kernels read it: blocks of 32 FLOAT4E2M1 codes (two a byte, the first in the low nibble) and one
// E8M0 scale byte (2^(e-127)) a block.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gptoss {

constexpr int kBlock = 32;  // values one scale byte covers

// 2^(e-127) for every E8M0 byte (0 is 2^-127, a float subnormal; 255, NaN in the format, reads as infinity).
struct E8M0Table {
  float values[256];
  E8M0Table() {
    for (int e = 0; e < 256; ++e) values[e] = std::ldexp(1.0f, e - 127);
  }
};
inline const E8M0Table kE8M0;

#if defined(__AVX2__)
// A block's 32 values as twice their E2M1 values (int8, exact), in order: values 0-15 in `first`, 16-31 in `second`.
struct TwiceE2M1 {
  __m128i first, second;
  explicit TwiceE2M1(const uint8_t* block_codes) {
    const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i low_nibble = _mm_set1_epi8(0x0F);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block_codes));
    const __m128i even = _mm_shuffle_epi8(table, _mm_and_si128(packed, low_nibble));
    const __m128i odd = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(packed, 4), low_nibble));
    first = _mm_unpacklo_epi8(even, odd);
    second = _mm_unpackhi_epi8(even, odd);
  }
};
#endif

}  // namespace gptoss
