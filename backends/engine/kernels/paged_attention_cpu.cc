// gptoss.engine::PagedAttention on the CPU execution provider, in the activation dtype (float, fp16, bf16), float
// arithmetic throughout.
//
// First every token of the step writes its key (rotated) and value into its row's page, spread over tokens on
// ONNX Runtime's intra-op thread pool; then each task (up to 16 consecutive tokens of one row, and one KV head)
// attends for its tokens and the KV head's group of query heads at once, so that each key and value row is read
// once per task: scores by tiles of 16 keys (vectors over the keys), the softmax online with each head's sink
// as one more logit, and the values weighted by it.
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

constexpr int64_t kKeys = 16;       // keys per tile: one vector of scores per query head
constexpr int64_t kQueryBlock = 8;  // queries scored together against a tile

// e^x for x <= 0 (a score minus the running maximum), in plain arithmetic that the compiler
// vectorizes over a tile's keys: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its degree-6 Taylor polynomial
// (relative error below 2e-7 there), times 2^n built in the exponent bits.
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);  // e^-87 is below float's normal range: 0 for a softmax weight
  const float n = std::nearbyint(x * 1.44269504f);
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 split in two for an exact product
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Floats in a row of a tile's values: the head size when known at compile time, else the largest.
template <int D>
constexpr int64_t kKeyRow = D ? D : kMaxHeadDim;

// Scores of kQueryBlock queries (rows of `q`, d wide) against a tile of keys (`keys`: d rows of kKeys, transposed).
template <int D>
void Scores(const float* q, const float* keys, int64_t d, float (&scores)[kQueryBlock][kKeys]) {
  if constexpr (D % 8 == 0 && D > 0) {
    typedef float Vec __attribute__((vector_size(32)));  // eight floats: the compiler's registers hold them
    Vec sums[kQueryBlock][2] = {};
    for (int64_t i = 0; i < D; ++i) {
      Vec low, high;
      std::memcpy(&low, keys + i * kKeys, sizeof low);
      std::memcpy(&high, keys + i * kKeys + 8, sizeof high);
      for (int64_t b = 0; b < kQueryBlock; ++b) {
        const float qi = q[b * D + i];
        sums[b][0] += qi * low;
        sums[b][1] += qi * high;
      }
    }
    for (int64_t b = 0; b < kQueryBlock; ++b) {
      std::memcpy(scores[b], &sums[b][0], sizeof sums[b][0]);
      std::memcpy(scores[b] + 8, &sums[b][1], sizeof sums[b][1]);
    }
  } else {
    for (int64_t b = 0; b < kQueryBlock; ++b) {
      for (int64_t j = 0; j < kKeys; ++j) scores[b][j] = 0.0f;
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = 0; j < kKeys; ++j) scores[b][j] += q[b * d + i] * keys[i * kKeys + j];
      }
    }
  }
}

// out[b] = out[b] * rescale[b] + weights[b] . values, for `block` queries (rows of `out`, d wide), two at a time
// sharing each load of a value row.
template <int D>
void Accumulate(const float (&weights)[kQueryBlock][kKeys], const float (&rescale)[kQueryBlock], const float* values,
                int64_t d, int64_t block, float* out) {
  if constexpr (D % 8 == 0 && D > 0) {
    typedef float Vec __attribute__((vector_size(32)));
    constexpr int64_t kVectors = D / 8;
    for (int64_t b = 0; b < block; b += 2) {
      const bool pair = b + 1 < block;
      Vec first[kVectors], second[kVectors];
      for (int64_t c = 0; c < kVectors; ++c) {
        std::memcpy(&first[c], out + b * D + c * 8, sizeof(Vec));
        first[c] *= rescale[b];
        if (pair) {
          std::memcpy(&second[c], out + (b + 1) * D + c * 8, sizeof(Vec));
          second[c] *= rescale[b + 1];
        } else {
          second[c] = Vec{};
        }
      }
      for (int64_t j = 0; j < kKeys; ++j) {
        const float w0 = weights[b][j], w1 = pair ? weights[b + 1][j] : 0.0f;
        for (int64_t c = 0; c < kVectors; ++c) {
          Vec value;
          std::memcpy(&value, values + j * kKeyRow<D> + c * 8, sizeof value);
          first[c] += w0 * value;
          second[c] += w1 * value;
        }
      }
      for (int64_t c = 0; c < kVectors; ++c) {
        std::memcpy(out + b * D + c * 8, &first[c], sizeof(Vec));
        if (pair) std::memcpy(out + (b + 1) * D + c * 8, &second[c], sizeof(Vec));
      }
    }
  } else {
    for (int64_t b = 0; b < block; ++b) {
      float* row = out + b * d;
      for (int64_t i = 0; i < d; ++i) row[i] *= rescale[b];
      for (int64_t j = 0; j < kKeys; ++j) {
        for (int64_t i = 0; i < d; ++i) row[i] += weights[b][j] * values[j * kKeyRow<D> + i];
      }
    }
  }
}

// A task: up to kSegmentTokens consecutive tokens of one row, and one KV head.
struct Task {
  int64_t first_token, tokens, head;
};

