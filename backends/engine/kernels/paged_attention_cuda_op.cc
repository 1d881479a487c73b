// The CUDA PagedAttention kernel's ONNX Runtime side: inputs on the device, launched on ORT's compute stream (so
// CUDA graph capture sees it).
#include <string>

#include "paged_attention_op.h"

namespace gptoss {

void AttentionCudaKernel::Compute(OrtKernelContext* raw_context) {
  Ort::KernelContext context(raw_context);
  const AttentionArgs args = ReadAttentionArgs(context, attributes_);
  const char* error = LaunchPagedAttention(args, context.GetGPUComputeStream());
  if (error) ORT_CXX_API_THROW(std::string("PagedAttention (CUDA): ") + error, ORT_RUNTIME_EXCEPTION);
}

}  // namespace gptoss
