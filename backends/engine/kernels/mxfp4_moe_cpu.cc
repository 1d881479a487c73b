// gptoss.engine::MXFP4MoE on the CPU execution provider.
//
// y[t] = sum over the top-k experts e of token t (softmax over those k router logits) of
//        W2[e] . swiglu(W1[e] . x[t] + b1[e]) + b2[e]
// with W1 [E, 2I, H] and W2 [E, H, I] in MXFP4: FLOAT4E2M1 codes (two per byte, the first in the low
// nibble) and one E8M0 scale byte (2^(e-127)) per 32 values along the row. fp16/bf16 activations are
// widened to float on the way in and rounded (to nearest even) on the way out; the arithmetic is float. swiglu takes the interleaved
// gate/linear rows of gpt-oss: gate = min(g, limit), lin = clamp(l, -limit, limit),
// out = gate * sigmoid(alpha * gate) * (lin + 1).
//
// Each weight row is decoded once and used for every token routed to that expert, so the packed bytes are read
// once per step: an expert with few tokens (decode) looks its codes up in registers as it reads them (float, or
// int8 with `int8_activations`; AVX-512, AVX2 or NEON, else plain C++), one with more (prefill) decodes a few rows
// into floats and tiles them against its tokens (with `int8_activations` in an AVX2 or AVX-512 build, into int16
// against its tokens quantized as the int8 path quantizes them, packed once a phase: moe_int_tiles_cpu.h; in an AMX
// build, its task's rows into bfloat16 tiles against its tokens' pieces: amx_cpu.h). The work is split over (expert, block of rows) on ONNX Runtime's
// intra-op thread pool, a thread taking a batch of consecutive weights at a time (weight_batches.h).

#include "amx_cpu.h"
#include "moe_int_tiles_cpu.h"
#include "mxfp4_cpu.h"
#include "mxfp4_moe_op.h"
#include "simd_cpu.h"
#include "weight_batches.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

// The int8 path's two pieces as one int16 a value against int16 weights (WideRowDots): AVX-512 (BW, DQ, VL).
#if defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define GPTOSS_MOE_WIDE 1
#endif

// The int8 decode's sums reduced to one a block before their scaling, four pairs of blocks at a time (Int8GroupSteps):
// 256-bit builds, where the AVX-512 steps of two pairs a load (Int8PairSteps, with VNNI) do not take the pairs.
#if defined(__AVX2__) && defined(__FMA__) && \
    !(defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__))
#define GPTOSS_MOE_GROUPED 1
#endif

// The decode's float path on vectors reordered by block (PermuteBlocks, PermutedRowDots): AVX-512, AVX2 or NEON.
#if (defined(__AVX2__) && defined(__FMA__)) || defined(GPTOSS_SIMD_NEON)
#define GPTOSS_MOE_PERMUTED 1
#endif

namespace gptoss {
namespace {

// Rows (fc2) or gate/linear pairs (fc1) a task takes. In AVX2 builds a whole number of the prefill's groups of 6 decoded
// rows (kTileRows), so that every pass of its tiles takes 3 rows: with 16, a task's last group of 4 went as two passes
// of 2 (one 20b layer's 512-token step with the x86-64-v3 kernels on 2 AMD EPYC cores of the Zen 5 family, alternated
// in one process: 1.02-1.03x with 18, its decode unchanged). AVX-512's groups of 4 divide 16.
#if defined(GPTOSS_SIMD_AVX2)
constexpr int64_t kRowsPerTask = 18;
#else
constexpr int64_t kRowsPerTask = 16;
#endif
constexpr int64_t kTiledFrom = 4;  // experts with this many tokens in a step take the tiled path (prefill)
// Code bytes a decode step asks the cache for ahead of the one it reads (about a row of 2880 values): with the
// step's arithmetic between its loads, the hardware prefetcher alone leaves the loads waiting on memory
// (bench/moe_bench.py and llama_cpp_bench.py show the decode rates).
constexpr int64_t kPrefetchBytes = 1536;

// A vector quantized for the int8 path (QuantizePairs): int8 values, their remainders (two pieces; else null),
// block scales and offset sums.
struct QuantizedRow {
  const int8_t* q;
  const int8_t* remainders;
  const float* d;
  const int32_t* offset_sums;
  const int16_t* wide = nullptr;  // two pieces as one int16 a value, where WideRowDots takes them (else null)
  // each block's scale and offset sum, a group of four pairs' eight blocks in Int8GroupSteps's order (GroupBlocks),
  // where that path takes them (else null)
  const float* block_d = nullptr;
  const int32_t* block_offsets = nullptr;
};

// Scratch of one task, kept per thread: the vectors its rows meet, their dot products, decoded rows and
// per-vector accumulators (nothing is allocated per row or per step once it has grown).
struct Scratch {
  std::vector<const float*> xs;
  std::vector<QuantizedRow> quantized;  // the int8 path's vectors
  std::vector<float> dots, decoded, acc;
  std::vector<uint16_t> bf16;  // the AMX path's decoded rows
#if defined(GPTOSS_MOE_INT_TILES)
  IntTileScratch int_tiles;
#endif
};
// Dot products of one MXFP4 row (cols / 2 code bytes, cols / 32 scales) with `count` vectors:
// out[t] = row . xs[t]. Each block of 32 codes is decoded once and used for every vector.
#if defined(__AVX2__) && defined(__FMA__)
void RowDots(const uint8_t* codes, const uint8_t* scales, int64_t cols, const float* const* xs, int64_t count,
             float* out, std::vector<float>& acc) {
  // twice each E2M1 value, as int8 (exact): scaled back by half the block scale
  acc.assign(static_cast<size_t>(count) * 8, 0.0f);
  for (int64_t block = 0; block < cols / kBlock; ++block) {
    const auto [first, second] = TwiceE2M1(codes + block * (kBlock / 2));
    const __m256 v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first));
    const __m256 v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8)));
    const __m256 v2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second));
    const __m256 v3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8)));
    const __m256 scale = _mm256_set1_ps(kE8M0.values[scales[block]] * 0.5f);
    for (int64_t t = 0; t < count; ++t) {
      const float* x = xs[t] + block * kBlock;
      __m256 sum = _mm256_mul_ps(v0, _mm256_loadu_ps(x));
      sum = _mm256_fmadd_ps(v1, _mm256_loadu_ps(x + 8), sum);
      sum = _mm256_fmadd_ps(v2, _mm256_loadu_ps(x + 16), sum);
      sum = _mm256_fmadd_ps(v3, _mm256_loadu_ps(x + 24), sum);
      float* a = acc.data() + t * 8;
      _mm256_storeu_ps(a, _mm256_fmadd_ps(sum, scale, _mm256_loadu_ps(a)));
    }
  }
  for (int64_t t = 0; t < count; ++t) {
    const float* a = acc.data() + t * 8;
    out[t] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
  }
}

// Rows decoded to floats (scales applied) kTileRows at a time (4 in AVX-512 builds, 6 in AVX2 ones: two passes of 3,
// kPassRows below), then dot products tiled over them and the vectors so that every load feeds several multiply-adds
// (Tiles): the path for experts with many tokens (prefill).
constexpr int64_t kTileRows = Simd::kRegisters == 32 ? 4 : 6;
static_assert(kRowsPerTask % kTileRows == 0, "a task's rows are whole groups of decoded rows");

// `rows` consecutive rows (at most kTileRows) decoded into out, `cols` floats apart.
void DecodeRows(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, float* out) {
  for (int64_t block = 0; block < rows * cols / kBlock; ++block) {
    const auto [first, second] = TwiceE2M1(codes + block * (kBlock / 2));
    const __m256 scale = _mm256_set1_ps(kE8M0.values[scales[block]] * 0.5f);
    float* dst = out + block * kBlock;
    _mm256_storeu_ps(dst, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first))));
    _mm256_storeu_ps(dst + 8,
                     _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8)))));
    _mm256_storeu_ps(dst + 16, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second))));
    _mm256_storeu_ps(dst + 24,
                     _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8)))));
  }
}

inline float Sum8(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

// Eight consecutive blocks' E8M0 scales as floats, block j's in lane j, from one load: e is the float 2^(e-127) whose
// exponent field is e (e = 0, 2^-127, is a subnormal: the shift's 0 raised to it; 255 reads as infinity, as kE8M0's).
inline __m256 EightBlockScales(const uint8_t* scales) {
  const __m256i exponents = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)));
  return _mm256_castsi256_ps(_mm256_max_epi32(_mm256_slli_epi32(exponents, 23), _mm256_set1_epi32(0x00400000)));
}

#if defined(__AVX512F__)
// Few vectors (decode): four blocks (128 values, 64 code bytes) a step, read as 16 dwords: dword i holds values
// 8i..8i+7, nibble j of it value 8i+j. Shifted right by 4j, the dwords index the E2M1 values as floats (a permute is
// the lookup, and it reads only an index's low four bits), so the step's eight vectors of values come from one load,
// seven shifts and eight permutes, vector j's lane i being value 8i+j, with no widening of bytes to lanes; each vector
// x is laid out once per phase in that order (PermuteBlocks). Lane i belongs to block i/4: the step's products are
// summed per lane and scaled by a vector of its four blocks' scales (made for up to 16 blocks at a time). A row's last
// blocks, fewer than four, go as a step whose missing lanes are masked off (the loads too: nothing past the row is
// read). Alone on an Intel Xeon core (AVX-512; 8 experts' fc1 rows, 100 MB), one vector ran at 9.6 GB/s of codes
// against 9.0 for a block a step (its code bytes widened to lanes, the low nibbles masked), two and three within 3%
// of it; bench/moe_bench.py's decode rows show the rate.
constexpr int64_t kPermutedCols = kBlock;
constexpr int64_t kStepBlocks = 4;

// x's `cols` values (whole blocks) in the order PermutedRowDots meets them: per step of (up to) four blocks, with m
// blocks in the step, out[j * 4m + i] = x[8i + j] for value j of lane i.
void PermuteBlocks(const float* x, int64_t cols, float* out) {
  for (int64_t c = 0; c < cols; c += kStepBlocks * kBlock) {
    const int64_t lanes = std::min<int64_t>(kStepBlocks * kBlock, cols - c) / 8;
    for (int64_t j = 0; j < 8; ++j) {
      for (int64_t i = 0; i < lanes; ++i) out[c + j * lanes + i] = x[c + 8 * i + j];
    }
  }
}

template <int Count>
void PermutedRowDots(const uint8_t* codes, const uint8_t* scales, int64_t cols, const float* const* permuted,
                     float* out) {
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                      -2.0f, -3.0f, -4.0f, -6.0f);
  // E8M0 e as the float 2^(e-127), whose exponent field is e (e = 0, 2^-127, a subnormal: the shift's 0 raised to it)
  const __m512i smallest = _mm512_set1_epi32(0x00400000);
  // the steps' scale vectors from a group's 16 blocks: step s's lane i takes block 4s + i/4
  const __m512i spread[4] = {
      _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
      _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
      _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
      _mm512_setr_epi32(12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15)};
  // a step's sums run as two chains of four multiply-adds, so one accumulator a vector keeps up (its multiply-add a
  // step is no longer than a step's work)
  __m512 acc[Count];
  for (int t = 0; t < Count; ++t) acc[t] = _mm512_setzero_ps();
  // the step from value `c` over its `lanes` lanes (4 a block: 16 unless the row ends first), its blocks' scales in
  // `scale`
  auto step = [&](auto full, int64_t c, int64_t lanes, __m512 scale) {
    const __mmask16 mask = full ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << lanes) - 1);
    const uint8_t* bytes = codes + c / 2;
    _mm_prefetch(reinterpret_cast<const char*>(bytes + kPrefetchBytes), _MM_HINT_T0);
    const __m512i packed = full ? _mm512_loadu_si512(bytes) : _mm512_maskz_loadu_epi32(mask, bytes);
    // the shifts' counts constant, the values in registers (unrolled: a loop kept them on the stack)
    __m512 values[8];
    values[0] = _mm512_permutexvar_ps(packed, table);
