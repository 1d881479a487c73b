// gptoss.engine::PagedAttention on the CUDA execution provider, in the activation dtype (float, fp16, bf16),
// float arithmetic:
//
// 1. Write: a block per token rotates its keys and stores them and its values into its row's page.
// 2. Attend: a block per (token, KV head), a warp per query head of the KV head's group. The block walks the
//    token's keys in tiles of 32 positions, each tile's keys and values read once into shared memory for the
//    group; lane l scores key l of the tile for its warp's head, and the softmax runs online (a running maximum
//    and sum per head, started from the head's sink logit), each lane accumulating the weighted values of the
//    dimensions it holds. Where rows run several tokens (prefill chunks), AttendTiles instead takes 8 tokens a
//    block and reads each tile once for all of a row's tokens among them.
//    In 16-bit dtypes at gpt-oss's heads (unless GATEWAY_ATTENTION_MMA=0), both run on the tensor cores instead:
//    DecodeMma in Attend's blocks, AttendMma with 16 tokens a block (below).
// Both run on ONNX Runtime's stream, in order, with nothing read back: a step replays as a CUDA graph whatever
// its page tables hold (they are device buffers).
//
// The file is also compiled as host C++ with a warp-emulation shim (tests/kernel_emulation), so it keeps to
// threadIdx/blockIdx, __syncthreads and GPTOSS_LAUNCH.

#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cuda_launch.h"
#include "cuda_mma.h"
#include "cuda_numbers.h"
#include "paged_attention_launch.h"

