// The CPU kernels' float vectors, one type for the widest instruction set the library is compiled for: AVX-512 (16
// floats, 32 registers), AVX2 with FMA (8 floats, 16 registers), NEON on 64-bit ARM (4 floats, 32 registers) or
// none (GPTOSS_SIMD undefined: the kernels' plain C++ loops). A kernel written once against Simd runs as AVX-512 in
// an x86-64-v4 build and as AVX2 in an x86-64-v3 one; build.py compiles both and the loader picks the one the CPU
// can run (variants.py).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#define GPTOSS_SIMD_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define GPTOSS_SIMD_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define GPTOSS_SIMD_NEON 1
#endif
#if defined(GPTOSS_SIMD_AVX512) || defined(GPTOSS_SIMD_AVX2)
#include <immintrin.h>
#define GPTOSS_SIMD 1
#elif defined(GPTOSS_SIMD_NEON)
#include <arm_neon.h>
#define GPTOSS_SIMD 1
#endif

namespace gptoss {

constexpr int kHighHalf = static_cast<int>(0xFFFF0000u);  // a 32-bit word's high 16 bits

#if defined(GPTOSS_SIMD_AVX512)
struct Simd {
  using F = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kRegisters = 32;
  static F Zero() { return _mm512_setzero_ps(); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F Set1(float v) { return _mm512_set1_ps(v); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static float Sum(F v) { return _mm512_reduce_add_ps(v); }
  // kLanes int8 values converted
  static F WidenInt8(const int8_t* values) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values))));
  }
  // of 2 x kLanes bfloat16 values (a bfloat16 is a float's top half), the even ones (each word's low half shifted
  // up) and the odd ones (each word's low half masked off): no shuffle, a plain logic instruction a vector
  static F Bf16Evens(const uint16_t* bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(bits), 16));
  }
  static F Bf16Odds(const uint16_t* bits) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(bits), _mm512_set1_epi32(kHighHalf)));
  }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static void PrefetchL2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
  // keeps a loaded vector in its register: left to itself GCC may fold the load into every instruction that reads
  // it (one load feeding several multiply-adds becomes several loads)
  static void Pin(F& v) { __asm__("" : "+v"(v)); }
};
#elif defined(GPTOSS_SIMD_AVX2)
struct Simd {
  using F = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kRegisters = 16;
  static F Zero() { return _mm256_setzero_ps(); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F Set1(float v) { return _mm256_set1_ps(v); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static float Sum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F WidenInt8(const int8_t* values) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(values))));
  }
  static F Bf16Evens(const uint16_t* bits) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits)), 16));
  }
  static F Bf16Odds(const uint16_t* bits) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits)), _mm256_set1_epi32(kHighHalf)));
  }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static void PrefetchL2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
  // keeps a loaded vector in its register: left to itself GCC may fold the load into every instruction that reads
  // it (one load feeding several multiply-adds becomes several loads)
  static void Pin(F& v) { __asm__("" : "+v"(v)); }
};
#elif defined(GPTOSS_SIMD_NEON)
struct Simd {
  using F = float32x4_t;
  static constexpr int kLanes = 4;
  static constexpr int kRegisters = 32;
  static F Zero() { return vdupq_n_f32(0.0f); }
  static F Load(const float* p) { return vld1q_f32(p); }
  static void Store(float* p, F v) { vst1q_f32(p, v); }
  static F Set1(float v) { return vdupq_n_f32(v); }
  static F Fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F Mul(F a, F b) { return vmulq_f32(a, b); }
  static F Add(F a, F b) { return vaddq_f32(a, b); }
  static float Sum(F v) { return vaddvq_f32(v); }
  static F Bf16Evens(const uint16_t* bits) {
    return vreinterpretq_f32_u32(vshlq_n_u32(vreinterpretq_u32_u16(vld1q_u16(bits)), 16));
  }
  static F Bf16Odds(const uint16_t* bits) {
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_u16(vld1q_u16(bits)), vdupq_n_u32(0xFFFF0000u)));
  }
  static F WidenInt8(const int8_t* values) {
    int32_t word;  // exactly kLanes bytes: a wider load could pass the end of the weights
    std::memcpy(&word, values, sizeof word);
    const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(word)));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
  }
  static void Prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }
  static void PrefetchL2(const void* p) { __builtin_prefetch(p, 0, 2); }
  static void Pin(F& v) { __asm__("" : "+w"(v)); }
};
#endif

}  // namespace gptoss
