// The CUDA PagedAttention kernel's ONNX Runtime side: inputs on the device, launched on ORT's compute stream (so
// CUDA graph capture sees it).
#include <string>

#include "paged_attention_op.h"

namespace gptoss {

void AttentionCudaKernel::Compute(OrtKernelContext* raw_context) {
  Ort::KernelContext context(raw_context);
  const AttentionArgs args = ReadAttentionArgs(context, attributes_);
  const size_t bytes = AttentionWorkspaceBytes(args);
  void* workspace = nullptr;
  Ort::ConstMemoryInfo device = context.GetInput(0).GetTensorMemoryInfo();
  Ort::Allocator allocator = context.GetAllocator(*static_cast<const OrtMemoryInfo*>(device));
  if (bytes) workspace = allocator.Alloc(bytes);
  // freed before the kernels run: ORT's arena hands memory out in stream order, and this stream is ORT's
  const char* error = LaunchPagedAttention(args, workspace, context.GetGPUComputeStream());
  if (workspace) allocator.Free(workspace);
  if (error) ORT_CXX_API_THROW(std::string("PagedAttention (CUDA): ") + error, ORT_RUNTIME_EXCEPTION);
}

}  // namespace gptoss
