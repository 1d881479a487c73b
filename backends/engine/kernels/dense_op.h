// gptoss.engine::DenseBF16 and DenseInt8 as ONNX Runtime custom ops on the CPU (dense_cpu.cc): y = x . w^T, with
// x [..., K] float, w [N, K] (rows of K, as gpt-oss checkpoints store their dense weights), y [..., N] float.
// DenseBF16: w in bfloat16, each value widened to float exactly as it is read, so the products are those of a
// float32 MatMul over the same values, at half the bytes read per step. DenseInt8: w in int8 with a float scale
// per row ([N]): y[n] = scale[n] * (x . w[n]), a quarter of the bytes.
#pragma once

#include <onnxruntime_cxx_api.h>

namespace gptoss {

struct DenseBf16Kernel {
  DenseBf16Kernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}
  void Compute(OrtKernelContext* context);
};

struct DenseInt8Kernel {
  DenseInt8Kernel(const OrtApi& /*api*/, const OrtKernelInfo* /*info*/) {}
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

struct DenseInt8Op : Ort::CustomOpBase<DenseInt8Op, DenseInt8Kernel> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new DenseInt8Kernel(api, info); }
  const char* GetName() const { return "DenseInt8"; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace gptoss
