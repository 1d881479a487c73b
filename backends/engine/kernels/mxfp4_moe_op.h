// gptoss.engine::MXFP4MoE as ONNX Runtime custom ops: the CPU kernel (mxfp4_moe_cpu.cc) and the CUDA one
// (mxfp4_moe_cuda_op.cc, kernels in mxfp4_moe_cuda.cu).
//
// Inputs: x [T,H] f32, router_logits [T,E] f32, w1 [E,2I,H] FLOAT4E2M1, s1 [E,2I,H/32] f32, b1 [E,2I] f32,
// w2 [E,H,I] FLOAT4E2M1, s2 [E,H,I/32] f32, b2 [E,H] f32. Attributes: k, swiglu_limit, activation_alpha.
// Output: y [T,H] f32.
#pragma once

#include <onnxruntime_cxx_api.h>

#include "mxfp4_moe_launch.h"

namespace gptoss {

struct MoeAttributes {
  explicit MoeAttributes(const OrtKernelInfo* info);
  int64_t k;
  float limit;
  float alpha;
};

ONNXTensorElementDataType MoeInputType(size_t index);

// The inputs as pointers and sizes (shapes checked), with the output allocated.
MoeArgs ReadMoeArgs(Ort::KernelContext& context, const MoeAttributes& attributes);

struct MoeKernel {
  MoeKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) : attributes_(info) {}
  void Compute(OrtKernelContext* context);

 private:
  MoeAttributes attributes_;
};

template <typename Kernel>
struct MoeOpBase : Ort::CustomOpBase<MoeOpBase<Kernel>, Kernel> {
  explicit MoeOpBase(const char* provider) : provider_(provider) {}
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "MXFP4MoE"; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return 8; }
  ONNXTensorElementDataType GetInputType(size_t index) const { return MoeInputType(index); }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }

 private:
  const char* provider_;
};

struct MoeCudaKernel {
  MoeCudaKernel(const OrtApi& /*api*/, const OrtKernelInfo* info) : attributes_(info) {}
  void Compute(OrtKernelContext* context);

 private:
  MoeAttributes attributes_;
};

}  // namespace gptoss
