// gptoss.engine::SampleTokens on the CUDA execution provider: one block per sampled row, so that only the
// token ids (and the logprobs asked for) leave the device. The arithmetic is sample_tokens_launch.h's; the
// passes over a row:
// 1. max and greedy index of z (strided, coalesced; mask bits and penalties applied as each logit is read,
//    the penalties found by binary search in the row's ascending ids);
// 2. sampling: S = sum e, each thread over a contiguous chunk; with top_p < 1, the nucleus threshold tau
//    found 4 bits of its bit pattern per pass (e >= 0, so its bits order like its value: 8 passes of 15
//    candidate thresholds each), then the mass above tau and the count of ties; the draw over the same chunks
//    (ties counted where some are kept, then kept mass, each scanned across the block; without a nucleus the
//    chunk sums of S are the kept mass), then the thread whose chunk holds the crossing walks it: the lowest
//    index where the running mass passes uniform * kept mass (every thread walks only when rounding left
//    uniform * kept mass at or past the end: the last kept index);
// 3. logprobs: log sum exp(z - m), then the top alternatives one block argmax at a time.
//
// The file is also compiled as host C++ with the warp-emulation shim (tests/support/kernel_emulation), so it
// keeps to threadIdx/blockIdx, __shfl_down_sync/__shfl_up_sync, __syncthreads and GPTOSS_LAUNCH.

#include <cmath>
#include <cstdint>

#include "cuda_launch.h"
#include "sample_tokens_launch.h"

namespace gptoss {
namespace {

constexpr int kThreads = 512;  // 128 registers a thread: the nucleus search's 15 sums stay in registers
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr unsigned kAllLanes = 0xffffffffu;
constexpr int kCandidates = 15;  // thresholds tried per pass of the nucleus search: 4 bits of it
constexpr int kSearchPasses = 8;  // bits 30..3 four at a time, then bits 2..0
constexpr double kLeastTarget = 1e-300;  // top_p 0 keeps the most likely token: a target above zero
constexpr int32_t kNoIndex = 0x7fffffff;

struct Row {
  const float* logits;
  const uint32_t* mask;  // nullptr: no mask
  const int32_t* penalty_ids;
  const float* penalty_values;
  int64_t penalties;
};

__device__ __forceinline__ float Penalised(const Row& row, int64_t i) {
  if (row.mask && !((row.mask[i >> 5] >> (i & 31)) & 1u)) return -INFINITY;
  float value = row.logits[i];
  int64_t low = 0, high = row.penalties;  // the first id not below i (the padding sorts last)
  while (low < high) {
    const int64_t middle = (low + high) >> 1;
    if (row.penalty_ids[middle] < i) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  if (low < row.penalties && row.penalty_ids[low] == i) value -= row.penalty_values[low];
  return value;
}

// (value, index) before (other, other_index) in the order of the top list: larger value, then lower index.
__device__ __forceinline__ bool Before(float value, int32_t index, float other, int32_t other_index) {
  return value > other || (value == other && index < other_index);
}

struct Best {
  float value;
  int32_t index;
};

// The block's first (value, index) in Before's order, returned to every thread.
__device__ Best BlockBest(Best best, float* values, int32_t* indices, Best* out) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    const float value = __shfl_down_sync(kAllLanes, best.value, offset);
    const int32_t index = __shfl_down_sync(kAllLanes, best.index, offset);
    if (Before(value, index, best.value, best.index)) best = Best{value, index};
  }
  if (lane == 0) values[warp] = best.value, indices[warp] = best.index;
  __syncthreads();
  if (warp == 0) {
    best = lane < kWarps ? Best{values[lane], indices[lane]} : Best{-INFINITY, kNoIndex};
    for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
      const float value = __shfl_down_sync(kAllLanes, best.value, offset);
      const int32_t index = __shfl_down_sync(kAllLanes, best.index, offset);
      if (Before(value, index, best.value, best.index)) best = Best{value, index};
    }
    if (lane == 0) *out = best;
  }
  __syncthreads();
  return *out;
}

