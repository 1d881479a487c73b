// gptoss.engine::MXFP4MoE as ONNX Runtime custom ops: the CPU kernel (mxfp4_moe_cpu.cc) and the CUDA one
// (mxfp4_moe_cuda_op.cc, kernels in mxfp4_moe_cuda.cu), each registered for float, fp16 and bf16.
//
// Inputs: x [..., H] T (T tokens in all), router_logits [..., E] T, w1 [E,2I,H] FLOAT4E2M1, s1 [E,2I,H/32] uint8 (E8M0), b1 [E,2I] T,
// w2 [E,H,I] FLOAT4E2M1, s2 [E,H,I/32] uint8, b2 [E,H] T. Attributes: k, swiglu_limit, activation_alpha,
// int8_activations (optional, CPU: see mxfp4_moe_cpu.cc).
// Output: y, x's shape, T.
#pragma once

#include <onnxruntime_cxx_api.h>

#include "mxfp4_moe_launch.h"
#include "moe_variants.h"

namespace gptoss {

struct MoeAttributes {
  explicit MoeAttributes(const OrtKernelInfo* info);
  int64_t k;
  float limit;
  float alpha;
  int64_t gemm_min_tokens;  // GATEWAY_MOE_GEMM_MIN_TOKENS, else kDefaultGemmMinTokens
  int64_t mma_min_tokens;   // GATEWAY_MOE_MMA_MIN_TOKENS, else kDefaultMmaMinTokens
  int64_t int8_activations;  // the node's int8_activations: 0 (also when absent), 1 or 2 (pieces)
  bool l2_prefetch;         // GATEWAY_MOE_L2_PREFETCH: "0" off, else on
  MoeVariants variants;     // GATEWAY_MOE_VARIANTS (moe_variants.h): the CUDA path by step size, else none
};

ONNXTensorElementDataType MoeInputType(size_t index, ONNXTensorElementDataType activation);

// The inputs as pointers and sizes (shapes and types checked), with the output allocated.
MoeArgs ReadMoeArgs(Ort::KernelContext& context, const MoeAttributes& attributes);

struct MoeKernel {
  MoeKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) : attributes_(info) {}
  void Compute(OrtKernelContext* context);

 private:
  MoeAttributes attributes_;
};

struct MoeCudaKernel {
  MoeCudaKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) : attributes_(info) {}
  void Compute(OrtKernelContext* context);

 private:
  MoeAttributes attributes_;
};

template <typename Kernel>
struct MoeOpBase : Ort::CustomOpBase<MoeOpBase<Kernel>, Kernel> {
  MoeOpBase(const char* provider, ONNXTensorElementDataType activation)
      : provider_(provider), activation_(activation) {}
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "MXFP4MoE"; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return 8; }
  ONNXTensorElementDataType GetInputType(size_t index) const { return MoeInputType(index, activation_); }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return activation_; }

 private:
  const char* provider_;
  ONNXTensorElementDataType activation_;
};

}  // namespace gptoss