namespace gptoss {
namespace {

constexpr int kWarp = 32;
constexpr int kTile = 32;  // key positions per tile: one per lane
constexpr int kWriteThreads = 256;

// The cache slot of `row`'s `position`; a page number outside the cache reads and writes page 0.
__device__ __forceinline__ int64_t SlotOf(const AttentionArgs& a, int64_t row, int64_t position) {
  int64_t page = a.page_table[row * a.table_width + position / a.page_size];
  if (page < 0 || page * a.page_size >= a.cache_slots) page = 0;
  return page * a.page_size + position % a.page_size;
}

__device__ __forceinline__ bool TokenInRange(const AttentionArgs& a, int64_t row, int64_t position) {
  return row >= 0 && row < a.rows && position >= 0 && position < a.max_positions &&
         position / a.page_size < a.table_width;
}

template <typename T>
__global__ void WriteKv(AttentionArgs a) {
  const int64_t t = blockIdx.x, d = a.head_dim, half = d / 2;
  const int64_t row = a.token_rows[t], position = a.positions[t];
  if (!TokenInRange(a, row, position)) return;
  const int64_t slot = SlotOf(a, row, position);
  const int64_t width = (a.heads + 2 * a.kv_heads) * d;
  const T* qkv = static_cast<const T*>(a.qkv) + t * width;
  T* keys = static_cast<T*>(a.key_cache) + slot * a.kv_heads * d;
  T* values = static_cast<T*>(a.value_cache) + slot * a.kv_heads * d;
  const T* cos = static_cast<const T*>(a.cos) + position * half;
  const T* sin = static_cast<const T*>(a.sin) + position * half;
  for (int64_t e = threadIdx.x; e < a.kv_heads * half; e += blockDim.x) {
    const int64_t h = e / half, i = e % half;
    const T* key = qkv + (a.heads + h) * d;
    const float x1 = ToFloat(key[i]), x2 = ToFloat(key[i + half]), c = ToFloat(cos[i]), s = ToFloat(sin[i]);
    keys[h * d + i] = FromFloat<T>(x1 * c - x2 * s);
    keys[h * d + i + half] = FromFloat<T>(x2 * c + x1 * s);
    const T* value = qkv + (a.heads + a.kv_heads + h) * d;
    values[h * d + i] = value[i];
    values[h * d + i + half] = value[i + half];
  }
}

// The fewest keys a split part of a decode step takes: one tile, and more as the step's (token, KV head) pairs
// alone fill the GPU (kBusyPairs of them), so that many short contexts are not cut into parts of a few keys
// that each cost a block a whole tile. From the shapes only: a CUDA graph's launch stays valid.
constexpr int64_t kBusyPairs = 128;
constexpr int64_t kMostSpanTiles = 32;

__device__ __forceinline__ int64_t SplitSpan(const AttentionArgs& a) {
  const int64_t tiles = a.tokens * a.kv_heads / kBusyPairs;
  return kTile * (tiles < 1 ? 1 : tiles > kMostSpanTiles ? kMostSpanTiles : tiles);
}

template <typename T>
__global__ void Attend(AttentionArgs a) {
  __shared__ float keys[kTile][kMaxHeadDim + 1];  // padded: lanes reading one dimension of 32 keys hit 32 banks
  __shared__ float values[kTile][kMaxHeadDim + 1];
  __shared__ float queries[kMaxGroup][kMaxHeadDim];
  __shared__ float weights[kMaxGroup][kTile];
  const int64_t t = blockIdx.x, h = blockIdx.y, d = a.head_dim, half = d / 2;
  const int64_t group = a.heads / a.kv_heads;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = a.token_rows[t], position = a.positions[t];
  const int64_t head = h * group + warp;
  T* out = static_cast<T*>(a.out) + t * a.heads * d + head * d;
  const bool valid = TokenInRange(a, row, position);
  if (!valid) {  // nothing to attend to: zeros (every thread of the block returns before any barrier)
    for (int64_t i = lane; i < d; i += kWarp) out[i] = FromFloat<T>(0.0f);
    return;
  }
  const int64_t earliest = a.window > 0 ? (position - a.window + 1 > 0 ? position - a.window + 1 : 0) : 0;
  // this block's share of the keys: all of them, or one of gridDim.z equal parts (flash-decoding) of at least
  // SplitSpan keys, so that a short context fills a few blocks and the others end at once
  const int64_t splits = gridDim.z, even = (position - earliest + splits) / splits, least = SplitSpan(a);
  const int64_t span = even > least ? even : least;
  const int64_t first = earliest + static_cast<int64_t>(blockIdx.z) * span;
  const int64_t last = first + span - 1 < position ? first + span - 1 : position;
  if (first > last) {  // an empty part (splits > 1 here): nothing for MergeSplits to add
    float* part = a.parts + ((t * a.heads + head) * splits + blockIdx.z) * (d + 2);
    for (int64_t i = lane; i < d; i += kWarp) part[i] = 0.0f;
    if (lane == 0) part[d] = -FLT_MAX, part[d + 1] = 0.0f;
    return;
  }
  {  // this warp's query, rotated and scaled, into shared memory
    const T* q = static_cast<const T*>(a.qkv) + t * (a.heads + 2 * a.kv_heads) * d + head * d;
    const T* cos = static_cast<const T*>(a.cos) + position * half;
    const T* sin = static_cast<const T*>(a.sin) + position * half;
    for (int64_t i = lane; i < half; i += kWarp) {
      const float x1 = ToFloat(q[i]), x2 = ToFloat(q[i + half]), c = ToFloat(cos[i]), s = ToFloat(sin[i]);
      queries[warp][i] = (x1 * c - x2 * s) * a.scale;
      queries[warp][i + half] = (x2 * c + x1 * s) * a.scale;
    }
  }
  constexpr int kPerLane = kMaxHeadDim / kWarp;
  float acc[kPerLane] = {};
  // the sink, a logit with no value, starts the softmax (split: the merge adds it once)
  float top = splits == 1 ? ToFloat(static_cast<const T*>(a.sinks)[head]) : -FLT_MAX;
  float total = splits == 1 ? 1.0f : 0.0f;
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);
  for (int64_t base = first; base <= last; base += kTile) {
    __syncthreads();  // the last tile's readers are done (and, the first time, the queries written)
    for (int64_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
      const int64_t k = e / d, i = e % d, j = base + k;
      float key = 0.0f, value = 0.0f;
      if (j <= last) {
        const int64_t at = (SlotOf(a, row, j) * a.kv_heads + h) * d + i;
        key = ToFloat(key_cache[at]);
        value = ToFloat(value_cache[at]);
      }
      keys[k][i] = key;
      values[k][i] = value;
    }
    __syncthreads();
    float score = -FLT_MAX;
    if (base + lane <= last) {
      score = 0.0f;
      for (int64_t i = 0; i < d; ++i) score += queries[warp][i] * keys[lane][i];
    }
    weights[warp][lane] = score;
    __syncthreads();
    float tile_top = top;
    for (int k = 0; k < kTile; ++k) tile_top = fmaxf(tile_top, weights[warp][k]);
    const float rescale = expf(top - tile_top);
    total *= rescale;
    for (int e = 0; e < kPerLane; ++e) acc[e] *= rescale;
    for (int k = 0; k < kTile && base + k <= last; ++k) {
      const float p = expf(weights[warp][k] - tile_top);
      total += p;
      for (int e = 0; e < kPerLane && lane + e * kWarp < d; ++e) acc[e] += p * values[k][lane + e * kWarp];
    }
    top = tile_top;
  }
  if (splits == 1) {
    for (int e = 0; e < kPerLane && lane + e * kWarp < d; ++e) out[lane + e * kWarp] = FromFloat<T>(acc[e] / total);
    return;
  }
  // this part's running maximum, sum and weighted values, for MergeSplits (an empty part: -FLT_MAX, 0, zeros)
  float* part = a.parts + ((t * a.heads + head) * splits + blockIdx.z) * (d + 2);
  for (int e = 0; e < kPerLane && lane + e * kWarp < d; ++e) part[lane + e * kWarp] = acc[e];
  if (lane == 0) part[d] = top, part[d + 1] = total;
}

// The parts of a split token's attention merged per (token, head), the sink added once.
template <typename T>
__global__ void MergeSplits(AttentionArgs a, int splits) {
  const int64_t t = blockIdx.x, head = blockIdx.y, d = a.head_dim;
  if (!TokenInRange(a, a.token_rows[t], a.positions[t])) return;  // Attend wrote its zeros
  const float* parts = a.parts + (t * a.heads + head) * splits * (d + 2);
  float top = ToFloat(static_cast<const T*>(a.sinks)[head]);
  for (int s = 0; s < splits; ++s) top = fmaxf(top, parts[s * (d + 2) + d]);
  float total = expf(ToFloat(static_cast<const T*>(a.sinks)[head]) - top);
  for (int s = 0; s < splits; ++s) total += parts[s * (d + 2) + d + 1] * expf(parts[s * (d + 2) + d] - top);
  T* out = static_cast<T*>(a.out) + t * a.heads * d + head * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += parts[s * (d + 2) + i] * expf(parts[s * (d + 2) + d] - top);
    out[i] = FromFloat<T>(sum / total);
  }
}

