// Choosing each sequence's next token from its logits row as plain data, shared by the CPU kernel
// (sample_tokens_cpu.cc) and the CUDA launcher (sample_tokens_cuda.cu), so that nvcc never sees the ONNX
// Runtime headers and the CUDA file also compiles as host C++ for the emulation tests.
//
// Per sampled row r (logits row rows[r]), the arithmetic every realization follows (backends/engine/sampler.py
// is its reference):
// 1. z_i = logits_i - penalty_i in float32, -inf where the row's mask (bit i of its mask row) forbids i.
// 2. m = max z; the greedy token is the lowest i with z_i = m.
// 3. logprobs[r] >= 0: the chosen token's z - m - log(sum exp(z_i - m)) (exp in float32, the sum in double),
//    and the logprobs[r] largest z (lowest index first among equals, -inf never) likewise.
// 4. temperature <= 0: the greedy token. Else e_i = expf((z_i - m) * (1 / temperature)) and S = sum e (double);
//    with top_p < 1 the nucleus is the largest tau such that the mass of {e >= tau} reaches top_p * S, keeping
//    every e > tau and the lowest-index n of the e = tau, n the fewest that reach it; the token is the first
//    index (in index order) where the running kept mass passes uniform * kept mass (else the last kept index).
// A row whose every token is masked, or whose logits row is outside the logits, gets token -1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gptoss {

constexpr int32_t kNoPenalty = 0x7fffffff;  // penalty_ids padding: sorts after every token id
constexpr int64_t kMaxTopLogprobs = 20;

struct SampleArgs {
  int64_t rows;                  // R: rows sampled
  int64_t vocab;                 // V
  int64_t logits_rows;           // N
  const float* logits;           // [N, V]
  const int32_t* row;            // [R]: each sampled row's row of logits (outside [0, N): token -1)
  const float* temperature;      // [R]
  const float* top_p;            // [R]
  const float* uniform;          // [R] in [0, 1)
  const int32_t* mask_index;     // [R]: its row of masks, or -1 (none; so is an index past mask_count)
  const uint32_t* masks;         // [M, mask_words]: bit i of word i / 32 set where token i is allowed
  int64_t mask_count, mask_words;
  const int32_t* penalty_ids;    // [R, penalties]: ascending, padded with kNoPenalty
  const float* penalty_values;   // [R, penalties]: subtracted from the logit of the token beside it
  int64_t penalties;
  const int32_t* logprobs;       // [R]: -1 none, else how many alternatives (at most `top`)
  int64_t top;                   // K: columns of the top outputs
  int64_t* token;                // [R]
  float* logprob;                // [R] (0 where not asked)
  int32_t* top_ids;              // [R, K]: -1 past a row's count or its finite logits
  float* top_logprobs;           // [R, K]: -inf where top_ids is -1
};

// The CPU realization of sampled row r (rows are independent: the op runs them on ONNX Runtime's thread pool).
void SampleRowCpu(const SampleArgs& args, int64_t r);

// The CUDA realization: one block per sampled row on `stream` (a cudaStream_t); a CUDA error string or nullptr.
const char* LaunchSampleTokens(const SampleArgs& args, void* stream);

}  // namespace gptoss
