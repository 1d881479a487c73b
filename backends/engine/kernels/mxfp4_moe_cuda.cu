// gptoss.engine::MXFP4MoE on the CUDA execution provider, in the activation dtype (float, fp16, bf16):
//
// 1. Route (one block; a step of more than 32 tokens across the GPU in three kernels): each token's top-k
//    experts, softmax over those k logits, and the step's tokens grouped by expert (per-expert offsets into one
//    list of (token, choice) indices).
// 2. Fc1 / Fc2: a block per (routed expert, 8 output rows), a warp per row (a gate/linear pair for fc1).
//    Each lane loads whole MXFP4 blocks (16 code bytes, one scale), several before it uses any, decodes
//    them in registers and uses them for up to kChunk of the expert's tokens, so an expert's weights are
//    read from memory once per step for its first kChunk tokens (from the cache for the next ones).
// 3. Combine: y[t] = the routing-weighted sum of its k choices, in choice order (deterministic).
// A one-token step (batch-1 decode) runs two kernels instead of four: each fc1 block routes the token itself,
// and fc2's blocks combine their rows' k choices in shared memory, with the same arithmetic.
//
// A step of many tokens (a prefill: gemm_min_tokens or more) in 16-bit activations runs steps 2 and 3 as GEMMs
// on tensor cores instead, where cuBLAS loads: the choices' tokens gathered in expert order, then per routed
// expert its MXFP4 rows decoded once into a 16-bit matrix (exact: an E2M1 value times a power of two) and
// multiplied with its tokens (float32 accumulation), swiglu between fc1 and fc2, and the same combine.
//
// The file is also compiled as host C++ with a warp-emulation shim (tests/kernel_emulation), so it keeps
// to threadIdx/blockIdx, __shfl_down_sync, __syncthreads, atomicAdd and GPTOSS_LAUNCH.

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <type_traits>
#include <vector>
#ifndef GPTOSS_HOST_EMULATION
#include <dlfcn.h>
#endif

#include "cuda_launch.h"
#include "cuda_mma.h"
#include "cuda_numbers.h"
#include "mxfp4_moe_launch.h"

namespace gptoss {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kBlock = 32;       // MXFP4 values per scale
constexpr int kChunk = 8;        // tokens sharing one decoded weight block (steps of more than one token)
constexpr int kRouteThreads = 1024;  // a warp per token, 32 at a time
// Fc1/Fc2 blocks resident per SM (the register budget follows): enough warps to keep the loads in flight;
// the one-token kernels hold no chunk of tokens in registers, so more of them fit.
constexpr int kChunkMinBlocks = 2;
constexpr int kTokenMinBlocks = 3;


// E2M1 code (sign in bit 3) as a float, built from its bits: no table.
__device__ __forceinline__ float E2M1(uint32_t code) {
  const uint32_t magnitude = code & 7u, exponent = magnitude >> 1, mantissa = magnitude & 1u;
  const uint32_t bits = exponent ? ((exponent + 126u) << 23) | (mantissa << 22) : (mantissa ? 0x3F000000u : 0u);
  return __uint_as_float(bits | ((code & 8u) << 28));
}

// E8M0 exponent as a float: 2^(e - 127).
__device__ __forceinline__ float E8M0(uint8_t e) { return __uint_as_float(e ? static_cast<uint32_t>(e) << 23 : 0x00400000u); }

__device__ __forceinline__ float WarpSum(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  return value;
}

// gpt-oss's swiglu of one gate/linear pair's fc1 outputs (biases included), each clamped at the limit.
__device__ __forceinline__ float Swiglu(const MoeArgs& a, float gate, float linear) {
  const float g = fminf(gate, a.limit);
  const float l = fmaxf(fminf(linear, a.limit), -a.limit);
  return g / (1.0f + expf(-a.alpha * g)) * (l + 1.0f);
}

// A warp walks a row one MXFP4 block per lane at a time: 16 code bytes (one uint4, 32 values) and their E8M0
// scale, so that each lane's loads are 16 bytes wide and the warp's 512 bytes contiguous. A lane loads its
// kRound blocks of a row before it uses any of them, so that they are in flight together (gpt-oss's rows of
// 2,880 values are 90 blocks: three rounds of the warp's 32 lanes, all loaded at once); the activations
// (8 values at a time, one or two 16-byte loads) come from the caches, shared by every row.
constexpr int kLaneValues = 8;
constexpr int kBlockBytes = kBlock / 2;
constexpr int kRound = 3;

__device__ __forceinline__ void Codes8(uint32_t word, float* out) {
#pragma unroll
  for (int j = 0; j < kLaneValues; ++j) out[j] = E2M1((word >> (4 * j)) & 0xFu);  // low nibble first
}

__device__ __forceinline__ uint32_t Word(const uint4& codes, int i) {
  return i == 0 ? codes.x : i == 1 ? codes.y : i == 2 ? codes.z : codes.w;
}

__device__ __forceinline__ void Load8(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

template <typename T>
__device__ __forceinline__ void Load8(const T* p, float* out) {  // 16-bit: one 16-byte load
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = ToFloat(T{static_cast<uint16_t>(words[i] & 0xFFFFu)});
    out[2 * i + 1] = ToFloat(T{static_cast<uint16_t>(words[i] >> 16)});
  }
}

__device__ __forceinline__ float Dot8(const float* a, const float* b) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kLaneValues; ++j) sum += a[j] * b[j];
  return sum;
}

// One round of a row: the lane's blocks `base + r * kWarp + lane` (r < kRound) of `rows` rows sharing the
// same columns (fc1's gate and linear rows; fc2's one row), codes and scales loaded before any is used;
// false for a block past the row's end.
template <int kRows>
struct Round {
  uint4 codes[kRows][kRound];
  float scales[kRows][kRound];
  bool present[kRound];

  __device__ __forceinline__ Round(const uint8_t* const* rows, const uint8_t* const* row_scales, int64_t groups,
                                   int64_t base, int lane) {
#pragma unroll
    for (int r = 0; r < kRound; ++r) {
      const int64_t block = base + r * kWarp + lane;
      present[r] = block < groups;
#pragma unroll
      for (int w = 0; w < kRows; ++w) {
        codes[w][r] = present[r] ? *reinterpret_cast<const uint4*>(rows[w] + block * kBlockBytes) : uint4{0, 0, 0, 0};
        scales[w][r] = present[r] ? E8M0(row_scales[w][block]) : 0.0f;
      }
    }
  }
};

// The step's routing, and its tokens grouped by expert (all device pointers into the workspace).
struct Plan {
  int* chosen;       // [T*k] expert of each (token, choice)
  float* weights;    // [T*k] its routing weight
  int* list;         // [T*k] (token, choice) indices grouped by expert
  int* offsets;      // [E+1] each expert's start in `list`
  int* active;       // [E] experts with tokens, ascending
  int* active_count; // [1]
  int* position;     // [T*k] each choice's place in `list`
  float* activated;  // [T*k, I] swiglu(fc1) per choice (CUDA-core path; the tiles keep it in T)
  float* partial;    // [T*k, H] fc2 + bias per choice (CUDA-core path and unsplit tiles)
  float* split_sums; // [S, T*k, max(2I, H)] the tiles' sums of each part of K, when a step splits K in S > 1
  int* cursor;       // [E] the wide routing's counts, then each expert's next place in `list`
};

// The GEMM path's scratch; rows in `list` order (grouped by expert).
struct GemmScratch {
  void* gathered;   // [T*k, H] 16-bit: each choice's token
  float* fc1;       // [T*k, 2I] W1 x
  void* activated;  // [T*k, I] 16-bit: swiglu(fc1 + b1)
  float* fc2;       // [T*k, H] W2 activated
  void* decoded;    // one expert's W1 [2I, H] or W2 [H, I], 16-bit
};