// Steps where rows run several tokens (prefill chunks): a block per (kTileTokens consecutive tokens, KV head), a
// warp per query head of the group. The block's tokens are taken in runs of one row; each run's keys and values
// are read once per tile for all of its tokens (not once per token), every warp scoring its head's queries of the
// run against the tile, lane l key l. For gpt-oss's shape (a group of at most 8 heads of at most 64).
constexpr int kTileTokens = 8;
constexpr int kTileGroup = 8;
constexpr int kTileDim = 64;

template <typename T>
__global__ void AttendTiles(AttentionArgs a) {
  __shared__ float keys[kTile][kTileDim + 1];
  __shared__ float values[kTile][kTileDim + 1];
  __shared__ float queries[kTileGroup][kTileTokens][kTileDim];
  __shared__ float weights[kTileGroup][kTileTokens][kTile];
  const int64_t h = blockIdx.y, d = a.head_dim, half = d / 2;
  const int64_t group = a.heads / a.kv_heads;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t head = h * group + warp;
  const int64_t block_first = static_cast<int64_t>(blockIdx.x) * kTileTokens;
  const int64_t block_end = block_first + kTileTokens < a.tokens ? block_first + kTileTokens : a.tokens;
  constexpr int kPerLane = kTileDim / kWarp;
  for (int64_t run = block_first; run < block_end;) {
    const int64_t row = a.token_rows[run];
    int64_t run_end = run + 1;
    while (run_end < block_end && a.token_rows[run_end] == row) ++run_end;
    const int64_t count = run_end - run;
    int64_t lowest = 0, highest = -1;
    bool valid = row >= 0 && row < a.rows;
    for (int64_t n = 0; n < count; ++n) {
      const int64_t position = a.positions[run + n];
      valid = valid && TokenInRange(a, row, position);
      const int64_t first = a.window > 0 ? (position - a.window + 1 > 0 ? position - a.window + 1 : 0) : 0;
      lowest = n == 0 || first < lowest ? first : lowest;
      highest = position > highest ? position : highest;
    }
    float acc[kTileTokens][kPerLane] = {};
    float top[kTileTokens], total[kTileTokens];
    __syncthreads();  // the last run's readers of the queries are done
#pragma unroll
    for (int n = 0; n < kTileTokens; ++n) {
      total[n] = 1.0f;
      top[n] = ToFloat(static_cast<const T*>(a.sinks)[head]);
      if (n < count && valid) {
        const int64_t t = run + n, position = a.positions[t];
        const T* q = static_cast<const T*>(a.qkv) + t * (a.heads + 2 * a.kv_heads) * d + head * d;
        const T* cos = static_cast<const T*>(a.cos) + position * half;
        const T* sin = static_cast<const T*>(a.sin) + position * half;
        for (int64_t i = lane; i < half; i += kWarp) {
          const float x1 = ToFloat(q[i]), x2 = ToFloat(q[i + half]), c = ToFloat(cos[i]), s = ToFloat(sin[i]);
          queries[warp][n][i] = (x1 * c - x2 * s) * a.scale;
          queries[warp][n][i + half] = (x2 * c + x1 * s) * a.scale;
        }
      }
    }
    for (int64_t base = valid ? lowest : highest + 1; base <= highest; base += kTile) {
      __syncthreads();  // the queries written; the last tile's readers done
      for (int64_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
        const int64_t k = e / d, i = e % d, j = base + k;
        float key = 0.0f, value = 0.0f;
        if (j <= highest) {
          const int64_t at = (SlotOf(a, row, j) * a.kv_heads + h) * d + i;
          key = ToFloat(static_cast<const T*>(a.key_cache)[at]);
          value = ToFloat(static_cast<const T*>(a.value_cache)[at]);
        }
        keys[k][i] = key;
        values[k][i] = value;
      }
      __syncthreads();
#pragma unroll
      for (int n = 0; n < kTileTokens; ++n) {
        if (n < count) {
          const int64_t position = a.positions[run + n], j = base + lane;
          const int64_t first = a.window > 0 ? (position - a.window + 1 > 0 ? position - a.window + 1 : 0) : 0;
          float score = -FLT_MAX;
          if (j >= first && j <= position) {
            score = 0.0f;
            for (int64_t i = 0; i < d; ++i) score += queries[warp][n][i] * keys[lane][i];
          }
          weights[warp][n][lane] = score;
        }
      }
      __syncthreads();
#pragma unroll
      for (int n = 0; n < kTileTokens; ++n) {
        if (n < count) {
          float tile_top = top[n];
          for (int k = 0; k < kTile; ++k) tile_top = fmaxf(tile_top, weights[warp][n][k]);
          const float rescale = expf(top[n] - tile_top);
          total[n] *= rescale;
#pragma unroll
          for (int e = 0; e < kPerLane; ++e) acc[n][e] *= rescale;
          for (int k = 0; k < kTile; ++k) {
            const float w = weights[warp][n][k];
            if (w == -FLT_MAX) continue;
            const float p = expf(w - tile_top);
            total[n] += p;
#pragma unroll
            for (int e = 0; e < kPerLane; ++e) {
              if (lane + e * kWarp < d) acc[n][e] += p * values[k][lane + e * kWarp];
            }
          }
          top[n] = tile_top;
        }
      }
    }
#pragma unroll
    for (int n = 0; n < kTileTokens; ++n) {
      if (n < count) {
        T* out = static_cast<T*>(a.out) + (run + n) * a.heads * d + head * d;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          if (lane + e * kWarp < d) out[lane + e * kWarp] = FromFloat<T>(valid ? acc[n][e] / total[n] : 0.0f);
        }
      }
    }
    run = run_end;
  }
}

