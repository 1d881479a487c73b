// The MoE's prefill on int8 activations in word multiply-adds: moe_int_tiles_cpu.h.
#include "moe_int_tiles_cpu.h"

#if defined(GPTOSS_MOE_INT_TILES)
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "mxfp4_cpu.h"
#include "simd_cpu.h"

namespace gptoss {
namespace {

constexpr int64_t kPairsPerBlock = kBlock / 2;

// The integer side of a tile: int32 lanes as many as Simd's floats. A pass takes kRows decoded rows against kGroups
// groups of tokens, its sums in registers: rows x groups int32 sums for the block under way, as many float sums for
// the row, a group's words and a row's broadcast pair (AVX-512: 4 x 3 in 32 registers; AVX2: 3 x 2 in 16). On a Zen 5
// AMD EPYC core (one thread, 36 rows of 2880 against 64 tokens, a standalone probe) AVX2's 3 x 2 read 1.35-1.55x the
// float tiles' multiply-adds a second, 2 x 2 1.18x and 2 x 3 (spilling) 0.96x; AVX-512's 4 x 3, 3 x 4, 6 x 2 and
// 3 x 3 within noise of each other, 1.7-2.6x; AVX-VNNI's fused word multiply-add in 256 bits gained nothing over the
// multiply-add and addition.
#if defined(__AVX512F__) && defined(__AVX512BW__)
struct Words {
  using I = __m512i;
  static constexpr int kRows = 4;
  static constexpr int kGroups = 3;
  static I Zero() { return _mm512_setzero_si512(); }
  static I Load(const int32_t* p) { return _mm512_loadu_si512(p); }
  static I Broadcast(const int16_t* pair) {
    int32_t word;
    std::memcpy(&word, pair, sizeof word);
    return _mm512_set1_epi32(word);
  }
  // acc plus, in each int32 lane, the two products of its int16 pairs: VNNI's fused word multiply-add
  static I AddDots(I acc, I a, I b) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
  }
  static Simd::F ToFloat(I v) { return _mm512_cvtepi32_ps(v); }
  static void Pin(I& v) { __asm__("" : "+v"(v)); }
};
#else
struct Words {
  using I = __m256i;
  static constexpr int kRows = 3;
  static constexpr int kGroups = 2;
  static I Zero() { return _mm256_setzero_si256(); }
  static I Load(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I Broadcast(const int16_t* pair) {
    int32_t word;
    std::memcpy(&word, pair, sizeof word);
    return _mm256_set1_epi32(word);
  }
  static I AddDots(I acc, I a, I b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
  static Simd::F ToFloat(I v) { return _mm256_cvtepi32_ps(v); }
  static void Pin(I& v) { __asm__("" : "+v"(v)); }
};
#endif
constexpr int64_t kLanes = Simd::kLanes;
static_assert(sizeof(Words::I) == kLanes * sizeof(int32_t), "a token an int32 lane, a float lane alike");

// Where a pass's tokens are: their groups' words and steps (a group `group_words` and `group_steps` apart), and
// where their dot products go (out[r * count + t], t counted from the first group's first token; `tokens` of them).
struct Tokens {
  const int32_t* words;
  const float* steps;
  int64_t group_words, group_steps;
  float* out;
  int64_t count, tokens;
};

// Rows decoded rows (`weights`: int16, `cols` apart; `weight_scales`: a float a block, `blocks` apart) against
// Groups groups of tokens.
template <int Rows, int Groups>
void Tile(const int16_t* weights, const float* weight_scales, int64_t blocks, const Tokens& x) {
  const int64_t cols = blocks * kBlock;
  Simd::F sums[Rows][Groups];
  for (auto& row : sums)
    for (auto& sum : row) sum = Simd::Zero();
  for (int64_t b = 0; b < blocks; ++b) {
    Words::I dots[Rows][Groups];
    for (auto& row : dots)
      for (auto& dot : row) dot = Words::Zero();
    const int32_t* block_words = x.words + b * kPairsPerBlock * kLanes;
    const int16_t* block_weights = weights + b * kBlock;
    // four pairs a turn: unrolled whole, GCC sums the block's products as a tree through the stack (0.85x the float
    // tiles in the probe above, against 1.48x four a turn, 1.25-1.37x two, 1.09x one)
#pragma GCC unroll 4
    for (int64_t pair = 0; pair < kPairsPerBlock; ++pair) {
      Words::I words[Groups];
      for (int g = 0; g < Groups; ++g) {
        words[g] = Words::Load(block_words + g * x.group_words + pair * kLanes);
        Words::Pin(words[g]);  // one load feeds every row
      }
      for (int r = 0; r < Rows; ++r) {
        const Words::I weight = Words::Broadcast(block_weights + r * cols + 2 * pair);
        for (int g = 0; g < Groups; ++g) dots[r][g] = Words::AddDots(dots[r][g], weight, words[g]);
      }
    }
    for (int r = 0; r < Rows; ++r) {
      const Simd::F weight_scale = Simd::Set1(weight_scales[r * blocks + b]);
      for (int g = 0; g < Groups; ++g) {
        const Simd::F scale = Simd::Mul(Simd::Load(x.steps + g * x.group_steps + b * kLanes), weight_scale);
        sums[r][g] = Simd::Fma(Words::ToFloat(dots[r][g]), scale, sums[r][g]);
      }
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int g = 0; g < Groups; ++g) {
      float lanes[kLanes];
      Simd::Store(lanes, sums[r][g]);
      const int64_t first = g * kLanes, taken = std::min<int64_t>(kLanes, x.tokens - first);
      std::memcpy(x.out + r * x.count + first, lanes, sizeof(float) * taken);
    }
  }
}

template <int Rows, int Groups>
void TileOf(int64_t groups, const int16_t* weights, const float* weight_scales, int64_t blocks, const Tokens& x) {
  if (groups == Groups) return Tile<Rows, Groups>(weights, weight_scales, blocks, x);
  if constexpr (Groups > 1) TileOf<Rows, Groups - 1>(groups, weights, weight_scales, blocks, x);
}

template <int Rows>
void PassOf(int64_t rows, int64_t groups, const int16_t* weights, const float* weight_scales, int64_t blocks,
            const Tokens& x) {
  if (rows == Rows) return TileOf<Rows, Words::kGroups>(groups, weights, weight_scales, blocks, x);
  if constexpr (Rows > 1) PassOf<Rows - 1>(rows, groups, weights, weight_scales, blocks, x);
}

// How many of `left` groups of tokens the next pass takes: kGroups, except that 4 left of passes of 3 go as 2 and 2
// (AVX-512 at 64 tokens, as a prefill's expert meets: 1.2x as fast as 3 and 1 in the probe above).
int64_t GroupsTaken(int64_t left) {
  return Words::kGroups == 3 && left == 4 ? 2 : std::min<int64_t>(Words::kGroups, left);
}

// `rows` consecutive rows as twice their E2M1 values (int16, `cols` apart) and their blocks' scales halved.
void DecodeRows(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, int16_t* out,
                float* out_scales) {
  for (int64_t block = 0; block < rows * cols / kBlock; ++block) {
    const TwiceE2M1 twice(codes + block * (kBlock / 2));
    auto* dst = reinterpret_cast<__m256i*>(out + block * kBlock);
    _mm256_storeu_si256(dst, _mm256_cvtepi8_epi16(twice.first));
    _mm256_storeu_si256(dst + 1, _mm256_cvtepi8_epi16(twice.second));
    out_scales[block] = kE8M0.values[scales[block]] * 0.5f;
  }
}

}  // namespace

int64_t PackedWordsSize(int64_t count, int64_t cols) { return (count + kLanes - 1) / kLanes * kLanes * cols / 2; }

int64_t PackedStepsSize(int64_t count, int64_t cols) { return (count + kLanes - 1) / kLanes * kLanes * cols / kBlock; }

void PackTokens(const int16_t* const* values, const float* const* steps, int64_t count, int64_t cols, int32_t* words,
                float* packed_steps) {
  const int64_t blocks = cols / kBlock, groups = (count + kLanes - 1) / kLanes;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      const int64_t t = g * kLanes + lane;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t* block_words = words + (g * blocks + b) * kPairsPerBlock * kLanes + lane;
        packed_steps[(g * blocks + b) * kLanes + lane] = t < count ? steps[t][b] : 0.0f;
        for (int64_t pair = 0; pair < kPairsPerBlock; ++pair) {
          int32_t word = 0;
          if (t < count) std::memcpy(&word, values[t] + b * kBlock + 2 * pair, sizeof word);
          block_words[pair * kLanes] = word;
        }
      }
    }
  }
}