// One token's top-k experts of its router logits `row` (ties: the lower index first), in order, and their
// routing weights: the softmax over those k logits.
template <typename Logit>
__device__ __forceinline__ void TopK(const Logit* row, int64_t experts, int64_t k, int* picked, float* weights) {
  float values[kMaxTopK];
  for (int64_t j = 0; j < k; ++j) {
    int best = -1;
    float best_value = -FLT_MAX;
    for (int64_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= picked[i] == e;
      const float value = ToFloat(row[e]);
      if (!taken && (best < 0 || value > best_value)) {
        best = static_cast<int>(e);
        best_value = value;
      }
    }
    picked[j] = best;
    values[j] = best_value;
  }
  float total = 0.0f;
  for (int64_t j = 0; j < k; ++j) total += weights[j] = expf(values[j] - values[0]);
  for (int64_t j = 0; j < k; ++j) weights[j] /= total;
}

// (value, index) before (other, other_index) in the routing's order: a real index first, then the larger value,
// then the lower index (TopK's order).
__device__ __forceinline__ bool RoutesBefore(float value, int index, float other, int other_index) {
  if (other_index < 0) return index >= 0;
  return index >= 0 && (value > other || (value == other && index < other_index));
}

// One token's top-k experts by a warp (the same picks and weights as TopK): k rounds of a warp argmax over the
// experts not yet picked, each round's pick shared through `shared` ([kMaxTopK], the warp's own).
template <typename Logit>
__device__ __forceinline__ void WarpTopK(const Logit* row, int64_t experts, int64_t k, int lane, int* shared,
                                         int* picked, float* weights) {
  float values[kMaxTopK];
  for (int64_t j = 0; j < k; ++j) {
    float best = -FLT_MAX;
    int best_index = -1;
    for (int64_t e = lane; e < experts; e += kWarp) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= picked[i] == e;
      const float value = ToFloat(row[e]);
      if (!taken && RoutesBefore(value, static_cast<int>(e), best, best_index)) {
        best = value;
        best_index = static_cast<int>(e);
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float value = __shfl_down_sync(0xffffffffu, best, offset);
      const int index = __shfl_down_sync(0xffffffffu, best_index, offset);
      if (RoutesBefore(value, index, best, best_index)) best = value, best_index = index;
    }
    if (lane == 0) shared[j] = best_index;
    __syncwarp();
    picked[j] = shared[j];
    values[j] = ToFloat(row[picked[j]]);
    __syncwarp();
  }
  float total = 0.0f;
  for (int64_t j = 0; j < k; ++j) total += weights[j] = expf(values[j] - values[0]);
  for (int64_t j = 0; j < k; ++j) weights[j] /= total;
}

// The step's routing in one block: a warp per token picks its top k, then the choices grouped by expert.
template <typename T>
__global__ void __launch_bounds__(kRouteThreads) Route(MoeArgs a, Plan plan) {
  __shared__ int counts[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ int picks[kRouteThreads / kWarp][kMaxTopK];
  const T* logits = static_cast<const T*>(a.logits);
  for (int64_t e = threadIdx.x; e < a.experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int64_t t = warp; t < a.tokens; t += warps) {
    int picked[kMaxTopK];
    float weights[kMaxTopK];
    WarpTopK(logits + t * a.experts, a.experts, a.k, lane, picks[warp], picked, weights);
    if (lane == 0) {
      for (int64_t j = 0; j < a.k; ++j) {
        plan.chosen[t * a.k + j] = picked[j];
        plan.weights[t * a.k + j] = weights[j];
        atomicAdd(&counts[picked[j]], 1);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int running = 0, active = 0;
    for (int64_t e = 0; e < a.experts; ++e) {
      plan.offsets[e] = running;
      cursor[e] = running;
      if (counts[e]) plan.active[active++] = static_cast<int>(e);
      running += counts[e];
    }
    plan.offsets[a.experts] = running;
    *plan.active_count = active;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < a.tokens * a.k; c += blockDim.x) {
    const int slot = atomicAdd(&cursor[plan.chosen[c]], 1);
    plan.list[slot] = static_cast<int>(c);
    plan.position[c] = slot;
  }
}

// A step of more tokens than Route's block takes at once, routed across the GPU in three kernels: RouteTokens (a
// warp per token, as Route's) picks each token's top k and counts them per expert in `cursor` (zeroed first), one
// thread of RoutePlan turns the counts into the experts' offsets, and RoutePlace puts each choice in its expert's
// range of the list (in no particular order within it, as Route's shared counters do).
constexpr int kRouteWideWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kRouteWideWarps * kWarp) RouteTokens(MoeArgs a, Plan plan) {
  __shared__ int picks[kRouteWideWarps][kMaxTopK];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWideWarps + warp;
  if (t >= a.tokens) return;  // the whole warp: WarpTopK's barriers are the warp's
  int picked[kMaxTopK];
  float weights[kMaxTopK];
  WarpTopK(static_cast<const T*>(a.logits) + t * a.experts, a.experts, a.k, lane, picks[warp], picked, weights);
  if (lane == 0) {
    for (int64_t j = 0; j < a.k; ++j) {
      plan.chosen[t * a.k + j] = picked[j];
      plan.weights[t * a.k + j] = weights[j];
      atomicAdd(&plan.cursor[picked[j]], 1);
    }
  }
}

__global__ void RoutePlan(MoeArgs a, Plan plan) {
  if (threadIdx.x != 0) return;
  int running = 0, active = 0;
  for (int64_t e = 0; e < a.experts; ++e) {
    const int count = plan.cursor[e];
    plan.offsets[e] = running;
    plan.cursor[e] = running;
    if (count) plan.active[active++] = static_cast<int>(e);
    running += count;
  }
  plan.offsets[a.experts] = running;
  *plan.active_count = active;
}

__global__ void RoutePlace(MoeArgs a, Plan plan) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= a.tokens * a.k) return;
  const int slot = atomicAdd(&plan.cursor[plan.chosen[c]], 1);
  plan.list[slot] = static_cast<int>(c);
  plan.position[c] = slot;
}

// The step's routing: in Route's one block while its warps take every token at once, else across the GPU.
template <typename T>
void LaunchRoute(const MoeArgs& a, const Plan& plan, cudaStream_t stream) {
  if (a.tokens <= kRouteThreads / kWarp) {
    auto* route = &Route<T>;
    GPTOSS_LAUNCH(route, dim3(1), dim3(kRouteThreads), stream, a, plan);
    return;
  }
  cudaMemsetAsync(plan.cursor, 0, static_cast<size_t>(a.experts) * sizeof(int), stream);
  auto* tokens = &RouteTokens<T>;
  auto* counts = &RoutePlan;
  auto* place = &RoutePlace;
  const unsigned blocks = static_cast<unsigned>((a.tokens + kRouteWideWarps - 1) / kRouteWideWarps);
  GPTOSS_LAUNCH(tokens, dim3(blocks), dim3(kRouteWideWarps * kWarp), stream, a, plan);
  GPTOSS_LAUNCH(counts, dim3(1), dim3(kWarp), stream, a, plan);
  const unsigned place_blocks = static_cast<unsigned>((a.tokens * a.k + 255) / 256);
  GPTOSS_LAUNCH(place, dim3(place_blocks), dim3(256), stream, a, plan);
}

// The block's routed expert and its range [first, last) in the plan's list; false when the block has none.
__device__ __forceinline__ bool ExpertRange(const Plan& plan, int* expert, int* first, int* last) {
  if (static_cast<int>(blockIdx.x) >= *plan.active_count) return false;
  *expert = plan.active[blockIdx.x];
  *first = plan.offsets[*expert];
  *last = plan.offsets[*expert + 1];
  return true;
}

