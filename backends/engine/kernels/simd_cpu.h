// The CPU kernels' float vectors, one type for the widest instruction set the library is compiled for: AVX-512 (16
// floats, 32 registers), AVX2 with FMA (8 floats, 16 registers) or none (GPTOSS_SIMD undefined: the kernels' plain
// C++ loops). A kernel written once against Simd runs as AVX-512 in an x86-64-v4 build and as AVX2 in an x86-64-v3
// one; build.py compiles both and the loader picks the one the CPU can run (variants.py).
#pragma once

#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define GPTOSS_SIMD 1
#endif

namespace gptoss {

#if defined(__AVX512F__)
struct Simd {
  using F = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kRegisters = 32;
  static F Zero() { return _mm512_setzero_ps(); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F Set1(float v) { return _mm512_set1_ps(v); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static float Sum(F v) { return _mm512_reduce_add_ps(v); }
  // kLanes bfloat16 values widened (a bfloat16 is a float's top half) and kLanes int8 values converted
  static F WidenBf16(const uint16_t* bits) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
  static F WidenInt8(const int8_t* values) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values))));
  }
};
#elif defined(GPTOSS_SIMD)
struct Simd {
  using F = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kRegisters = 16;
  static F Zero() { return _mm256_setzero_ps(); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F Set1(float v) { return _mm256_set1_ps(v); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static float Sum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F WidenBf16(const uint16_t* bits) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
  }
  static F WidenInt8(const int8_t* values) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(values))));
  }
};
#endif

}  // namespace gptoss