#pragma GCC unroll 8
    for (int j = 1; j < 8; ++j) values[j] = _mm512_permutexvar_ps(_mm512_srli_epi32(packed, 4 * j), table);
    for (int t = 0; t < Count; ++t) {
      const float* x = permuted[t] + c;
      const auto load = [&](int j) {
        return full ? _mm512_loadu_ps(x + 16 * j) : _mm512_maskz_loadu_ps(mask, x + lanes * j);
      };
      // two chains of four: the step's sum waits on four multiply-adds, not eight
      __m512 even = _mm512_mul_ps(values[0], load(0)), odd = _mm512_mul_ps(values[1], load(1));
#pragma GCC unroll 4
      for (int j = 2; j < 8; j += 2) {
        even = _mm512_fmadd_ps(values[j], load(j), even);
        odd = _mm512_fmadd_ps(values[j + 1], load(j + 1), odd);
      }
      acc[t] = _mm512_fmadd_ps(_mm512_add_ps(even, odd), scale, acc[t]);
    }
  };
  const int64_t blocks = cols / kBlock;
  for (int64_t group = 0; group < blocks; group += 16) {
    const int64_t in_group = std::min<int64_t>(16, blocks - group);
    const __m512i exponents = _mm512_cvtepu8_epi32(
        _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << in_group) - 1), scales + group));
    const __m512 sixteen = _mm512_castsi512_ps(_mm512_max_epi32(_mm512_slli_epi32(exponents, 23), smallest));
    for (int64_t s = 0; s * kStepBlocks < in_group; ++s) {
      const int64_t lanes = std::min<int64_t>(kStepBlocks, in_group - s * kStepBlocks) * 4;
      const int64_t c = (group + s * kStepBlocks) * kBlock;
      const __m512 scale = _mm512_permutexvar_ps(spread[s], sixteen);
      if (lanes == 16) {
        step(std::true_type{}, c, lanes, scale);
      } else {
        step(std::false_type{}, c, lanes, scale);
      }
    }
  }
  for (int t = 0; t < Count; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}
#else
// Few vectors (decode) on AVX2: a pair of blocks a step, its 32 code bytes in one register (block j in 128-bit lane
// j). Each nibble's E2M1 value is a bfloat16 whose two bytes come from two byte-table lookups (a bfloat16 is a
// float's top half: exact), zipped into 16-bit words; a word pair's low word becomes a float by a 16-bit shift and
// its high word by masking the low one off. The vectors are laid out once per phase in the order those floats come
// (PermuteBlocks), so every lookup is in-lane and half the conversions are plain logic, not shuffles: in a standalone
// probe on 2 AMD EPYC cores (AVX2, no AVX-512) about 1.5x the rate of widening the codes to int32 lanes and looking
// each nibble up as a float by a cross-lane permute, as this path did before (bench/moe_bench.py's decode rows
// show its rate).
constexpr int64_t kPermutedCols = 2 * kBlock;

// x's `cols` values (a multiple of a pair of blocks) in the order PermutedRowDots meets them: per pair, for the low
// nibbles then the high ones (each block's evens, then its odds), for code bytes 0-7 then 8-15, the words' low
// halves then their high halves (bytes 0, 2, 4, 6, then 1, 3, 5, 7 of the eight), block 0's four values then block
// 1's.
void PermuteBlocks(const float* x, int64_t cols, float* out) {
  for (int64_t c = 0; c < cols; c += kPermutedCols) {
    float* o = out + c;
    for (int nibble = 0; nibble < 2; ++nibble) {
      for (int half = 0; half < 2; ++half) {
        for (int word_half = 0; word_half < 2; ++word_half) {
          for (int block = 0; block < 2; ++block) {
            for (int i = 0; i < 4; ++i) *o++ = x[c + block * kBlock + 2 * (half * 8 + 2 * i + word_half) + nibble];
          }
        }
      }
    }
  }
}

template <int Count>
void PermutedRowDots(const uint8_t* codes, const uint8_t* scales, int64_t cols, const float* const* permuted,
                     float* out) {
  // each E2M1 value's bfloat16: its high byte (sign and exponent) and its low byte
  const __m256i high_bytes = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, static_cast<char>(0x80), static_cast<char>(0xBF),
                    static_cast<char>(0xBF), static_cast<char>(0xBF), static_cast<char>(0xC0), static_cast<char>(0xC0),
                    static_cast<char>(0xC0), static_cast<char>(0xC0)));
  const __m256i low_bytes = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0x00, 0x00, static_cast<char>(0x80), static_cast<char>(0xC0), 0x00, 0x40, static_cast<char>(0x80),
                    static_cast<char>(0xC0), 0x00, 0x00, static_cast<char>(0x80), static_cast<char>(0xC0), 0x00, 0x40,
                    static_cast<char>(0x80), static_cast<char>(0xC0)));
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  const __m256i high_word = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  // a pair's sums in two chains for one vector (its first and second 16-bit words), one chain for more; the pairs'
  // scaled sums alternate between two accumulators (both named statically: an index computed per pair kept them in
  // memory)
  constexpr int kChains = Count == 1 ? 2 : 1;
  __m256 acc[Count][2];
  for (int t = 0; t < Count; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  // a pair's scaled sums: `scale` holds its first block's E8M0 scale in the low four lanes, its second's in the high
  auto step = [&](int64_t pair, int parity, __m256 scale) {
    if (pair % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(codes + pair * 32 + kPrefetchBytes), _MM_HINT_T0);
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + pair * 32));
    const __m256i nibbles[2] = {_mm256_and_si256(packed, low_nibble),
                                _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibble)};
    __m256 sums[Count][kChains];
    for (int t = 0; t < Count; ++t)
      for (int c = 0; c < kChains; ++c) sums[t][c] = _mm256_setzero_ps();
    for (int n = 0; n < 2; ++n) {
      const __m256i high = _mm256_shuffle_epi8(high_bytes, nibbles[n]), low = _mm256_shuffle_epi8(low_bytes, nibbles[n]);
      const __m256i words[2] = {_mm256_unpacklo_epi8(low, high), _mm256_unpackhi_epi8(low, high)};
      for (int h = 0; h < 2; ++h) {
        const __m256 first = _mm256_castsi256_ps(_mm256_slli_epi32(words[h], 16));
        const __m256 second = _mm256_castsi256_ps(_mm256_and_si256(words[h], high_word));
        for (int t = 0; t < Count; ++t) {
          const float* x = permuted[t] + pair * kPermutedCols + n * 32 + h * 16;
          sums[t][0] = _mm256_fmadd_ps(first, _mm256_loadu_ps(x), sums[t][0]);
          sums[t][kChains - 1] = _mm256_fmadd_ps(second, _mm256_loadu_ps(x + 8), sums[t][kChains - 1]);
        }
      }
    }
    for (int t = 0; t < Count; ++t) {
      const __m256 sum = kChains == 1 ? sums[t][0] : _mm256_add_ps(sums[t][0], sums[t][kChains - 1]);
      acc[t][parity] = _mm256_fmadd_ps(sum, scale, acc[t][parity]);
    }
  };
  // four pairs' eight scales a load (EightBlockScales), spread over each pair's lanes by a permute
  const __m256i spread[4] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                             _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
  const int64_t pairs = cols / kPermutedCols;
  int64_t pair = 0;
  for (; pair + 4 <= pairs; pair += 4) {
    const __m256 eight = EightBlockScales(scales + 2 * pair);
    for (int i = 0; i < 4; ++i) step(pair + i, i % 2, _mm256_permutevar8x32_ps(eight, spread[i]));
  }
  for (; pair < pairs; ++pair) {
    step(pair, pair % 2,
         _mm256_setr_m128(_mm_set1_ps(kE8M0.values[scales[2 * pair]]), _mm_set1_ps(kE8M0.values[scales[2 * pair + 1]])));
  }
  for (int t = 0; t < Count; ++t) out[t] = Sum8(_mm256_add_ps(acc[t][0], acc[t][1]));
}
#endif

// The prefill's tiles, in the widest vectors of the build (simd_cpu.h): up to kPassRows decoded rows x up to
// kTileVectors vectors over the whole row, the sums in registers from the first column to the last and each x load
// feeding every row's multiply-add from a register: 4 rows x 6 vectors (24 sums) in AVX-512's 32 registers, 3 x 4
// (12 sums) in AVX2's 16, whose 7 loads a column step feed 12 multiply-adds where 2 rows x 6 vectors took 8 (on 2 AMD
// EPYC cores with AVX2 only, a 20b layer's 512-token step in 954 ms against 1,079 with 2 x 6, alternated in one
// process; bench/moe_bench.py's prefill row shows the rate). Left to itself GCC folds a load into every multiply-add
// (AVX2's former 4 rows x 3 vectors: 16 loads for 12 of them; tuned for znver3, the rows' loads), so each load is
// pinned to a register; sums carried to memory between column chunks ran AVX-512's prefill about half as fast on 2
// AMD EPYC cores, and chunks that keep AVX2's rows in L1 gave nothing measurable.
constexpr int kPassRows = Simd::kRegisters == 32 ? 4 : 3;
constexpr int64_t kTileVectors = Simd::kRegisters == 32 ? 6 : 4;

// out[r * stride + v] = rows[r] . xs[v] for Rows rows and Vectors vectors (cols a multiple of the lanes: MXFP4 rows
// come in blocks of 32).
template <int Rows, int Vectors>
void Tile(const float* rows, int64_t cols, const float* const* xs, float* out, int64_t stride) {
  Simd::F sums[Rows][Vectors];
  for (auto& row : sums)
    for (auto& sum : row) sum = Simd::Zero();
  for (int64_t c = 0; c < cols; c += Simd::kLanes) {
    Simd::F w[Rows];
    for (int r = 0; r < Rows; ++r) {
      w[r] = Simd::Load(rows + r * cols + c);
      Simd::Pin(w[r]);  // one load feeds every vector
    }
    for (int v = 0; v < Vectors; ++v) {
      Simd::F x = Simd::Load(xs[v] + c);
      Simd::Pin(x);  // one load feeds every row
      for (int r = 0; r < Rows; ++r) sums[r][v] = Simd::Fma(w[r], x, sums[r][v]);
    }
  }
  for (int r = 0; r < Rows; ++r)
    for (int v = 0; v < Vectors; ++v) out[r * stride + v] = Simd::Sum(sums[r][v]);
}

template <int Rows, int Vectors>
void TileOf(const float* rows, int64_t cols, const float* const* xs, float* out, int64_t stride, int64_t vectors) {
  if (vectors == Vectors) return Tile<Rows, Vectors>(rows, cols, xs, out, stride);
  if constexpr (Vectors > 1) TileOf<Rows, Vectors - 1>(rows, cols, xs, out, stride, vectors);
}

template <int Rows>
void PassOf(int64_t pass_rows, const float* rows, int64_t cols, const float* const* xs, float* out, int64_t stride,
            int64_t vectors) {
  if (pass_rows == Rows) return TileOf<Rows, kTileVectors>(rows, cols, xs, out, stride, vectors);
  if constexpr (Rows > 1) PassOf<Rows - 1>(pass_rows, rows, cols, xs, out, stride, vectors);
}

// How many of `left` decoded rows the next pass takes: kPassRows, except that 4 left of passes of 3 go as 2 and 2.
int64_t PassRows(int64_t left) { return kPassRows == 3 && left == 4 ? 2 : std::min<int64_t>(kPassRows, left); }