// Up to C (token, choice) indices of the list from `from` (padded with 0); how many there are.
template <int C>
__device__ __forceinline__ int LoadChunk(const Plan& plan, int from, int last, int* choices) {
  const int n = last - from < C ? last - from : C;
  for (int t = 0; t < C; ++t) choices[t] = t < n ? plan.list[from + t] : 0;
  return n;
}

// sums[w][t] = row w · inputs[t] (t < n), whole rows: the lane's part, then the warp's sum in every lane.
template <int kRows, int C, typename In>
__device__ __forceinline__ void RowDots(const uint8_t* const* rows, const uint8_t* const* row_scales, int64_t groups,
                                        const In* const* inputs, int n, int lane, float (&sums)[kRows][C]) {
#pragma unroll
  for (int w = 0; w < kRows; ++w)
#pragma unroll
    for (int t = 0; t < C; ++t) sums[w][t] = 0.0f;
  for (int64_t base = 0; base < groups; base += kWarp * kRound) {
    const Round<kRows> round(rows, row_scales, groups, base, lane);
#pragma unroll
    for (int r = 0; r < kRound; ++r) {
      if (!round.present[r]) continue;
      const int64_t column = (base + r * kWarp + lane) * kBlock;
      float block_sums[kRows][C];
#pragma unroll
      for (int w = 0; w < kRows; ++w)
#pragma unroll
        for (int t = 0; t < C; ++t) block_sums[w][t] = 0.0f;
#pragma unroll
      for (int i = 0; i < kBlock / kLaneValues; ++i) {
        float weights[kRows][kLaneValues];
#pragma unroll
        for (int w = 0; w < kRows; ++w) Codes8(Word(round.codes[w][r], i), weights[w]);
#pragma unroll
        for (int t = 0; t < C; ++t) {
          if (t < n) {
            float v[kLaneValues];
            Load8(inputs[t] + column + i * kLaneValues, v);
#pragma unroll
            for (int w = 0; w < kRows; ++w) block_sums[w][t] += Dot8(weights[w], v);
          }
        }
      }
#pragma unroll
      for (int w = 0; w < kRows; ++w)
#pragma unroll
        for (int t = 0; t < C; ++t) sums[w][t] += round.scales[w][r] * block_sums[w][t];
    }
  }
#pragma unroll
  for (int t = 0; t < C; ++t) {
    if (t < n) {  // n is the same in every lane of the warp
#pragma unroll
      for (int w = 0; w < kRows; ++w) sums[w][t] = WarpSum(sums[w][t]);
    }
  }
}

// A warp per gate/linear row pair of one routed expert: activated[c] = swiglu(W1 x + b1) per choice c,
// kChunk of the expert's choices at a time.
template <typename T>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock, kChunkMinBlocks) Fc1(MoeArgs a, Plan plan) {
  const int lane = threadIdx.x % kWarp;
  const int64_t pair = blockIdx.y * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  int expert, first, last;
  if (pair >= a.inter || !ExpertRange(plan, &expert, &first, &last)) return;
  const int64_t gate_row = expert * 2 * a.inter + 2 * pair, lin_row = gate_row + 1;
  const int64_t bytes = a.hidden / 2, groups = a.hidden / kBlock;
  const uint8_t* rows[2] = {a.w1 + gate_row * bytes, a.w1 + lin_row * bytes};
  const uint8_t* row_scales[2] = {a.s1 + gate_row * groups, a.s1 + lin_row * groups};
  const T* x = static_cast<const T*>(a.x);
  const T* b1 = static_cast<const T*>(a.b1);
  const float gate_bias = ToFloat(b1[gate_row]), lin_bias = ToFloat(b1[lin_row]);
  for (int start = first; start < last; start += kChunk) {
    int choices[kChunk];
    const int n = LoadChunk<kChunk>(plan, start, last, choices);
    const T* inputs[kChunk];  // each token's activations (the division by k kept out of the inner loop)
    for (int t = 0; t < kChunk; ++t) {
      inputs[t] = x + static_cast<int64_t>(choices[t] / static_cast<int>(a.k)) * a.hidden;
    }
    float sums[2][kChunk];
    RowDots<2>(rows, row_scales, groups, inputs, n, lane, sums);
    if (lane == 0) {
      for (int t = 0; t < n; ++t) {
        plan.activated[choices[t] * a.inter + pair] = Swiglu(a, sums[0][t] + gate_bias, sums[1][t] + lin_bias);
      }
    }
  }
}

// A warp per output row of one routed expert: partial[c] = W2 activated[c] + b2 per choice c.
template <typename T>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock, kChunkMinBlocks) Fc2(MoeArgs a, Plan plan) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = blockIdx.y * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  int expert, first, last;
  if (row >= a.hidden || !ExpertRange(plan, &expert, &first, &last)) return;
  const int64_t flat = expert * a.hidden + row, bytes = a.inter / 2, groups = a.inter / kBlock;
  const uint8_t* rows[1] = {a.w2 + flat * bytes};
  const uint8_t* row_scales[1] = {a.s2 + flat * groups};
  const float bias = ToFloat(static_cast<const T*>(a.b2)[flat]);
  for (int start = first; start < last; start += kChunk) {
    int choices[kChunk];
    const int n = LoadChunk<kChunk>(plan, start, last, choices);
    const float* inputs[kChunk];
    for (int t = 0; t < kChunk; ++t) inputs[t] = plan.activated + static_cast<int64_t>(choices[t]) * a.inter;
    float sums[1][kChunk];
    RowDots<1>(rows, row_scales, groups, inputs, n, lane, sums);
    if (lane == 0) {
      for (int t = 0; t < n; ++t) plan.partial[choices[t] * a.hidden + row] = sums[0][t] + bias;
    }
  }
}

// y[t, column] for a thread per output value: the routing-weighted sum of its k choices' values there
// (`value(choice, column)`: fc2's output plus its expert's bias), in choice order (deterministic).
template <typename T, typename Value>
__device__ __forceinline__ void CombineChoices(const MoeArgs& a, const Plan& plan, Value value) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= a.tokens * a.hidden) return;
  const int64_t token = index / a.hidden, column = index % a.hidden;
  float sum = 0.0f;
  for (int64_t j = 0; j < a.k; ++j) {
    const int64_t choice = token * a.k + j;
    sum += plan.weights[choice] * value(choice, column);
  }
  static_cast<T*>(a.y)[index] = FromFloat<T>(sum);
}

// The expert's bias of `choice` at output row `column`.
template <typename T>
__device__ __forceinline__ float Fc2Bias(const MoeArgs& a, const Plan& plan, int64_t choice, int64_t column) {
  return ToFloat(static_cast<const T*>(a.b2)[plan.chosen[choice] * a.hidden + column]);
}

template <typename T>
__global__ void Combine(MoeArgs a, Plan plan) {
  CombineChoices<T>(a, plan, [&](int64_t choice, int64_t column) { return plan.partial[choice * a.hidden + column]; });
}

// ---- One token (batch-1 decode): routing fused into fc1 and the combine into fc2, two kernels in all ----

