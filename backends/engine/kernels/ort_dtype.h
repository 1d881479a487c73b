// The activation dtype (kernel_dtype.h) of an ONNX Runtime tensor type, for the ops' input readers (kept apart
// from kernel_dtype.h, which the CUDA files include without the ONNX Runtime headers).
#pragma once

#include <onnxruntime_cxx_api.h>

#include <string>

#include "kernel_dtype.h"

namespace gptoss {

// float, float16 or bfloat16; else an invalid-argument error naming `op`.
inline Dtype ToDtype(ONNXTensorElementDataType type, const char* op) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
      return Dtype::kFloat32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
      return Dtype::kFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      return Dtype::kBFloat16;
    default:
      ORT_CXX_API_THROW(std::string(op) + ": activations must be float, float16 or bfloat16", ORT_INVALID_ARGUMENT);
  }
}

}  // namespace gptoss