// out[r * count + t] = rows[r] . xs[t] for `decoded` rows (at most kTileRows) and every vector: each tile of vectors
// meets every pass of rows.
void Tiles(const float* rows, int64_t decoded, int64_t cols, const float* const* xs, int64_t count, float* out) {
  for (int64_t t = 0; t < count; t += kTileVectors) {
    for (int64_t r = 0, n = 0; r < decoded; r += n) {
      n = PassRows(decoded - r);
      PassOf<kPassRows>(n, rows + r * cols, cols, xs + t, out + r * count + t, count, std::min(kTileVectors, count - t));
    }
  }
}

// out[r * count + t] = row (first_row + r) . xs[t], for `rows` consecutive rows of one matrix.
void ConsecutiveRowDots(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                        const float* const* xs, int64_t count, float* out, Scratch& scratch) {
  if (count < kTiledFrom) {
    for (int64_t row = 0; row < rows; ++row) {
      RowDots(codes + row * cols / 2, scales + row * cols / kBlock, cols, xs, count, out + row * count, scratch.acc);
    }
    return;
  }
  std::vector<float>& decoded = scratch.decoded;
  decoded.resize(static_cast<size_t>(kTileRows * cols));
  for (int64_t row = 0; row < rows; row += kTileRows) {
    const int64_t group = std::min(kTileRows, rows - row);
    DecodeRows(codes + row * cols / 2, scales + row * cols / kBlock, group, cols, decoded.data());
    Tiles(decoded.data(), group, cols, xs, count, out + row * count);
  }
}
#else
constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void RowDots(const uint8_t* codes, const uint8_t* scales, int64_t cols, const float* const* xs, int64_t count,
             float* out, std::vector<float>& acc) {
  acc.assign(static_cast<size_t>(count), 0.0f);
  float values[kBlock];
  for (int64_t block = 0; block < cols / kBlock; ++block) {
    const uint8_t* bytes = codes + block * (kBlock / 2);
    for (int i = 0; i < kBlock / 2; ++i) {
      values[2 * i] = kE2M1[bytes[i] & 0x0F];
      values[2 * i + 1] = kE2M1[bytes[i] >> 4];
    }
    for (int64_t t = 0; t < count; ++t) {
      const float* x = xs[t] + block * kBlock;
      float sum = 0.0f;
      for (int j = 0; j < kBlock; ++j) sum += values[j] * x[j];
      acc[t] += sum * kE8M0.values[scales[block]];
    }
  }
  std::copy(acc.begin(), acc.end(), out);
}

void ConsecutiveRowDots(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                        const float* const* xs, int64_t count, float* out, Scratch& scratch) {
  for (int64_t row = 0; row < rows; ++row) {
    RowDots(codes + row * cols / 2, scales + row * cols / kBlock, cols, xs, count, out + row * count, scratch.acc);
  }
}
#endif

#if defined(GPTOSS_SIMD_NEON)
// Few vectors (decode) on NEON: each block's 16 code bytes give the E2M1 values of their low nibbles (the block's
// evens) and high nibbles (its odds) as bfloat16 halves, two table lookups (their high and their low bytes) zipped,
// each widened to a float by a shift (exact), against the block's even and odd x values (each vector reordered once
// per phase, as for AVX2).
template <int Count>
void PermutedRowDots(const uint8_t* codes, const uint8_t* scales, int64_t cols, const float* const* permuted,
                     float* out) {
  const uint8x16_t high_bytes = {0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                 0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};
  const uint8x16_t low_bytes = {0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0};
  // 16 codes' values as four vectors of floats, in order
  const auto widen = [&](uint8x16_t nibbles, float32x4_t* v) {
    const uint8x16_t high = vqtbl1q_u8(high_bytes, nibbles), low = vqtbl1q_u8(low_bytes, nibbles);
    const uint16x8_t first = vreinterpretq_u16_u8(vzip1q_u8(low, high));
    const uint16x8_t second = vreinterpretq_u16_u8(vzip2q_u8(low, high));
    v[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(first), 16));
    v[1] = vreinterpretq_f32_u32(vshll_high_n_u16(first, 16));
    v[2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(second), 16));
    v[3] = vreinterpretq_f32_u32(vshll_high_n_u16(second, 16));
  };
  float32x4_t acc[Count][2];  // even blocks' sums and odd blocks'
  for (int t = 0; t < Count; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
  auto step = [&](int64_t block, int parity) {
    const uint8x16_t packed = vld1q_u8(codes + block * 16);
    float32x4_t v[8];
    widen(vandq_u8(packed, vdupq_n_u8(0x0F)), v);
    widen(vshrq_n_u8(packed, 4), v + 4);
    const float scale = kE8M0.values[scales[block]];
    for (int t = 0; t < Count; ++t) {
      const float* x = permuted[t] + block * kBlock;
      float32x4_t sum = vmulq_f32(v[0], vld1q_f32(x));
      for (int j = 1; j < 8; ++j) sum = vfmaq_f32(sum, v[j], vld1q_f32(x + 4 * j));
      acc[t][parity] = vfmaq_n_f32(acc[t][parity], sum, scale);
    }
  };
  const int64_t blocks = cols / kBlock;
  int64_t block = 0;
  for (; block + 2 <= blocks; block += 2) {
    step(block, 0);
    step(block + 1, 1);
  }
  if (block < blocks) step(block, 0);
  for (int t = 0; t < Count; ++t) out[t] = vaddvq_f32(vaddq_f32(acc[t][0], acc[t][1]));
}
#endif

#if defined(GPTOSS_SIMD_NEON)
constexpr int64_t kPermutedCols = kBlock;

// Each block of 32 values as its 16 evens, then its 16 odds.
void PermuteBlocks(const float* x, int64_t cols, float* out) {
  for (int64_t c = 0; c < cols; c += kBlock) {
    for (int i = 0; i < kBlock / 2; ++i) {
      out[c + i] = x[c + 2 * i];
      out[c + kBlock / 2 + i] = x[c + 2 * i + 1];
    }
  }
}
#endif

#if defined(GPTOSS_MOE_PERMUTED)
// For each of `rows` consecutive rows, dots(Count, its codes, its scales, its `count` outputs) with Count the number
// of vectors as a constant: 1, 2, or 3 for more (the decode paths take fewer than kTiledFrom).
template <typename Dots>
void EachRow(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, int64_t count, float* out,
             Dots dots) {
  for (int64_t row = 0; row < rows; ++row) {
    const uint8_t* row_codes = codes + row * cols / 2;
    const uint8_t* row_scales = scales + row * cols / kBlock;
    float* row_out = out + row * count;
    switch (count) {
      case 1: dots(std::integral_constant<int, 1>{}, row_codes, row_scales, row_out); break;
      case 2: dots(std::integral_constant<int, 2>{}, row_codes, row_scales, row_out); break;
      default: dots(std::integral_constant<int, 3>{}, row_codes, row_scales, row_out); break;
    }
  }
}

// out[r * count + t] = row r . vector t for `rows` consecutive rows and up to three vectors, each already reordered
// by PermuteBlocks (once per phase: PrepareRows).
void FewVectorDots(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                   const float* const* permuted, int64_t count, float* out) {
  EachRow(codes, scales, rows, cols, count, out, [&](auto vectors, const uint8_t* c, const uint8_t* s, float* o) {
    PermutedRowDots<decltype(vectors)::value>(c, s, cols, permuted, o);
  });
}

#endif

// Int8 activations (the `int8_activations` attribute; here decode: fewer than kInt8Below tokens per expert, the
// integer tiles taking the experts with more: moe_int_tiles_cpu.h). Each
// vector is quantized once per phase to int8 per block of 32 (scale max|x| / 127, rounded to nearest even, as
// q8_0 does), laid out by pairs of blocks as the code bytes hold their values: a pair's two blocks' evens (low
// nibbles), then their odds (high nibbles), two pairs at a time (both pairs' evens, then both pairs' odds: one
// 512-bit load each) and a last odd pair alone; each block's scale is repeated over the four int32 lanes its sums
// land in. A block's dot product is then taken in integers (twice each E2M1 value as int8, exact) and scaled by
// half its E8M0 scale times the vector block's scale. For AVX2's byte multiply-add, whose first operand is unsigned,
// the weights are taken as twice their E2M1 value plus kWeightOffset (0 to 24) and each int32 lane's share of that
// offset, kWeightOffset times the sum of the lane's eight x values, is stored with the vector and taken back off.
//
// In two pieces (`int8_activations` 2), each value's remainder x - q s (s = max|x| / 127, the first piece's step;
// the remainder taken with one rounding, as a fused multiply-add) is quantized too, in steps of s / kRemainderSteps
// (rounded to nearest even, within +-127), laid out as q; a block's sums are taken as kRemainderSteps times the
// values' plus the remainders', in integers (exact), and the stored block scale is s / kRemainderSteps: each value
// within s / 508 of x, about 15 bits of the block's largest where one piece keeps 8. AVX-512 builds take the two
// pieces as one int16 a value instead, kRemainderSteps q + r (QuantizeWide, WideRowDots): the same integer sums.
constexpr int64_t kPair = 2 * kBlock;  // columns per quantized pair of blocks
constexpr int64_t kPairScales = 8;     // scales stored per pair (each block's, four times)
constexpr int64_t kPairLanes = 8;      // int32 lanes of a pair's sums (four a block), and offset sums stored a pair
constexpr int32_t kWeightOffset = 12;
constexpr int64_t kInt8Below = 4;      // experts with fewer tokens than this in a step take the int8 path
constexpr int32_t kRemainderSteps = 254;  // a remainder's steps in the first piece's one

bool Int8Fits(int64_t cols) { return cols % kPair == 0; }

// Where a pair's 32 even bytes start in a quantized vector of `pairs` pairs, and how far after them its odd bytes.
int64_t EvensAt(int64_t pair, int64_t pairs) {
  return pair < pairs / 2 * 2 ? pair / 2 * 2 * kPair + pair % 2 * kBlock : pair * kPair;
}
int64_t OddsGap(int64_t pair, int64_t pairs) { return pair < pairs / 2 * 2 ? kPair : kBlock; }

// A block's steps: the first piece's, s = max|x| / 127 (rounded to nearest even), and its remainders'.
struct BlockSteps {
  float inverse, step, remainder_inverse;
  explicit BlockSteps(const float* xb) {
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    step = amax / 127.0f;
    remainder_inverse = inverse * static_cast<float>(kRemainderSteps);
  }
  // x as its first piece; with `rest`, its remainder x - q s (one rounding, a fused multiply-add) as the second
  int8_t Piece(float x, int8_t* rest) const {
    const float value = std::nearbyint(x * inverse);
    if (rest != nullptr) {
      const float remainder = std::fma(-value, step, x);
      *rest = static_cast<int8_t>(std::clamp(std::nearbyint(remainder * remainder_inverse), -127.0f, 127.0f));
    }
    return static_cast<int8_t>(value);
  }
  // x as one int16: its first piece, or with two pieces kRemainderSteps q + r (exact, within +-32385)
  int16_t Word(float x, int pieces) const {
    int8_t rest = 0;
    const int8_t piece = Piece(x, pieces == 2 ? &rest : nullptr);
    return static_cast<int16_t>(pieces == 2 ? kRemainderSteps * piece + rest : piece);
  }
  // the step of a block's sums in `pieces` pieces: s, or s / kRemainderSteps
  float SumStep(int pieces) const { return pieces == 2 ? step / static_cast<float>(kRemainderSteps) : step; }
};