// ---- Tensor cores: 16-bit activations, gpt-oss's heads (a group of 8 query heads, 64 wide) ----
//
// A warp's 16 mma rows (cuda_mma.h's m16n8k16) are the group's 8 heads of up to two tokens (row g: the first
// token's head g, row g + 8: the second's), so one tile scores all of a KV head's queries against 8 keys. Keys are
// walked in tiles of kMmaKeys: each tile's keys ([key][dim]) and values (transposed, [dim][key]) go to shared
// memory once for every warp of the block, the next tile's loads in registers while this one's products run. A
// warp computes S = Q K^T over its keys of the tile (its queries rotated, scaled and rounded to T once), drops
// keys outside each token's window or past its position, moves each row's running maximum and sum (from the
// head's sink logit, as everywhere here), and adds P V, P rounded to T (the S fragments are P's A fragments as
// they lie), in float sums.
//
// AttendMma (rows running several tokens: prefill chunks): a block per (kMmaTokens consecutive tokens, KV head),
// a warp per two of them, every warp over the whole tile; it takes the block's tokens in runs of one row, as
// AttendTiles does, and a warp skips the tiles none of its tokens sees.
// DecodeMma (a token per row): a block per (token, KV head, key part), as Attend; its kDecodeWarps warps each
// take 16 keys of every tile (their own running maxima and sums, merged through shared memory at the end).
constexpr int kMmaTokens = 16;
constexpr int kMmaWarps = kMmaTokens / 2;
constexpr int kMmaThreads = kMmaWarps * kWarp;
constexpr int kMmaKeys = 64;
constexpr int kMmaGroup = 8;
constexpr int kMmaDim = 64;
constexpr int kMmaDimTiles = kMmaDim / 8;
constexpr int kMmaStride = kMmaDim + 8;  // padded: a B fragment's 8 rows x 4 words fall in 32 banks
constexpr int kDecodeWarps = kMmaKeys / 16;
constexpr int kDecodeThreads = kDecodeWarps * kWarp;

__device__ __forceinline__ int64_t Earliest(const AttentionArgs& a, int64_t position) {
  return a.window > 0 && position - a.window + 1 > 0 ? position - a.window + 1 : 0;
}

__device__ __forceinline__ uint32_t PairAt(const uint16_t* p) {  // two T at a 4-byte-aligned address
#ifdef GPTOSS_HOST_EMULATION
  uint32_t word;
  std::memcpy(&word, p, sizeof word);
  return word;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}

// A tile's keys as the cache holds them and its values transposed, in shared memory.
struct alignas(16) MmaTile {
  uint16_t keys[kMmaKeys][kMmaStride];
  uint16_t values[kMmaDim][kMmaStride];
};

// This thread's 16-byte pieces of a tile's keys and values (zeros past `highest`), the block's kThreads threads
// sharing them: keys by (key, 8 dims) with the dims fastest, so a warp reads whole key rows; values with the keys
// fastest, so that their transposed stores fall in distinct banks.
template <typename T, int kThreads>
struct MmaTileLoads {
  static constexpr int kPieces = kMmaKeys * kMmaDim / 8 / kThreads;  // each cache's, per thread
  uint4 keys[kPieces], values[kPieces];

  __device__ __forceinline__ void Fetch(const AttentionArgs& a, int64_t row, int64_t h, int64_t base,
                                        int64_t highest) {
    const uint4 zero = {0, 0, 0, 0};
#pragma unroll
    for (int c = 0; c < kPieces; ++c) {
      const int e = static_cast<int>(threadIdx.x) + c * kThreads;
      const int64_t key = base + e / (kMmaDim / 8), value = base + e % kMmaKeys;
      keys[c] = key <= highest ? Piece(a.key_cache, a, row, h, key, e % (kMmaDim / 8)) : zero;
      values[c] = value <= highest ? Piece(a.value_cache, a, row, h, value, e / kMmaKeys) : zero;
    }
  }