template <typename T>
__device__ __forceinline__ T WarpSum(T value) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) value += __shfl_down_sync(kAllLanes, value, offset);
  return value;
}

// Each of `values` summed over the block, in place in every thread. `partial`: [N * kWarps], `out`: [N].
template <int N>
__device__ void BlockSums(double (&values)[N], double* partial, double* out) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int k = 0; k < N; ++k) {
    const double sum = WarpSum(values[k]);
    if (lane == 0) partial[k * kWarps + warp] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    for (int k = 0; k < N; ++k) {
      const double sum = WarpSum(lane < kWarps ? partial[k * kWarps + lane] : 0.0);
      if (lane == 0) out[k] = sum;
    }
  }
  __syncthreads();
  for (int k = 0; k < N; ++k) values[k] = out[k];
}

// The sum of `value` over the threads before this one. `partial`: [kWarps].
template <typename T>
__device__ T BlockExclusiveScan(T value, T* partial) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  T inclusive = value;
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const T other = __shfl_up_sync(kAllLanes, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == kWarp - 1) partial[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const T total = lane < kWarps ? partial[lane] : T{};
    T running = total;
    for (int offset = 1; offset < kWarp; offset <<= 1) {
      const T other = __shfl_up_sync(kAllLanes, running, offset);
      if (lane >= offset) running += other;
    }
    if (lane < kWarps) partial[lane] = running - total;  // the warps before this one
  }
  __syncthreads();
  const T before = partial[warp] + inclusive - value;
  __syncthreads();  // `partial` is free again
  return before;
}

// e of token i: its probability at the temperature, unnormalised (the row's peak is 1).
__device__ __forceinline__ float Weight(const Row& row, int64_t i, float peak, float inverse) {
  return expf((Penalised(row, i) - peak) * inverse);
}

struct Nucleus {
  float tau;      // every e above it is kept
  int64_t ties;   // and this many of the e equal to it, lowest index first
  double mass;    // the kept mass
};

// This thread's contiguous chunk [begin, end) of the vocabulary (the draw's order: chunks in thread order).
__device__ __forceinline__ void Chunk(int64_t vocab, int64_t* begin, int64_t* end) {
  const int64_t size = (vocab + kThreads - 1) / kThreads;
  *begin = threadIdx.x * size < vocab ? threadIdx.x * size : vocab;
  *end = *begin + size < vocab ? *begin + size : vocab;
}

// The nucleus, and in `chunk_total` the sum of e over this thread's chunk.
__device__ Nucleus FindNucleus(const Row& row, int64_t vocab, float peak, float inverse, float top_p, double* partial,
                               double* out, double* chunk_total) {
  int64_t begin, end;
  Chunk(vocab, &begin, &end);
  double own = 0.0;
  for (int64_t i = begin; i < end; ++i) own += Weight(row, i, peak, inverse);
  *chunk_total = own;
  double total[1] = {own};
  BlockSums(total, partial, out);
  if (!(top_p < 1.0f)) return Nucleus{0.0f, 0, total[0]};
  const double target = fmax(static_cast<double>(top_p) * total[0], kLeastTarget);
  uint32_t threshold = 0;  // the largest bit pattern whose mass of e at or above it reaches the target
  for (int pass = 0; pass < kSearchPasses; ++pass) {
    const int low = pass + 1 < kSearchPasses ? 27 - 4 * pass : 0;
    const uint32_t digits = pass + 1 < kSearchPasses ? 16u : 8u;
    double mass[kCandidates] = {};
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float e = Weight(row, i, peak, inverse);
      const uint32_t key = __float_as_uint(e);
#pragma unroll
      for (int d = 0; d < kCandidates; ++d) {
        if (key >= (threshold | (static_cast<uint32_t>(d + 1) << low))) mass[d] += e;
      }
    }
    BlockSums(mass, partial, out);
    for (uint32_t d = digits - 1; d >= 1; --d) {
      if (mass[d - 1] >= target) {
        threshold |= d << low;
        break;
      }
    }
  }
  const float tau = __uint_as_float(threshold);
  double above[2] = {0.0, 0.0};  // the mass above tau, and how many e equal it
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float e = Weight(row, i, peak, inverse);
    if (e > tau) above[0] += e;
    if (e == tau) above[1] += 1.0;
  }
  BlockSums(above, partial, out);
  int64_t ties = 0;
  if (tau > 0.0f) {
    const double needed = ceil((target - above[0]) / tau);
    const int64_t equal = static_cast<int64_t>(above[1]);
    ties = needed < 1.0 ? 1 : (needed > static_cast<double>(equal) ? equal : static_cast<int64_t>(needed));
  }
  return Nucleus{tau, ties, above[0] + static_cast<double>(ties) * tau};
}

