// What both PagedAttention kernels share: attributes, and reading the inputs.
#include "paged_attention_op.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "ort_dtype.h"

namespace gptoss {

AttentionAttributes::AttentionAttributes(const OrtKernelInfo* info) {
  Ort::ConstKernelInfo kernel_info(info);
  heads = kernel_info.GetAttribute<int64_t>("num_heads");
  kv_heads = kernel_info.GetAttribute<int64_t>("kv_num_heads");
  page_size = kernel_info.GetAttribute<int64_t>("page_size");
  window = kernel_info.GetAttribute<int64_t>("window");
  scale = kernel_info.GetAttribute<float>("scale");
  const char* mma = std::getenv("GATEWAY_ATTENTION_MMA");
  tensor_cores = !(mma && std::string(mma) == "0");
  const char* tuned = std::getenv("GATEWAY_ATTENTION_SPLITS");
  if (tuned && !ParseAttentionSplits(tuned, &splits)) {
    ORT_CXX_API_THROW(std::string("PagedAttention: GATEWAY_ATTENTION_SPLITS is not a list of ROWS=KEYS entries "
                                  "(bounds increasing, KEYS 0 to 1048576, ';' between): '") +
                          std::string(tuned).substr(0, 200) + "'",
                      ORT_INVALID_ARGUMENT);
  }
}

namespace {

void Require(bool condition, const char* message) {
  if (!condition) ORT_CXX_API_THROW(std::string("PagedAttention: ") + message, ORT_INVALID_ARGUMENT);
}

}  // namespace

AttentionArgs ReadAttentionArgs(Ort::KernelContext& context, const AttentionAttributes& attributes) {
  const auto qkv = context.GetInput(0);
  const auto keys = context.GetInput(1);
  const auto values = context.GetInput(2);
  const auto table = context.GetInput(5);
  const auto cos = context.GetInput(6);
  const std::vector<int64_t> qkv_shape = qkv.GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> cache_shape = keys.GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> table_shape = table.GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> cos_shape = cos.GetTensorTypeAndShapeInfo().GetShape();
  AttentionArgs a{};
  a.heads = attributes.heads;
  a.kv_heads = attributes.kv_heads;
  a.page_size = attributes.page_size;
  a.window = attributes.window;
  a.scale = attributes.scale;
  Require(a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0 && a.heads / a.kv_heads <= kMaxGroup,
          "num_heads must be a multiple of kv_num_heads, at most 16 times it");
  Require(a.page_size > 0 && a.window >= 0, "page_size must be positive and window not negative");
  Require(qkv_shape.size() == 2 && cache_shape.size() == 3 && table_shape.size() == 2 && cos_shape.size() == 2,
          "qkv must be [T, (H + 2 Hkv) D], the caches [N, Hkv, D], page_table [B, P], the rotary tables [S, D/2]");
  a.tokens = qkv_shape[0];
  a.head_dim = cache_shape[2];
  a.cache_slots = cache_shape[0];
  a.rows = table_shape[0];
  a.table_width = table_shape[1];
  a.max_positions = cos_shape[0];
  Require(cache_shape[1] == a.kv_heads && a.head_dim % 2 == 0 && a.head_dim <= kMaxHeadDim,
          "the caches must hold kv_num_heads heads of an even head size, at most 128");
  Require(qkv_shape[1] == (a.heads + 2 * a.kv_heads) * a.head_dim, "qkv's width must be (H + 2 Hkv) D");
  Require(values.GetTensorTypeAndShapeInfo().GetShape() == cache_shape, "value_cache must match key_cache");
  Require(a.cache_slots % a.page_size == 0, "the caches must hold whole pages");
  Require(cos_shape[1] * 2 == a.head_dim, "the rotary tables must be [S, D/2]");
  Require(context.GetInput(3).GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(a.tokens) &&
              context.GetInput(4).GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(a.tokens),
          "positions and token_rows must hold one entry per token");
  Require(context.GetInput(8).GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(a.heads),
          "sinks must hold one logit per query head");
  a.dtype = ToDtype(qkv.GetTensorTypeAndShapeInfo().GetElementType(), "PagedAttention");
  a.qkv = qkv.GetTensorRawData();
  a.key_cache_in = keys.GetTensorRawData();
  a.value_cache_in = values.GetTensorRawData();
  a.positions = static_cast<const int32_t*>(context.GetInput(3).GetTensorRawData());
  a.token_rows = static_cast<const int32_t*>(context.GetInput(4).GetTensorRawData());
  a.page_table = static_cast<const int32_t*>(table.GetTensorRawData());
  a.cos = cos.GetTensorRawData();
  a.sin = context.GetInput(7).GetTensorRawData();
  a.sinks = context.GetInput(8).GetTensorRawData();
  a.out = context.GetOutput(0, {a.tokens, a.heads * a.head_dim}).GetTensorMutableRawData();
  a.key_cache = context.GetOutput(1, cache_shape).GetTensorMutableRawData();
  a.value_cache = context.GetOutput(2, cache_shape).GetTensorMutableRawData();
  a.split_keys = SplitKeysFor(a.rows, attributes.splits, kDefaultSplitKeys);
  a.tensor_cores = attributes.tensor_cores;
  return a;
}

}  // namespace gptoss