  __device__ __forceinline__ void Store(MmaTile& tile) const {
#pragma unroll
    for (int c = 0; c < kPieces; ++c) {
      const int e = static_cast<int>(threadIdx.x) + c * kThreads;
      const int key = e / (kMmaDim / 8), piece = e % (kMmaDim / 8);
#ifdef GPTOSS_HOST_EMULATION
      std::memcpy(&tile.keys[key][piece * 8], &keys[c], sizeof keys[c]);
#else
      *reinterpret_cast<uint4*>(&tile.keys[key][piece * 8]) = keys[c];
#endif
      const int value = e % kMmaKeys, dims = e / kMmaKeys * 8;
      const uint32_t words[4] = {values[c].x, values[c].y, values[c].z, values[c].w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        tile.values[dims + i][value] = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
      }
    }
  }

  // The tile from `base` into shared memory once every thread is done with the last one, then the next tile's
  // loads (if any up to `highest`) in flight while the block works on this one. Every thread calls it.
  __device__ __forceinline__ void Advance(MmaTile& tile, const AttentionArgs& a, int64_t row, int64_t h,
                                          int64_t base, int64_t highest) {
    __syncthreads();  // the last tile's readers are done
    Store(tile);
    __syncthreads();
    if (base + kMmaKeys <= highest) Fetch(a, row, h, base + kMmaKeys, highest);
  }

  static __device__ __forceinline__ uint4 Piece(const void* cache, const AttentionArgs& a, int64_t row, int64_t h,
                                                int64_t position, int piece) {
    const T* at = static_cast<const T*>(cache) + (SlotOf(a, row, position) * a.kv_heads + h) * kMmaDim + piece * 8;
    return *reinterpret_cast<const uint4*>(at);
  }
};

// A fragments of the warp's queries (16 rows x 64 dims, 4 K steps of 16 dims): row group r (0: rows g, 1: rows
// g + 8) is head `head` of token[r] at position[r], rotated and scaled; zeros where not live[r].
template <typename T>
__device__ __forceinline__ void QueryFragments(const AttentionArgs& a, const int64_t (&token)[2],
                                               const int64_t (&position)[2], const bool (&live)[2], int64_t head,
                                               int t, uint32_t (&queries)[4][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const T* q = static_cast<const T*>(a.qkv) + (live[r] ? token[r] : 0) * (a.heads + 2 * a.kv_heads) * kMmaDim +
                 head * kMmaDim;
    const int64_t at = live[r] ? position[r] : 0;
    const T* cos = static_cast<const T*>(a.cos) + at * (kMmaDim / 2);
    const T* sin = static_cast<const T*>(a.sin) + at * (kMmaDim / 2);
#pragma unroll
    for (int step = 0; step < 2; ++step) {  // dims below 32 (steps 0, 1) pair with those 32 above (2, 3)
#pragma unroll
      for (int upper = 0; upper < 2; ++upper) {  // K 2t, 2t + 1 (registers r) or 2t + 8, 2t + 9 (r + 2)
        float low[2], high[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 16 * step + 8 * upper + 2 * t + e;
          const float x1 = ToFloat(q[i]), x2 = ToFloat(q[i + kMmaDim / 2]), c = ToFloat(cos[i]), s = ToFloat(sin[i]);
          low[e] = live[r] ? (x1 * c - x2 * s) * a.scale : 0.0f;
          high[e] = live[r] ? (x2 * c + x1 * s) * a.scale : 0.0f;
        }
        queries[step][r + 2 * upper] = Pack<T>(low[0], low[1]);
        queries[step + 2][r + 2 * upper] = Pack<T>(high[0], high[1]);
      }
    }
  }
}

// S for the tile's keys from `key` (kKeyTiles tiles of 8).
template <typename T, int kKeyTiles>
__device__ __forceinline__ void TileScores(const uint32_t (&queries)[4][4], const MmaTile& tile, int key, int g,
                                           int t, float (&scores)[kKeyTiles][4]) {
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) scores[n][0] = scores[n][1] = scores[n][2] = scores[n][3] = 0.0f;
#pragma unroll
  for (int step = 0; step < kMmaDim / 16; ++step) {
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      const uint32_t b[2] = {PairAt(&tile.keys[key + 8 * n + g][16 * step + 2 * t]),
                             PairAt(&tile.keys[key + 8 * n + g][16 * step + 2 * t + 8])};
      Mma<T>(scores[n], queries[step], b);
    }
  }
}

