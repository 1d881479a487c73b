// gptoss.engine::MXFP4MoE on the CUDA execution provider (fp32 activations), same contract as the CPU
// kernel: a warp per output row reads the row's packed MXFP4 bytes once (16 bytes per lane per block of
// 32 values), decodes them in registers and reduces the dot product across the warp.

#include <cuda_runtime.h>

#include <cfloat>

#include "mxfp4_moe_launch.h"

namespace gptoss {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kBlock = 32;

__constant__ float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

__device__ float WarpSum(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  return value;
}

// Row (cols values: cols / 2 bytes, cols / 32 scales) . vector, by one warp; the sum lands in lane 0.
__device__ float RowDot(const uint8_t* codes, const float* scales, int64_t cols, const float* vector, int lane) {
  float total = 0.0f;
  for (int64_t block = lane; block < cols / kBlock; block += kWarp) {
    const uint4 packed = *reinterpret_cast<const uint4*>(codes + block * (kBlock / 2));
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    const float* v = vector + block * kBlock;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t byte = (words[w] >> (8 * b)) & 0xFFu;
        const int index = 8 * w + 2 * b;
        sum += kE2M1[byte & 0x0Fu] * v[index] + kE2M1[byte >> 4] * v[index + 1];
      }
    }
    total += sum * scales[block];
  }
  return WarpSum(total);
}

__global__ void Route(const float* logits, int64_t tokens, int64_t experts, int64_t k, int* chosen, float* weights) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  const float* row = logits + t * experts;
  int picked[kMaxCudaTopK];
  float values[kMaxCudaTopK];
  for (int64_t j = 0; j < k; ++j) {
    int best = -1;
    float best_value = -FLT_MAX;
    for (int64_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= picked[i] == e;
      if (!taken && (best < 0 || row[e] > best_value)) {
        best = static_cast<int>(e);
        best_value = row[e];
      }
    }
    picked[j] = best;
    values[j] = best_value;
  }
  float total = 0.0f;
  for (int64_t j = 0; j < k; ++j) total += values[j] = expf(values[j] - values[0]);
  for (int64_t j = 0; j < k; ++j) {
    chosen[t * k + j] = picked[j];
    weights[t * k + j] = values[j] / total;
  }
}

// One warp per (token choice, gate/linear row pair): the clamped SwiGLU of fc1.
__global__ void Fc1(MoeArgs a, const int* chosen, float* activated) {
  const int lane = threadIdx.x % kWarp;
  const int64_t choice = blockIdx.x;
  const int64_t pair = blockIdx.y * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (pair >= a.inter) return;
  const int64_t expert = chosen[choice], token = choice / a.k;
  const int64_t gate_row = expert * 2 * a.inter + 2 * pair, lin_row = gate_row + 1;
  const float* x = a.x + token * a.hidden;
  const int64_t bytes = a.hidden / 2, groups = a.hidden / kBlock;
  const float gate = RowDot(a.w1 + gate_row * bytes, a.s1 + gate_row * groups, a.hidden, x, lane);
  const float lin = RowDot(a.w1 + lin_row * bytes, a.s1 + lin_row * groups, a.hidden, x, lane);
  if (lane == 0) {
    const float g = fminf(gate + a.b1[gate_row], a.limit);
    const float l = fmaxf(fminf(lin + a.b1[lin_row], a.limit), -a.limit);
    activated[choice * a.inter + pair] = g / (1.0f + expf(-a.alpha * g)) * (l + 1.0f);
  }
}

// One warp per (token choice, output row) of fc2.
__global__ void Fc2(MoeArgs a, const int* chosen, const float* activated, float* partial) {
  const int lane = threadIdx.x % kWarp;
  const int64_t choice = blockIdx.x;
  const int64_t row = blockIdx.y * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (row >= a.hidden) return;
  const int64_t flat = chosen[choice] * a.hidden + row;
  const float sum = RowDot(a.w2 + flat * (a.inter / 2), a.s2 + flat * (a.inter / kBlock), a.inter,
                           activated + choice * a.inter, lane);
  if (lane == 0) partial[choice * a.hidden + row] = sum + a.b2[flat];
}

// y[t] = the routing-weighted sum of its k choices, in choice order.
__global__ void Combine(MoeArgs a, const float* weights, const float* partial) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= a.tokens * a.hidden) return;
  const int64_t token = index / a.hidden, column = index % a.hidden;
  float sum = 0.0f;
  for (int64_t j = 0; j < a.k; ++j) sum += weights[token * a.k + j] * partial[(token * a.k + j) * a.hidden + column];
  a.y[index] = sum;
}

}  // namespace

const char* LaunchMoe(const MoeArgs& a, void* raw_stream) {
  cudaStream_t stream = static_cast<cudaStream_t>(raw_stream);
  const int64_t choices = a.tokens * a.k;
  if (choices == 0) return nullptr;
  char* scratch = nullptr;
  const size_t chosen_bytes = choices * sizeof(int), weight_bytes = choices * sizeof(float);
  const size_t activated_bytes = choices * a.inter * sizeof(float), partial_bytes = choices * a.hidden * sizeof(float);
  cudaError_t status = cudaMallocAsync(reinterpret_cast<void**>(&scratch),
                                       chosen_bytes + weight_bytes + activated_bytes + partial_bytes, stream);
  if (status != cudaSuccess) return cudaGetErrorString(status);
  int* chosen = reinterpret_cast<int*>(scratch);
  float* weights = reinterpret_cast<float*>(scratch + chosen_bytes);
  float* activated = reinterpret_cast<float*>(scratch + chosen_bytes + weight_bytes);
  float* partial = reinterpret_cast<float*>(scratch + chosen_bytes + weight_bytes + activated_bytes);
  const int threads = kWarp * kWarpsPerBlock;
  Route<<<(a.tokens + 127) / 128, 128, 0, stream>>>(a.logits, a.tokens, a.experts, a.k, chosen, weights);
  Fc1<<<dim3(choices, (a.inter + kWarpsPerBlock - 1) / kWarpsPerBlock), threads, 0, stream>>>(a, chosen, activated);
  Fc2<<<dim3(choices, (a.hidden + kWarpsPerBlock - 1) / kWarpsPerBlock), threads, 0, stream>>>(a, chosen, activated,
                                                                                                 partial);
  Combine<<<(a.tokens * a.hidden + 255) / 256, 256, 0, stream>>>(a, weights, partial);
  status = cudaGetLastError();
  cudaFreeAsync(scratch, stream);
  return status == cudaSuccess ? nullptr : cudaGetErrorString(status);
}

}  // namespace gptoss
