// gptoss.engine::DenseBF16 and DenseInt8 on the CPU execution provider: y[m, n] = scale[n] * sum_k x[m, k] * w[n, k],
// w in bfloat16 (no scale) or int8 (a float scale per output row).
//
// A bfloat16 is the top half of a float, so widening one is a 16-bit shift: exact; an int8 widens exactly too,
// and its row's scale multiplies the row's sums (in prefill, the widened tile). The work is split over
// blocks of output rows on ONNX Runtime's intra-op thread pool (at decode, a thread takes a batch of consecutive
// blocks at a time: weight_batches.h), and each block's weights are read from memory once whatever the number of
// input rows:
// - up to kFewRows input rows (decode): each weight row is widened as it is read and met by every input row
//   (dot products: the step reads the weights' bytes at memory bandwidth); with 1 or 2 rows a block's weight rows
//   are read several at a time, a share of the block apart (StreamedRows); from 3 rows several weight rows a
//   pass share each x load;
// - more (prefill): the block is widened once into a float tile laid out by k, and groups of input rows run
//   against it as an outer product in registers (the arithmetic bound, not the memory).
//   In an AMX build (bf16 weights), the block's rows go as bfloat16 tiles against x packed once a call
//   (amx_cpu.h).
// The sums are float, in an order of their own: equal to a float32 MatMul's to float rounding. The vector paths are
// written once against simd_cpu.h: AVX-512 in an x86-64-v4 build, AVX2 and FMA in an x86-64-v3 one, NEON on ARM.

#include "amx_cpu.h"
#include "dense_op.h"
#include "simd_cpu.h"
#include "weight_batches.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>