// The online softmax over one tile's scores (position of S column c of tile n: first_key + 8 n + c): keys outside
// [first[r], last[r]] dropped, each row's running maximum `top` and this lane's part of its sum `total` moved
// (the sums rescaled), the scores turned into the weights P.
template <int kKeyTiles>
__device__ __forceinline__ void SoftmaxTile(int64_t first_key, const int64_t (&first)[2], const int64_t (&last)[2],
                                            int t, float (&scores)[kKeyTiles][4], float (&top)[2], float (&total)[2],
                                            float (&sums)[kMmaDimTiles][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float tile_top = top[r];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t j = first_key + 8 * n + 2 * t + e;
        float& score = scores[n][2 * r + e];
        score = j >= first[r] && j <= last[r] ? score : -FLT_MAX;
        tile_top = fmaxf(tile_top, score);
      }
    }
    tile_top = fmaxf(tile_top, __shfl_xor_sync(0xFFFFFFFFu, tile_top, 1));
    tile_top = fmaxf(tile_top, __shfl_xor_sync(0xFFFFFFFFu, tile_top, 2));
    const float rescale = expf(top[r] - tile_top);
    total[r] *= rescale;
#pragma unroll
    for (int n = 0; n < kMmaDimTiles; ++n) sums[n][2 * r] *= rescale, sums[n][2 * r + 1] *= rescale;
    top[r] = tile_top;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& score = scores[n][2 * r + e];
        score = score == -FLT_MAX ? 0.0f : expf(score - tile_top);
        total[r] += score;
      }
    }
  }
}