// Fc1 for a one-token step: block (choice j, 8 gate/linear pairs). Each block routes the token itself (its
// logits staged in shared memory, thread 0 picks the top k as Route does) and works on its j-th expert; the
// blocks of the first pairs record the routing for Fc2Token.
template <typename T>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock, kTokenMinBlocks) Fc1Token(MoeArgs a, Plan plan) {
  __shared__ float logits[kMaxExperts];
  __shared__ int picked[kMaxTopK];
  __shared__ float weights[kMaxTopK];
  const T* row = static_cast<const T*>(a.logits);
  for (int64_t e = threadIdx.x; e < a.experts; e += blockDim.x) logits[e] = ToFloat(row[e]);
  __syncthreads();
  if (threadIdx.x == 0) {
    TopK(logits, a.experts, a.k, picked, weights);
    if (blockIdx.y == 0) {
      plan.chosen[blockIdx.x] = picked[blockIdx.x];
      plan.weights[blockIdx.x] = weights[blockIdx.x];
    }
  }
  __syncthreads();
  const int lane = threadIdx.x % kWarp;
  const int64_t pair = blockIdx.y * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (pair >= a.inter) return;
  const int64_t choice = blockIdx.x, expert = picked[choice];
  const int64_t gate_row = expert * 2 * a.inter + 2 * pair, lin_row = gate_row + 1;
  const int64_t bytes = a.hidden / 2, groups = a.hidden / kBlock;
  const uint8_t* rows[2] = {a.w1 + gate_row * bytes, a.w1 + lin_row * bytes};
  const uint8_t* row_scales[2] = {a.s1 + gate_row * groups, a.s1 + lin_row * groups};
  const T* b1 = static_cast<const T*>(a.b1);
  const T* inputs[1] = {static_cast<const T*>(a.x)};
  float sums[2][1];
  RowDots<2>(rows, row_scales, groups, inputs, 1, lane, sums);
  if (lane == 0) {
    plan.activated[choice * a.inter + pair] =
        Swiglu(a, sums[0][0] + ToFloat(b1[gate_row]), sums[1][0] + ToFloat(b1[lin_row]));
  }
}

// Fc2 and the combine for a one-token step: a block of 8 warps holds 8 / k output rows, a warp per (row,
// choice); each warp's W2 row · activated + bias goes to shared memory, and the row's first warp sums its k
// choices in choice order with their routing weights (Combine's arithmetic, without its kernel).
template <typename T>
__global__ void __launch_bounds__(kWarp * kWarpsPerBlock, kTokenMinBlocks) Fc2Token(MoeArgs a, Plan plan) {
  __shared__ float partial[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int k = static_cast<int>(a.k), rows_per_block = kWarpsPerBlock / k;
  const int local_row = warp / k, choice = warp % k;
  const int64_t row = blockIdx.x * static_cast<int64_t>(rows_per_block) + local_row;
  const bool working = local_row < rows_per_block && row < a.hidden;
  if (working) {
    const int64_t expert = plan.chosen[choice];
    const int64_t flat = expert * a.hidden + row, bytes = a.inter / 2, groups = a.inter / kBlock;
    const uint8_t* rows[1] = {a.w2 + flat * bytes};
    const uint8_t* row_scales[1] = {a.s2 + flat * groups};
    const float* inputs[1] = {plan.activated + choice * a.inter};
    float sums[1][1];
    RowDots<1>(rows, row_scales, groups, inputs, 1, lane, sums);
    if (lane == 0) partial[warp] = sums[0][0] + ToFloat(static_cast<const T*>(a.b2)[flat]);
  }
  __syncthreads();
  if (working && choice == 0 && lane == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += plan.weights[j] * partial[local_row * k + j];
    static_cast<T*>(a.y)[row] = FromFloat<T>(sum);
  }
}

// ---- The GEMM path (prefill) ----

// gathered[i] = the token of choice list[i]: a thread per 8 values (one 16-byte load and store).
template <typename T>
__global__ void Gather(MoeArgs a, Plan plan, T* gathered) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t per_row = a.hidden / kLaneValues;
  if (index >= a.tokens * a.k * per_row) return;
  const int64_t row = index / per_row, part = index % per_row;
  const int64_t token = plan.list[row] / a.k;
  const uint4* source = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + token * a.hidden);
  reinterpret_cast<uint4*>(gathered + row * a.hidden)[part] = source[part];
}

// out [rows, columns] = the MXFP4 matrix (codes, scales) in T: a thread per block of 32 values.
template <typename T>
__global__ void Decode(const uint8_t* codes, const uint8_t* scales, int64_t blocks, T* out) {
  const int64_t block = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (block >= blocks) return;
  const uint4 v = reinterpret_cast<const uint4*>(codes)[block];
  const float scale = E8M0(scales[block]);
  uint4* target = reinterpret_cast<uint4*>(out + block * kBlock);
#pragma unroll
  for (int i = 0; i < kBlock / kLaneValues; ++i) {
    float values[kLaneValues];
    Codes8(Word(v, i), values);
    uint32_t words[kLaneValues / 2];
#pragma unroll
    for (int j = 0; j < kLaneValues / 2; ++j) {
      words[j] = static_cast<uint32_t>(FromFloat<T>(values[2 * j] * scale).bits) |
                 static_cast<uint32_t>(FromFloat<T>(values[2 * j + 1] * scale).bits) << 16;
    }
    target[i] = uint4{words[0], words[1], words[2], words[3]};
  }
}

// activated[i, p] = swiglu of fc1 row i's gate/linear pair p plus its expert's biases (as Fc1 computes it).
template <typename T>
__global__ void Activate(MoeArgs a, Plan plan, GemmScratch s) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= a.tokens * a.k * a.inter) return;
  const int64_t row = index / a.inter, pair = index % a.inter;
  const int64_t expert = plan.chosen[plan.list[row]];
  const T* b1 = static_cast<const T*>(a.b1) + expert * 2 * a.inter;
  const float* sums = s.fc1 + row * 2 * a.inter;
  static_cast<T*>(s.activated)[index] =
      FromFloat<T>(Swiglu(a, sums[2 * pair] + ToFloat(b1[2 * pair]), sums[2 * pair + 1] + ToFloat(b1[2 * pair + 1])));
}

// y[t] = the routing-weighted sum of its choices' fc2 rows plus their experts' biases, in choice order.
template <typename T>
__global__ void CombineRows(MoeArgs a, Plan plan, GemmScratch s) {
  CombineChoices<T>(a, plan, [&](int64_t choice, int64_t column) {
    return s.fc2[plan.position[choice] * a.hidden + column] + Fc2Bias<T>(a, plan, choice, column);
  });
}

// cuBLAS, loaded at run time (no link-time dependency; the CUDA execution provider has it in the process).
// Its C ABI for the three calls used; enums are ints.
using CublasCreate = int (*)(void** handle);
using CublasSetStream = int (*)(void* handle, cudaStream_t stream);
using CublasGemmEx = int (*)(void* handle, int transa, int transb, int m, int n, int k, const void* alpha,
                             const void* A, int a_type, int lda, const void* B, int b_type, int ldb, const void* beta,
                             void* C, int c_type, int ldc, int compute_type, int algo);
constexpr int kOpN = 0, kOpT = 1, kR32F = 0, kR16F = 2, kR16BF = 14, kCompute32F = 68, kGemmDefault = -1;

struct Cublas {
  CublasCreate create;
  CublasSetStream set_stream;
  CublasGemmEx gemm;
};

#ifdef GPTOSS_HOST_EMULATION
const Cublas* LoadCublas() {
  static const Cublas functions{emulation::CublasCreate, emulation::CublasSetStream, emulation::CublasGemmEx};
  return &functions;
}
#else
const Cublas* LoadCublas() {
  static const Cublas* loaded = []() -> const Cublas* {
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (!library) continue;
      const Cublas functions{reinterpret_cast<CublasCreate>(dlsym(library, "cublasCreate_v2")),
                             reinterpret_cast<CublasSetStream>(dlsym(library, "cublasSetStream_v2")),
                             reinterpret_cast<CublasGemmEx>(dlsym(library, "cublasGemmEx"))};
      if (functions.create && functions.set_stream && functions.gemm) return new Cublas(functions);
    }
    return nullptr;
  }();
  return loaded;
}
#endif

