// The MXFP4 MoE layer as plain data, shared by the CPU kernel and the CUDA launcher (so that nvcc never
// sees the ONNX Runtime headers, and the CUDA file also compiles as host C++ for the emulation tests).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel_dtype.h"

namespace gptoss {

// The activation dtype (kernel_dtype.h): x, router logits, biases and y share it.

struct MoeArgs {
  int64_t tokens, hidden, inter, experts, k;
  float limit, alpha;
  Dtype dtype;
  const void* x;       // [T, H]
  const void* logits;  // [T, E]
  const uint8_t* w1;   // [E, 2I, H/2] packed FLOAT4E2M1, gate and linear rows interleaved
  const uint8_t* s1;   // [E, 2I, H/32] E8M0 exponents
  const void* b1;      // [E, 2I]
  const uint8_t* w2;   // [E, H, I/2]
  const uint8_t* s2;   // [E, H, I/32]
  const void* b2;      // [E, H]
  void* y;             // [T, H]
  // CUDA, 16-bit activations: from this many tokens in a step (a prefill) the experts run as GEMMs on tensor
  // cores through cuBLAS, where it loads; 0: never. The CPU kernel ignores it.
  int64_t gemm_min_tokens;
  // CUDA, 16-bit activations: from this many tokens (below gemm_min_tokens, or under a CUDA graph capture) the
  // experts run as mma.sync tiles on tensor cores; 0: never (the CUDA-core kernels). The CPU kernel ignores it.
  int64_t mma_min_tokens;
  // CPU: experts with fewer than four tokens in a step (decode) take int8 dot products of the activations
  // quantized per block of 32 in this many int8 pieces (1, or 2: the value and its remainder, mxfp4_moe_cpu.cc);
  // 0: float. The CUDA kernels ignore it.
  int64_t int8_activations;
  // CUDA tensor-core tiles on Hopper: each warp first asks L2 for all of its rows' codes it will read (bulk
  // prefetch), so its rounds of loads find them there; GATEWAY_MOE_L2_PREFETCH=0: off. Other kernels ignore it.
  bool l2_prefetch;
  // CUDA tensor-core tiles: the parts of K a step splits into, as a tuned variant says (moe_variants.h); 0: the
  // built-in rule (kMmaSplits for steps of few choices, else none). Other kernels ignore it.
  int64_t mma_splits;
};

constexpr int64_t kDefaultGemmMinTokens = 128;  // above the largest decode batch a CUDA graph captures
// every decode step: on an H200 the tiles ran a 20b layer faster than the CUDA-core kernels at 1 token too (145.5
// against 177.9 µs a session run) and at 8 (420.5 against 903.6; docs/benchmarks.md, engine_check's kernel step)
constexpr int64_t kDefaultMmaMinTokens = 1;

constexpr int64_t kMaxTopK = 8;
constexpr int64_t kMaxExperts = 1024;

// Turns the GEMM path off while `stream` (a cudaStream_t) is being captured into a CUDA graph: that path reads
// the experts' row counts back to the host, which a capture cannot wait for. Call before MoeWorkspaceBytes.
void KeepMoeOnDevice(MoeArgs& args, void* stream);

// Device scratch the CUDA launcher needs for these arguments (the caller allocates it).
size_t MoeWorkspaceBytes(const MoeArgs& args);

// Runs the layer on `stream` (a cudaStream_t) with `workspace` of MoeWorkspaceBytes; returns a CUDA error
// string, or nullptr.
const char* LaunchMoe(const MoeArgs& args, void* workspace, void* stream);

}  // namespace gptoss