// sums += P V over the tile's keys from `key` (P: the weights of kKeyTiles S tiles; 16 keys a K step).
template <typename T, int kKeyTiles>
__device__ __forceinline__ void AddValues(const float (&weights)[kKeyTiles][4], const MmaTile& tile, int key, int g,
                                          int t, float (&sums)[kMmaDimTiles][4]) {
#pragma unroll
  for (int step = 0; step < kKeyTiles / 2; ++step) {  // S tiles 2 step and 2 step + 1
    const uint32_t p[4] = {Pack<T>(weights[2 * step][0], weights[2 * step][1]),
                           Pack<T>(weights[2 * step][2], weights[2 * step][3]),
                           Pack<T>(weights[2 * step + 1][0], weights[2 * step + 1][1]),
                           Pack<T>(weights[2 * step + 1][2], weights[2 * step + 1][3])};
#pragma unroll
    for (int n = 0; n < kMmaDimTiles; ++n) {
      const uint32_t b[2] = {PairAt(&tile.values[8 * n + g][key + 16 * step + 2 * t]),
                             PairAt(&tile.values[8 * n + g][key + 16 * step + 2 * t + 8])};
      Mma<T>(sums[n], p, b);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kMmaThreads) AttendMma(AttentionArgs a) {
  __shared__ MmaTile tile;
  const int64_t h = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t head = h * kMmaGroup + g;
  const int64_t block_first = static_cast<int64_t>(blockIdx.x) * kMmaTokens;
  const int64_t block_end = block_first + kMmaTokens < a.tokens ? block_first + kMmaTokens : a.tokens;
  const float sink = ToFloat(static_cast<const T*>(a.sinks)[head]);
  for (int64_t run = block_first; run < block_end;) {
    const int64_t row = a.token_rows[run];
    int64_t run_end = run + 1;
    while (run_end < block_end && a.token_rows[run_end] == row) ++run_end;
    int64_t lowest = 0, highest = -1;  // the keys any of the run's tokens sees
    for (int64_t n = run; n < run_end; ++n) {
      const int64_t position = a.positions[n];
      if (!TokenInRange(a, row, position)) continue;
      lowest = highest < 0 || Earliest(a, position) < lowest ? Earliest(a, position) : lowest;
      highest = position > highest ? position : highest;
    }
    // this warp's tokens (r = 0: rows g, r = 1: rows g + 8) where they are in the run, and what they see
    int64_t token[2], first[2], last[2];
    bool mine[2], live[2];
    int64_t warp_low = 0, warp_high = -1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      token[r] = block_first + 2 * warp + r;
      mine[r] = token[r] >= run && token[r] < run_end;
      const int64_t position = mine[r] ? a.positions[token[r]] : -1;
      live[r] = mine[r] && TokenInRange(a, row, position);
      first[r] = live[r] ? Earliest(a, position) : 0;
      last[r] = live[r] ? position : -1;
      if (live[r]) {
        warp_low = warp_high < 0 || first[r] < warp_low ? first[r] : warp_low;
        warp_high = last[r] > warp_high ? last[r] : warp_high;
      }
    }
    uint32_t queries[4][4];
    QueryFragments<T>(a, token, last, live, head, t, queries);
    float top[2] = {sink, sink}, total[2] = {t == 0 ? 1.0f : 0.0f, t == 0 ? 1.0f : 0.0f};  // lane partial sums
    float sums[kMmaDimTiles][4] = {};  // C fragments of the output (16 rows x 64 dims)
    MmaTileLoads<T, kMmaThreads> loads;
    if (lowest <= highest) loads.Fetch(a, row, h, lowest, highest);
    for (int64_t base = lowest; base <= highest; base += kMmaKeys) {
      loads.Advance(tile, a, row, h, base, highest);
      if (warp_high < base || warp_low > base + kMmaKeys - 1) continue;  // warp-uniform: no token sees the tile
      float scores[kMmaKeys / 8][4];
      TileScores<T, kMmaKeys / 8>(queries, tile, 0, g, t, scores);
      SoftmaxTile<kMmaKeys / 8>(base, first, last, t, scores, top, total, sums);
      AddValues<T, kMmaKeys / 8>(scores, tile, 0, g, t, sums);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      total[r] += __shfl_xor_sync(0xFFFFFFFFu, total[r], 1);
      total[r] += __shfl_xor_sync(0xFFFFFFFFu, total[r], 2);
      if (!mine[r]) continue;
      T* out = static_cast<T*>(a.out) + token[r] * a.heads * kMmaDim + head * kMmaDim;
#pragma unroll
      for (int n = 0; n < kMmaDimTiles; ++n) {
        out[8 * n + 2 * t] = FromFloat<T>(live[r] ? sums[n][2 * r] / total[r] : 0.0f);
        out[8 * n + 2 * t + 1] = FromFloat<T>(live[r] ? sums[n][2 * r + 1] / total[r] : 0.0f);
      }
    }
    run = run_end;
  }
}

template <typename T>
__global__ void __launch_bounds__(kDecodeThreads) DecodeMma(AttentionArgs a) {
  __shared__ MmaTile tile;
  __shared__ float merge_top[kDecodeWarps][kMmaGroup], merge_total[kDecodeWarps][kMmaGroup];
  __shared__ float merge_sums[kDecodeWarps][kMmaGroup][kMmaDim];
  const int64_t token = blockIdx.x, h = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t row = a.token_rows[token], position = a.positions[token];
  const int64_t splits = gridDim.z;
  if (!TokenInRange(a, row, position)) {  // nothing to attend to: zeros (MergeSplits leaves such a token alone)
    T* out = static_cast<T*>(a.out) + token * a.heads * kMmaDim + h * kMmaGroup * kMmaDim;
    for (int e = static_cast<int>(threadIdx.x); e < kMmaGroup * kMmaDim; e += kDecodeThreads) {
      out[e] = FromFloat<T>(0.0f);
    }
    return;
  }
  // this block's keys: as Attend's part (all of them when the token is not split)
  const int64_t earliest = Earliest(a, position);
  const int64_t even = (position - earliest + splits) / splits, least = SplitSpan(a);
  const int64_t span = even > least ? even : least;
  const int64_t first_key = earliest + static_cast<int64_t>(blockIdx.z) * span;
  const int64_t last_key = first_key + span - 1 < position ? first_key + span - 1 : position;
  const int64_t tokens[2] = {token, token}, positions[2] = {position, 0};
  const bool live[2] = {true, false};
  const int64_t first[2] = {first_key, 0}, last[2] = {last_key, -1};
  uint32_t queries[4][4];
  QueryFragments<T>(a, tokens, positions, live, h * kMmaGroup + g, t, queries);
  // the sink counted once: by the first warp's first lanes of an unsplit token (MergeSplits adds it to parts)
  const float sink = ToFloat(static_cast<const T*>(a.sinks)[h * kMmaGroup + g]);
  const float counted = splits == 1 && warp == 0 && t == 0 ? 1.0f : 0.0f;
  float top[2] = {sink, sink}, total[2] = {counted, 0.0f};
  float sums[kMmaDimTiles][4] = {};
  MmaTileLoads<T, kDecodeThreads> loads;
  if (first_key <= last_key) loads.Fetch(a, row, h, first_key, last_key);
  for (int64_t base = first_key; base <= last_key; base += kMmaKeys) {
    loads.Advance(tile, a, row, h, base, last_key);
    const int key = 16 * warp;
    if (base + key > last_key) continue;  // warp-uniform
    float scores[2][4];
    TileScores<T, 2>(queries, tile, key, g, t, scores);
    SoftmaxTile<2>(base + key, first, last, t, scores, top, total, sums);
    AddValues<T, 2>(scores, tile, key, g, t, sums);
  }
  total[0] += __shfl_xor_sync(0xFFFFFFFFu, total[0], 1);
  total[0] += __shfl_xor_sync(0xFFFFFFFFu, total[0], 2);
  if (t == 0) merge_top[warp][g] = top[0], merge_total[warp][g] = total[0];
#pragma unroll
  for (int n = 0; n < kMmaDimTiles; ++n) {  // row g's C entries: its head's dims 8n + 2t, 8n + 2t + 1
    merge_sums[warp][g][8 * n + 2 * t] = sums[n][0];
    merge_sums[warp][g][8 * n + 2 * t + 1] = sums[n][1];
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < kMmaGroup * kMmaDim; e += kDecodeThreads) {
    const int member = e / kMmaDim, dim = e % kMmaDim;
    float most = merge_top[0][member];
    for (int w = 1; w < kDecodeWarps; ++w) most = fmaxf(most, merge_top[w][member]);
    float sum = 0.0f, weight = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float scale = expf(merge_top[w][member] - most);
      sum += merge_sums[w][member][dim] * scale;
      weight += merge_total[w][member] * scale;
    }
    const int64_t head = h * kMmaGroup + member;
    if (splits == 1) {
      static_cast<T*>(a.out)[token * a.heads * kMmaDim + head * kMmaDim + dim] = FromFloat<T>(sum / weight);
      continue;
    }
    // this part's maximum, sum and weighted values, for MergeSplits (an empty part: its sink-started maximum, 0)
    float* part = a.parts + ((token * a.heads + head) * splits + blockIdx.z) * (kMmaDim + 2);
    part[dim] = sum;
    if (dim == 0) part[kMmaDim] = most, part[kMmaDim + 1] = weight;
  }
}