// A cuBLAS handle per device, made on first use; its mutex keeps one caller's stream and GEMMs together.
struct Handle {
  void* handle = nullptr;
  std::mutex mutex;
};

Handle* DeviceHandle(const Cublas& cublas) {
  static std::mutex guard;
  static std::vector<Handle*> handles;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return nullptr;
  std::lock_guard<std::mutex> lock(guard);
  if (static_cast<size_t>(device) >= handles.size()) handles.resize(device + 1, nullptr);
  if (!handles[device]) {
    auto* made = new Handle();
    if (cublas.create(&made->handle) != 0) {
      delete made;
      return nullptr;
    }
    handles[device] = made;
  }
  return handles[device];
}

bool UsesGemms(const MoeArgs& a) {
  return a.dtype != Dtype::kFloat32 && a.gemm_min_tokens > 0 && a.tokens >= a.gemm_min_tokens &&
         LoadCublas() != nullptr;
}

bool UsesMma(const MoeArgs& a) {
  return a.dtype != Dtype::kFloat32 && a.mma_min_tokens > 0 && a.tokens >= a.mma_min_tokens;
}

// Parts of K a tile step splits into (1: none). A step of few choices (batch-1 and -2 decode: 4 to 8 routed
// experts) has too few blocks of output rows to keep enough weight bytes in flight; each part's blocks then
// read a quarter of each row, and their sums are added in part order after (deterministic).
constexpr int64_t kSplitChoices = 8;
constexpr int64_t kMmaSplits = 4;

int64_t MmaSplits(const MoeArgs& a) {
  if (!UsesMma(a) || UsesGemms(a)) return 1;
  if (a.mma_splits > 0) return a.mma_splits;  // a tuned variant's (moe_variants.h)
  return a.tokens * a.k <= kSplitChoices ? kMmaSplits : 1;
}

constexpr size_t kAlign = 256;

size_t Aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The workspace's parts in order (the GEMM path's or the CUDA-core path's); `base` null: only the total.
size_t Layout(const MoeArgs& a, bool gemms, char* base, Plan* plan, GemmScratch* scratch) {
  const size_t choices = static_cast<size_t>(a.tokens * a.k), experts = static_cast<size_t>(a.experts);
  const size_t hidden = static_cast<size_t>(a.hidden), inter = static_cast<size_t>(a.inter), half = 2;
  std::vector<size_t> sizes = {choices * sizeof(int), choices * sizeof(float), choices * sizeof(int),
                               (experts + 1) * sizeof(int), experts * sizeof(int), sizeof(int),
                               choices * sizeof(int)};
  if (gemms) {
    sizes.insert(sizes.end(), {choices * hidden * half, choices * 2 * inter * sizeof(float), choices * inter * half,
                               choices * hidden * sizeof(float), 2 * inter * hidden * half});
  } else {
    const int64_t splits = MmaSplits(a);
    const size_t widest = 2 * inter > hidden ? 2 * inter : hidden;
    sizes.insert(sizes.end(), {choices * inter * sizeof(float), choices * hidden * sizeof(float),
                               splits > 1 ? static_cast<size_t>(splits) * choices * widest * sizeof(float) : 0});
  }
  sizes.push_back(experts * sizeof(int));  // the cursor, last
  size_t offset = 0;
  std::vector<char*> parts;
  for (const size_t size : sizes) {
    parts.push_back(base ? base + offset : nullptr);
    offset += Aligned(size);
  }
  if (plan) {
    *plan = Plan{reinterpret_cast<int*>(parts[0]), reinterpret_cast<float*>(parts[1]),
                 reinterpret_cast<int*>(parts[2]), reinterpret_cast<int*>(parts[3]),
                 reinterpret_cast<int*>(parts[4]), reinterpret_cast<int*>(parts[5]),
                 reinterpret_cast<int*>(parts[6]),
                 gemms ? nullptr : reinterpret_cast<float*>(parts[7]),
                 gemms ? nullptr : reinterpret_cast<float*>(parts[8]),
                 gemms ? nullptr : reinterpret_cast<float*>(parts[9]),
                 reinterpret_cast<int*>(parts.back())};
  }
  if (scratch && gemms) {
    *scratch = GemmScratch{parts[7], reinterpret_cast<float*>(parts[8]), parts[9],
                           reinterpret_cast<float*>(parts[10]), parts[11]};
  }
  return offset;
}

int64_t Blocks(int64_t threads, int per_block) { return (threads + per_block - 1) / per_block; }

// Steps 2 and 3 as GEMMs (after Route has run on `stream`); an error message, or nullptr.
template <typename T>
const char* LaunchGemms(const MoeArgs& a, const Plan& plan, const GemmScratch& s, cudaStream_t stream) {
  static_assert(sizeof(T) == 2, "the GEMM path runs in 16-bit activations");
  const Cublas& cublas = *LoadCublas();
  Handle* handle = DeviceHandle(cublas);
  if (!handle) return "cuBLAS did not make a handle";
  std::vector<int> offsets(a.experts + 1);  // the experts' row ranges, needed here for the GEMMs' sizes
  if (cudaMemcpyAsync(offsets.data(), plan.offsets, offsets.size() * sizeof(int), cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    return cudaGetErrorString(cudaGetLastError());
  }
  T* gathered = static_cast<T*>(s.gathered);
  T* decoded = static_cast<T*>(s.decoded);
  T* activated = static_cast<T*>(s.activated);
  const int type = std::is_same<T, BFloat>::value ? kR16BF : kR16F;
  const int64_t choices = a.tokens * a.k, h = a.hidden, i2 = 2 * a.inter, in = a.inter;
  const float one = 1.0f, zero = 0.0f;
  auto* gather = &Gather<T>;
  auto* decode = &Decode<T>;
  auto* activate = &Activate<T>;
  auto* combine = &CombineRows<T>;
  GPTOSS_LAUNCH(gather, dim3(Blocks(choices * h / kLaneValues, 256)), dim3(256), stream, a, plan, gathered);
  std::lock_guard<std::mutex> lock(handle->mutex);
  if (cublas.set_stream(handle->handle, stream) != 0) return "cuBLAS did not take the stream";
  // Per routed expert e with n rows: out [n, rows] = in [n, columns] W[e]^T, W[e] decoded to T first. In cuBLAS's
  // column-major terms: out^T [rows, n] = W[e] ([columns, rows] column-major, transposed) in^T.
  const auto expert_gemms = [&](const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t columns,
                                const T* in, float* out) {
    const int64_t blocks = rows * columns / kBlock;
    for (int64_t e = 0; e < a.experts; ++e) {
      const int n = offsets[e + 1] - offsets[e];
      if (n == 0) continue;
      GPTOSS_LAUNCH(decode, dim3(Blocks(blocks, 256)), dim3(256), stream, codes + e * blocks * kBlockBytes,
                    scales + e * blocks, blocks, decoded);
      const int status = cublas.gemm(handle->handle, kOpT, kOpN, static_cast<int>(rows), n, static_cast<int>(columns),
                                     &one, decoded, type, static_cast<int>(columns), in + offsets[e] * columns, type,
                                     static_cast<int>(columns), &zero, out + offsets[e] * rows, kR32F,
                                     static_cast<int>(rows), kCompute32F, kGemmDefault);
      if (status != 0) return status;
    }
    return 0;
  };
  int status = expert_gemms(a.w1, a.s1, i2, h, gathered, s.fc1);  // fc1 = W1 x
  if (status == 0) {
    GPTOSS_LAUNCH(activate, dim3(Blocks(choices * in, 256)), dim3(256), stream, a, plan, s);
    status = expert_gemms(a.w2, a.s2, h, in, activated, s.fc2);  // fc2 = W2 swiglu(...)
  }
  if (status != 0) {
    static thread_local char message[64];
    std::snprintf(message, sizeof message, "cuBLAS GemmEx failed (status %d)", status);
    return message;
  }
  GPTOSS_LAUNCH(combine, dim3(Blocks(a.tokens * h, 256)), dim3(256), stream, a, plan, s);
  return nullptr;
}

// ---- Decode steps on tensor cores: Fc1 and Fc2 as mma.sync m16n8k16 tiles (16-bit inputs, float sums) ----
//
// The same plan and combine as the CUDA-core path, so a step replays as a CUDA graph (nothing read back): a block
// per (routed expert, kMmaRows output rows), a warp per kWarpRows of them (kNTiles tiles of 8 output rows that
// share each input fragment), the expert's choices taken kMmaTokens at a time as the tiles' rows (fragment
// layouts: cuda_mma.h; B's columns are output rows).
//
// Two tile steps cover one MXFP4 block of 32 columns, and the order of K within a block is ours to choose (the
// same for A and B): lane t takes the block's columns 8t to 8t + 7, so that its codes are one 32-bit word of the
// row (the group's four lanes read the block's 16 bytes together) and its inputs one 16-byte load per tile row.
// The codes become 16-bit values by a table of byte -> two E2M1 values (exact in fp16 and bf16); the block's
// E8M0 scale multiplies the two steps' float sums (exact: a power of two), not the weights, so no weight is
// rounded. A warp fetches kMmaAhead blocks of its kWarpRows rows (1 KB of codes) one round ahead of the blocks
// it multiplies, so that a round's loads are in flight while the previous round's tiles run.
constexpr int kMmaWarps = 4;
constexpr int kNTiles = 2;  // each input fragment loaded once for 16 output rows: half the input reads of 8
constexpr int kWarpRows = 8 * kNTiles;
constexpr int kMmaRows = kMmaWarps * kWarpRows;
constexpr int kMmaTokens = 32;  // two tiles of 16 rows: each weight read once for up to 32 choices
constexpr int kMmaAhead = 4;
constexpr int kMmaMinBlocks = 4;  // resident per SM: at most 128 registers a thread (the split kernels asked for 144)

// The block's table of a code byte (two E2M1 codes, low nibble first) as two T values, low half first. Every
// thread of the block must call it (a barrier).
template <typename T>
__device__ __forceinline__ void FillCodePairs(uint32_t* pairs) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) pairs[i] = Pack<T>(E2M1(i & 0xF), E2M1(i >> 4));
  __syncthreads();
}