namespace gptoss {
namespace {

constexpr int64_t kFewRows = 8;
constexpr int64_t kBlockRows = 32;  // output rows per task (and per prefill tile: two 16-float vectors)
// Weight bytes the decode path asks the cache for ahead of those it reads: the hardware prefetcher alone leaves
// some of its loads waiting on memory. 4 KiB ahead beat 1 KiB (tuned on an Intel Xeon) and 2, 8 and 16 KiB on a
// 2-core AMD EPYC, alternated in one process; bench/llama_cpp_bench.py reports the decode rates it gives. With one
// input row (a last block of fewer than kBlockRows rows: whole blocks go as StreamedRows' streams, which ask theirs
// as far ahead into L2) the lines are asked into L1; with more, whose arithmetic between loads is
// longer, into L2 only (prefetcht1; SharedRowsPass's next rows too): asked into L1 they stalled the loads of a Zen 4
// AMD EPYC core, whose 4-row pass over the unembedding read 13 GB/s a core against 21 with L2 (a standalone probe),
// and a 6-layer decode step of gpt-oss-20b's width ran 12-13% faster at 4 sequences and 18-21% at 2, in both the
// AVX-512 and the AVX2 build (alternated in one process); at 1 row L1 read 7% faster in the probe.
constexpr int64_t kPrefetchBytes = 4096;

// How each kind of weight widens to float: one value, and (vector paths) a chunk of kParts x Simd::kLanes consecutive
// values as kParts vectors, part `part` of the chunk at `bits`. A pair of bfloat16 values is one 32-bit word: the even
// value is the word shifted up and the odd one the word with its low half masked off, so a chunk is a vector's worth of
// words split into its evens and its odds, one logic instruction a vector and no shuffle, against x laid out to match
// (PermuteChunks: each chunk's evens, then its odds). On 2 Intel Xeon cores with AVX-512, a 6-layer decode step of
// gpt-oss-20b's width at 1 sequence spent 44.8 ms in the unembedding (201,088 x 2880) this way against 47.6 ms with
// each value widened from 16 bits to a lane (ONNX Runtime's profiler, alternated). An int8 value widens to a lane: one
// part a chunk.
struct Bf16Weights {
  using Stored = uint16_t;
  static constexpr int kParts = 2;
  static float Widen(Stored bits) {
    const uint32_t word = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &word, sizeof value);
    return value;
  }
#if defined(GPTOSS_SIMD)
  static Simd::F WidenPart(const Stored* chunk, int part) {
    return part == 0 ? Simd::Bf16Evens(chunk) : Simd::Bf16Odds(chunk);
  }
#endif
};

struct Int8Weights {
  using Stored = int8_t;
  static constexpr int kParts = 1;
  static float Widen(Stored value) { return static_cast<float>(value); }
#if defined(GPTOSS_SIMD)
  static Simd::F WidenPart(const Stored* chunk, int) { return Simd::WidenInt8(chunk); }
#endif
};

template <typename W>
struct Problem {
  const float* x;
  const typename W::Stored* w;
  const float* scale;  // per output row, or null (1)
  float* y;
  int64_t rows;  // M
  int64_t k;
  int64_t n;
  const uint16_t* packed = nullptr;  // x laid out for the AMX tiles (PackVectors), where they take the prefill
  float Scale(int64_t row) const { return scale != nullptr ? scale[row] : 1.0f; }
};

// Output rows [first, last) for the R input rows from m0 (R <= kFewRows): dot products, each weight vector
// widened once and met by every row; with few rows, U independent sums per row keep the FMAs in flight (a whole
// number of chunks: W::kParts vectors each).
template <typename W, int R>
void FewRows(const Problem<W>& p, int64_t first, int64_t last, int64_t m0) {
  constexpr int U = std::max(R == 1 ? 4 : R == 2 ? 2 : 1, W::kParts);
  const int64_t k = p.k;
  for (int64_t row = first; row < last; ++row) {
    const typename W::Stored* w = p.w + row * k;
    float sums[R] = {};
    int64_t i = 0;
#if defined(GPTOSS_SIMD)
    constexpr int64_t L = Simd::kLanes;
    constexpr int64_t kChunk = L * W::kParts;
    Simd::F acc[R][U];
    for (int r = 0; r < R; ++r) {
      for (int u = 0; u < U; ++u) acc[r][u] = Simd::Zero();
    }
    for (; i + L * U <= k; i += L * U) {
      const char* ahead = reinterpret_cast<const char*>(w + i) + kPrefetchBytes;
      for (size_t b = 0; b < L * U * sizeof *w; b += 64) {
        if constexpr (R == 1) {
          Simd::Prefetch(ahead + b);
        } else {
          Simd::PrefetchL2(ahead + b);
        }
      }
      for (int u = 0; u < U; ++u) {
        const Simd::F wide = W::WidenPart(w + i + kChunk * (u / W::kParts), u % W::kParts);
        for (int r = 0; r < R; ++r) {
          acc[r][u] = Simd::Fma(wide, Simd::Load(p.x + (m0 + r) * k + i + L * u), acc[r][u]);
        }
      }
    }
    for (; i + kChunk <= k; i += kChunk) {
      for (int part = 0; part < W::kParts; ++part) {
        const Simd::F wide = W::WidenPart(w + i, part);
        for (int r = 0; r < R; ++r) {
          acc[r][part] = Simd::Fma(wide, Simd::Load(p.x + (m0 + r) * k + i + L * part), acc[r][part]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int u = 1; u < U; ++u) acc[r][0] = Simd::Add(acc[r][0], acc[r][u]);
      sums[r] = Simd::Sum(acc[r][0]);
    }
#endif
    for (; i < k; ++i) {
      const float value = W::Widen(w[i]);
      for (int r = 0; r < R; ++r) sums[r] += value * p.x[(m0 + r) * k + i];
    }
    for (int r = 0; r < R; ++r) p.y[(m0 + r) * p.n + row] = sums[r] * p.Scale(row);
  }
}

#if defined(GPTOSS_SIMD)
// Weight rows a pass of SharedRows takes for R input rows: P x R sums, P widened weights and one x vector within a
// budget of registers: 24 of the 32 vector registers of AVX-512 and NEON (the pass shapes measured on AVX-512: 4 up
// to 4 rows, else 2); AVX2's 16, whose passes take up to 4 rows (SharedRows): 4 weight rows at up to 2 input rows
// (13 registers), 3 at 3 (13), 2 at 4 (11: 3 weight rows at 4 input rows take all 16, leaving none for the
// widening's mask).
template <int R>
constexpr int SharedPass() {
  static_assert(Simd::kRegisters == 32 ? R <= 8 : R <= 4, "a pass's sums fit in the registers");
  if constexpr (Simd::kRegisters == 32) return 4 * R + 4 + 1 <= 24 ? 4 : 2;
  return R <= 2 ? 4 : R == 3 ? 3 : 2;
}

// The same for R >= 3 rows: P weight rows at a time share each load of an x vector, over the whole of K (the
// x rows come from L2: R x K floats). K taken in chunks whose x rows stay in L1 read each block's weight rows as
// short runs, which streamed slower on a 2-core AMD EPYC (bench/llama_cpp_bench.py, 4 sequences with
// moe_int8_activations: 1.09x llama.cpp f16 with the chunks; 1.22-1.33x in three runs with whole rows).
template <typename W, int R>
void SharedRowsPass(const Problem<W>& p, int64_t first, int64_t last) {
  constexpr int P = SharedPass<R>();
  constexpr int64_t L = Simd::kLanes;
  const int64_t k = p.k;
  constexpr int64_t kChunk = L * W::kParts;
  const int64_t whole = k / kChunk * kChunk;
  int64_t j = first;
  for (; j + P <= last; j += P) {
    const typename W::Stored* w = p.w + j * k;
    Simd::F sums[P][R];
    for (int q = 0; q < P; ++q) {
      for (int r = 0; r < R; ++r) sums[q][r] = Simd::Zero();
    }
    for (int64_t i = 0; i < whole; i += kChunk) {
      // the next P rows' line at this column, read right after these (past the matrix's end a prefetch is
      // dropped, never a fault; a chunk is at most a line)
      static_assert(64 % (kChunk * sizeof *w) == 0, "a chunk lies within one cache line");
      if (i % (64 / sizeof *w) == 0) {
        for (int q = 0; q < P; ++q) Simd::PrefetchL2(w + (P + q) * k + i);
      }
      // each part widened from the chunk's words as it is needed (a second read of them comes from L1): P vectors
      // held, not P x kParts
      for (int part = 0; part < W::kParts; ++part) {
        Simd::F wide[P];
        for (int q = 0; q < P; ++q) wide[q] = W::WidenPart(w + q * k + i, part);
        for (int r = 0; r < R; ++r) {
          Simd::F x = Simd::Load(p.x + r * k + i + L * part);
          // one load feeds the P multiply-adds where registers are left for it (AVX-512's 32; tuned for znver4, GCC
          // folded it into each of them: 9% slower at 4 sequences on a Zen 4 EPYC). In AVX2's 16, bf16 passes leave
          // room (P x R sums, P widened weights, x and the mask: 12 at 4 rows, 14 at 3), and unpinned GCC loaded each
          // x vector once per weight row from L2 (x of 4 rows, 46 KB, is past L1): pinned, the unembedding's
          // 201,088 rows read 1.09x as fast at 4 rows and 1.03x at 3, a 5,000-row slice from L3 1.17x at 4 and 1.7x at
          // 3; a 6-layer decode step of gpt-oss-20b's width at 4 sequences took 107 ms against 106-119 (its bf16 dense
          // ops 53 ms against 63 in the profiler; 2 AMD EPYC cores of the Zen 3 family, alternated in one process).
          // The int8 dense passes' x stays unpinned: pinned, it spilled them (the int8 dense decode at 4 sequences 22%
          // slower on a Zen 4 EPYC).
          constexpr bool kRoomForX = W::kParts == 2 && P * R + P + 2 <= Simd::kRegisters;
          if constexpr (Simd::kRegisters == 32 || kRoomForX) Simd::Pin(x);
          for (int q = 0; q < P; ++q) sums[q][r] = Simd::Fma(wide[q], x, sums[q][r]);
        }
      }
    }
    for (int q = 0; q < P; ++q) {
      for (int r = 0; r < R; ++r) {
        float sum = Simd::Sum(sums[q][r]);
        for (int64_t i = whole; i < k; ++i) sum += W::Widen(w[q * k + i]) * p.x[r * k + i];
        p.y[r * p.n + j + q] = sum * p.Scale(j + q);
      }
    }
  }
  if (j < last) FewRows<W, R>(p, j, last, 0);
}

// SharedRowsPass, except in AVX2's 16 registers, where more than 4 rows go 4 at a time (the rest in one last pass).
// Each pass reads the block's weights (from memory once, then from L2) and widens them, so the fewer passes the
// better while a pass's sums and weights fit the registers: 4 rows in one pass of 2 weight rows, against two passes of
// 2 rows (4 weight rows each), read a 50,000 x 2880 slice of the unembedding 1.17x as fast at 4 rows, 1.05x at 5,
// 1.00x at 6 and 1.12x at 8, 3 rows (the same code in both) 1.02x (a standalone probe, the two builds alternated in
// one process, medians of 28; 2 AMD EPYC cores of the Zen 4 family, x86-64-v3 kernels). A 6-layer decode step of
// gpt-oss-20b's width at 4 sequences showed no difference beyond the ±10% that two runtimes of one build differed by
// there. (On a Zen 5 EPYC, passes of 2 rows had beaten one pass of 3 weight rows at 4 input rows, a shape that leaves
// no register for the widening's mask.) AVX-512's and NEON's 32 registers take up to 8 rows in one pass.
template <typename W, int R>
void SharedRows(const Problem<W>& p, int64_t first, int64_t last) {
  if constexpr (Simd::kRegisters == 16 && R >= 5) {
    SharedRowsPass<W, 4>(p, first, last);
    Problem<W> rest = p;
    rest.x += 4 * p.k;
    rest.y += 4 * p.n;
    rest.rows -= 4;
    SharedRows<W, R - 4>(rest, first, last);
  } else {
    SharedRowsPass<W, R>(p, first, last);
  }
}
#endif

#if defined(GPTOSS_SIMD)
// A whole block's output rows for R = 1 or 2 input rows: its weight rows read kStreamsOf<R> at a time, a block's
// share apart (with one input row, rows j, j + 8, j + 16 and j + 24), each widened part met by every input row's x
// vector, loaded once for all the streams. One weight row at a time is one stream of loads a core, which the core
// keeps too few of in flight to read at the memory's rate: streams apart let the hardware prefetcher run ahead on each
// (on 2 AMD EPYC cores of the Zen 3 family with AVX2 only, the unembedding's 201,088 x 2880 bf16 rows read in a
// standalone probe at 13.5-15.1 GB/s one row at a time, 18.6 four rows 8 apart, 16.9 two 16 apart, while consecutive
// rows gained nothing; bench/llama_cpp_bench.py's decode rows show the step).
template <int R>
constexpr int kStreamsOf = R == 1 ? 4 : 2;  // in AVX2's 16 registers: S x R x parts sums, R x parts x, a part

template <typename W, int R>
void StreamedRows(const Problem<W>& p, int64_t first) {
  constexpr int S = kStreamsOf<R>;
  constexpr int64_t kApart = kBlockRows / S;
  constexpr int64_t L = Simd::kLanes;
  constexpr int64_t kChunk = L * W::kParts;
  const int64_t k = p.k;
  for (int64_t j = 0; j < kApart; ++j) {
    const typename W::Stored* w[S];
    for (int s = 0; s < S; ++s) w[s] = p.w + (first + j + s * kApart) * k;
    Simd::F acc[S][R][W::kParts];
    for (auto& stream : acc)
      for (auto& row : stream)
        for (auto& part : row) part = Simd::Zero();
    int64_t i = 0;
    for (; i + kChunk <= k; i += kChunk) {
      Simd::F x[R][W::kParts];
      for (int r = 0; r < R; ++r) {
        for (int part = 0; part < W::kParts; ++part) {
          x[r][part] = Simd::Load(p.x + r * k + i + L * part);
          Simd::Pin(x[r][part]);  // one load feeds every stream
        }
      }
      static_assert(64 % (kChunk * sizeof **w) == 0, "a chunk lies within one cache line");
      if (i % (64 / sizeof **w) == 0) {
        for (int s = 0; s < S; ++s) {
          // each stream's line kPrefetchBytes ahead asked into L2 as its line is begun (past a row's end, the
          // stream's next row): the hardware prefetcher alone leaves some of the streams' loads waiting on memory.
          // Asked into L1 1 KiB ahead, as before, on 2 AMD EPYC cores of the Zen 4 family a 6-layer decode step of
          // gpt-oss-20b's width ran at 1 / 2 sequences 0.89x / 0.80x this rate with AVX-512 and 0.82x / 0.74x with
          // AVX2 (each runtime made anew, alternated, 10 rounds); in 8 rounds, with AVX-512, 2 KiB ahead into L2
          // 1.06x / 0.84x, 2 KiB into L1 0.98x / 0.70x. (On a Zen 5 EPYC, asked into L1 1 KiB ahead had read the
          // unembedding 1.08-1.10x as fast as not asking at 1 row.)
          Simd::PrefetchL2(reinterpret_cast<const char*>(w[s] + i) + kPrefetchBytes);
        }
      }
      for (int s = 0; s < S; ++s) {
        for (int part = 0; part < W::kParts; ++part) {
          const Simd::F wide = W::WidenPart(w[s] + i, part);
          for (int r = 0; r < R; ++r) acc[s][r][part] = Simd::Fma(wide, x[r][part], acc[s][r][part]);
        }
      }
    }
    for (int s = 0; s < S; ++s) {
      const int64_t row = first + j + s * kApart;
      for (int r = 0; r < R; ++r) {
        for (int part = 1; part < W::kParts; ++part) acc[s][r][0] = Simd::Add(acc[s][r][0], acc[s][r][part]);
        float sum = Simd::Sum(acc[s][r][0]);
        for (int64_t tail = i; tail < k; ++tail) sum += W::Widen(w[s][tail]) * p.x[r * k + tail];
        p.y[r * p.n + row] = sum * p.Scale(row);
      }
    }
  }
}
#endif

template <typename W>
void FewRows(const Problem<W>& p, int64_t first, int64_t last) {
#if defined(GPTOSS_SIMD)
  if (last - first == kBlockRows) {  // a whole block (the last one of the weights may hold fewer)
    if (p.rows == 1) return StreamedRows<W, 1>(p, first);
    if (p.rows == 2) return StreamedRows<W, 2>(p, first);
  }
#endif
  switch (p.rows) {
    case 1: return FewRows<W, 1>(p, first, last, 0);
    case 2: return FewRows<W, 2>(p, first, last, 0);
#if defined(GPTOSS_SIMD)
    case 3: return SharedRows<W, 3>(p, first, last);
    case 4: return SharedRows<W, 4>(p, first, last);
    case 5: return SharedRows<W, 5>(p, first, last);
    case 6: return SharedRows<W, 6>(p, first, last);
    case 7: return SharedRows<W, 7>(p, first, last);
    default: return SharedRows<W, 8>(p, first, last);
#else
    case 3: return FewRows<W, 3>(p, first, last, 0);
    case 4: return FewRows<W, 4>(p, first, last, 0);
    case 5: return FewRows<W, 5>(p, first, last, 0);
    case 6: return FewRows<W, 6>(p, first, last, 0);
    case 7: return FewRows<W, 7>(p, first, last, 0);
    default: return FewRows<W, 8>(p, first, last, 0);
#endif
  }
}

// Output rows [first, last) for every input row, through a widened (and scaled) tile [k][kBlockRows].
template <typename W>
void ManyRows(const Problem<W>& p, int64_t first, int64_t last, std::vector<float>& tile) {
  const int64_t k = p.k;
  const int64_t width = last - first;
  tile.assign(static_cast<size_t>(k) * kBlockRows, 0.0f);
  for (int64_t j = 0; j < width; ++j) {
    const typename W::Stored* w = p.w + (first + j) * k;
    const float scale = p.Scale(first + j);
    for (int64_t i = 0; i < k; ++i) tile[i * kBlockRows + j] = W::Widen(w[i]) * scale;
  }
  int64_t m = 0;
#if defined(GPTOSS_SIMD)
  // groups of G input rows against 2 vectors of the tile's columns at a time: 2G sums, 2 tile loads and a
  // broadcast in the registers (AVX-512: 8 rows, the tile's 32 columns in one pass; AVX2: 6 rows, 16 columns
  // a pass)
  constexpr int64_t L = Simd::kLanes;
  constexpr int64_t G = Simd::kRegisters == 32 ? 8 : 6;
  static_assert(kBlockRows % (2 * L) == 0, "a pass takes two vectors of the tile's columns");
  const int64_t passes = (width + 2 * L - 1) / (2 * L);
  for (; m + G <= p.rows; m += G) {
    const float* x = p.x + m * k;
    for (int64_t pass = 0; pass < passes; ++pass) {
      const float* column = tile.data() + pass * 2 * L;
      Simd::F lo[G], hi[G];
      for (int64_t r = 0; r < G; ++r) lo[r] = hi[r] = Simd::Zero();
      for (int64_t i = 0; i < k; ++i) {
        const Simd::F w_lo = Simd::Load(column + i * kBlockRows);
        const Simd::F w_hi = Simd::Load(column + i * kBlockRows + L);
        for (int64_t r = 0; r < G; ++r) {
          const Simd::F value = Simd::Set1(x[r * k + i]);
          lo[r] = Simd::Fma(value, w_lo, lo[r]);
          hi[r] = Simd::Fma(value, w_hi, hi[r]);
        }
      }
      const int64_t taken = std::min<int64_t>(2 * L, width - pass * 2 * L);
      for (int64_t r = 0; r < G; ++r) {
        float out[2 * L];
        Simd::Store(out, lo[r]);
        Simd::Store(out + L, hi[r]);
        std::memcpy(p.y + (m + r) * p.n + first + pass * 2 * L, out, sizeof(float) * taken);
      }
    }
  }
#endif
  for (; m < p.rows; ++m) {
    const float* x = p.x + m * k;
    float sums[kBlockRows] = {};
    for (int64_t i = 0; i < k; ++i) {
      const float value = x[i];
      for (int64_t j = 0; j < width; ++j) sums[j] += value * tile[i * kBlockRows + j];
    }
    std::memcpy(p.y + m * p.n + first, sums, sizeof(float) * width);
  }
}

// `rows` rows of x (k values each) laid out for WidenPart: each whole chunk of kParts x Simd::kLanes values as its
// part 0 (values 0, kParts, 2 kParts, ...), then its part 1, ...; the values past the last whole chunk as they are.
#if defined(GPTOSS_SIMD)
template <typename W>
void PermuteChunks(const float* x, int64_t rows, int64_t k, float* out) {
  constexpr int64_t kChunk = Simd::kLanes * W::kParts;
  const int64_t whole = k / kChunk * kChunk;
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * k;
    float* to = out + r * k;
    for (int64_t c = 0; c < whole; c += kChunk) {
      for (int64_t i = 0; i < kChunk; ++i) to[c + (i % W::kParts) * (kChunk / W::kParts) + i / W::kParts] = in[c + i];
    }
    std::copy(in + whole, in + k, to + whole);
  }
}
#endif

// Points p.x at x as RunBlock's tasks read it: the decode path of weights whose chunks hold several parts meets x
// laid out by PermuteChunks, in `chunked` (which must outlive the tasks); otherwise x as it is.
template <typename W>
void ChunkInput(Problem<W>& p, std::vector<float>& chunked) {
#if defined(GPTOSS_SIMD)
  if (p.rows <= kFewRows && W::kParts > 1) {
    chunked.resize(static_cast<size_t>(p.rows * p.k));
    PermuteChunks<W>(p.x, p.rows, p.k, chunked.data());
    p.x = chunked.data();
  }
#else
  (void)p;
  (void)chunked;
#endif
}

#if defined(GPTOSS_AMX)
// Output rows [first, last) (whole tiles) for every input row on the AMX tiles: the block's bf16 weight rows copied
// into the tiles' layout, met by x as Dense packed it, the sums turned from (weight row, input row) to y's order.
void AmxBlock(const Problem<Bf16Weights>& p, int64_t first, int64_t last) {
  thread_local std::vector<uint16_t> tiles;
  thread_local std::vector<float> sums;
  const int64_t width = last - first, chunks = p.k / kAmxDepth;
  tiles.resize(static_cast<size_t>(width * p.k));
  for (int64_t r = 0; r < width; ++r) {
    const uint16_t* row = p.w + (first + r) * p.k;
    uint16_t* group = TileRow(tiles.data(), r, chunks);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      std::memcpy(group + chunk * kAmxTileValues, row + chunk * kAmxDepth, kAmxDepth * sizeof(uint16_t));
    }
  }
  sums.resize(static_cast<size_t>(width * p.rows));
  AmxDots(tiles.data(), width, p.k, p.packed, p.rows, sums.data());
  for (int64_t m = 0; m < p.rows; ++m) {
    for (int64_t r = 0; r < width; ++r) p.y[m * p.n + first + r] = sums[r * p.rows + m];
  }
}

// Points p.packed at x laid out for the AMX tiles (in `packed`, which must outlive the tasks) where a bf16 prefill
// takes them: many input rows, K in whole tile rows, and tiles this process may use.
template <typename W>
void PackForTiles(Problem<W>& p, std::vector<uint16_t>& packed) {
  if (!std::is_same_v<W, Bf16Weights> || p.rows <= kFewRows || p.k % kAmxDepth != 0 || !AmxReady()) return;
  std::vector<const float*> vectors(p.rows);
  for (int64_t m = 0; m < p.rows; ++m) vectors[m] = p.x + m * p.k;
  packed.resize(static_cast<size_t>(PackedVectorsSize(p.rows, p.k)));
  PackVectors(vectors.data(), p.rows, p.k, packed.data());
  p.packed = packed.data();
}
#endif

template <typename W>
void RunBlock(void* data, size_t task) {
  const Problem<W>& p = *static_cast<const Problem<W>*>(data);
  const int64_t first = static_cast<int64_t>(task) * kBlockRows;
  const int64_t last = std::min(first + kBlockRows, p.n);
  if (p.rows <= kFewRows) {
    FewRows(p, first, last);
    return;
  }
#if defined(GPTOSS_AMX)
  if constexpr (std::is_same_v<W, Bf16Weights>) {
    if (p.packed != nullptr && (last - first) % kAmxRows == 0) return AmxBlock(p, first, last);
  }
#endif
  thread_local std::vector<float> tile;
  ManyRows(p, first, last, tile);
}

// y = x . w^T (times the rows' scales, when given) for the context's inputs x [..., K], w [N, K] (, scale [N]).
template <typename W>
void Dense(OrtKernelContext* raw_context, const char* op, bool scaled) {
  Ort::KernelContext context(raw_context);
  const Ort::ConstValue x = context.GetInput(0);
  const Ort::ConstValue w = context.GetInput(1);
  const std::vector<int64_t> x_shape = x.GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> w_shape = w.GetTensorTypeAndShapeInfo().GetShape();
  if (x_shape.empty() || w_shape.size() != 2 || x_shape.back() != w_shape[1]) {
    ORT_CXX_API_THROW(std::string(op) + ": x [..., K] and w [N, K] must share K", ORT_INVALID_ARGUMENT);
  }
  Problem<W> p{};
  if (scaled) {
    const Ort::ConstValue scale = context.GetInput(2);
    const std::vector<int64_t> scale_shape = scale.GetTensorTypeAndShapeInfo().GetShape();
    if (scale_shape.size() != 1 || scale_shape[0] != w_shape[0]) {
      ORT_CXX_API_THROW(std::string(op) + ": scale must be [N], one per row of w", ORT_INVALID_ARGUMENT);
    }
    p.scale = scale.GetTensorData<float>();
  }
  std::vector<int64_t> y_shape = x_shape;
  y_shape.back() = w_shape[0];
  Ort::UnownedValue y = context.GetOutput(0, y_shape);
  p.x = x.GetTensorData<float>();
  p.w = reinterpret_cast<const typename W::Stored*>(w.GetTensorRawData());
  p.y = y.GetTensorMutableData<float>();
  p.k = w_shape[1];
  p.n = w_shape[0];
  p.rows = 1;
  for (size_t d = 0; d + 1 < x_shape.size(); ++d) p.rows *= x_shape[d];
  if (p.rows == 0 || p.n == 0) return;
  if (p.k == 0) {
    std::fill(p.y, p.y + p.rows * p.n, 0.0f);
    return;
  }
  thread_local std::vector<float> chunked;  // kept from call to call: no allocation a step once it has grown
  ChunkInput(p, chunked);
#if defined(GPTOSS_AMX)
  thread_local std::vector<uint16_t> packed;
  PackForTiles(p, packed);
#endif
  const size_t tasks = static_cast<size_t>((p.n + kBlockRows - 1) / kBlockRows);
  // decode streams the weights: a thread takes a batch of consecutive blocks; prefill's tiles are arithmetic-bound,
  // split as ONNX Runtime splits them (a small matrix still spread over every thread)
  const size_t batches = p.rows <= kFewRows ? WeightBatches(tasks, sizeof(typename W::Stored) * p.n * p.k) : 0;
  context.ParallelFor(RunBlock<W>, tasks, batches, &p);
}

}  // namespace

void DenseBf16Kernel::Compute(OrtKernelContext* context) { Dense<Bf16Weights>(context, "DenseBF16", false); }

void DenseInt8Kernel::Compute(OrtKernelContext* context) { Dense<Int8Weights>(context, "DenseInt8", true); }

}  // namespace gptoss
