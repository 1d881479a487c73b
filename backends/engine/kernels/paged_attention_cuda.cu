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
// Both run on ONNX Runtime's stream, in order, with nothing read back: a step replays as a CUDA graph whatever
// its page tables hold (they are device buffers).
//
// The file is also compiled as host C++ with a warp-emulation shim (tests/kernel_emulation), so it keeps to
// threadIdx/blockIdx, __syncthreads and GPTOSS_LAUNCH.

#include <cfloat>
#include <cmath>

#include "cuda_launch.h"
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
  if (runs && a.heads / a.kv_heads <= kTileGroup && a.head_dim <= kTileDim) {
    const unsigned blocks = static_cast<unsigned>((a.tokens + kTileTokens - 1) / kTileTokens);
    GPTOSS_LAUNCH(AttendTiles<T>, dim3(blocks, static_cast<unsigned>(a.kv_heads)), dim3(threads), stream, a);
    return;
  }
  const int64_t splits = Splits(a);
  const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(splits));
  GPTOSS_LAUNCH(Attend<T>, grid, dim3(threads), stream, a);
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