__device__ __forceinline__ bool Kept(float e, const Nucleus& nucleus, int64_t& tie_rank) {
  if (e > nucleus.tau) return true;
  return e == nucleus.tau && nucleus.tau > 0.0f && tie_rank++ < nucleus.ties;
}

// The first index whose running kept mass passes uniform * kept mass, else the last kept index. `chunk_total`:
// this thread's sum of e (FindNucleus's), its kept mass when tau is 0 (every e above 0 kept, no ties).
__device__ int64_t Draw(const Row& row, int64_t vocab, float peak, float inverse, const Nucleus& nucleus,
                        double chunk_total, float uniform, double* scan_mass, int64_t* scan_count, Best* best_out,
                        float* best_values, int32_t* best_indices) {
  int64_t begin, end;
  Chunk(vocab, &begin, &end);
  const bool all_kept = !(nucleus.tau > 0.0f);
  int64_t equal = 0;
  if (!all_kept) {
    for (int64_t i = begin; i < end; ++i) equal += Weight(row, i, peak, inverse) == nucleus.tau;
  }
  const int64_t ties_before = BlockExclusiveScan(equal, scan_count);
  double mass = all_kept ? chunk_total : 0.0;
  int64_t rank = ties_before;
  if (!all_kept) {
    for (int64_t i = begin; i < end; ++i) {
      const float e = Weight(row, i, peak, inverse);
      if (Kept(e, nucleus, rank)) mass += e;
    }
  }
  double running = BlockExclusiveScan(mass, scan_mass);
  const double x = static_cast<double>(uniform) * nucleus.mass;
  int32_t found = kNoIndex;
  // only a chunk the crossing may lie in is walked (the slack covers the walk's own rounding of the sum)
  if (running <= x && running + mass * (1.0 + 1e-9) > x) {
    rank = ties_before;
    for (int64_t i = begin; i < end; ++i) {
      const float e = Weight(row, i, peak, inverse);
      if (!Kept(e, nucleus, rank)) continue;
      running += e;
      if (running > x) {
        found = static_cast<int32_t>(i);
        break;
      }
    }
  }
  // the lowest found index: Before orders equal values by index; a negated index makes the largest last come first
  const Best first = BlockBest(Best{0.0f, found}, best_values, best_indices, best_out);
  if (first.index != kNoIndex) return first.index;
  int32_t last = -1;  // rounding left x at or past the kept mass: the last kept index
  rank = ties_before;
  for (int64_t i = begin; i < end; ++i) {
    if (Kept(Weight(row, i, peak, inverse), nucleus, rank)) last = static_cast<int32_t>(i);
  }
  return -BlockBest(Best{0.0f, -last}, best_values, best_indices, best_out).index;
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleArgs a) {
  __shared__ double partial[kCandidates * kWarps];
  __shared__ double out[kCandidates];
  __shared__ double scan_mass[kWarps];
  __shared__ int64_t scan_count[kWarps];
  __shared__ float best_values[kWarps];
  __shared__ int32_t best_indices[kWarps];
  __shared__ Best best_out;
  const int64_t r = blockIdx.x;
  if (a.row[r] < 0 || a.row[r] >= a.logits_rows) {
    if (threadIdx.x == 0) {
      a.token[r] = -1;
      a.logprob[r] = 0.0f;
      for (int64_t j = 0; j < a.top; ++j) a.top_ids[r * a.top + j] = -1, a.top_logprobs[r * a.top + j] = -INFINITY;
    }
    return;
  }
  const int32_t mask = a.mask_index[r];
  const Row row{a.logits + static_cast<int64_t>(a.row[r]) * a.vocab,
                mask >= 0 && mask < a.mask_count ? a.masks + mask * a.mask_words : nullptr,
                a.penalty_ids + r * a.penalties, a.penalty_values + r * a.penalties, a.penalties};
  const int64_t top = a.logprobs[r] < a.top ? a.logprobs[r] : a.top;
  if (threadIdx.x == 0) {
    a.logprob[r] = 0.0f;
    for (int64_t j = 0; j < a.top; ++j) a.top_ids[r * a.top + j] = -1, a.top_logprobs[r * a.top + j] = -INFINITY;
  }
  Best greedy{-INFINITY, kNoIndex};
  for (int64_t i = threadIdx.x; i < a.vocab; i += kThreads) {
    const float z = Penalised(row, i);
    if (Before(z, static_cast<int32_t>(i), greedy.value, greedy.index)) greedy = Best{z, static_cast<int32_t>(i)};
  }
  greedy = BlockBest(greedy, best_values, best_indices, &best_out);
  const float peak = greedy.value;
  if (peak == -INFINITY) {  // every token masked
    if (threadIdx.x == 0) a.token[r] = -1;
    return;
  }
  int64_t token = greedy.index;
  if (a.temperature[r] > 0.0f) {
    const float inverse = 1.0f / a.temperature[r];
    double chunk_total = 0.0;
    const Nucleus nucleus = FindNucleus(row, a.vocab, peak, inverse, a.top_p[r], partial, out, &chunk_total);
    token = Draw(row, a.vocab, peak, inverse, nucleus, chunk_total, a.uniform[r], scan_mass, scan_count, &best_out,
                 best_values, best_indices);
  }
  if (threadIdx.x == 0) a.token[r] = token;
  if (a.logprobs[r] < 0) return;
  double sum[1] = {0.0};
  for (int64_t i = threadIdx.x; i < a.vocab; i += kThreads) sum[0] += expf(Penalised(row, i) - peak);
  BlockSums(sum, partial, out);
  const double log_total = log(sum[0]);
  if (threadIdx.x == 0) {
    a.logprob[r] = static_cast<float>(static_cast<double>(Penalised(row, token) - peak) - log_total);
  }
  Best previous{INFINITY, -1};
  for (int64_t j = 0; j < top; ++j) {
    Best next{-INFINITY, kNoIndex};
    for (int64_t i = threadIdx.x; i < a.vocab; i += kThreads) {
      const float z = Penalised(row, i);
      const auto index = static_cast<int32_t>(i);
      if (z != -INFINITY && Before(previous.value, previous.index, z, index) &&
          Before(z, index, next.value, next.index)) {
        next = Best{z, index};
      }
    }
    next = BlockBest(next, best_values, best_indices, &best_out);
    if (next.value == -INFINITY) break;
    if (threadIdx.x == 0) {
      a.top_ids[r * a.top + j] = next.index;
      a.top_logprobs[r * a.top + j] = static_cast<float>(static_cast<double>(next.value - peak) - log_total);
    }
    previous = next;
  }
}

}  // namespace

const char* LaunchSampleTokens(const SampleArgs& args, void* stream) {
  if (args.rows == 0) return nullptr;
  GPTOSS_LAUNCH(SampleKernel, dim3(static_cast<unsigned>(args.rows)), dim3(kThreads),
                static_cast<cudaStream_t>(stream), args);
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace gptoss