void IntTileDots(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, const int32_t* words,
                 const float* packed_steps, int64_t count, float* out, IntTileScratch& scratch) {
  const int64_t blocks = cols / kBlock, groups = (count + kLanes - 1) / kLanes;
  const int64_t group_words = blocks * kPairsPerBlock * kLanes, group_steps = blocks * kLanes;
  scratch.rows.resize(static_cast<size_t>(Words::kRows * cols));
  scratch.scales.resize(static_cast<size_t>(Words::kRows * blocks));
  for (int64_t row = 0; row < rows; row += Words::kRows) {
    const int64_t pass = std::min<int64_t>(Words::kRows, rows - row);
    DecodeRows(codes + row * cols / 2, scales + row * blocks, pass, cols, scratch.rows.data(), scratch.scales.data());
    // the next pass's code bytes asked into L2 while this pass's tiles run: else its decoding waits on memory
    const int64_t next = std::min<int64_t>(Words::kRows, rows - row - pass) * cols / 2;
    for (int64_t byte = 0; byte < next; byte += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + (row + pass) * cols / 2 + byte), _MM_HINT_T1);
    }
    for (int64_t g = 0, taken = 0; g < groups; g += taken) {
      taken = GroupsTaken(groups - g);
      const Tokens x{words + g * group_words, packed_steps + g * group_steps, group_words, group_steps,
                     out + row * count + g * kLanes, count, count - g * kLanes};
      PassOf<Words::kRows>(pass, taken, scratch.rows.data(), scratch.scales.data(), blocks, x);
    }
  }
}

}  // namespace gptoss

#endif
