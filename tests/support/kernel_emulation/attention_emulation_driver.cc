// A C entry point over the PagedAttention CUDA kernel file compiled for the host (cuda_shim.h is included first):
// one step at gpt-oss's attention heads (64 query, 8 KV, 64 wide) in `dtype` (gptoss::Dtype: 0 float32, 1 fp16,
// 2 bf16; every array but the int32 ones in it) on caches in host memory, updated in place, decode steps' keys
// split among blocks of about `split_keys` (0: none), several-token rows on the tensor cores where
// `tensor_cores` and the dtype allow, for the tests to compare with the reference.
#include <cmath>
#include <vector>

#include "attention_splits.h"
#include "paged_attention_launch.h"

extern "C" const char* gptoss_emulated_attention(const void* qkv, void* keys, void* values, const int32_t* positions,
                                                 const int32_t* rows, const int32_t* table, const void* cos,
                                                 const void* sin, const void* sinks, void* out, int64_t tokens,
                                                 int64_t table_rows, int64_t table_width, int64_t slots,
                                                 int64_t max_positions, int64_t window, int64_t page_size,
                                                 int64_t split_keys, int dtype, int tensor_cores) {
  gptoss::AttentionArgs a{};
  a.tokens = tokens;
  a.rows = table_rows;
  a.table_width = table_width;
  a.heads = 64;
  a.kv_heads = 8;
  a.head_dim = 64;
  a.page_size = page_size;
  a.cache_slots = slots;
  a.max_positions = max_positions;
  a.window = window;
  a.scale = 1.0f / std::sqrt(64.0f);
  a.dtype = static_cast<gptoss::Dtype>(dtype);
  a.tensor_cores = tensor_cores != 0;
  a.qkv = qkv;
  a.key_cache_in = keys;
  a.value_cache_in = values;
  a.key_cache = keys;
  a.value_cache = values;
  a.positions = positions;
  a.token_rows = rows;
  a.page_table = table;
  a.cos = cos;
  a.sin = sin;
  a.sinks = sinks;
  a.out = out;
  a.split_keys = split_keys;
  std::vector<unsigned char> workspace(gptoss::AttentionWorkspaceBytes(a));
  return gptoss::LaunchPagedAttention(a, workspace.data(), nullptr);
}

// The keys per split part a decode step of `rows` rows takes under the GATEWAY_ATTENTION_SPLITS text `table` (as
// the op reads it when a session makes its kernel), or -1 where the op would refuse the text.
extern "C" int64_t gptoss_split_keys_for(const char* table, int64_t rows) {
  gptoss::AttentionSplits splits;
  if (!gptoss::ParseAttentionSplits(table, &splits)) return -1;
  return gptoss::SplitKeysFor(rows, splits, gptoss::kDefaultSplitKeys);
}