// x's `cols` values into q (int8, laid out as above), d (the blocks' scales) and offset_sums (kPairLanes a pair);
// with `remainders` (null: one piece), their remainders too, laid out as q.
void QuantizePairs(const float* x, int64_t cols, int8_t* q, int8_t* remainders, float* d, int32_t* offset_sums) {
  const int64_t pairs = cols / kPair;
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t evens_at = EvensAt(pair, pairs), odds_at = evens_at + OddsGap(pair, pairs);
    for (int half = 0; half < 2; ++half) {
      const float* xb = x + pair * kPair + half * kBlock;
      const BlockSteps steps(xb);
      for (int i = 0; i < kBlock / 2; ++i) {
        const int64_t at = half * 16 + i;
        q[evens_at + at] = steps.Piece(xb[2 * i], remainders ? remainders + evens_at + at : nullptr);
        q[odds_at + at] = steps.Piece(xb[2 * i + 1], remainders ? remainders + odds_at + at : nullptr);
      }
      const float scale = steps.SumStep(remainders ? 2 : 1);
      std::fill(d + pair * kPairScales + half * 4, d + pair * kPairScales + half * 4 + 4, scale);
      for (int lane = 0; lane < 4; ++lane) {  // a lane sums the products of 4 consecutive code bytes
        int32_t sum = 0;
        for (int i = half * 16 + 4 * lane; i < half * 16 + 4 * lane + 4; ++i) {
          const int32_t values = q[evens_at + i] + q[odds_at + i];
          sum += remainders ? kRemainderSteps * values + remainders[evens_at + i] + remainders[odds_at + i] : values;
        }
        offset_sums[pair * kPairLanes + half * 4 + lane] = kWeightOffset * sum;
      }
    }
  }
}

#if defined(GPTOSS_MOE_GROUPED)
constexpr int64_t kGroupPairs = 4;  // pairs of blocks whose sums Int8GroupSteps reduces together

// Block j of a group's eight as Int8GroupSteps's reduction leaves it: lane j holds block kGroupOrder[j] of the group.
constexpr int kGroupOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// QuantizePairs's block scales and offset sums of x's whole groups of kGroupPairs pairs, one a block, each group's
// blocks in kGroupOrder (the pairs past the last whole group keep their lanes' own: Int8RowDots's steps take them).
void GroupBlocks(const float* d, const int32_t* offset_sums, int64_t pairs, float* block_d, int32_t* block_offsets) {
  for (int64_t group = 0; group < pairs / kGroupPairs; ++group) {
    for (int j = 0; j < 8; ++j) {
      const int64_t block = group * 2 * kGroupPairs + kGroupOrder[j];  // block b: pair b / 2, its lanes 4 (b % 2) on
      const int64_t lanes = block / 2 * kPairLanes + block % 2 * 4;
      block_d[group * 8 + j] = d[block / 2 * kPairScales + block % 2 * 4];
      block_offsets[group * 8 + j] =
          offset_sums[lanes] + offset_sums[lanes + 1] + offset_sums[lanes + 2] + offset_sums[lanes + 3];
    }
  }
}
#endif

#if defined(GPTOSS_MOE_INT_TILES)
// x's `cols` values in order as int16 for the integer tiles (moe_int_tiles_cpu.h): in `pieces` pieces as QuantizePairs
// takes them, one (q) or two as one value (kRemainderSteps q + r); steps[block] the block's step (s, or
// s / kRemainderSteps).
void QuantizeWords(const float* x, int64_t cols, int pieces, int16_t* values, float* steps) {
  for (int64_t block = 0; block < cols / kBlock; ++block) {
    const float* xb = x + block * kBlock;
    const BlockSteps block_steps(xb);
    for (int j = 0; j < kBlock; ++j) values[block * kBlock + j] = block_steps.Word(xb[j], pieces);
    steps[block] = block_steps.SumStep(pieces);
  }
}
#endif

#if defined(GPTOSS_MOE_WIDE)
// Two pieces as one int16 a value for WideRowDots: kRemainderSteps q + r (exact, within +-32385). A group of
// blocks, four (two pairs) or, the last of an odd count of pairs, two, holds value 4w + j of the group (counted
// from its first) at j * (its values / 4) + w, as the code words give their nibbles; d as QuantizePairs's.
void QuantizeWide(const float* x, int64_t cols, int16_t* wide, float* d) {
  const int64_t pairs = cols / kPair;
  for (int64_t block = 0; block < cols / kBlock; ++block) {
    const int64_t pair = block / 2;
    const bool two_pairs = pair < pairs / 2 * 2;
    const int64_t group_at = two_pairs ? pair / 2 * 2 * kPair : pair * kPair;
    const int64_t quarter = (two_pairs ? 2 * kPair : kPair) / 4;
    const float* xb = x + block * kBlock;
    const BlockSteps steps(xb);
    for (int j = 0; j < kBlock; ++j) {
      const int64_t v = block * kBlock + j - group_at;
      wide[group_at + v % 4 * quarter + v / 4] = steps.Word(xb[j], 2);
    }
    float* block_scales = d + pair * kPairScales + block % 2 * 4;
    std::fill(block_scales, block_scales + 4, steps.SumStep(2));
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The byte dot product into int32 lanes in 256-bit registers: AVX-512 VNNI's, or AVX-VNNI's (the same instruction
// VEX-encoded: Intel's Alder Lake and later clients and its AVX2-only E-core Xeons, AMD's Zen 5).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define GPTOSS_DPBUSD256 _mm256_dpbusd_epi32
#elif defined(__AVXVNNI__)
#define GPTOSS_DPBUSD256 _mm256_dpbusd_avx_epi32
#endif

// The int8 path's weight lookup in each 128-bit lane: twice each E2M1 value plus kWeightOffset, by code nibble.
inline __m256i OffsetWeights() {
  return _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

// In each int32 lane, the sum of the eight u8 x s8 products of its four bytes of a . b and of c . d (no overflow:
// a and c <= 24, |b| and |d| <= 127, so the byte multiply-add's int16 sums stay within 4 x 24 x 127).
inline __m256i DotPairU8S8(__m256i a, __m256i b, __m256i c, __m256i d) {
#if defined(GPTOSS_DPBUSD256)
  return GPTOSS_DPBUSD256(GPTOSS_DPBUSD256(_mm256_setzero_si256(), a, b), c, d);
#else
  const __m256i sums = _mm256_add_epi16(_mm256_maddubs_epi16(a, b), _mm256_maddubs_epi16(c, d));
  return _mm256_madd_epi16(sums, _mm256_set1_epi16(1));
#endif
}

// In each int32 lane, kRemainderSteps times DotPairU8S8(a, b, c, d) plus DotPairU8S8(a, e, c, f): two pieces' sums.
inline __m256i DotPiecesU8S8(__m256i a, __m256i b, __m256i c, __m256i d, __m256i e, __m256i f) {
  static_assert(kRemainderSteps == 256 - 2, "the values' sums are scaled by two shifts");
#if defined(GPTOSS_DPBUSD256)
  // the remainders' products accumulate onto the values' sums times kRemainderSteps
  const __m256i values = DotPairU8S8(a, b, c, d);
  const __m256i scaled = _mm256_sub_epi32(_mm256_slli_epi32(values, 8), _mm256_slli_epi32(values, 1));
  return GPTOSS_DPBUSD256(GPTOSS_DPBUSD256(scaled, a, e), c, f);
#else
  // each piece's int16 sums as DotPairU8S8's, widened and weighed by one multiply-add each
  const __m256i values = _mm256_add_epi16(_mm256_maddubs_epi16(a, b), _mm256_maddubs_epi16(c, d));
  const __m256i rest = _mm256_add_epi16(_mm256_maddubs_epi16(a, e), _mm256_maddubs_epi16(c, f));
  return _mm256_add_epi32(_mm256_madd_epi16(values, _mm256_set1_epi16(kRemainderSteps)),
                          _mm256_madd_epi16(rest, _mm256_set1_epi16(1)));
#endif
}

#if defined(__AVX512BW__)
// Four blocks' E8M0 scales (at `scales`) as floats, block j's on the four int32 lanes of 128-bit lane j.
inline __m512 FourBlockScales(const uint8_t* scales) {
  const __m512i each_four_times =  // lane j of 128 bits: scale byte j zero-extended into each of its four int32s
      _mm512_set_epi8(-1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 2, -1, -1, -1, 2, -1, -1,
                      -1, 2, -1, -1, -1, 2, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 0,
                      -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1, 0);
  const __m512i smallest = _mm512_set1_epi32(0x00400000);  // E8M0 0: 2^-127 (a subnormal), not the shift's 0
  uint32_t four_scales;
  std::memcpy(&four_scales, scales, sizeof four_scales);
  const __m512i exponents = _mm512_shuffle_epi8(_mm512_set1_epi32(static_cast<int>(four_scales)), each_four_times);
  return _mm512_castsi512_ps(_mm512_max_epi32(_mm512_slli_epi32(exponents, 23), smallest));
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
// Two pairs of blocks (64 code bytes, 128 values) a step in 512-bit registers: lane j of 128 bits holds block j's
// codes, its evens' and odds' sums land in its four int32 lanes. The weights are offset as for AVX2 (twice each E2M1
// value plus kWeightOffset: unsigned), so a piece costs its two loads and two byte multiply-adds, the second piece's
// accumulating onto the first's sums times kRemainderSteps, and the two pairs' offset sums come off in one subtraction.
// The magnitudes met by x bytes negated under each code's sign bit (as this path did before) cost two more
// instructions a piece: 13.3 cycles of the time-stamp counter per 64 code bytes in two pieces against 11.0 now, on an
// Intel Xeon core with the rows in L2 (a standalone probe; bench/moe_bench.py's decode rows show the rate).
// Adds the steps' scaled sums to `acc` and returns the first pair not taken.
template <int Count, int Pieces>
int64_t Int8PairSteps(const uint8_t* codes, const uint8_t* scales, int64_t pairs, const QuantizedRow* xs,
                      __m256* acc) {
  static_assert(kRemainderSteps == 256 - 2, "the values' sums are scaled by two shifts");
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low_nibble = _mm512_set1_epi8(0x0F);
  __m512 wide[Count];
  for (int t = 0; t < Count; ++t) wide[t] = _mm512_setzero_ps();
  int64_t pair = 0;
  for (; pair + 2 <= pairs; pair += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + pair * kBlock + kPrefetchBytes), _MM_HINT_T0);
    const __m512i packed = _mm512_loadu_si512(codes + pair * kBlock);
    const __m512i evens = _mm512_shuffle_epi8(table, _mm512_and_si512(packed, low_nibble));
    const __m512i odds = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibble));
    const __m512 weight_scales = FourBlockScales(scales + 2 * pair);
    for (int t = 0; t < Count; ++t) {
      // a piece's sums added to `sums`: both pairs' evens at `q`, then (kPair on) their odds
      const auto add_piece = [&](__m512i sums, const int8_t* q) {
        return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sums, evens, _mm512_loadu_si512(q)), odds,
                                   _mm512_loadu_si512(q + kPair));
      };
      const int64_t at = EvensAt(pair, pairs);
      __m512i sums = add_piece(_mm512_setzero_si512(), xs[t].q + at);
      if constexpr (Pieces == 2) {
        sums = add_piece(_mm512_sub_epi32(_mm512_slli_epi32(sums, 8), _mm512_slli_epi32(sums, 1)),
                         xs[t].remainders + at);
      }
      const __m512i dots = _mm512_sub_epi32(sums, _mm512_loadu_si512(xs[t].offset_sums + pair * kPairLanes));
      const __m512 scale = _mm512_mul_ps(weight_scales, _mm512_loadu_ps(xs[t].d + pair * kPairScales));
      wide[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, wide[t]);
    }
  }
  for (int t = 0; t < Count; ++t) {
    acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(_mm512_castps512_ps256(wide[t]), _mm512_extractf32x8_ps(wide[t], 1)));
  }
  return pair;
}
#endif

