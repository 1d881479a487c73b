// gptoss.engine::DenseBF16 as an ONNX Runtime custom op on the CPU (dense_bf16_cpu.cc): y = x . w^T, with x
// [..., K] float, w [N, K] bfloat16 (rows of K, as gpt-oss checkpoints store their dense weights), y [..., N]
// float. The weights stay in their 16 bits: each is widened to float exactly as it is read, so the products
// are those of a float32 MatMul over the same values, at half the bytes read per step.
#pragma once

#include <onnxruntime_cxx_api.h>

namespace gptoss {

struct DenseBf16Kernel {
  DenseBf16Kernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}
  void Compute(OrtKernelContext* context);
};

struct DenseBf16Op : Ort::CustomOpBase<DenseBf16Op, DenseBf16Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new DenseBf16Kernel(api, info); }
  const char* GetName() const { return "DenseBF16"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace gptoss
