// The CUDA decode attention's key split by step rows, as a GPU sweep chose it (bench/engine_check.py --steps sweep
// writes the table, backends/engine/kernels/attention_tuning.py hands the engine's device its entry in
// GATEWAY_ATTENTION_SPLITS):
//
//   "1=256;8=512;64=1024;256=0"
//
// A decode step of R rows takes the first entry whose bound is at least R: its token's keys go to blocks of about
// that many keys each (so the split count grows with the context, at most kMaxSplits), 0 not split. A step past the
// last bound keeps kDefaultSplitKeys. Only the CUDA kernel splits; the CPU kernel ignores it.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace gptoss {

constexpr int kMaxAttentionSplitEntries = 32;
constexpr int64_t kMaxSplitKeys = 1 << 20;

struct AttentionSplitEntry {
  int64_t max_rows;
  int64_t split_keys;  // 0: not split
};

struct AttentionSplits {
  int count = 0;
  AttentionSplitEntry entries[kMaxAttentionSplitEntries];
};

// `text` as above into `out` (bounds strictly increasing); false, with `out` empty, when it is not that.
inline bool ParseAttentionSplits(const char* text, AttentionSplits* out) {
  *out = AttentionSplits{};
  const char* p = text;
  while (*p) {
    if (out->count == kMaxAttentionSplitEntries) break;
    if (*p < '1' || *p > '9') break;  // digits only (strtoll would take spaces and signs)
    char* end = nullptr;
    const long long bound = std::strtoll(p, &end, 10);
    if (end == p || *end != '=' || bound < 1 || (out->count && bound <= out->entries[out->count - 1].max_rows)) {
      break;
    }
    p = end + 1;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9')) break;  // no sign, no leading zero
    const long long keys = std::strtoll(p, &end, 10);
    if (end == p || keys < 0 || keys > kMaxSplitKeys) break;
    out->entries[out->count++] = AttentionSplitEntry{bound, keys};
    p = end;
    if (*p == '\0') return true;
    if (*p != ';' || p[1] == '\0') break;
    ++p;
  }
  *out = AttentionSplits{};
  return *text == '\0';
}

// The keys per split part of a decode step of `rows` rows: the table's entry, else `fallback`.
inline int64_t SplitKeysFor(int64_t rows, const AttentionSplits& splits, int64_t fallback) {
  for (int i = 0; i < splits.count; ++i) {
    if (rows <= splits.entries[i].max_rows) return splits.entries[i].split_keys;
  }
  return fallback;
}

}  // namespace gptoss
