// gptoss.engine::SampleTokens on the CPU: one row at a time, in the arithmetic sample_tokens_launch.h states.
// The nucleus threshold is found by a radix select: the kept-mass histogram over the top 12 bits of each
// probability's bit pattern, then the one bucket the threshold falls in sorted.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "sample_tokens_launch.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gptoss {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
constexpr int kBucketShift = 19;  // a probability in [0, 1] has its sign bit clear: 12 bits left above bit 19
constexpr int kBuckets = 1 << 12;
constexpr double kLeastTarget = 1e-300;  // top_p 0 keeps the most likely token: a target above zero

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// z: the row's logits less its penalties, -inf where masked: the logits row itself when it has neither, else
// a copy in `scratch`.
const float* Penalised(const SampleArgs& a, int64_t r, std::vector<float>& scratch) {
  const float* logits = a.logits + static_cast<int64_t>(a.row[r]) * a.vocab;
  const int32_t* ids = a.penalty_ids + r * a.penalties;
  const float* values = a.penalty_values + r * a.penalties;
  const int32_t mask = a.mask_index[r];
  const bool masked = mask >= 0 && mask < a.mask_count;
  if (!masked && (a.penalties == 0 || ids[0] == kNoPenalty)) return logits;
  scratch.assign(logits, logits + a.vocab);
  for (int64_t j = 0; j < a.penalties && ids[j] != kNoPenalty; ++j) {
    if (ids[j] >= 0 && ids[j] < a.vocab) scratch[ids[j]] -= values[j];
  }
  if (masked) {
    const uint32_t* bits = a.masks + mask * a.mask_words;
    for (int64_t i = 0; i < a.vocab; ++i) {
      if (!((bits[i >> 5] >> (i & 31)) & 1u)) scratch[i] = kMinusInf;
    }
  }
  return scratch.data();
}

struct Nucleus {
  float tau = 0.0f;    // every e above it is kept
  int64_t ties = 0;    // and this many of the e equal to it, lowest index first
  double mass = 0.0;   // the kept mass
};

Nucleus FindNucleus(const std::vector<float>& e, double total, float top_p) {
  Nucleus nucleus;
  if (!(top_p < 1.0f)) {
    nucleus.mass = total;
    return nucleus;
  }
  const double target = std::max(static_cast<double>(top_p) * total, kLeastTarget);
  std::vector<double> mass(kBuckets, 0.0);
  std::vector<int64_t> count(kBuckets, 0);
  for (float value : e) {
    const uint32_t bucket = Bits(value) >> kBucketShift;
    mass[bucket] += value;
    ++count[bucket];
  }
  double above = 0.0;  // the mass of the buckets above the one being looked at
  int crossing = -1;
  for (int bucket = kBuckets - 1; bucket >= 0; --bucket) {
    if (count[bucket] == 0) continue;
    crossing = bucket;  // the lowest non-empty bucket when rounding leaves the target unreached
    if (above + mass[bucket] >= target) break;
    above += mass[bucket];
  }
  std::vector<std::pair<float, int64_t>> inside;
  for (int64_t i = 0; i < static_cast<int64_t>(e.size()); ++i) {
    if (static_cast<int>(Bits(e[i]) >> kBucketShift) == crossing) inside.emplace_back(e[i], i);
  }
  std::sort(inside.begin(), inside.end(), [](const auto& x, const auto& y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);
  });
  double greater = above;  // the mass of every e above the value being looked at
  size_t group = 0;
  while (group < inside.size()) {
    size_t end = group;
    double group_mass = 0.0;
    while (end < inside.size() && inside[end].first == inside[group].first) group_mass += inside[end++].first;
    nucleus.tau = inside[group].first;
    nucleus.ties = static_cast<int64_t>(end - group);
    if (greater + group_mass >= target || end == inside.size()) break;
    greater += group_mass;
    group = end;
  }
  if (nucleus.tau > 0.0f) {
    const double needed = std::ceil((target - greater) / nucleus.tau);
    nucleus.ties = std::clamp<int64_t>(static_cast<int64_t>(needed), 1, nucleus.ties);
  } else {
    nucleus.ties = 0;  // zero-probability tokens are never kept
  }
  nucleus.mass = greater + static_cast<double>(nucleus.ties) * nucleus.tau;
  return nucleus;
}