// A round of kMmaAhead blocks from `first_block`: this lane's code word of each of its B rows (columns 8t to
// 8t + 7 of each block) and the E8M0 scale bytes of its C columns' rows (two an n-tile); zeros from block `end`.
struct MmaRound {
  static_assert(kMmaAhead <= 4, "a round's scales of one row are the bytes of one word");
  uint32_t words[kNTiles][kMmaAhead];
  uint32_t scales[kNTiles][2];  // byte j: block j's (registers are what bounds the warps in flight)

  __device__ __forceinline__ void Fetch(const uint8_t* const (&codes)[kNTiles],
                                        const uint8_t* const (&scale_rows)[kNTiles][2], int64_t end,
                                        int64_t first_block, int t) {
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) scales[n][0] = scales[n][1] = 0u;
#pragma unroll
    for (int j = 0; j < kMmaAhead; ++j) {
      const int64_t block = first_block + j;
      const bool present = block < end;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        words[n][j] = present ? *reinterpret_cast<const uint32_t*>(codes[n] + block * kBlockBytes + 4 * t) : 0u;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          scales[n][r] |= (present ? static_cast<uint32_t>(scale_rows[n][r][block]) : 0u) << (8 * j);
        }
      }
    }
  }

  __device__ __forceinline__ uint8_t Scale(int n, int r, int j) const {
    return static_cast<uint8_t>(scales[n][r] >> (8 * j));
  }
};

// Asks L2 for the codes of blocks [begin, end) of this lane's n-tile rows (the lanes of thread 0 of each group,
// a row each: one bulk prefetch per row, Hopper's; a no-op elsewhere), so that the warp's rounds of loads find
// them in L2 rather than each waiting on memory with only a round in flight.
__device__ __forceinline__ void PrefetchRows(const MoeArgs& a, const uint8_t* const (&codes)[kNTiles],
                                             int64_t begin, int64_t end, int t) {
#if !defined(GPTOSS_HOST_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (!a.l2_prefetch || t != 0 || end <= begin) return;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    const uint8_t* first = codes[n] + begin * kBlockBytes;
    const uint32_t bytes = static_cast<uint32_t>((end - begin) * kBlockBytes);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first), "r"(bytes) : "memory");
  }
#endif
}

// One tile's A fragments for a block's two steps: the tile rows' (`low`, `high`: their inputs, or null for a
// row past the choices) columns 8t to 8t + 7 of the block, one 16-byte load each.
template <typename T>
__device__ __forceinline__ void TileInputs(const T* low, const T* high, int64_t column, uint32_t (&step0)[4],
                                           uint32_t (&step1)[4]) {
  const uint4 zero{0, 0, 0, 0};
  const uint4 l = low ? *reinterpret_cast<const uint4*>(low + column) : zero;
  const uint4 h = high ? *reinterpret_cast<const uint4*>(high + column) : zero;
  step0[0] = l.x, step0[1] = h.x, step0[2] = l.y, step0[3] = h.y;
  step1[0] = l.z, step1[1] = h.z, step1[2] = l.w, step1[3] = h.w;
}

// This lane's C entries of up to two tiles of choices (rows[tile][0 / 1]: the inputs of tile rows g and g + 8,
// null past the choices; `tiles` 1 or 2, the same in every lane) against the warp's kNTiles tiles of output rows
// over K's blocks [begin, end): n-tile n's codes read at its row g (`codes[n]`), its scales at this lane's C
// columns' rows.
template <typename T>
__device__ __forceinline__ void TileSums(const T* const (&rows)[2][2], int tiles,
                                         const uint8_t* const (&codes)[kNTiles],
                                         const uint8_t* const (&scale_rows)[kNTiles][2], int64_t begin, int64_t end,
                                         int t, const uint32_t* pairs, float (&c)[2][kNTiles][4]) {
#pragma unroll
  for (int tile = 0; tile < 2; ++tile)
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) c[tile][n][0] = c[tile][n][1] = c[tile][n][2] = c[tile][n][3] = 0.0f;
  MmaRound next;
  next.Fetch(codes, scale_rows, end, begin, t);
  for (int64_t first_block = begin; first_block < end; first_block += kMmaAhead) {
    const MmaRound round = next;
    if (first_block + kMmaAhead < end) next.Fetch(codes, scale_rows, end, first_block + kMmaAhead, t);
#pragma unroll
    for (int j = 0; j < kMmaAhead; ++j) {
      if (first_block + j >= end) break;  // the same in every lane
      uint32_t b0[kNTiles][2], b1[kNTiles][2];
      float even_scale[kNTiles], odd_scale[kNTiles];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const uint32_t word = round.words[n][j];
        b0[n][0] = pairs[word & 0xFFu], b0[n][1] = pairs[(word >> 8) & 0xFFu];
        b1[n][0] = pairs[(word >> 16) & 0xFFu], b1[n][1] = pairs[word >> 24];
        even_scale[n] = E8M0(round.Scale(n, 0, j));
        odd_scale[n] = E8M0(round.Scale(n, 1, j));
      }
      const int64_t column = (first_block + j) * kBlock + 8 * t;
#pragma unroll
      for (int tile = 0; tile < 2; ++tile) {
        if (tile >= tiles) break;
        uint32_t a0[4], a1[4];
        TileInputs<T>(rows[tile][0], rows[tile][1], column, a0, a1);
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          Mma<T>(d, a0, b0[n]);
          Mma<T>(d, a1, b1[n]);
          c[tile][n][0] += even_scale[n] * d[0];
          c[tile][n][1] += odd_scale[n] * d[1];
          c[tile][n][2] += even_scale[n] * d[2];
          c[tile][n][3] += odd_scale[n] * d[3];
        }
      }
    }
  }
}

