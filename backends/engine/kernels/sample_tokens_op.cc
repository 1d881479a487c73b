// What both SampleTokens kernels share (input and output types, reading the inputs), and each one's Compute.
#include "sample_tokens_op.h"

#include <string>
#include <vector>

namespace gptoss {

ONNXTensorElementDataType SampleInputType(size_t index) {
  switch (index) {
    case 0:
    case 2:
    case 3:
    case 4:
    case 8:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case kSampleTopInput:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    default:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  }
}

ONNXTensorElementDataType SampleOutputType(size_t index) {
  switch (index) {
    case 0:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case 2:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    default:
      return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

namespace {

[[noreturn]] void Invalid(const std::string& message) {
  ORT_CXX_API_THROW("SampleTokens: " + message, ORT_INVALID_ARGUMENT);
}

std::vector<int64_t> Shape(Ort::KernelContext& context, size_t index) {
  return context.GetInput(index).GetTensorTypeAndShapeInfo().GetShape();
}

}  // namespace

SampleArgs ReadSampleArgs(Ort::KernelContext& context) {
  const std::vector<int64_t> logits = Shape(context, 0), masks = Shape(context, 6), penalties = Shape(context, 7);
  if (logits.size() != 2) Invalid("logits must be [N, V]");
  SampleArgs a{};
  a.logits_rows = logits[0];
  a.vocab = logits[1];
  a.rows = Shape(context, 1).size() == 1 ? Shape(context, 1)[0] : -1;
  for (size_t index : {2, 3, 4, 5, 9}) {
    const std::vector<int64_t> shape = Shape(context, index);
    if (shape.size() != 1 || shape[0] != a.rows) Invalid("rows, temperature, top_p, uniform, mask_index and logprobs must be [R]");
  }
  if (masks.size() != 2 || (masks[0] > 0 && masks[1] * 32 < a.vocab)) Invalid("masks must be [M, W] with W * 32 >= V");
  if (penalties.size() != 2 || penalties[0] != a.rows || Shape(context, 8) != penalties) {
    Invalid("penalty_ids and penalty_values must both be [R, P]");
  }
  const auto top = context.GetInput(kSampleTopInput);
  if (top.GetTensorTypeAndShapeInfo().GetElementCount() != 1) Invalid("top must hold one value");
  a.top = top.GetTensorData<int64_t>()[0];
  if (a.top < 0 || a.top > kMaxTopLogprobs) Invalid("top must be 0..20");
  a.mask_count = masks[0];
  a.mask_words = masks[1];
  a.penalties = penalties[1];
  a.logits = context.GetInput(0).GetTensorData<float>();
  a.row = context.GetInput(1).GetTensorData<int32_t>();
  a.temperature = context.GetInput(2).GetTensorData<float>();
  a.top_p = context.GetInput(3).GetTensorData<float>();
  a.uniform = context.GetInput(4).GetTensorData<float>();
  a.mask_index = context.GetInput(5).GetTensorData<int32_t>();
  a.masks = reinterpret_cast<const uint32_t*>(context.GetInput(6).GetTensorData<int32_t>());
  a.penalty_ids = context.GetInput(7).GetTensorData<int32_t>();
  a.penalty_values = context.GetInput(8).GetTensorData<float>();
  a.logprobs = context.GetInput(9).GetTensorData<int32_t>();
  const std::vector<int64_t> rows{a.rows}, table{a.rows, a.top};
  a.token = context.GetOutput(0, rows).GetTensorMutableData<int64_t>();
  a.logprob = context.GetOutput(1, rows).GetTensorMutableData<float>();
  a.top_ids = context.GetOutput(2, table).GetTensorMutableData<int32_t>();
  a.top_logprobs = context.GetOutput(3, table).GetTensorMutableData<float>();
  return a;
}

namespace {

void SampleTask(void* args, size_t r) { SampleRowCpu(*static_cast<const SampleArgs*>(args), static_cast<int64_t>(r)); }

}  // namespace

void SampleCpuKernel::Compute(OrtKernelContext* raw_context) {
  Ort::KernelContext context(raw_context);
  SampleArgs args = ReadSampleArgs(context);
  const auto rows = static_cast<size_t>(args.rows);
  if (rows > 0) context.ParallelFor(SampleTask, rows, rows, &args);  // a row per batch: rows cost the same
}

#ifdef GPTOSS_WITH_CUDA
void SampleCudaKernel::Compute(OrtKernelContext* raw_context) {
  Ort::KernelContext context(raw_context);
  const SampleArgs args = ReadSampleArgs(context);
  const char* error = LaunchSampleTokens(args, context.GetGPUComputeStream());
  if (error) ORT_CXX_API_THROW(std::string("SampleTokens (CUDA): ") + error, ORT_RUNTIME_EXCEPTION);
}
#endif

}  // namespace gptoss
