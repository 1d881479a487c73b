// gptoss.engine::PagedAttention on the CPU execution provider, in the activation dtype (float, fp16, bf16), float
// arithmetic throughout.
//
// First every token of the step writes its key (rotated) and value into its row's page, spread over tokens on
// ONNX Runtime's intra-op thread pool; then each (token, KV head) task attends for the KV head's group of query
// heads at once, so that each key and value row is read once per task: the scores of the group, their softmax
// with each head's sink as one more logit, and the values weighted by it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "paged_attention_op.h"

namespace gptoss {
namespace {

inline float Widen(Dtype dtype, const void* data, int64_t i) {
  if (dtype == Dtype::kFloat32) return static_cast<const float*>(data)[i];
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == Dtype::kFloat16 ? Ort::Float16_t::FromBits(bits).ToFloat() : Ort::BFloat16_t::FromBits(bits).ToFloat();
}

inline void Narrow(Dtype dtype, void* data, int64_t i, float value) {
  if (dtype == Dtype::kFloat32) {
    static_cast<float*>(data)[i] = value;
  } else {
    static_cast<uint16_t*>(data)[i] = dtype == Dtype::kFloat16 ? Ort::Float16_t(value).val : Ort::BFloat16_t(value).val;
  }
}

// `count` values from `data` + `first` as floats into `out`.
inline void WidenRow(Dtype dtype, const void* data, int64_t first, int64_t count, float* out) {
  if (dtype == Dtype::kFloat32) {
    std::memcpy(out, static_cast<const float*>(data) + first, count * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < count; ++i) out[i] = Widen(dtype, data, first + i);
}

struct Step {
  AttentionArgs a;
  int64_t element;  // bytes per cache value
  int64_t qkv_width;
};

// The cache slot of `row`'s position `position`.
inline int64_t SlotOf(const AttentionArgs& a, int64_t row, int64_t position) {
  const int64_t page = a.page_table[row * a.table_width + position / a.page_size];
  return page * a.page_size + position % a.page_size;
}

// x [D] rotated by position's angles (half-split: pairs (i, i + D/2)), in place.
inline void Rotate(const AttentionArgs& a, int64_t position, float* x) {
  const int64_t half = a.head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = Widen(a.dtype, a.cos, position * half + i), s = Widen(a.dtype, a.sin, position * half + i);
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c - x2 * s;
    x[i + half] = x2 * c + x1 * s;
  }
}

void WriteToken(void* user, size_t index) {
  const Step& step = *static_cast<const Step*>(user);
  const AttentionArgs& a = step.a;
  const int64_t t = static_cast<int64_t>(index), d = a.head_dim;
  const int64_t slot = SlotOf(a, a.token_rows[t], a.positions[t]);
  float row[kMaxHeadDim];
  for (int64_t h = 0; h < a.kv_heads; ++h) {
    const int64_t key = t * step.qkv_width + (a.heads + h) * d, value = key + a.kv_heads * d;
    const int64_t target = (slot * a.kv_heads + h) * d;
    WidenRow(a.dtype, a.qkv, key, d, row);
    Rotate(a, a.positions[t], row);
    for (int64_t i = 0; i < d; ++i) Narrow(a.dtype, a.key_cache, target + i, row[i]);
    std::memcpy(static_cast<char*>(a.value_cache) + target * step.element,
                static_cast<const char*>(a.qkv) + value * step.element, d * step.element);
  }
}

void AttendGroup(void* user, size_t index) {
  const Step& step = *static_cast<const Step*>(user);
  const AttentionArgs& a = step.a;
  const int64_t t = static_cast<int64_t>(index) / a.kv_heads, h = static_cast<int64_t>(index) % a.kv_heads;
  const int64_t d = a.head_dim, group = a.heads / a.kv_heads, row = a.token_rows[t], position = a.positions[t];
  const int64_t first = a.window > 0 ? std::max<int64_t>(0, position - a.window + 1) : 0;
  const int64_t count = position - first + 1;
  float q[kMaxGroup][kMaxHeadDim], acc[kMaxGroup][kMaxHeadDim], kv[kMaxHeadDim];
  for (int64_t g = 0; g < group; ++g) {
    WidenRow(a.dtype, a.qkv, t * step.qkv_width + (h * group + g) * d, d, q[g]);
    Rotate(a, position, q[g]);
    for (int64_t i = 0; i < d; ++i) q[g][i] *= a.scale;
    std::fill(acc[g], acc[g] + d, 0.0f);
  }
  thread_local std::vector<float> scores;
  scores.resize(group * count);
  for (int64_t j = 0; j < count; ++j) {
    WidenRow(a.dtype, a.key_cache, (SlotOf(a, row, first + j) * a.kv_heads + h) * d, d, kv);
    for (int64_t g = 0; g < group; ++g) {
      float sum = 0.0f;
      for (int64_t i = 0; i < d; ++i) sum += q[g][i] * kv[i];
      scores[g * count + j] = sum;
    }
  }
  float total[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    const float sink = Widen(a.dtype, a.sinks, h * group + g);
    float* s = scores.data() + g * count;
    const float top = std::max(sink, *std::max_element(s, s + count));
    total[g] = std::exp(sink - top);
    for (int64_t j = 0; j < count; ++j) {
      s[j] = std::exp(s[j] - top);
      total[g] += s[j];
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    WidenRow(a.dtype, a.value_cache, (SlotOf(a, row, first + j) * a.kv_heads + h) * d, d, kv);
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * count + j];
      for (int64_t i = 0; i < d; ++i) acc[g][i] += p * kv[i];
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const int64_t target = t * a.heads * d + (h * group + g) * d;
    for (int64_t i = 0; i < d; ++i) Narrow(a.dtype, a.out, target + i, acc[g][i] / total[g]);
  }
}

// Every token's row, position and pages in range: the kernel reads no memory the caches do not hold.
void CheckTokens(const AttentionArgs& a) {
  const int64_t pages = a.cache_slots / a.page_size;
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t row = a.token_rows[t], position = a.positions[t];
    if (row < 0 || row >= a.rows || position < 0 || position >= a.max_positions ||
        position / a.page_size >= a.table_width) {
      ORT_CXX_API_THROW("PagedAttention: token " + std::to_string(t) + " has a row or position out of range",
                        ORT_INVALID_ARGUMENT);
    }
    const int64_t first = a.window > 0 ? std::max<int64_t>(0, position - a.window + 1) : 0;
    for (int64_t p = first / a.page_size; p <= position / a.page_size; ++p) {
      const int64_t page = a.page_table[row * a.table_width + p];
      if (page < 0 || page >= pages) {
        ORT_CXX_API_THROW("PagedAttention: row " + std::to_string(row) + " names page " + std::to_string(page) +
                              " outside the cache",
                          ORT_INVALID_ARGUMENT);
      }
    }
  }
}

}  // namespace

void AttentionKernel::Compute(OrtKernelContext* raw_context) {
  Ort::KernelContext context(raw_context);
  Step step{ReadAttentionArgs(context, attributes_), 0, 0};
  const AttentionArgs& a = step.a;
  step.element = a.dtype == Dtype::kFloat32 ? 4 : 2;
  step.qkv_width = (a.heads + 2 * a.kv_heads) * a.head_dim;
  const size_t cache_bytes = a.cache_slots * a.kv_heads * a.head_dim * step.element;
  if (a.key_cache != a.key_cache_in) std::memcpy(a.key_cache, a.key_cache_in, cache_bytes);
  if (a.value_cache != a.value_cache_in) std::memcpy(a.value_cache, a.value_cache_in, cache_bytes);
  if (a.tokens == 0) return;
  CheckTokens(a);
  context.ParallelFor(WriteToken, a.tokens, 0, &step);
  context.ParallelFor(AttendGroup, a.tokens * a.kv_heads, 0, &step);
}

}  // namespace gptoss
