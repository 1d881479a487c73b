// The library's entry point: SessionOptions.register_custom_ops_library() calls RegisterCustomOps.
#include <onnxruntime_cxx_api.h>  // ORT_API_MANUAL_INIT is set for every unit by the build

#include "mxfp4_moe_op.h"

namespace {
constexpr const char* kDomain = "gptoss.engine";
}

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  static gptoss::MoeOpBase<gptoss::MoeKernel> cpu_op("CPUExecutionProvider");
#ifdef GPTOSS_WITH_CUDA
  static gptoss::MoeOpBase<gptoss::MoeCudaKernel> cuda_op("CUDAExecutionProvider");
#endif
  static Ort::CustomOpDomain domain{nullptr};
  OrtStatus* status = nullptr;
  try {
    if (!domain) {
      domain = Ort::CustomOpDomain(kDomain);
      domain.Add(&cpu_op);
#ifdef GPTOSS_WITH_CUDA
      domain.Add(&cuda_op);
#endif
    }
    Ort::UnownedSessionOptions(options).Add(domain);
  } catch (const Ort::Exception& error) {
    status = Ort::GetApi().CreateStatus(error.GetOrtErrorCode(), error.what());
  }
  return status;
}