#if defined(GPTOSS_MOE_WIDE)
// acc plus, in each int32 lane, the two products of its int16 pairs (a 512- or 256-bit register): VNNI's word
// multiply-add, else AVX-512BW's multiply-add and an addition.
template <typename V>
inline V AddWordDots(V acc, V a, V b) {
  static_assert(sizeof(V) == 64 || sizeof(V) == 32, "a 512- or 256-bit integer register");
#if defined(__AVX512VNNI__)
  if constexpr (sizeof(V) == 64) return _mm512_dpwssd_epi32(acc, a, b);
  else return _mm256_dpwssd_epi32(acc, a, b);
#else
  if constexpr (sizeof(V) == 64) return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
  else return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// sum_j of the word dot products of weights[j] and x[j], as two chains of two multiply-adds added: one chain of four
// waits on each one's latency (on a Zen 5 AMD EPYC core, one thread, WideRowDots over rows in L1 read 37 GB/s of
// codes with two chains against 25-30 with one, 23-27 against 19-22 from memory; four chains of one, 25 in L1).
template <typename V>
inline V FourWordDots(const V (&weights)[4], const V (&x)[4]) {
  const V low = AddWordDots(AddWordDots(V{}, weights[0], x[0]), weights[1], x[1]);
  const V high = AddWordDots(AddWordDots(V{}, weights[2], x[2]), weights[3], x[3]);
  if constexpr (sizeof(V) == 64) return _mm512_add_epi32(low, high);
  else return _mm256_add_epi32(low, high);
}

// Two pieces as one int16 a value (QuantizeWide) against the weights as int16, twice their E2M1 values: each code
// word's four nibbles index a 32-entry word table (the 16 values twice: a permute reads an index's low five bits),
// shifted down by 0, 4, 8 and 12, so the 64 code bytes of two pairs give four vectors of words, vector j's word w
// being value 4w + j, without masking; the word multiply-adds sum eight products in each int32 lane, value 8m to
// 8m + 7 in lane m (block m / 4, as Int8PairSteps's). Signed both, nothing is offset; the sums are those of
// Int8PairSteps's two pieces, exactly, in 4 multiply-adds a vector where those took 4, two shifts, a subtraction
// and the offset's subtraction (without VNNI, where the int8 path has only AVX2's steps of one pair: 4 multiply-adds
// and 4 additions for two pairs). A last odd pair goes in 256-bit registers.
template <int Count>
void WideRowDots(const uint8_t* codes, const uint8_t* scales, int64_t cols, const QuantizedRow* xs, float* out) {
  const __m512i table = _mm512_set_epi16(-12, -8, -6, -4, -3, -2, -1, 0, 12, 8, 6, 4, 3, 2, 1, 0, -12, -8, -6, -4, -3,
                                         -2, -1, 0, 12, 8, 6, 4, 3, 2, 1, 0);
  __m512 wide[Count];
  for (int t = 0; t < Count; ++t) wide[t] = _mm512_setzero_ps();
  const int64_t pairs = cols / kPair;
  int64_t pair = 0;
  for (; pair + 2 <= pairs; pair += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + pair * kBlock + kPrefetchBytes), _MM_HINT_T0);
    const __m512i packed = _mm512_loadu_si512(codes + pair * kBlock);
    const __m512i weights[4] = {
        _mm512_permutexvar_epi16(packed, table), _mm512_permutexvar_epi16(_mm512_srli_epi16(packed, 4), table),
        _mm512_permutexvar_epi16(_mm512_srli_epi16(packed, 8), table),
        _mm512_permutexvar_epi16(_mm512_srli_epi16(packed, 12), table)};
    const __m512 weight_scales = FourBlockScales(scales + 2 * pair);
    for (int t = 0; t < Count; ++t) {
      const int16_t* x = xs[t].wide + pair * kPair;
      const __m512i sums = FourWordDots(weights, {_mm512_loadu_si512(x), _mm512_loadu_si512(x + 32),
                                                  _mm512_loadu_si512(x + 64), _mm512_loadu_si512(x + 96)});
      const __m512 scale = _mm512_mul_ps(weight_scales, _mm512_loadu_ps(xs[t].d + pair * kPairScales));
      wide[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, wide[t]);
    }
  }
  __m256 acc[Count];
  for (int t = 0; t < Count; ++t) {
    acc[t] = _mm256_add_ps(_mm512_castps512_ps256(wide[t]), _mm512_extractf32x8_ps(wide[t], 1));
  }
  if (pair < pairs) {  // 32 code bytes: 16 words, four vectors of 16 values
    const __m256i half_table = _mm512_castsi512_si256(table);
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + pair * kBlock));
    const __m256i weights[4] = {
        _mm256_permutexvar_epi16(packed, half_table),
        _mm256_permutexvar_epi16(_mm256_srli_epi16(packed, 4), half_table),
        _mm256_permutexvar_epi16(_mm256_srli_epi16(packed, 8), half_table),
        _mm256_permutexvar_epi16(_mm256_srli_epi16(packed, 12), half_table)};
    const __m256 weight_scales = _mm256_set_m128(_mm_broadcast_ss(&kE8M0.values[scales[2 * pair + 1]]),
                                                 _mm_broadcast_ss(&kE8M0.values[scales[2 * pair]]));
    for (int t = 0; t < Count; ++t) {
      const auto* x = reinterpret_cast<const __m256i*>(xs[t].wide + pair * kPair);
      const __m256i sums = FourWordDots(weights, {_mm256_loadu_si256(x), _mm256_loadu_si256(x + 1),
                                                  _mm256_loadu_si256(x + 2), _mm256_loadu_si256(x + 3)});
      const __m256 scale = _mm256_mul_ps(weight_scales, _mm256_loadu_ps(xs[t].d + pair * kPairScales));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[t]);
    }
  }
  for (int t = 0; t < Count; ++t) out[t] = 0.5f * Sum8(acc[t]);
}
#endif

#if defined(GPTOSS_MOE_GROUPED)
// In each 128-bit lane of a and b (four int32 lanes each), the sums of lanes 0 and 2 and of 1 and 3: a's two, then b's.
// Two of these and a SumLaneHalves give a group's eight block sums, the same as three horizontal additions (vphaddd)
// gave, in four unpacks, two shuffles and three additions: one core of a Zen 4 AMD EPYC, the x86-64-v3 build, rows of
// 2880 in a probe alternating both builds in one process (medians of 15, four runs): 1.01-1.22x the rate with the rows
// in L1, 0.96-1.08x from memory; one 20b layer's decode on 2 such cores 1.01x at 1 token and 1.03x at 4 (alternated
// step by step).
inline __m256i SumLanePairs(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

// In each 128-bit lane, lanes 0 + 1 and 2 + 3 of a, then of b (the lanes SumLanePairs leaves: one sum a block).
inline __m256i SumLaneHalves(__m256i a, __m256i b) {
  const __m256 x = _mm256_castsi256_ps(a), y = _mm256_castsi256_ps(b);
  return _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0))),
                          _mm256_castps_si256(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1))));
}

// Four pairs of blocks a step in 256-bit registers: each pair's int32 lanes (four a block, DotPiecesU8S8's) summed to
// one a block by two levels of lane sums (SumLanePairs, SumLaneHalves), the group's eight blocks then scaled in one
// conversion, one scale product and one multiply-add, where each pair took its own (kGroupOrder: the lane each block
// lands in). On one Zen 3 AMD EPYC core, rows in L1, one vector in two pieces: 1.22-1.42x the rate of a pair's own
// scaling (a standalone probe, medians of 5 and 7); one 20b layer's decode on 2 such cores, the experts from memory
// (the two builds alternated in one process, medians of 8 and 10 rounds): in two pieces 1.10-1.14x at 1 token and
// 1.04-1.10x at 4, its rate then about one piece's (12 GB/s), which did not change. Adds the groups' scaled sums to
// `acc` and returns the first pair not taken.
template <int Count, int Pieces>
int64_t Int8GroupSteps(const uint8_t* codes, const uint8_t* scales, int64_t pairs, const QuantizedRow* xs,
                       __m256* acc) {
  const __m256i table = OffsetWeights();
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  const __m256i order = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kGroupOrder));
  const auto load = [](const void* at) { return _mm256_loadu_si256(static_cast<const __m256i*>(at)); };
  int64_t pair = 0;
  for (; pair + kGroupPairs <= pairs; pair += kGroupPairs) {  // whole groups lie where pairs go two together (EvensAt)
    _mm_prefetch(reinterpret_cast<const char*>(codes + pair * kBlock + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(codes + pair * kBlock + kPrefetchBytes + 64), _MM_HINT_T0);
    __m256i halves[2][Count];  // each token's sums of the group's first two pairs and of its last two
    for (int step = 0; step < kGroupPairs; ++step) {
      const __m256i packed = load(codes + (pair + step) * kBlock);
      const __m256i evens = _mm256_shuffle_epi8(table, _mm256_and_si256(packed, low_nibble));
      const __m256i odds = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibble));
      const int64_t evens_at = (pair + step / 2 * 2) * kPair + step % 2 * kBlock;
      for (int t = 0; t < Count; ++t) {
        const int8_t* q = xs[t].q + evens_at;
        __m256i sums;
        if constexpr (Pieces == 2) {
          const int8_t* r = xs[t].remainders + evens_at;
          sums = DotPiecesU8S8(evens, load(q), odds, load(q + kPair), load(r), load(r + kPair));
        } else {
          sums = DotPairU8S8(evens, load(q), odds, load(q + kPair));
        }
        __m256i& half = halves[step / 2][t];
        half = step % 2 == 0 ? sums : SumLanePairs(half, sums);
      }
    }
    const __m256 weight_scales = _mm256_permutevar8x32_ps(EightBlockScales(scales + 2 * pair), order);
    for (int t = 0; t < Count; ++t) {
      const __m256i blocks = SumLaneHalves(halves[0][t], halves[1][t]);
      const __m256i dots = _mm256_sub_epi32(blocks, load(xs[t].block_offsets + pair * 2));
      const __m256 scale = _mm256_mul_ps(weight_scales, _mm256_loadu_ps(xs[t].block_d + pair * 2));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), scale, acc[t]);
    }
  }
  return pair;
}
#endif

