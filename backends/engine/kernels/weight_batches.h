// How a kernel that streams weights (a decode step) splits its tasks over ONNX Runtime's intra-op threads: in
// batches of consecutive tasks, each reading about kBatchBytes of consecutive weights. Threads that take small
// interleaved tasks read memory in short runs, which stream slower than long ones, so a batch is the unit a
// thread takes.
#pragma once

#include <algorithm>
#include <cstddef>

namespace gptoss {

constexpr size_t kBatchBytes = size_t{1} << 20;

// num_batch for KernelContext::ParallelFor: `tasks` tasks reading `bytes` of weights in all, in batches of
// about kBatchBytes (at least one; never more batches than tasks).
inline size_t WeightBatches(size_t tasks, size_t bytes) {
  return std::clamp<size_t>(bytes / kBatchBytes, 1, std::max<size_t>(tasks, 1));
}

}  // namespace gptoss