// The choices of tile rows g and g + 8 of both tiles from list position `start` (-1 past `last`), and their
// inputs (`input(choice)`), null past the choices; how many tiles hold a choice.
template <typename T, typename Input>
__device__ __forceinline__ int TileRows(const Plan& plan, int start, int last, int g, Input input, int (&choices)[2][2],
                                        const T* (&rows)[2][2]) {
#pragma unroll
  for (int tile = 0; tile < 2; ++tile) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int place = start + 16 * tile + 8 * half + g;
      choices[tile][half] = place < last ? plan.list[place] : -1;
      rows[tile][half] = choices[tile][half] < 0 ? nullptr : input(choices[tile][half]);
    }
  }
  return last - start > 16 ? 2 : 1;
}

// This block's part [begin, end) of K's `groups` blocks: all of them, or one of gridDim.z parts (a split step).
__device__ __forceinline__ void KPart(int64_t groups, int64_t* begin, int64_t* end) {
  const int64_t per = (groups + gridDim.z - 1) / gridDim.z;
  *begin = blockIdx.z * per < groups ? blockIdx.z * per : groups;
  *end = *begin + per < groups ? *begin + per : groups;
}

// A split step's sums of part `part` for `choice`, one per output row (as many as the wider projection has).
__device__ __forceinline__ float* PartSums(const MoeArgs& a, const Plan& plan, int64_t part, int64_t choice) {
  const int64_t widest = 2 * a.inter > a.hidden ? 2 * a.inter : a.hidden;
  return plan.split_sums + (part * a.tokens * a.k + choice) * widest;
}

// The codes (row g of each n-tile) and the scale rows (this lane's C columns 2t, 2t + 1 of each n-tile) of a
// warp's output rows from `first` in an MXFP4 matrix of `groups` blocks a row.
__device__ __forceinline__ void WarpRows(const uint8_t* codes, const uint8_t* scales, int64_t first, int64_t groups,
                                         int g, int t, const uint8_t* (&row_codes)[kNTiles],
                                         const uint8_t* (&scale_rows)[kNTiles][2]) {
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    row_codes[n] = codes + (first + 8 * n + g) * groups * kBlockBytes;
    scale_rows[n][0] = scales + (first + 8 * n + 2 * t) * groups;
    scale_rows[n][1] = scales + (first + 8 * n + 2 * t + 1) * groups;
  }
}

// Fc1 on tensor cores: activated[c] = swiglu(W1 x + b1) per choice c, stored in T for Fc2Mma. Each n-tile's 8
// output rows are 4 gate/linear pairs; C's columns {2t, 2t + 1} are one pair's gate and linear sums, so each
// lane finishes its pairs itself.
template <typename T, bool kSplit>
__global__ void __launch_bounds__(kWarp * kMmaWarps, kMmaMinBlocks) Fc1Mma(MoeArgs a, Plan plan) {
  __shared__ uint32_t pairs[256];
  FillCodePairs<T>(pairs);
  const int lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int64_t first_row = blockIdx.y * static_cast<int64_t>(kMmaRows) + threadIdx.x / kWarp * kWarpRows;
  int expert, first, last;
  if (first_row >= 2 * a.inter || !ExpertRange(plan, &expert, &first, &last)) return;
  const int64_t groups = a.hidden / kBlock, expert_row = expert * 2 * a.inter + first_row;
  const uint8_t* codes[kNTiles];
  const uint8_t* scale_rows[kNTiles][2];
  WarpRows(a.w1, a.s1, expert_row, groups, g, t, codes, scale_rows);
  const T* x = static_cast<const T*>(a.x);
  const T* b1 = static_cast<const T*>(a.b1);
  T* activated = reinterpret_cast<T*>(plan.activated);
  float gate_bias[kNTiles], lin_bias[kNTiles];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    gate_bias[n] = ToFloat(b1[expert_row + 8 * n + 2 * t]);
    lin_bias[n] = ToFloat(b1[expert_row + 8 * n + 2 * t + 1]);
  }
  const int64_t k = a.k;
  const auto input = [&](int choice) { return x + choice / k * a.hidden; };
  int64_t begin = 0, end = groups;
  if constexpr (kSplit) KPart(groups, &begin, &end);
  PrefetchRows(a, codes, begin, end, t);
  for (int start = first; start < last; start += kMmaTokens) {
    int choices[2][2];
    const T* rows[2][2];
    const int tiles = TileRows<T>(plan, start, last, g, input, choices, rows);
    float c[2][kNTiles][4];
    TileSums<T>(rows, tiles, codes, scale_rows, begin, end, t, pairs, c);
#pragma unroll
    for (int tile = 0; tile < 2; ++tile) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (choices[tile][half] < 0) continue;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
          if constexpr (kSplit) {  // a part of K: its raw sums, for FinishFc1
            float* sums = PartSums(a, plan, blockIdx.z, choices[tile][half]) + first_row + 8 * n + 2 * t;
            sums[0] = c[tile][n][2 * half];
            sums[1] = c[tile][n][2 * half + 1];
            continue;
          }
          const int64_t pair = (first_row + 8 * n + 2 * t) / 2;  // the gate/linear pair of this lane's C columns
          activated[choices[tile][half] * a.inter + pair] =
              FromFloat<T>(Swiglu(a, c[tile][n][2 * half] + gate_bias[n], c[tile][n][2 * half + 1] + lin_bias[n]));
        }
      }
    }
  }
}

// Fc2 on tensor cores: partial[c] = W2 activated[c] + b2 per choice c (activated in T, as Fc1Mma stores it).
template <typename T, bool kSplit>
__global__ void __launch_bounds__(kWarp * kMmaWarps, kMmaMinBlocks) Fc2Mma(MoeArgs a, Plan plan) {
  __shared__ uint32_t pairs[256];
  FillCodePairs<T>(pairs);
  const int lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int64_t first_row = blockIdx.y * static_cast<int64_t>(kMmaRows) + threadIdx.x / kWarp * kWarpRows;
  int expert, first, last;
  if (first_row >= a.hidden || !ExpertRange(plan, &expert, &first, &last)) return;
  const int64_t groups = a.inter / kBlock, expert_row = expert * a.hidden + first_row;
  const uint8_t* codes[kNTiles];
  const uint8_t* scale_rows[kNTiles][2];
  WarpRows(a.w2, a.s2, expert_row, groups, g, t, codes, scale_rows);
  const T* b2 = static_cast<const T*>(a.b2);
  const T* activated = reinterpret_cast<const T*>(plan.activated);
  float biases[kNTiles][2];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    biases[n][0] = ToFloat(b2[expert_row + 8 * n + 2 * t]);
    biases[n][1] = ToFloat(b2[expert_row + 8 * n + 2 * t + 1]);
  }
  const auto input = [&](int choice) { return activated + static_cast<int64_t>(choice) * a.inter; };
  int64_t begin = 0, end = groups;
  if constexpr (kSplit) KPart(groups, &begin, &end);
  PrefetchRows(a, codes, begin, end, t);
  for (int start = first; start < last; start += kMmaTokens) {
    int choices[2][2];
    const T* rows[2][2];
    const int tiles = TileRows<T>(plan, start, last, g, input, choices, rows);
    float c[2][kNTiles][4];
    TileSums<T>(rows, tiles, codes, scale_rows, begin, end, t, pairs, c);
#pragma unroll
    for (int tile = 0; tile < 2; ++tile) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (choices[tile][half] < 0) continue;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {  // this lane's C columns: output rows 8n + 2t and 8n + 2t + 1
          const int64_t row = first_row + 8 * n + 2 * t;
          if constexpr (kSplit) {  // a part of K: its raw sums, for CombineSplits
            float* sums = PartSums(a, plan, blockIdx.z, choices[tile][half]) + row;
            sums[0] = c[tile][n][2 * half];
            sums[1] = c[tile][n][2 * half + 1];
          } else {
            float* out = plan.partial + static_cast<int64_t>(choices[tile][half]) * a.hidden + row;
            out[0] = c[tile][n][2 * half] + biases[n][0];
            out[1] = c[tile][n][2 * half + 1] + biases[n][1];
          }
        }
      }
    }
  }
}


