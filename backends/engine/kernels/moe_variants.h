// The CUDA MoE's launch variant by step size, as a GPU sweep chose it (bench/engine_check.py --steps sweep writes
// the table, backends/engine/kernels/moe_tuning.py hands the engine's device its entry in GATEWAY_MOE_VARIANTS):
//
//   "1=tiles/4;2=tiles/4;16=tiles/1;128=cores;4096=gemm"
//
// A step of T tokens takes the first entry whose bound is at least T: `cores` (the CUDA-core kernels), `tiles/S`
// (the tensor-core tiles, K split into S parts, 1 to 16) or `gemm` (cuBLAS GEMMs; the tiles where cuBLAS does not
// load or a CUDA graph is being captured). A step past the last bound keeps the built-in rule (mxfp4_moe_launch.h's
// defaults and the GATEWAY_MOE_* thresholds). Float32 activations always take the CUDA cores; the CPU kernel
// ignores all of it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "mxfp4_moe_launch.h"

namespace gptoss {

enum class MoePath : int8_t { kCores, kTiles, kGemm };

struct MoeVariant {
  int64_t max_tokens;
  MoePath path;
  int64_t splits;  // tiles: parts of K
};

constexpr int kMaxMoeVariants = 32;
constexpr int64_t kMaxMoeSplits = 16;

struct MoeVariants {
  int count = 0;
  MoeVariant entries[kMaxMoeVariants];
};

// `text` as above into `out` (bounds strictly increasing); false, with `out` empty, when it is not that.
inline bool ParseMoeVariants(const char* text, MoeVariants* out) {
  *out = MoeVariants{};
  const char* p = text;
  while (*p) {
    if (out->count == kMaxMoeVariants) break;
    if (*p < '1' || *p > '9') break;  // digits only (strtoll would take spaces and signs)
    char* end = nullptr;
    const long long bound = std::strtoll(p, &end, 10);
    if (end == p || *end != '=' || bound < 1 || (out->count && bound <= out->entries[out->count - 1].max_tokens)) {
      break;
    }
    p = end + 1;
    MoeVariant variant{bound, MoePath::kCores, 1};
    if (std::strncmp(p, "cores", 5) == 0) {
      p += 5;
    } else if (std::strncmp(p, "gemm", 4) == 0) {
      variant.path = MoePath::kGemm;
      p += 4;
    } else if (std::strncmp(p, "tiles/", 6) == 0) {
      variant.path = MoePath::kTiles;
      if (p[6] < '1' || p[6] > '9') break;
      const long long splits = std::strtoll(p + 6, &end, 10);
      if (end == p + 6 || splits < 1 || splits > kMaxMoeSplits) break;
      variant.splits = splits;
      p = end;
    } else {
      break;
    }
    out->entries[out->count++] = variant;
    if (*p == '\0') return true;
    if (*p != ';' || p[1] == '\0') break;
    ++p;
  }
  *out = MoeVariants{};
  return *text == '\0';
}

// The step's entry of `variants`, if any, as the thresholds and split count the launcher reads.
inline void ApplyMoeVariant(MoeArgs& a, const MoeVariants& variants) {
  for (int i = 0; i < variants.count; ++i) {
    const MoeVariant& v = variants.entries[i];
    if (a.tokens > v.max_tokens) continue;
    a.gemm_min_tokens = v.path == MoePath::kGemm ? 1 : 0;
    a.mma_min_tokens = v.path == MoePath::kCores ? 0 : 1;
    a.mma_splits = v.path == MoePath::kTiles ? v.splits : 0;
    return;
  }
}

}  // namespace gptoss
