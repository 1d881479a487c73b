// A C entry point over the SampleTokens CUDA kernel file compiled for the host (cuda_shim.h is included
// first): samples rows of host memory, for the tests to compare with the CPU kernel.
#include "sample_tokens_launch.h"

extern "C" const char* gptoss_emulated_sample(int64_t rows, int64_t vocab, int64_t logits_rows, const float* logits, const int32_t* row,
                                              const float* temperature, const float* top_p, const float* uniform,
                                              const int32_t* mask_index, const uint32_t* masks, int64_t mask_count,
                                              int64_t mask_words, const int32_t* penalty_ids,
                                              const float* penalty_values, int64_t penalties, const int32_t* logprobs,
                                              int64_t top, int64_t* token, float* logprob, int32_t* top_ids,
                                              float* top_logprobs) {
  const gptoss::SampleArgs args{rows,       vocab,      logits_rows, logits,   row,         temperature,    top_p,
                                uniform,    mask_index, masks,    mask_count,  mask_words,     penalty_ids,
                                penalty_values, penalties, logprobs, top,       token,          logprob,
                                top_ids,    top_logprobs};
  return gptoss::LaunchSampleTokens(args, nullptr);
}
