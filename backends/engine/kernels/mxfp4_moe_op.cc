// What both MXFP4MoE kernels share: attributes, input types, and reading the inputs.
#include "mxfp4_moe_op.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "ort_dtype.h"

namespace gptoss {

MoeAttributes::MoeAttributes(const OrtKernelInfo* info) {
  Ort::ConstKernelInfo kernel_info(info);
  k = kernel_info.GetAttribute<int64_t>("k");
  limit = kernel_info.GetAttribute<float>("swiglu_limit");
  alpha = kernel_info.GetAttribute<float>("activation_alpha");
  try {
    int8_activations = kernel_info.GetAttribute<int64_t>("int8_activations");
  } catch (const Ort::Exception&) {  // not on the node: float activations
    int8_activations = 0;
  }
  if (int8_activations < 0 || int8_activations > 2) {
    ORT_CXX_API_THROW("MXFP4MoE: int8_activations is 0, 1 or 2", ORT_INVALID_ARGUMENT);
  }
  const char* gemm = std::getenv("GATEWAY_MOE_GEMM_MIN_TOKENS");
  gemm_min_tokens = gemm && *gemm ? std::strtoll(gemm, nullptr, 10) : kDefaultGemmMinTokens;
  const char* mma = std::getenv("GATEWAY_MOE_MMA_MIN_TOKENS");
  mma_min_tokens = mma && *mma ? std::strtoll(mma, nullptr, 10) : kDefaultMmaMinTokens;
  const char* prefetch = std::getenv("GATEWAY_MOE_L2_PREFETCH");
  l2_prefetch = !(prefetch && std::string(prefetch) == "0");
  const char* tuned = std::getenv("GATEWAY_MOE_VARIANTS");
  if (tuned && !ParseMoeVariants(tuned, &variants)) {
    ORT_CXX_API_THROW(std::string("MXFP4MoE: GATEWAY_MOE_VARIANTS is not a list of TOKENS=cores|tiles/SPLITS|gemm "
                                  "entries, bounds increasing, separated by ';': ") + std::string(tuned).substr(0, 200),
                      ORT_INVALID_ARGUMENT);
  }
}

ONNXTensorElementDataType MoeInputType(size_t index, ONNXTensorElementDataType activation) {
  switch (index) {
    case 2:
    case 5:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT4E2M1;
    case 3:
    case 6:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    default:
      return activation;
  }
}

MoeArgs ReadMoeArgs(Ort::KernelContext& context, const MoeAttributes& attributes) {
  constexpr int64_t kBlock = 32;
  const auto x = context.GetInput(0);
  const auto w1 = context.GetInput(2);
  const auto w2 = context.GetInput(5);
  const auto x_info = x.GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> x_shape = x_info.GetShape();
  const std::vector<int64_t> w1_shape = w1.GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> w2_shape = w2.GetTensorTypeAndShapeInfo().GetShape();
  if (x_shape.size() < 2 || w1_shape.size() != 3 || w2_shape.size() != 3) {
    ORT_CXX_API_THROW("MXFP4MoE: x must be [..., H] and the weights [E, N, K]", ORT_INVALID_ARGUMENT);
  }
  MoeArgs a{};
  a.dtype = ToDtype(x_info.GetElementType(), "MXFP4MoE");
  a.tokens = 1;
  for (size_t i = 0; i + 1 < x_shape.size(); ++i) a.tokens *= x_shape[i];
  a.hidden = x_shape.back();
  a.experts = w1_shape[0];
  a.inter = w2_shape[2];
  a.k = attributes.k;
  a.limit = attributes.limit;
  a.alpha = attributes.alpha;
  a.gemm_min_tokens = attributes.gemm_min_tokens;
  a.mma_min_tokens = attributes.mma_min_tokens;
  a.int8_activations = attributes.int8_activations;
  a.l2_prefetch = attributes.l2_prefetch;
  ApplyMoeVariant(a, attributes.variants);  // after the tokens are known
  if (w1_shape[1] != 2 * a.inter || w1_shape[2] != a.hidden || w2_shape[0] != a.experts || w2_shape[1] != a.hidden ||
      a.hidden % kBlock || a.inter % kBlock || a.k < 1 || a.k > a.experts || a.k > kMaxTopK ||
      a.experts > kMaxExperts) {
    ORT_CXX_API_THROW("MXFP4MoE: inconsistent shapes, or k outside 1..min(8, experts), or over 1024 experts",
                      ORT_INVALID_ARGUMENT);
  }
  const auto logits = context.GetInput(1);
  if (logits.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(a.tokens * a.experts)) {
    ORT_CXX_API_THROW("MXFP4MoE: router_logits must hold one row of E logits per token", ORT_INVALID_ARGUMENT);
  }
  a.x = x.GetTensorRawData();
  a.logits = logits.GetTensorRawData();
  a.w1 = static_cast<const uint8_t*>(w1.GetTensorRawData());
  a.s1 = static_cast<const uint8_t*>(context.GetInput(3).GetTensorRawData());
  a.b1 = context.GetInput(4).GetTensorRawData();
  a.w2 = static_cast<const uint8_t*>(w2.GetTensorRawData());
  a.s2 = static_cast<const uint8_t*>(context.GetInput(6).GetTensorRawData());
  a.b2 = context.GetInput(7).GetTensorRawData();
  a.y = context.GetOutput(0, x_shape).GetTensorMutableRawData();
  return a;
}

}  // namespace gptoss
