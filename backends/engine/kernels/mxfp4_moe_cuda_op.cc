// The CUDA MXFP4MoE kernel's ONNX Runtime side: inputs on the device, launched on ORT's compute stream.
#include "mxfp4_moe_op.h"

namespace gptoss {

void MoeCudaKernel::Compute(OrtKernelContext* raw_context) {
  Ort::KernelContext context(raw_context);
  const MoeArgs args = ReadMoeArgs(context, attributes_);
  if (args.k > kMaxCudaTopK) ORT_CXX_API_THROW("MXFP4MoE (CUDA): k above 8", ORT_INVALID_ARGUMENT);
  if (const char* error = LaunchMoe(args, context.GetGPUComputeStream())) {
    ORT_CXX_API_THROW(std::string("MXFP4MoE (CUDA): ") + error, ORT_RUNTIME_EXCEPTION);
  }
}

}  // namespace gptoss
