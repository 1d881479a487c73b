// The library's entry point: SessionOptions.register_custom_ops_library() calls RegisterCustomOps.
#include <onnxruntime_cxx_api.h>  // ORT_API_MANUAL_INIT is set for every unit by the build

#include "dense_op.h"
#include "mxfp4_moe_op.h"
#include "paged_attention_op.h"
#include "sample_tokens_op.h"

namespace {
constexpr const char* kDomain = "gptoss.engine";
constexpr ONNXTensorElementDataType kFloat = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kHalf = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kBFloat = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
constexpr const char* kCpu = "CPUExecutionProvider";
}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  using CpuOp = gptoss::MoeOpBase<gptoss::MoeKernel>;
  static CpuOp cpu_ops[] = {CpuOp(kCpu, kFloat), CpuOp(kCpu, kHalf), CpuOp(kCpu, kBFloat)};
  static gptoss::SampleOpBase<gptoss::SampleCpuKernel> cpu_sample(kCpu);
  static gptoss::DenseBf16Op cpu_dense;
  static gptoss::DenseInt8Op cpu_dense_int8;
  using CpuAttention = gptoss::AttentionOpBase<gptoss::AttentionKernel>;
  static CpuAttention cpu_attention[] = {CpuAttention(kCpu, kFloat), CpuAttention(kCpu, kHalf),
                                         CpuAttention(kCpu, kBFloat)};
#ifdef GPTOSS_WITH_CUDA
  using CudaOp = gptoss::MoeOpBase<gptoss::MoeCudaKernel>;
  constexpr const char* kCuda = "CUDAExecutionProvider";
  static CudaOp cuda_ops[] = {CudaOp(kCuda, kFloat), CudaOp(kCuda, kHalf), CudaOp(kCuda, kBFloat)};
  static gptoss::SampleOpBase<gptoss::SampleCudaKernel> cuda_sample(kCuda);
  using CudaAttention = gptoss::AttentionOpBase<gptoss::AttentionCudaKernel>;
  static CudaAttention cuda_attention[] = {CudaAttention(kCuda, kFloat), CudaAttention(kCuda, kHalf),
                                           CudaAttention(kCuda, kBFloat)};
#endif
  static Ort::CustomOpDomain domain{nullptr};
  OrtStatus* status = nullptr;
  try {
    if (!domain) {
      domain = Ort::CustomOpDomain(kDomain);
      for (auto& op : cpu_ops) domain.Add(&op);
      domain.Add(&cpu_sample);
      domain.Add(&cpu_dense);
      domain.Add(&cpu_dense_int8);
      for (auto& op : cpu_attention) domain.Add(&op);
#ifdef GPTOSS_WITH_CUDA
      for (auto& op : cuda_ops) domain.Add(&op);
      domain.Add(&cuda_sample);
      for (auto& op : cuda_attention) domain.Add(&op);
#endif
    }
    Ort::UnownedSessionOptions(options).Add(domain);
  } catch (const Ort::Exception& error) {
    status = Ort::GetApi().CreateStatus(error.GetOrtErrorCode(), error.what());
  }
  return status;
}