template <int Count, int Pieces>
void Int8RowDots(const uint8_t* codes, const uint8_t* scales, int64_t cols, const QuantizedRow* xs, float* out) {
  const __m256i table = OffsetWeights();
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[Count];
  for (int t = 0; t < Count; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t pairs = cols / kPair;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
  int64_t pair = Int8PairSteps<Count, Pieces>(codes, scales, pairs, xs, acc);
#elif defined(GPTOSS_MOE_GROUPED)
  int64_t pair = xs[0].block_d != nullptr ? Int8GroupSteps<Count, Pieces>(codes, scales, pairs, xs, acc) : 0;
#else
  int64_t pair = 0;
#endif
  // one pair's sums into sums[t], its evens at `evens_at` in each vector and its odds `odds_gap` after them
  const auto step = [&](int64_t pair, int64_t evens_at, int64_t odds_gap, __m256* sums) {
    if (pair % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(codes + pair * kBlock + kPrefetchBytes), _MM_HINT_T0);
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + pair * kBlock));
    const __m256i evens = _mm256_shuffle_epi8(table, _mm256_and_si256(packed, low_nibble));
    const __m256i odds = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibble));
    const __m256 weight_scales = _mm256_set_m128(_mm_broadcast_ss(&kE8M0.values[scales[2 * pair + 1]]),
                                                 _mm_broadcast_ss(&kE8M0.values[scales[2 * pair]]));
    for (int t = 0; t < Count; ++t) {
      const int8_t* q = xs[t].q + evens_at;
      const __m256i even_x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i odd_x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + odds_gap));
      const __m256i offset = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[t].offset_sums + pair * kPairLanes));
      __m256i products;
      if constexpr (Pieces == 2) {
        const int8_t* r = xs[t].remainders + evens_at;
        products = DotPiecesU8S8(evens, even_x, odds, odd_x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r)),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + odds_gap)));
      } else {
        products = DotPairU8S8(evens, even_x, odds, odd_x);
      }
      const __m256i dots = _mm256_sub_epi32(products, offset);
      const __m256 scale = _mm256_mul_ps(weight_scales, _mm256_loadu_ps(xs[t].d + pair * kPairScales));
      sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), scale, sums[t]);
    }
  };
  __m256 second[Count];  // the second pair of each two: its own sums, so that two chains are in flight
  for (int t = 0; t < Count; ++t) second[t] = _mm256_setzero_ps();
  for (; pair + 2 <= pairs; pair += 2) {  // two pairs laid out together (EvensAt)
    step(pair, pair * kPair, kPair, acc);
    step(pair + 1, pair * kPair + kBlock, kPair, second);
  }
  if (pair < pairs) step(pair, pair * kPair, kBlock, acc);
  for (int t = 0; t < Count; ++t) acc[t] = _mm256_add_ps(acc[t], second[t]);
  for (int t = 0; t < Count; ++t) out[t] = 0.5f * Sum8(acc[t]);
}

#elif defined(GPTOSS_SIMD_NEON)
// The int8 path on NEON: each block's 16 code bytes looked up as twice their E2M1 values (signed int8) and met by
// the block's int8 x values, evens and odds: with the dot-product extension four products a lane at once, else
// widening multiplies summed pairwise; a block's int32 sums are scaled by its E8M0 scale times the x block's scale.
template <int Count, int Pieces>
void Int8RowDots(const uint8_t* codes, const uint8_t* scales, int64_t cols, const QuantizedRow* xs, float* out) {
  const int8x16_t table = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  float32x4_t acc[Count];
  for (int t = 0; t < Count; ++t) acc[t] = vdupq_n_f32(0.0f);
  const int64_t pairs = cols / kPair;
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t evens_at = EvensAt(pair, pairs), odds_gap = OddsGap(pair, pairs);
    for (int half = 0; half < 2; ++half) {
      const int64_t block = 2 * pair + half;
      const uint8x16_t packed = vld1q_u8(codes + block * 16);
      const int8x16_t evens = vqtbl1q_s8(table, vandq_u8(packed, vdupq_n_u8(0x0F)));
      const int8x16_t odds = vqtbl1q_s8(table, vshrq_n_u8(packed, 4));
      const float weight_scale = kE8M0.values[scales[block]];
      // a piece's sums, its evens at `q` and its odds odds_gap after them
      const auto piece_sums = [&](const int8_t* q) {
        const int8x16_t even_x = vld1q_s8(q), odd_x = vld1q_s8(q + odds_gap);
#if defined(__ARM_FEATURE_DOTPROD)
        return vdotq_s32(vdotq_s32(vdupq_n_s32(0), evens, even_x), odds, odd_x);
#else
        // |12 x 127| twice fits an int16 lane
        const int16x8_t low = vmlal_s8(vmull_s8(vget_low_s8(evens), vget_low_s8(even_x)), vget_low_s8(odds),
                                       vget_low_s8(odd_x));
        const int16x8_t high = vmlal_high_s8(vmull_high_s8(evens, even_x), odds, odd_x);
        return vpadalq_s16(vpaddlq_s16(low), high);
#endif
      };
      for (int t = 0; t < Count; ++t) {
        int32x4_t sums = piece_sums(xs[t].q + evens_at + half * 16);
        if constexpr (Pieces == 2) {
          sums = vmlaq_n_s32(piece_sums(xs[t].remainders + evens_at + half * 16), sums, kRemainderSteps);
        }
        const float scale = weight_scale * xs[t].d[pair * kPairScales + half * 4];
        acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(sums), scale);
      }
    }
  }
  for (int t = 0; t < Count; ++t) out[t] = 0.5f * vaddvq_f32(acc[t]);
}
#endif

#if (defined(__AVX2__) && defined(__FMA__)) || defined(GPTOSS_SIMD_NEON)
// out[r * count + t] = row r . (quantized) vector t, for `rows` consecutive rows and fewer than kTiledFrom vectors.
template <int Pieces>
void Int8ConsecutiveRowDotsOf(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                              const QuantizedRow* xs, int64_t count, float* out) {
  EachRow(codes, scales, rows, cols, count, out, [&](auto vectors, const uint8_t* c, const uint8_t* s, float* o) {
    Int8RowDots<decltype(vectors)::value, Pieces>(c, s, cols, xs, o);
  });
}

void Int8ConsecutiveRowDots(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                            const QuantizedRow* xs, int64_t count, float* out) {
#if defined(GPTOSS_MOE_WIDE)
  if (xs[0].wide != nullptr) {
    const auto wide = [&](auto vectors, const uint8_t* c, const uint8_t* s, float* o) {
      WideRowDots<decltype(vectors)::value>(c, s, cols, xs, o);
    };
    return EachRow(codes, scales, rows, cols, count, out, wide);
  }
#endif
  if (xs[0].remainders != nullptr) return Int8ConsecutiveRowDotsOf<2>(codes, scales, rows, cols, xs, count, out);
  Int8ConsecutiveRowDotsOf<1>(codes, scales, rows, cols, xs, count, out);
}
#else
constexpr int32_t kTwiceE2M1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void Int8ConsecutiveRowDots(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                            const QuantizedRow* xs, int64_t count, float* out) {
  for (int64_t row = 0; row < rows; ++row) {
    const uint8_t* row_codes = codes + row * cols / 2;
    for (int64_t t = 0; t < count; ++t) {
      float total = 0.0f;
      const int64_t pairs = cols / kPair;
      for (int64_t pair = 0; pair < pairs; ++pair) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t* bytes = row_codes + pair * kBlock + half * 16;
          const int8_t* q = xs[t].q + EvensAt(pair, pairs) + half * 16;
          const int8_t* odd_q = q + OddsGap(pair, pairs);
          int32_t sum = 0;
          for (int i = 0; i < 16; ++i) {
            sum += kTwiceE2M1[bytes[i] & 0x0F] * q[i];
            sum += kTwiceE2M1[bytes[i] >> 4] * odd_q[i];
          }
          if (xs[t].remainders != nullptr) {
            const int8_t* r = xs[t].remainders + EvensAt(pair, pairs) + half * 16;
            const int8_t* odd_r = r + OddsGap(pair, pairs);
            sum *= kRemainderSteps;
            for (int i = 0; i < 16; ++i) {
              sum += kTwiceE2M1[bytes[i] & 0x0F] * r[i];
              sum += kTwiceE2M1[bytes[i] >> 4] * odd_r[i];
            }
          }
          const int64_t block = 2 * pair + half;
          total += static_cast<float>(sum) * kE8M0.values[scales[row * cols / kBlock + block]] *
                   xs[t].d[pair * kPairScales + half * 4];
        }
      }
      out[row * count + t] = 0.5f * total;
    }
  }
}
#endif

// One expert's tokens: which rows of the input they are, and their routing weights.
struct Route {
  std::vector<int64_t> tokens;
  std::vector<float> weights;
  std::vector<int64_t> slots;  // token's position among its k choices, for a fixed summation order
};

// Bytes the buffers hold allocated, whatever their sizes.
template <typename... Buffers>
size_t BytesHeld(const Buffers&... buffers) {
  return (size_t{0} + ... + (buffers.capacity() * sizeof(typename Buffers::value_type)));
}

// A phase's input rows prepared once for the experts with few tokens: quantized by pairs of blocks (the int8 path:
// QuantizePairs), or reordered for the float path's lookups (PermuteBlocks); indexed as the inputs are.
struct PreparedRows {
  std::vector<int8_t> q, remainders;
  std::vector<int16_t> wide;  // two pieces as one int16 a value, where WideRowDots takes them (QuantizeWide)
  std::vector<float> d, permuted, block_d;
  std::vector<int32_t> offset_sums, block_offsets;  // block_d and block_offsets: GroupBlocks's, where built
  std::vector<uint16_t> packed;     // the AMX path's experts' vectors (PackVectors), each expert's from packed_at
  std::vector<size_t> packed_at;  // by active index
  // the integer tiles' rows (QuantizeWords: values `cols` apart, steps cols / kBlock apart) and each expert's tokens
  // laid out from them (PackTokens), from tile_words_at (its steps from TileStepsAt: PrepareTiles)
  std::vector<int16_t> words;
  std::vector<float> word_steps;
  std::vector<int32_t> tile_words;
  std::vector<float> tile_steps;
  std::vector<size_t> tile_words_at;  // by active index

  // Starts a call: the AMX path's vectors are appended expert by expert; every other buffer is sized and written anew.
  void Begin() { packed.clear(); }
  size_t BytesHeld() const {
    return gptoss::BytesHeld(q, remainders, wide, d, permuted, block_d, offset_sums, block_offsets, packed, packed_at,
                             words, word_steps, tile_words, tile_steps, tile_words_at);
  }
};

// Where an expert's packed steps start, given where its packed words do: a block's 16 words a token to its one step.
size_t TileStepsAt(size_t words_at) { return words_at / (kBlock / 2); }

// The layer's inputs, and how this step's tokens are spread over the experts.
struct Problem : MoeArgs {
  const float* xf;  // x, router logits and biases as floats (the inputs themselves when float)
  const float* logitsf;
  const float* b1f;
  const float* b2f;
  float* yf;
  std::vector<float> widened[4], narrow_out;
  std::vector<Route> routes;
  std::vector<int64_t> active;   // experts with at least one token
  std::vector<float> activated;  // [active index][its tokens][inter]
  std::vector<int64_t> offsets;  // start of each active expert's rows in `activated` / `expert_out`
  std::vector<float> expert_out;  // [active index][its tokens][hidden]
  PreparedRows x_rows, activated_rows;  // fc1's and fc2's input rows as the few-token experts read them

  size_t BytesHeld() const {
    return gptoss::BytesHeld(widened[0], widened[1], widened[2], widened[3], narrow_out, activated, expert_out) +
           x_rows.BytesHeld() + activated_rows.BytesHeld();
  }
};

// A calling thread's Problem is kept for its next call, its buffers with it: a 512-token step of a 20b layer sizes
// about 90 MB of them (fc1's activations and the experts' outputs, the integer tiles' inputs), whose pages, allocated
// afresh each call, were mapped and cleared again each call. A 6-layer engine of 20b's width prefilled 512 tokens
// 1.064x as fast with them kept (the AVX2 kernels on 2 Zen 5 AMD EPYC cores, alternated in one process, medians of
// 8). Buffers that a call grew past kKeptBytes are released after it: only a longer step than the engine's default
// chunk of 512 tokens sizes them so.
constexpr size_t kKeptBytes = size_t{128} << 20;

void ReleaseIfLarge(Problem& p) {
  if (p.BytesHeld() > kKeptBytes) p = Problem{};
}

// Whether an expert with `count` tokens takes the int8 path for rows of `cols` columns.
bool Int8Path(const Problem& p, int64_t count, int64_t cols) {
  return p.int8_activations > 0 && count < kInt8Below && Int8Fits(cols);
}

// Whether the int8 path's two pieces go as one int16 a value (QuantizeWide, WideRowDots).
bool WidePieces(const Problem& p) {
#if defined(GPTOSS_MOE_WIDE)
  return p.int8_activations == 2;
#else
  (void)p;
  return false;
#endif
}

