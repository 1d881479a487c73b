// The CUDA launcher's interface: plain data, so that nvcc never sees the ONNX Runtime headers.
#pragma once

#include <cstdint>

namespace gptoss {

struct MoeArgs {
  int64_t tokens, hidden, inter, experts, k;
  float limit, alpha;
  const float* x;       // [T, H]
  const float* logits;  // [T, E]
  const uint8_t* w1;    // [E, 2I, H/2] packed FLOAT4E2M1
  const float* s1;      // [E, 2I, H/32]
  const float* b1;      // [E, 2I]
  const uint8_t* w2;    // [E, H, I/2]
  const float* s2;      // [E, H, I/32]
  const float* b2;      // [E, H]
  float* y;             // [T, H]
};

constexpr int64_t kMaxCudaTopK = 8;

// Runs the layer on `stream` (a cudaStream_t); returns a CUDA error string, or nullptr.
const char* LaunchMoe(const MoeArgs& args, void* stream);

}  // namespace gptoss
