// The CUDA MXFP4MoE kernel's ONNX Runtime side: inputs on the device, scratch from ONNX Runtime's
// allocator for the device, launched on ORT's compute stream (so CUDA graph capture sees it).
#include "mxfp4_moe_op.h"

#include <string>

namespace gptoss {

void MoeCudaKernel::Compute(OrtKernelContext* raw_context) {
  Ort::KernelContext context(raw_context);
  MoeArgs args = ReadMoeArgs(context, attributes_);
  if (args.tokens == 0) return;
  void* stream = context.GetGPUComputeStream();
  KeepMoeOnDevice(args, stream);
  Ort::ConstMemoryInfo device = context.GetInput(0).GetTensorMemoryInfo();
  Ort::Allocator allocator = context.GetAllocator(*static_cast<const OrtMemoryInfo*>(device));
  void* workspace = allocator.Alloc(MoeWorkspaceBytes(args));
  // freed before the kernels run: ORT's arena hands memory out in stream order, and this stream is ORT's
  const char* error = LaunchMoe(args, workspace, stream);
  allocator.Free(workspace);
  if (error) ORT_CXX_API_THROW(std::string("MXFP4MoE (CUDA): ") + error, ORT_RUNTIME_EXCEPTION);
}

}  // namespace gptoss