// Whether it takes the float path on reordered rows (FewVectorDots) instead.
bool PermutedPath(const Problem& p, int64_t count, int64_t cols) {
#if defined(GPTOSS_MOE_PERMUTED)
  static_assert(kTiledFrom == 4, "FewVectorDots takes up to three vectors");
  return !Int8Path(p, count, cols) && count < kTiledFrom && cols % kPermutedCols == 0;
#else
  return false;
#endif
}

// Whether it takes the AMX tiles instead of the float tiles (many tokens: prefill), in a build for them where the OS
// lets this process use them, for experts whose tasks' rows fill whole tiles.
bool AmxPath([[maybe_unused]] const Problem& p, [[maybe_unused]] int64_t count, [[maybe_unused]] int64_t cols) {
#if defined(GPTOSS_AMX)
  return count >= kTiledFrom && cols % kAmxDepth == 0 && p.hidden % kAmxRows == 0 && p.inter % kAmxRows == 0 &&
         AmxReady();
#else
  return false;
#endif
}

// Whether it takes the integer tiles instead of the float tiles (many tokens, int8 activations: prefill); the AMX
// tiles, where they run, before either.
bool IntTilePath([[maybe_unused]] const Problem& p, [[maybe_unused]] int64_t count, [[maybe_unused]] int64_t cols) {
#if defined(GPTOSS_MOE_INT_TILES)
  return p.int8_activations > 0 && count >= kTiledFrom && Int8Fits(cols) && !AmxPath(p, count, cols);
#else
  return false;
#endif
}

// Whether any active expert takes the AMX tiles for rows of `cols` columns.
bool AnyAmx(const Problem& p, int64_t cols) {
  for (const int64_t e : p.active) {
    if (AmxPath(p, static_cast<int64_t>(p.routes[e].tokens.size()), cols)) return true;
  }
  return false;
}

// Which row of a phase's inputs is active expert a's i-th: fc1 reads x's row of the token, fc2 the expert's own
// rows of `activated`.
using RowOf = int64_t (*)(const Problem& p, size_t a, int64_t i);
int64_t TokenRow(const Problem& p, size_t a, int64_t i) { return p.routes[p.active[a]].tokens[i]; }
int64_t ActivatedRow(const Problem& p, size_t a, int64_t i) { return p.offsets[a] + i; }

// The rows of `values` (`total` rows of `cols`) that few-token experts read, prepared for their path, each once
// however many such experts read it: into q (codes `cols` apart) and d (cols / kPair * kPairScales scales a row),
// or into permuted (`cols` apart).
#if defined(GPTOSS_AMX)
// Active expert a's input rows (of `values`) laid out for the AMX tiles (PackVectors), from prepared.packed_at[a].
void PackExpertRows(const Problem& p, size_t a, const float* values, int64_t cols, RowOf row_of,
                    PreparedRows& prepared) {
  const int64_t count = static_cast<int64_t>(p.routes[p.active[a]].tokens.size());
  std::vector<const float*> vectors(count);
  for (int64_t i = 0; i < count; ++i) vectors[i] = values + row_of(p, a, i) * cols;
  prepared.packed_at.resize(p.active.size());
  prepared.packed_at[a] = prepared.packed.size();
  prepared.packed.resize(prepared.packed.size() + PackedVectorsSize(count, cols));
  PackVectors(vectors.data(), count, cols, prepared.packed.data() + prepared.packed_at[a]);
}

// `rows` consecutive rows (whole tiles) decoded to bfloat16 (exact: an E2M1 value times a power of two) in the
// tiles' layout (AmxDots'): a block of 32 values is a tile row.
void DecodeRowsToTiles(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, uint16_t* tiles) {
  static_assert(kBlock == kAmxDepth, "a block fills a tile row");
  const int64_t chunks = cols / kBlock;
  for (int64_t row = 0; row < rows; ++row) {
    uint16_t* group = TileRow(tiles, row, chunks);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t block = row * chunks + chunk;
      const TwiceE2M1 twice(codes + block * (kBlock / 2));
      const __m512 scale = _mm512_set1_ps(kE8M0.values[scales[block]] * 0.5f);
      const __m512 first = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(twice.first)));
      const __m512 second = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(twice.second)));
      _mm512_storeu_si512(group + chunk * kAmxTileValues, (__m512i)_mm512_cvtne2ps_pbh(second, first));
    }
  }
}

// scratch.dots[r * count + i] for `rows` rows (whole tiles) decoded to bfloat16, against the expert's packed rows.
void AmxExpertDots(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, const uint16_t* packed,
                   int64_t count, Scratch& scratch) {
  scratch.bf16.resize(static_cast<size_t>(rows * cols));
  DecodeRowsToTiles(codes, scales, rows, cols, scratch.bf16.data());
  AmxDots(scratch.bf16.data(), rows, cols, packed, count, scratch.dots.data());
}
#endif

#if defined(GPTOSS_MOE_INT_TILES)
// The integer tiles' inputs of one phase: every row an integer-tile expert reads, quantized once however many such
// experts read it (QuantizeWords), then each such expert's tokens laid out from those (PackTokens), both spread
// over the intra-op threads: one 20b layer's 512-token step ran 1.045x as fast with AVX2 and 1.073x with AVX-512 VNNI
// as with the calling thread doing it all (2 threads on a Zen 5 AMD EPYC, alternated in one process, medians of 16).
struct TileInputs {
  const Problem* p;
  const float* values;
  int64_t cols;
  RowOf row_of;
  PreparedRows* prepared;
  std::vector<int64_t> rows;     // the rows to quantize
  std::vector<size_t> experts;   // active indices of the experts on the integer tiles
};

constexpr size_t kQuantizeBatches = 64;  // at most, for ParallelFor: a row is a few microseconds

void QuantizeTileRow(void* data, size_t i) {
  const TileInputs& in = *static_cast<const TileInputs*>(data);
  const int64_t row = in.rows[i];
  QuantizeWords(in.values + row * in.cols, in.cols, in.p->int8_activations, in.prepared->words.data() + row * in.cols,
                in.prepared->word_steps.data() + row * (in.cols / kBlock));
}

void PackTileExpert(void* data, size_t i) {
  const TileInputs& in = *static_cast<const TileInputs*>(data);
  const Problem& p = *in.p;
  PreparedRows& prepared = *in.prepared;
  const size_t a = in.experts[i];
  const int64_t count = static_cast<int64_t>(p.routes[p.active[a]].tokens.size()), blocks = in.cols / kBlock;
  std::vector<const int16_t*> rows(count);
  std::vector<const float*> steps(count);
  for (int64_t t = 0; t < count; ++t) {
    const int64_t row = in.row_of(p, a, t);
    rows[t] = prepared.words.data() + row * in.cols;
    steps[t] = prepared.word_steps.data() + row * blocks;
  }
  PackTokens(rows.data(), steps.data(), count, in.cols, prepared.tile_words.data() + prepared.tile_words_at[a],
             prepared.tile_steps.data() + TileStepsAt(prepared.tile_words_at[a]));
}

void PrepareTiles(const Ort::KernelContext& context, const Problem& p, const float* values, int64_t total,
                  int64_t cols, RowOf row_of, PreparedRows& prepared) {
  TileInputs in{&p, values, cols, row_of, &prepared, {}, {}};
  std::vector<bool> read(total, false);
  size_t words = 0;
  prepared.tile_words_at.assign(p.active.size(), 0);
  for (size_t a = 0; a < p.active.size(); ++a) {
    const int64_t count = static_cast<int64_t>(p.routes[p.active[a]].tokens.size());
    if (!IntTilePath(p, count, cols)) continue;
    in.experts.push_back(a);
    prepared.tile_words_at[a] = words;
    words += PackedWordsSize(count, cols);
    for (int64_t t = 0; t < count; ++t) read[row_of(p, a, t)] = true;
  }
  if (in.experts.empty()) return;
  for (int64_t row = 0; row < total; ++row) {
    if (read[row]) in.rows.push_back(row);
  }
  prepared.words.resize(total * cols);
  prepared.word_steps.resize(total * (cols / kBlock));
  prepared.tile_words.resize(words);
  prepared.tile_steps.resize(TileStepsAt(words));
  context.ParallelFor(QuantizeTileRow, in.rows.size(), std::min(in.rows.size(), kQuantizeBatches), &in);
  context.ParallelFor(PackTileExpert, in.experts.size(), in.experts.size(), &in);
}
#endif

void PrepareRows(const Problem& p, const float* values, int64_t total, int64_t cols, RowOf row_of,
                 PreparedRows& prepared) {
  const int64_t scales_per_row = cols / kPair * kPairScales;
  std::vector<bool> done(total, false);
  for (size_t a = 0; a < p.active.size(); ++a) {
    const int64_t count = static_cast<int64_t>(p.routes[p.active[a]].tokens.size());
    const bool int8 = Int8Path(p, count, cols);
    if (int8) {
      prepared.d.resize(total * scales_per_row);
      if (WidePieces(p)) {
        prepared.wide.resize(total * cols);
      } else {
        prepared.q.resize(total * cols);
        if (p.int8_activations == 2) prepared.remainders.resize(total * cols);
        prepared.offset_sums.resize(total * cols / kPair * kPairLanes);
#if defined(GPTOSS_MOE_GROUPED)
        prepared.block_d.resize(total * cols / kBlock);
        prepared.block_offsets.resize(total * cols / kBlock);
#endif
      }
    } else if (PermutedPath(p, count, cols)) {
      prepared.permuted.resize(total * cols);
    } else {
#if defined(GPTOSS_AMX)
      if (AmxPath(p, count, cols)) PackExpertRows(p, a, values, cols, row_of, prepared);
#endif
      continue;
    }
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = row_of(p, a, i);
      if (done[row]) continue;
      done[row] = true;
      if (int8 && WidePieces(p)) {
#if defined(GPTOSS_MOE_WIDE)  // WidePieces is false without it
        QuantizeWide(values + row * cols, cols, prepared.wide.data() + row * cols,
                     prepared.d.data() + row * scales_per_row);
#endif
      } else if (int8) {
        QuantizePairs(values + row * cols, cols, prepared.q.data() + row * cols,
                      p.int8_activations == 2 ? prepared.remainders.data() + row * cols : nullptr,
                      prepared.d.data() + row * scales_per_row,
                      prepared.offset_sums.data() + row * cols / kPair * kPairLanes);
#if defined(GPTOSS_MOE_GROUPED)
        GroupBlocks(prepared.d.data() + row * scales_per_row,
                    prepared.offset_sums.data() + row * cols / kPair * kPairLanes, cols / kPair,
                    prepared.block_d.data() + row * cols / kBlock, prepared.block_offsets.data() + row * cols / kBlock);
#endif
      } else {
#if defined(GPTOSS_MOE_PERMUTED)  // PermutedPath is false without it
        PermuteBlocks(values + row * cols, cols, prepared.permuted.data() + row * cols);
#endif
      }
    }
  }
}