// Whether a step runs on the tensor cores (else AttendTiles for rows running several tokens, Attend for one).
bool UsesMma(const AttentionArgs& a) {
  return a.tensor_cores && a.dtype != Dtype::kFloat32 && a.heads / a.kv_heads == kMmaGroup && a.head_dim == kMmaDim;
}

// Key splits of a decode step's tokens (1: none): from the page tables' width (the longest context a row may
// have; a CUDA graph's tables are of full width), so the launch shape never depends on the device's data.
int64_t Splits(const AttentionArgs& a) {
  if (a.tokens > a.rows || a.split_keys <= 0) return 1;  // rows running several tokens: the tiled kernel
  const int64_t reach = a.table_width * a.page_size / a.split_keys;
  return reach < 1 ? 1 : reach > kMaxSplits ? kMaxSplits : reach;
}

template <typename T>
void Launch(const AttentionArgs& a, cudaStream_t stream) {
  GPTOSS_LAUNCH(WriteKv<T>, dim3(static_cast<unsigned>(a.tokens)), dim3(kWriteThreads), stream, a);
  const unsigned threads = static_cast<unsigned>(a.heads / a.kv_heads * kWarp);
  const bool runs = a.tokens > a.rows;  // some row runs several tokens: known from the shapes, nothing read back
  if constexpr (!std::is_same<T, float>::value) {  // 16-bit only
    if (runs && UsesMma(a)) {
      const unsigned blocks = static_cast<unsigned>((a.tokens + kMmaTokens - 1) / kMmaTokens);
      GPTOSS_LAUNCH(AttendMma<T>, dim3(blocks, static_cast<unsigned>(a.kv_heads)), dim3(kMmaThreads), stream, a);
      return;
    }
  }
  if (runs && a.heads / a.kv_heads <= kTileGroup && a.head_dim <= kTileDim) {
    const unsigned blocks = static_cast<unsigned>((a.tokens + kTileTokens - 1) / kTileTokens);
    GPTOSS_LAUNCH(AttendTiles<T>, dim3(blocks, static_cast<unsigned>(a.kv_heads)), dim3(threads), stream, a);
    return;
  }
  const int64_t splits = Splits(a);
  const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(splits));
  bool launched = false;
  if constexpr (!std::is_same<T, float>::value) {
    if (UsesMma(a)) {
      GPTOSS_LAUNCH(DecodeMma<T>, grid, dim3(kDecodeThreads), stream, a);
      launched = true;
    }
  }
  if (!launched) GPTOSS_LAUNCH(Attend<T>, grid, dim3(threads), stream, a);
  if (splits > 1) {
    GPTOSS_LAUNCH(MergeSplits<T>, dim3(static_cast<unsigned>(a.tokens), static_cast<unsigned>(a.heads)),
                  dim3(kWarp), stream, a, static_cast<int>(splits));
  }
}

}  // namespace

size_t AttentionWorkspaceBytes(const AttentionArgs& a) {
  const int64_t splits = Splits(a);
  return splits > 1 ? static_cast<size_t>(a.tokens * a.heads * splits * (a.head_dim + 2)) * sizeof(float) : 0;
}

const char* LaunchPagedAttention(const AttentionArgs& args, void* workspace, void* raw_stream) {
  AttentionArgs a = args;
  a.parts = static_cast<float*>(workspace);
  cudaStream_t stream = static_cast<cudaStream_t>(raw_stream);
  if (a.heads / a.kv_heads > kMaxGroup || a.head_dim > kMaxHeadDim || a.head_dim % 2) {
    return "more than 16 query heads per KV head, or a head size that is odd or over 128";
  }
  const size_t element = a.dtype == Dtype::kFloat32 ? 4 : 2;
  const size_t cache_bytes = static_cast<size_t>(a.cache_slots * a.kv_heads * a.head_dim) * element;
  if (a.key_cache != a.key_cache_in) {
    cudaMemcpyAsync(a.key_cache, a.key_cache_in, cache_bytes, cudaMemcpyDeviceToDevice, stream);
  }
  if (a.value_cache != a.value_cache_in) {
    cudaMemcpyAsync(a.value_cache, a.value_cache_in, cache_bytes, cudaMemcpyDeviceToDevice, stream);
  }
  if (a.tokens > 0) {
    switch (a.dtype) {
      case Dtype::kFloat32:
        Launch<float>(a, stream);
        break;
      case Dtype::kFloat16:
        Launch<Half>(a, stream);
        break;
      case Dtype::kBFloat16:
        Launch<BFloat>(a, stream);
        break;
    }
  }
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? nullptr : cudaGetErrorString(status);
}

}  // namespace gptoss