int64_t Draw(const std::vector<float>& e, const Nucleus& nucleus, float uniform) {
  const double x = static_cast<double>(uniform) * nucleus.mass;
  double running = 0.0;
  int64_t ties = 0, last = -1;
  for (int64_t i = 0; i < static_cast<int64_t>(e.size()); ++i) {
    const bool kept = e[i] > nucleus.tau || (e[i] == nucleus.tau && nucleus.tau > 0.0f && ties++ < nucleus.ties);
    if (!kept) continue;
    running += e[i];
    last = i;
    if (running > x) return i;
  }
  return last;
}

void Top(const SampleArgs& a, int64_t r, const float* z, float peak, double log_total) {
  int32_t* ids = a.top_ids + r * a.top;
  float* values = a.top_logprobs + r * a.top;
  std::fill(ids, ids + a.top, -1);
  std::fill(values, values + a.top, kMinusInf);
  const int64_t wanted = std::min<int64_t>(a.logprobs[r], a.top);
  if (wanted <= 0) return;
  thread_local std::vector<int32_t> order;
  order.clear();
  for (int64_t i = 0; i < a.vocab; ++i) {
    if (z[i] != kMinusInf) order.push_back(static_cast<int32_t>(i));
  }
  const auto count = std::min<int64_t>(wanted, static_cast<int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + count, order.end(),
                    [z](int32_t x, int32_t y) { return z[x] > z[y] || (z[x] == z[y] && x < y); });
  for (int64_t j = 0; j < count; ++j) {
    ids[j] = order[j];
    values[j] = static_cast<float>(static_cast<double>(z[order[j]] - peak) - log_total);
  }
}

// The largest z (NaN-free rows), 8 lanes at a time where AVX2 is there.
float Peak(const float* z, int64_t vocab) {
  float peak = kMinusInf;
  int64_t i = 0;
#if defined(__AVX2__)
  __m256 lanes = _mm256_set1_ps(kMinusInf);
  for (; i + 8 <= vocab; i += 8) lanes = _mm256_max_ps(lanes, _mm256_loadu_ps(z + i));
  float spill[8];
  _mm256_storeu_ps(spill, lanes);
  for (float value : spill) peak = std::max(peak, value);
#endif
  for (; i < vocab; ++i) peak = std::max(peak, z[i]);
  return peak;
}

}  // namespace

void SampleRowCpu(const SampleArgs& a, int64_t r) {
  thread_local std::vector<float> scratch, e;
  float peak = kMinusInf;
  const float* z = nullptr;
  if (a.row[r] >= 0 && a.row[r] < a.logits_rows) {
    z = Penalised(a, r, scratch);
  } else {
    scratch.assign(a.vocab, kMinusInf);
    z = scratch.data();
  }
  peak = Peak(z, a.vocab);
  int64_t greedy = 0;
  while (greedy + 1 < a.vocab && z[greedy] != peak) ++greedy;  // the lowest index holding it
  a.logprob[r] = 0.0f;
  if (peak == kMinusInf) {  // every token masked
    a.token[r] = -1;
    std::fill(a.top_ids + r * a.top, a.top_ids + (r + 1) * a.top, -1);
    std::fill(a.top_logprobs + r * a.top, a.top_logprobs + (r + 1) * a.top, kMinusInf);
    return;
  }
  int64_t token = greedy;
  if (a.temperature[r] > 0.0f) {
    const float inverse = 1.0f / a.temperature[r];
    e.resize(a.vocab);
    double total = 0.0;
    for (int64_t i = 0; i < a.vocab; ++i) total += (e[i] = std::exp((z[i] - peak) * inverse));
    token = Draw(e, FindNucleus(e, total, a.top_p[r]), a.uniform[r]);
  }
  a.token[r] = token;
  double log_total = 0.0;
  if (a.logprobs[r] >= 0) {
    double sum = 0.0;
    for (int64_t i = 0; i < a.vocab; ++i) sum += std::exp(z[i] - peak);
    log_total = std::log(sum);
    a.logprob[r] = static_cast<float>(static_cast<double>(z[token] - peak) - log_total);
  }
  Top(a, r, z, peak, log_total);
}

}  // namespace gptoss
