// A C entry point over the CUDA kernel file compiled for the host (cuda_shim.h is included first): runs one
// MXFP4 MoE layer on host memory, for the tests to compare with the CPU kernel; from gemm_min_tokens tokens
// (0: never) through the GEMM path, on the shim's host cuBLAS, unless `capturing` stands for a stream being
// captured into a CUDA graph; from mma_min_tokens (0: never) below that, through the mma.sync tiles; `variants`
// (null: none), a tuned table as GATEWAY_MOE_VARIANTS holds it, applied as the ONNX Runtime op applies it.
#include <cstdlib>
#include <vector>

#include "moe_variants.h"
#include "mxfp4_moe_launch.h"

extern "C" const char* gptoss_emulated_moe(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t k,
                                           float limit, float alpha, int dtype, const void* x, const void* logits,
                                           const uint8_t* w1, const uint8_t* s1, const void* b1, const uint8_t* w2,
                                           const uint8_t* s2, const void* b2, void* y, int64_t gemm_min_tokens,
                                           int capturing, int64_t mma_min_tokens, const char* variants) {
  gptoss::MoeArgs a{tokens, hidden, inter, experts, k,  limit, alpha, static_cast<gptoss::Dtype>(dtype),
                    x,      logits, w1,    s1,      b1, w2, s2,    b2,    y,
                    gemm_min_tokens, mma_min_tokens};
  if (variants != nullptr) {
    gptoss::MoeVariants table;
    if (!gptoss::ParseMoeVariants(variants, &table)) return "not a table of variants";
    gptoss::ApplyMoeVariant(a, table);
  }
  void* stream = capturing ? reinterpret_cast<void*>(1) : nullptr;  // the shim: non-null is a capture
  gptoss::KeepMoeOnDevice(a, stream);
  std::vector<unsigned char> workspace(gptoss::MoeWorkspaceBytes(a) + 256);
  void* aligned = workspace.data() + (256 - reinterpret_cast<uintptr_t>(workspace.data()) % 256) % 256;
  return gptoss::LaunchMoe(a, aligned, stream);
}
