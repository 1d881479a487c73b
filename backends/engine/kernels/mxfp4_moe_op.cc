// What both MXFP4MoE kernels share: attributes, input types, and reading the inputs.
#include "mxfp4_moe_op.h"

#include <vector>

namespace gptoss {

MoeAttributes::MoeAttributes(const OrtKernelInfo* info) {
  Ort::ConstKernelInfo kernel_info(info);
  k = kernel_info.GetAttribute<int64_t>("k");
  limit = kernel_info.GetAttribute<float>("swiglu_limit");
  alpha = kernel_info.GetAttribute<float>("activation_alpha");
}

ONNXTensorElementDataType MoeInputType(size_t index) {
  return index == 2 || index == 5 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT4E2M1 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

MoeArgs ReadMoeArgs(Ort::KernelContext& context, const MoeAttributes& attributes) {
  constexpr int64_t kBlock = 32;
  const auto x = context.GetInput(0);
  const auto w1 = context.GetInput(2);
  const auto w2 = context.GetInput(5);
  const std::vector<int64_t> x_shape = x.GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> w1_shape = w1.GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> w2_shape = w2.GetTensorTypeAndShapeInfo().GetShape();
  if (x_shape.size() != 2 || w1_shape.size() != 3 || w2_shape.size() != 3) {
    ORT_CXX_API_THROW("MXFP4MoE: x must be [T, H] and the weights [E, N, K]", ORT_INVALID_ARGUMENT);
  }
  MoeArgs a{};
  a.tokens = x_shape[0];
  a.hidden = x_shape[1];
  a.experts = w1_shape[0];
  a.inter = w2_shape[2];
  a.k = attributes.k;
  a.limit = attributes.limit;
  a.alpha = attributes.alpha;
  if (w1_shape[1] != 2 * a.inter || w1_shape[2] != a.hidden || w2_shape[0] != a.experts || w2_shape[1] != a.hidden ||
      a.hidden % kBlock || a.inter % kBlock || a.k < 1 || a.k > a.experts) {
    ORT_CXX_API_THROW("MXFP4MoE: inconsistent shapes or k", ORT_INVALID_ARGUMENT);
  }
  a.x = x.GetTensorData<float>();
  a.logits = context.GetInput(1).GetTensorData<float>();
  a.w1 = static_cast<const uint8_t*>(w1.GetTensorRawData());
  a.s1 = context.GetInput(3).GetTensorData<float>();
  a.b1 = context.GetInput(4).GetTensorData<float>();
  a.w2 = static_cast<const uint8_t*>(w2.GetTensorRawData());
  a.s2 = context.GetInput(6).GetTensorData<float>();
  a.b2 = context.GetInput(7).GetTensorData<float>();
  a.y = context.GetOutput(0, x_shape).GetTensorMutableData<float>();
  return a;
}

}  // namespace gptoss