// A split step's fc1: activated[c, p] = swiglu of pair p's gate and linear sums over the parts (in part order)
// plus the expert's biases, in T; a thread per (choice, pair).
template <typename T>
__global__ void FinishFc1(MoeArgs a, Plan plan, int splits) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= a.tokens * a.k * a.inter) return;
  const int64_t choice = index / a.inter, pair = index % a.inter;
  float gate = 0.0f, linear = 0.0f;
  for (int z = 0; z < splits; ++z) {
    const float* sums = PartSums(a, plan, z, choice) + 2 * pair;
    gate += sums[0];
    linear += sums[1];
  }
  const T* b1 = static_cast<const T*>(a.b1) + plan.chosen[choice] * 2 * a.inter;
  reinterpret_cast<T*>(plan.activated)[index] =
      FromFloat<T>(Swiglu(a, gate + ToFloat(b1[2 * pair]), linear + ToFloat(b1[2 * pair + 1])));
}

// A split step's combine: y[t] = the routing-weighted sum of its choices' fc2 sums over the parts (in part
// order) plus their experts' biases, in choice order.
template <typename T>
__global__ void CombineSplits(MoeArgs a, Plan plan, int splits) {
  CombineChoices<T>(a, plan, [&](int64_t choice, int64_t column) {
    float value = 0.0f;
    for (int z = 0; z < splits; ++z) value += PartSums(a, plan, z, choice)[column];
    return value + Fc2Bias<T>(a, plan, choice, column);
  });
}

template <typename T>
void Launch(const MoeArgs& a, const Plan& plan, cudaStream_t stream) {
  const int threads = kWarp * kWarpsPerBlock;
  const int64_t slots = a.experts < a.tokens * a.k ? a.experts : a.tokens * a.k;
  auto* combine = &Combine<T>;
  if constexpr (sizeof(T) == 2) {
    if (UsesMma(a)) {
      const int splits = static_cast<int>(MmaSplits(a));
      auto* fc1_mma = splits > 1 ? &Fc1Mma<T, true> : &Fc1Mma<T, false>;
      auto* fc2_mma = splits > 1 ? &Fc2Mma<T, true> : &Fc2Mma<T, false>;
      const dim3 mma_threads(kWarp * kMmaWarps);
      const unsigned parts = static_cast<unsigned>(splits);
      LaunchRoute<T>(a, plan, stream);
      GPTOSS_LAUNCH(fc1_mma, dim3(slots, (2 * a.inter + kMmaRows - 1) / kMmaRows, parts), mma_threads, stream, a,
                    plan);
      if (splits > 1) {
        auto* finish = &FinishFc1<T>;
        GPTOSS_LAUNCH(finish, dim3(Blocks(a.tokens * a.k * a.inter, 256)), dim3(256), stream, a, plan, splits);
      }
      GPTOSS_LAUNCH(fc2_mma, dim3(slots, (a.hidden + kMmaRows - 1) / kMmaRows, parts), mma_threads, stream, a, plan);
      if (splits > 1) {
        auto* combine_splits = &CombineSplits<T>;
        GPTOSS_LAUNCH(combine_splits, dim3(Blocks(a.tokens * a.hidden, 256)), dim3(256), stream, a, plan, splits);
      } else {
        GPTOSS_LAUNCH(combine, dim3((a.tokens * a.hidden + 255) / 256), dim3(256), stream, a, plan);
      }
      return;
    }
  }
  if (a.tokens == 1) {  // batch-1 decode: two kernels, one choice per routed expert, no chunk registers
    auto* fc1 = &Fc1Token<T>;
    auto* fc2 = &Fc2Token<T>;
    const int64_t rows_per_block = kWarpsPerBlock / a.k;
    GPTOSS_LAUNCH(fc1, dim3(a.k, (a.inter + kWarpsPerBlock - 1) / kWarpsPerBlock), dim3(threads), stream, a, plan);
    GPTOSS_LAUNCH(fc2, dim3((a.hidden + rows_per_block - 1) / rows_per_block), dim3(threads), stream, a, plan);
    return;
  }
  auto* fc1 = &Fc1<T>;
  auto* fc2 = &Fc2<T>;
  LaunchRoute<T>(a, plan, stream);
  GPTOSS_LAUNCH(fc1, dim3(slots, (a.inter + kWarpsPerBlock - 1) / kWarpsPerBlock), dim3(threads), stream, a, plan);
  GPTOSS_LAUNCH(fc2, dim3(slots, (a.hidden + kWarpsPerBlock - 1) / kWarpsPerBlock), dim3(threads), stream, a, plan);
  GPTOSS_LAUNCH(combine, dim3((a.tokens * a.hidden + 255) / 256), dim3(256), stream, a, plan);
}

}  // namespace

void KeepMoeOnDevice(MoeArgs& args, void* stream) {
  if (args.gemm_min_tokens <= 0 || args.tokens < args.gemm_min_tokens) return;  // a decode step: no CUDA call
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    args.gemm_min_tokens = 0;
  }
}

size_t MoeWorkspaceBytes(const MoeArgs& args) { return Layout(args, UsesGemms(args), nullptr, nullptr, nullptr); }

const char* LaunchMoe(const MoeArgs& a, void* workspace, void* raw_stream) {
  if (a.tokens == 0) return nullptr;
  if (a.k > kMaxTopK || a.experts > kMaxExperts) return "k above 8 or more than 1024 experts";
  for (const void* p : {a.x, static_cast<const void*>(a.w1), static_cast<const void*>(a.w2)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return "x and the MXFP4 weights must be 16-byte aligned";
  }
  cudaStream_t stream = static_cast<cudaStream_t>(raw_stream);
  Plan plan{};
  GemmScratch scratch{};
  const bool gemms = UsesGemms(a);
  Layout(a, gemms, static_cast<char*>(workspace), &plan, &scratch);
  if (gemms) {
    if (a.dtype == Dtype::kBFloat16) {
      LaunchRoute<BFloat>(a, plan, stream);
    } else {
      LaunchRoute<Half>(a, plan, stream);
    }
    const char* error = a.dtype == Dtype::kBFloat16 ? LaunchGemms<BFloat>(a, plan, scratch, stream)
                                                     : LaunchGemms<Half>(a, plan, scratch, stream);
    if (error) return error;
  } else {
    switch (a.dtype) {
      case Dtype::kFloat32:
        Launch<float>(a, plan, stream);
        break;
      case Dtype::kFloat16:
        Launch<Half>(a, plan, stream);
        break;
      case Dtype::kBFloat16:
        Launch<BFloat>(a, plan, stream);
        break;
    }
  }
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? nullptr : cudaGetErrorString(status);
}

}  // namespace gptoss