// The task's tokens' queries for its KV head's group (rotated, scaled), the keys in tiles of kKeys read once for
// all of them (transposed, so that a tile's scores are vectors over its keys), the softmax online (a running
// maximum and sum per query, started from the head's sink). `D`: the head size when it is known at compile time
// (its loops unrolled, a query's output kept in registers), 0 for any.
template <int D>
void AttendSegment(const Step& step, const Task& task) {
  constexpr int64_t kDim = D ? D : kMaxHeadDim;
  const AttentionArgs& a = step.a;
  const int64_t d = D ? D : a.head_dim, group = a.heads / a.kv_heads, queries = task.tokens * group;
  const int64_t row = a.token_rows[task.first_token];
  const int64_t padded = (queries + kQueryBlock - 1) / kQueryBlock * kQueryBlock;
  thread_local std::vector<float> q, acc, top, total;
  q.assign(padded * d, 0.0f);  // whole blocks of queries
  acc.assign(queries * d, 0.0f);
  top.resize(queries);
  total.assign(queries, 1.0f);  // exp(sink - sink)
  int64_t lowest = a.positions[task.first_token], highest = lowest;
  for (int64_t n = 0; n < task.tokens; ++n) {
    const int64_t t = task.first_token + n, position = a.positions[t];
    lowest = std::min(lowest, a.window > 0 ? std::max<int64_t>(0, position - a.window + 1) : 0);
    highest = std::max(highest, position);
    for (int64_t g = 0; g < group; ++g) {
      float* query = q.data() + (n * group + g) * d;
      WidenRow(a.dtype, a.qkv, t * step.qkv_width + (task.head * group + g) * d, d, query);
      Rotate(a, position, query);
      for (int64_t i = 0; i < d; ++i) query[i] *= a.scale;
      top[n * group + g] = Widen(a.dtype, a.sinks, task.head * group + g);
    }
  }
  alignas(64) float keys[kDim][kKeys];  // transposed: keys[i][j] is dimension i of the tile's key j
  alignas(64) float values[kKeys][kDim];
  float row_buffer[kMaxHeadDim];
  for (int64_t base = lowest; base <= highest; base += kKeys) {
    const int64_t count = std::min(kKeys, highest - base + 1);
    for (int64_t j = 0; j < kKeys; ++j) {
      if (j < count) {
        const int64_t at = (SlotOf(a, row, base + j) * a.kv_heads + task.head) * d;
        WidenRow(a.dtype, a.key_cache, at, d, row_buffer);
        for (int64_t i = 0; i < d; ++i) keys[i][j] = row_buffer[i];
        WidenRow(a.dtype, a.value_cache, at, d, values[j]);
      } else {
        for (int64_t i = 0; i < d; ++i) keys[i][j] = 0.0f;
        std::fill(values[j], values[j] + d, 0.0f);
      }
    }
    for (int64_t m0 = 0; m0 < queries; m0 += kQueryBlock) {
      alignas(64) float scores[kQueryBlock][kKeys];
      Scores<D>(q.data() + m0 * d, &keys[0][0], d, scores);
      alignas(64) float weights[kQueryBlock][kKeys] = {};
      float rescale[kQueryBlock];
      for (int64_t b = 0; b < kQueryBlock; ++b) {
        const int64_t m = m0 + b;
        rescale[b] = 1.0f;
        if (m >= queries) continue;
        const int64_t position = a.positions[task.first_token + m / group];
        const int64_t first = a.window > 0 ? std::max<int64_t>(0, position - a.window + 1) : 0;
        if (base > position || base + count <= first) continue;  // no key of the tile is this query's
        // keys [seen_first, seen_end) of the tile are this query's
        const int64_t seen_first = std::max<int64_t>(0, first - base);
        const int64_t seen_end = std::min(count, position - base + 1);
        float tile_top = top[m];
        for (int64_t j = seen_first; j < seen_end; ++j) tile_top = std::max(tile_top, scores[b][j]);
        for (int64_t j = 0; j < kKeys; ++j) {  // vectorized: a select and the exponential over the tile
          const float weight = ExpNonPositive(scores[b][j] - tile_top);
          weights[b][j] = j >= seen_first && j < seen_end ? weight : 0.0f;
        }
        float sum = 0.0f;
        for (int64_t j = seen_first; j < seen_end; ++j) sum += weights[b][j];
        rescale[b] = ExpNonPositive(top[m] - tile_top);
        top[m] = tile_top;
        total[m] = total[m] * rescale[b] + sum;
      }
      const int64_t block = std::min(kQueryBlock, queries - m0);
      Accumulate<D>(weights, rescale, &values[0][0], d, block, acc.data() + m0 * d);
    }
  }
  for (int64_t n = 0; n < task.tokens; ++n) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t m = n * group + g;
      const int64_t target = (task.first_token + n) * a.heads * d + (task.head * group + g) * d;
      for (int64_t i = 0; i < d; ++i) Narrow(a.dtype, a.out, target + i, acc[m * d + i] / total[m]);
    }
  }
}

struct Tasks {
  const Step* step;
  std::vector<Task> list;
};

void RunTask(void* user, size_t index) {
  const Tasks& tasks = *static_cast<const Tasks*>(user);
  const Task& task = tasks.list[index];
  switch (tasks.step->a.head_dim) {
    case 64:
      AttendSegment<64>(*tasks.step, task);
      break;
    case 128:
      AttendSegment<128>(*tasks.step, task);
      break;
    default:
      AttendSegment<0>(*tasks.step, task);
  }
}

// The step's tasks: runs of consecutive tokens of one row, cut at kSegmentTokens, times the KV heads.
std::vector<Task> Segments(const AttentionArgs& a) {
  constexpr int64_t kSegmentTokens = 16;
  std::vector<Task> list;
  for (int64_t t = 0; t < a.tokens;) {
    int64_t end = t + 1;
    while (end < a.tokens && end - t < kSegmentTokens && a.token_rows[end] == a.token_rows[t]) ++end;
    for (int64_t h = 0; h < a.kv_heads; ++h) list.push_back({t, end - t, h});
    t = end;
  }
  return list;
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
  Tasks tasks{&step, Segments(a)};
  context.ParallelFor(RunTask, tasks.list.size(), 0, &tasks);
}

}  // namespace gptoss
