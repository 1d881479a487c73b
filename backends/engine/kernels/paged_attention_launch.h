// Attention over a paged KV cache as plain data, shared by the CPU kernel and the CUDA launcher (so that nvcc
// never sees the ONNX Runtime headers, and the CUDA file also compiles as host C++ for the emulation tests).
//
// The cache of one layer is `cache_slots` = pages x page_size positions of [kv_heads, head_dim], in the
// activation dtype. A row (a sequence in the step) names its pages in the page table: logical page p (positions
// [p * page_size, (p + 1) * page_size)) is physical page table[row, p]. Each token of the step is first
// written into its row's page at its position (keys rotated, as gpt-oss's YaRN rotary says: half-split, the
// tables carrying the concentration), then attends its row's keys up to its position (the last `window` of
// them when `window` > 0) with the head's learned sink as one more logit in the softmax.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel_dtype.h"

namespace gptoss {

struct AttentionArgs {
  int64_t tokens, rows, table_width;  // T, B, P
  int64_t heads, kv_heads, head_dim;  // H, Hkv, D
  int64_t page_size, cache_slots, max_positions;
  int64_t window;  // 0: every earlier position; else the last `window` positions, the token's own included
  float scale;
  Dtype dtype;
  const void* qkv;           // [T, (H + 2 Hkv) D]: queries, keys, values of the step's tokens
  // [cache_slots, Hkv, D] in and out: the same buffer when bound in place (else the output is copied from the
  // input first, whole)
  const void* key_cache_in;
  const void* value_cache_in;
  void* key_cache;
  void* value_cache;
  const int32_t* positions;  // [T]
  const int32_t* token_rows; // [T]: each token's row in the page table
  const int32_t* page_table; // [B, P]
  const void* cos;           // [max_positions, D / 2]
  const void* sin;           // [max_positions, D / 2]
  const void* sinks;         // [H]
  void* out;                 // [T, H D]
  // CUDA decode steps (a token per row): each token's keys split among blocks of about this many, at most
  // kMaxSplits (flash-decoding: a long context is read by many blocks at once), the parts merged after
  int64_t split_keys;
  // CUDA steps where rows run several tokens: on the tensor cores where the shapes allow (16-bit, 8 query heads
  // per KV head, 64 wide); false (GATEWAY_ATTENTION_MMA=0): on the CUDA cores
  bool tensor_cores;
  float* parts;  // set by the launcher: the workspace of the split parts
};

constexpr int64_t kDefaultSplitKeys = 1024;
constexpr int64_t kMaxSplits = 16;

constexpr int64_t kMaxGroup = 16;     // query heads per KV head
constexpr int64_t kMaxHeadDim = 128;  // and even

// Device scratch the CUDA launcher needs for these arguments (the caller allocates it; 0: none).
size_t AttentionWorkspaceBytes(const AttentionArgs& args);

// Runs the step on `stream` (a cudaStream_t): the writes, then the attention, with `workspace` of
// AttentionWorkspaceBytes; returns a CUDA error string, or nullptr. Page numbers outside the cache read and write
// page 0 (the engine's scratch page).
const char* LaunchPagedAttention(const AttentionArgs& args, void* workspace, void* stream);

}  // namespace gptoss
