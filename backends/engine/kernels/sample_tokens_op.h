// gptoss.engine::SampleTokens as ONNX Runtime custom ops, on the CPU (sample_tokens_cpu.cc) and on CUDA
// (sample_tokens_cuda.cu): each sequence's next token from its logits row, so that on a GPU only token ids
// (and the logprobs asked for) cross to the host.
//
// Inputs: logits [N, V] float, rows [R] int32, temperature [R] float, top_p [R] float, uniform [R] float,
// mask_index [R] int32, masks [M, W] int32 (bit i of word i / 32: token i allowed; W * 32 >= V unless M = 0),
// penalty_ids [R, P] int32 (ascending, padded with 2^31 - 1), penalty_values [R, P] float, logprobs [R] int32
// (-1: none, else how many alternatives), top [1] int64 (K, at most 20; host memory on every device).
// Outputs: token [R] int64, logprob [R] float, top_ids [R, K] int32, top_logprobs [R, K] float.
#pragma once

#include <onnxruntime_cxx_api.h>

#include "sample_tokens_launch.h"

namespace gptoss {

// The inputs as pointers and sizes (shapes checked), with the outputs allocated.
SampleArgs ReadSampleArgs(Ort::KernelContext& context);

ONNXTensorElementDataType SampleInputType(size_t index);
ONNXTensorElementDataType SampleOutputType(size_t index);

struct SampleCpuKernel {
  SampleCpuKernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}
  void Compute(OrtKernelContext* context);
};

struct SampleCudaKernel {
  SampleCudaKernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}
  void Compute(OrtKernelContext* context);
};

constexpr size_t kSampleTopInput = 10;

template <typename Kernel>
struct SampleOpBase : Ort::CustomOpBase<SampleOpBase<Kernel>, Kernel> {
  explicit SampleOpBase(const char* provider) : provider_(provider) {}
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel(api, info); }
  const char* GetName() const { return "SampleTokens"; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return 11; }
  ONNXTensorElementDataType GetInputType(size_t index) const { return SampleInputType(index); }
  OrtMemType GetInputMemoryType(size_t index) const {
    return index == kSampleTopInput ? OrtMemTypeCPUInput : OrtMemTypeDefault;  // K shapes the outputs
  }
  size_t GetOutputTypeCount() const { return 4; }
  ONNXTensorElementDataType GetOutputType(size_t index) const { return SampleOutputType(index); }

 private:
  const char* provider_;
};

}  // namespace gptoss