// scratch.dots[r * count + i] = weight row r (of `rows` consecutive ones) . active expert a's i-th input row (of
// `values`, or of its prepared copy where the expert takes the int8 or the permuted path).
void ExpertDots(const Problem& p, size_t a, const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                const float* values, const PreparedRows& prepared, RowOf row_of, Scratch& scratch) {
  const int64_t count = static_cast<int64_t>(p.routes[p.active[a]].tokens.size());
  scratch.dots.resize(rows * count);
  scratch.xs.resize(count);
  if (Int8Path(p, count, cols)) {
    const int64_t pairs = cols / kPair;
    scratch.quantized.resize(count);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = row_of(p, a, i);
      const float* d = prepared.d.data() + row * pairs * kPairScales;
      if (WidePieces(p)) {
        scratch.quantized[i] = {nullptr, nullptr, d, nullptr, prepared.wide.data() + row * cols};
      } else {
        scratch.quantized[i] = {prepared.q.data() + row * cols,
                                p.int8_activations == 2 ? prepared.remainders.data() + row * cols : nullptr, d,
                                prepared.offset_sums.data() + row * pairs * kPairLanes};
#if defined(GPTOSS_MOE_GROUPED)
        scratch.quantized[i].block_d = prepared.block_d.data() + row * cols / kBlock;
        scratch.quantized[i].block_offsets = prepared.block_offsets.data() + row * cols / kBlock;
#endif
      }
    }
    Int8ConsecutiveRowDots(codes, scales, rows, cols, scratch.quantized.data(), count, scratch.dots.data());
    return;
  }
#if defined(GPTOSS_MOE_INT_TILES)
  if (IntTilePath(p, count, cols)) {
    IntTileDots(codes, scales, rows, cols, prepared.tile_words.data() + prepared.tile_words_at[a],
                prepared.tile_steps.data() + TileStepsAt(prepared.tile_words_at[a]), count, scratch.dots.data(),
                scratch.int_tiles);
    return;
  }
#endif
#if defined(GPTOSS_AMX)
  if (AmxPath(p, count, cols)) {
    AmxExpertDots(codes, scales, rows, cols, prepared.packed.data() + prepared.packed_at[a], count, scratch);
    return;
  }
#endif
#if defined(GPTOSS_MOE_PERMUTED)
  if (PermutedPath(p, count, cols)) {
    for (int64_t i = 0; i < count; ++i) scratch.xs[i] = prepared.permuted.data() + row_of(p, a, i) * cols;
    FewVectorDots(codes, scales, rows, cols, scratch.xs.data(), count, scratch.dots.data());
    return;
  }
#endif
  for (int64_t i = 0; i < count; ++i) scratch.xs[i] = values + row_of(p, a, i) * cols;
  ConsecutiveRowDots(codes, scales, rows, cols, scratch.xs.data(), count, scratch.dots.data(), scratch);
}

void RouteTokens(Problem& p) {
  p.routes.assign(p.experts, Route{});
  std::vector<int64_t> order(p.experts);
  for (int64_t t = 0; t < p.tokens; ++t) {
    const float* row = p.logitsf + t * p.experts;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + p.k, order.end(),
                      [row](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    const float top = row[order[0]];
    float total = 0.0f;
    std::vector<float> weights(p.k);
    for (int64_t j = 0; j < p.k; ++j) total += weights[j] = std::exp(row[order[j]] - top);
    for (int64_t j = 0; j < p.k; ++j) {
      Route& route = p.routes[order[j]];
      route.tokens.push_back(t);
      route.weights.push_back(weights[j] / total);
      route.slots.push_back(j);
    }
  }
  p.active.clear();
  p.offsets.clear();
  int64_t rows = 0;
  for (int64_t e = 0; e < p.experts; ++e) {
    if (p.routes[e].tokens.empty()) continue;
    p.active.push_back(e);
    p.offsets.push_back(rows);
    rows += static_cast<int64_t>(p.routes[e].tokens.size());
  }
  // every value written by fc1's and fc2's tasks (their row blocks cover each expert's rows): not cleared
  p.activated.resize(rows * p.inter);
  p.expert_out.resize(rows * p.hidden);
}

// fc1 and swiglu for the gate/linear row pairs [first_pair, first_pair + pairs): activation columns.
void Fc1(Problem& p, size_t active_index, int64_t first_pair, int64_t pairs, Scratch& scratch) {
  const int64_t e = p.active[active_index];
  const int64_t h = p.hidden, count = static_cast<int64_t>(p.routes[e].tokens.size());
  const int64_t first_row = e * 2 * p.inter + 2 * first_pair;
  ExpertDots(p, active_index, p.w1 + first_row * (h / 2), p.s1 + first_row * (h / kBlock), 2 * pairs, h, p.xf,
             p.x_rows, TokenRow, scratch);
  float* out = p.activated.data() + p.offsets[active_index] * p.inter;
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t gate_row = first_row + 2 * pair, lin_row = gate_row + 1;
    const float* gates = scratch.dots.data() + 2 * pair * count;
    const float* lins = gates + count;
    for (int64_t i = 0; i < count; ++i) {
      const float g = std::min(gates[i] + p.b1f[gate_row], p.limit);
      const float l = std::max(std::min(lins[i] + p.b1f[lin_row], p.limit), -p.limit);
      out[i * p.inter + first_pair + pair] = g / (1.0f + std::exp(-p.alpha * g)) * (l + 1.0f);
    }
  }
}

// fc2 for the output rows [first_row, first_row + rows).
void Fc2(Problem& p, size_t active_index, int64_t first_row, int64_t rows, Scratch& scratch) {
  const int64_t e = p.active[active_index];
  const int64_t inter = p.inter, count = static_cast<int64_t>(p.routes[e].tokens.size());
  const int64_t flat = e * p.hidden + first_row;
  ExpertDots(p, active_index, p.w2 + flat * (inter / 2), p.s2 + flat * (inter / kBlock), rows, inter,
             p.activated.data(), p.activated_rows, ActivatedRow, scratch);
  float* out = p.expert_out.data() + p.offsets[active_index] * p.hidden;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < count; ++i) out[i * p.hidden + first_row + r] = scratch.dots[r * count + i] + p.b2f[flat + r];
  }
}

// Tasks of one phase: (active expert, block of rows).
struct Phase {
  Problem* problem;
  int64_t blocks_per_expert;
  int64_t rows;  // rows (fc2) or gate/linear pairs (fc1) per expert
  int64_t rows_per_task;
  bool first;
};

void RunTask(void* data, size_t task) {
  Phase& phase = *static_cast<Phase*>(data);
  const size_t active_index = task / phase.blocks_per_expert;
  const int64_t start = static_cast<int64_t>(task % phase.blocks_per_expert) * phase.rows_per_task;
  const int64_t count = std::min(phase.rows_per_task, phase.rows - start);
  Problem& p = *phase.problem;  // tasks write disjoint rows
  thread_local Scratch scratch;
  if (phase.first) {
    Fc1(p, active_index, start, count, scratch);
  } else {
    Fc2(p, active_index, start, count, scratch);
  }
}

// Packed bytes of an MXFP4 row of `cols` values: codes and scales.
size_t MxRowBytes(int64_t cols) { return static_cast<size_t>(cols / 2 + cols / kBlock); }

// A phase's tasks on the intra-op threads, in batches of consecutive weights (`expert_bytes` an expert).
void RunPhase(const Ort::KernelContext& context, Phase& phase, size_t expert_bytes) {
  const size_t experts = phase.problem->active.size();
  const size_t tasks = experts * static_cast<size_t>(phase.blocks_per_expert);
  context.ParallelFor(RunTask, tasks, WeightBatches(tasks, experts * expert_bytes), &phase);
}

void Combine(const Problem& p) {
  // y[t] = sum of its k experts' outputs in the order of its choices (a fixed order: deterministic).
  std::vector<const float*> parts(p.tokens * p.k);
  std::vector<float> weights(p.tokens * p.k);
  for (size_t a = 0; a < p.active.size(); ++a) {
    const Route& route = p.routes[p.active[a]];
    for (size_t i = 0; i < route.tokens.size(); ++i) {
      const int64_t slot = route.tokens[i] * p.k + route.slots[i];
      parts[slot] = p.expert_out.data() + (p.offsets[a] + static_cast<int64_t>(i)) * p.hidden;
      weights[slot] = route.weights[i];
    }
  }
  for (int64_t t = 0; t < p.tokens; ++t) {
    float* out = p.yf + t * p.hidden;
    std::fill(out, out + p.hidden, 0.0f);
    for (int64_t j = 0; j < p.k; ++j) {
      const float* part = parts[t * p.k + j];
      const float w = weights[t * p.k + j];
      for (int64_t c = 0; c < p.hidden; ++c) out[c] += w * part[c];
    }
  }
}

float Widen(Dtype dtype, const void* data, int64_t i) {
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == Dtype::kFloat16 ? Ort::Float16_t::FromBits(bits).ToFloat() : Ort::BFloat16_t::FromBits(bits).ToFloat();
}

// `data` as floats: itself when the dtype is float, else widened into `buffer`.
const float* AsFloat(Dtype dtype, const void* data, int64_t count, std::vector<float>& buffer) {
  if (dtype == Dtype::kFloat32) return static_cast<const float*>(data);
  buffer.resize(count);
  for (int64_t i = 0; i < count; ++i) buffer[i] = Widen(dtype, data, i);
  return buffer.data();
}

void Narrow(const Problem& p) {
  if (p.dtype == Dtype::kFloat32) return;
  uint16_t* out = static_cast<uint16_t*>(p.y);
  for (int64_t i = 0; i < p.tokens * p.hidden; ++i) {
    out[i] = p.dtype == Dtype::kFloat16 ? Ort::Float16_t(p.yf[i]).val : Ort::BFloat16_t(p.yf[i]).val;
  }
}

}  // namespace

void MoeKernel::Compute(OrtKernelContext* raw_context) {
  Ort::KernelContext context(raw_context);
  thread_local Problem kept;
  Problem& p = kept;
  static_cast<MoeArgs&>(p) = ReadMoeArgs(context, attributes_);
  if (p.tokens == 0) return;
  p.x_rows.Begin();
  p.activated_rows.Begin();
  p.xf = AsFloat(p.dtype, p.x, p.tokens * p.hidden, p.widened[0]);
  p.logitsf = AsFloat(p.dtype, p.logits, p.tokens * p.experts, p.widened[1]);
  p.b1f = AsFloat(p.dtype, p.b1, p.experts * 2 * p.inter, p.widened[2]);
  p.b2f = AsFloat(p.dtype, p.b2, p.experts * p.hidden, p.widened[3]);
  if (p.dtype == Dtype::kFloat32) {
    p.yf = static_cast<float*>(p.y);
  } else {
    p.narrow_out.resize(p.tokens * p.hidden);
    p.yf = p.narrow_out.data();
  }
  RouteTokens(p);
  PrepareRows(p, p.xf, p.tokens, p.hidden, TokenRow, p.x_rows);
#if defined(GPTOSS_MOE_INT_TILES)
  PrepareTiles(context, p, p.xf, p.tokens, p.hidden, TokenRow, p.x_rows);
#endif
  Phase fc1{&p, (p.inter + kRowsPerTask - 1) / kRowsPerTask, p.inter, kRowsPerTask, true};
  RunPhase(context, fc1, 2 * p.inter * MxRowBytes(p.hidden));
  const int64_t activated_rows = static_cast<int64_t>(p.activated.size()) / p.inter;
  PrepareRows(p, p.activated.data(), activated_rows, p.inter, ActivatedRow, p.activated_rows);
#if defined(GPTOSS_MOE_INT_TILES)
  PrepareTiles(context, p, p.activated.data(), activated_rows, p.inter, ActivatedRow, p.activated_rows);
#endif
  // fc2's tasks as many rows as fc1's (two pairs of rows a pair) where the AMX tiles run: two groups of tile rows
  // share each load of the vectors' tiles
  const int64_t fc2_rows = AnyAmx(p, p.inter) ? 2 * kRowsPerTask : kRowsPerTask;
  Phase fc2{&p, (p.hidden + fc2_rows - 1) / fc2_rows, p.hidden, fc2_rows, false};
  RunPhase(context, fc2, p.hidden * MxRowBytes(p.inter));
  Combine(p);
  Narrow(p);
  ReleaseIfLarge(p);
}

}  // namespace gptoss
