// The MoE kernel's dot products of MXFP4 rows with vectors (mxfp4_moe_cpu.cc, included whole: its internals are
// this file's) run without ONNX Runtime against a double-precision reference at gpt-oss's width (2880 columns): the
// decode's float path (1 to 3 vectors an expert, reordered by block where the build has that path), its int8 path
// in one piece and in two (the same vectors quantized as the kernel quantizes them; the reference takes the quantized
// values) and the tiled
// path (prefill: 4 and 7 vectors). What a build for another CPU (ARM under qemu-user, an x86-64 level the host
// lacks) is checked with where the ORT library cannot be loaded. Prints the vector width the build's MoE paths use,
// then one line per check; exits 1 if any dot product is off by more than 1e-5 of the magnitude of its products.
#include "mxfp4_moe_cpu.cc"
#include "mxfp4_moe_op.cc"  // the op's argument reading, which the kernel's Compute links to
#include "amx_cpu.cc"       // the AMX tiles (an x86-64-v4-amx build), which its prefill links to
#include "moe_int_tiles_cpu.cc"  // the integer tiles (AVX2, AVX-512), which its prefill links to

#include <cstdio>
#include <random>

namespace {

constexpr int64_t kRows = 22;  // a task's rows (16; AVX2: 18) and a partial group of the decoded rows (4 or 6)
constexpr int64_t kCols = 2880;
// Narrower rows the decode's float path is checked at too: their last blocks fewer than a step of its vectors takes
// (AVX-512's four blocks a step: 3 blocks alone, 4 + 1; AVX2's pairs: 2 pairs, 3 pairs); each where its path takes
// that width.
constexpr int64_t kNarrowCols[] = {96, 160, 128, 192};
constexpr float kValues[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

struct Rows {
  std::vector<uint8_t> codes, scales;
  int64_t cols;
  double Value(int64_t row, int64_t col) const {
    const uint8_t byte = codes[(row * cols + col) / 2];
    const int nibble = col % 2 == 0 ? byte & 0x0F : byte >> 4;
    return static_cast<double>(kValues[nibble]) * std::ldexp(1.0, scales[(row * cols + col) / 32] - 127);
  }
};

Rows RandomRows(std::mt19937& rng, int64_t cols = kCols) {
  Rows rows{std::vector<uint8_t>(kRows * cols / 2), std::vector<uint8_t>(kRows * cols / 32), cols};
  for (auto& byte : rows.codes) byte = static_cast<uint8_t>(rng());
  for (auto& scale : rows.scales) scale = static_cast<uint8_t>(118 + rng() % 12);
  return rows;
}

// The largest |out - reference| over the magnitude of the products, for `count` vectors `xs` against the first
// `checked` of `rows`.
double Worst(const Rows& rows, const std::vector<std::vector<float>>& xs, const std::vector<float>& out,
             int64_t checked = kRows) {
  const int64_t count = static_cast<int64_t>(xs.size());
  double worst = 0.0;
  for (int64_t r = 0; r < checked; ++r) {
    for (int64_t t = 0; t < count; ++t) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t c = 0; c < rows.cols; ++c) {
        const double product = rows.Value(r, c) * xs[t][c];
        sum += product;
        magnitude += std::fabs(product);
      }
      worst = std::max(worst, std::fabs(out[r * count + t] - sum) / (magnitude + 1e-30));
    }
  }
  return worst;
}

std::vector<std::vector<float>> RandomVectors(int64_t count, std::mt19937& rng, int64_t cols = kCols) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::vector<float>> xs(count, std::vector<float>(cols));
  for (auto& x : xs)
    for (auto& v : x) v = uniform(rng);
  return xs;
}

// The float path over the first `checked` rows: every count of rows a tiled pass can be left with (22: AVX2's groups
// of 6 end with 4, taken as 2 and 2; 19: with 1; AVX-512's groups of 4 with 2 and 3).
double CheckFloat(int64_t count, std::mt19937& rng, int64_t checked = kRows, int64_t cols = kCols) {
  const Rows rows = RandomRows(rng, cols);
  const auto xs = RandomVectors(count, rng, cols);
  std::vector<float> out(kRows * count);
  std::vector<const float*> pointers;
  for (const auto& x : xs) pointers.push_back(x.data());
#if defined(GPTOSS_MOE_PERMUTED)
  std::vector<std::vector<float>> permuted(count, std::vector<float>(cols));
  if (count < gptoss::kTiledFrom) {
    for (int64_t t = 0; t < count; ++t) {
      gptoss::PermuteBlocks(xs[t].data(), cols, permuted[t].data());
      pointers[t] = permuted[t].data();
    }
    gptoss::FewVectorDots(rows.codes.data(), rows.scales.data(), kRows, cols, pointers.data(), count, out.data());
    return Worst(rows, xs, out);
  }
#endif
  gptoss::Scratch scratch;
  gptoss::ConsecutiveRowDots(rows.codes.data(), rows.scales.data(), checked, kCols, pointers.data(), count,
                             out.data(), scratch);
  return Worst(rows, xs, out, checked);
}

// x as the int8 path quantizes it, `pieces` int8 pieces of each value (1, or 2: the value and its remainder in steps
// of a 254th of its own): the values the reference meets.
void Quantized(std::vector<float>& x, int pieces) {
  for (int64_t block = 0; block < static_cast<int64_t>(x.size()) / 32; ++block) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[block * 32 + j]));
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f, step = amax / 127.0f;
    for (int j = 0; j < 32; ++j) {
      float& v = x[block * 32 + j];
      const float value = std::nearbyint(v * inverse);
      if (pieces == 1) {
        v = value * step;
        continue;
      }
      const float rest = std::clamp(std::nearbyint(std::fma(-value, step, v) * (inverse * 254.0f)), -127.0f, 127.0f);
      v = static_cast<float>((254.0 * value + rest) * static_cast<double>(step / 254.0f));
    }
  }
}

// The decode's int8 path, `pieces` int8 pieces of each value, at `cols` columns; `grouped`: with each block's scale and
// offset sum laid out for the groups of four pairs (GroupBlocks), where the build has that path.
double CheckInt8(int64_t count, int pieces, std::mt19937& rng, bool grouped = false, int64_t cols = kCols) {
  const Rows rows = RandomRows(rng, cols);
  auto xs = RandomVectors(count, rng, cols);
  const int64_t pairs = cols / gptoss::kPair;
  std::vector<std::vector<int8_t>> q(count, std::vector<int8_t>(cols)), r(count, std::vector<int8_t>(cols));
  std::vector<std::vector<float>> d(count, std::vector<float>(pairs * gptoss::kPairScales));
  std::vector<std::vector<int32_t>> offsets(count, std::vector<int32_t>(pairs * gptoss::kPairLanes));
  std::vector<std::vector<float>> block_d(count, std::vector<float>(cols / gptoss::kBlock));
  std::vector<std::vector<int32_t>> block_offsets(count, std::vector<int32_t>(cols / gptoss::kBlock));
  std::vector<gptoss::QuantizedRow> quantized;
  for (int64_t t = 0; t < count; ++t) {
    int8_t* remainders = pieces == 2 ? r[t].data() : nullptr;
    gptoss::QuantizePairs(xs[t].data(), cols, q[t].data(), remainders, d[t].data(), offsets[t].data());
    quantized.push_back({q[t].data(), remainders, d[t].data(), offsets[t].data()});
#if defined(GPTOSS_MOE_GROUPED)
    if (grouped) {
      gptoss::GroupBlocks(d[t].data(), offsets[t].data(), pairs, block_d[t].data(), block_offsets[t].data());
      quantized.back().block_d = block_d[t].data();
      quantized.back().block_offsets = block_offsets[t].data();
    }
#endif
    Quantized(xs[t], pieces);
  }
  std::vector<float> out(kRows * count);
  gptoss::Int8ConsecutiveRowDots(rows.codes.data(), rows.scales.data(), kRows, cols, quantized.data(), count,
                                 out.data());
  return Worst(rows, xs, out);
}

#if defined(GPTOSS_MOE_INT_TILES)
// The prefill's integer tiles, `pieces` as CheckInt8's, for `count` tokens (partial groups of tokens and of passes).
double CheckIntTiles(int64_t count, int pieces, std::mt19937& rng) {
  const Rows rows = RandomRows(rng);
  auto xs = RandomVectors(count, rng);
  std::vector<std::vector<int16_t>> values(count, std::vector<int16_t>(kCols));
  std::vector<std::vector<float>> steps(count, std::vector<float>(kCols / 32));
  std::vector<const int16_t*> value_rows;
  std::vector<const float*> step_rows;
  for (int64_t t = 0; t < count; ++t) {
    gptoss::QuantizeWords(xs[t].data(), kCols, pieces, values[t].data(), steps[t].data());
    value_rows.push_back(values[t].data());
    step_rows.push_back(steps[t].data());
    Quantized(xs[t], pieces);
  }
  std::vector<int32_t> words(gptoss::PackedWordsSize(count, kCols));
  std::vector<float> packed_steps(gptoss::PackedStepsSize(count, kCols));
  gptoss::PackTokens(value_rows.data(), step_rows.data(), count, kCols, words.data(), packed_steps.data());
  std::vector<float> out(kRows * count);
  gptoss::IntTileScratch scratch;
  gptoss::IntTileDots(rows.codes.data(), rows.scales.data(), kRows, kCols, words.data(), packed_steps.data(), count,
                      out.data(), scratch);
  return Worst(rows, xs, out);
}
#endif

}  // namespace

int main() {
#if defined(__AVX512F__)
  std::printf("vector lanes 16\n");
#elif defined(__AVX2__) && defined(__FMA__)
  std::printf("vector lanes 8\n");
#elif defined(GPTOSS_SIMD_NEON)
  std::printf("vector lanes 4\n");
#else
  std::printf("vector lanes 0\n");  // plain C++
#endif
  std::mt19937 rng(7);
  bool ok = true;
  const auto report = [&ok](const char* path, int64_t count, double worst) {
    const bool good = worst < 1e-5;
    ok = ok && good;
    std::printf("%s %s vectors=%lld %.2e\n", good ? "ok" : "FAIL", path, static_cast<long long>(count), worst);
  };
  for (int64_t count : {1, 2, 3, 4, 7}) report("float", count, CheckFloat(count, rng));
  for (int64_t count : {4, 7}) report("float, 19 rows", count, CheckFloat(count, rng, 19));
#if defined(GPTOSS_MOE_PERMUTED)
  for (int64_t cols : kNarrowCols) {
    if (cols % gptoss::kPermutedCols != 0) continue;
    char path[32];
    std::snprintf(path, sizeof path, "float, %lld cols", static_cast<long long>(cols));
    for (int64_t count : {1, 3}) report(path, count, CheckFloat(count, rng, kRows, cols));
  }
#endif
  for (int64_t count : {1, 2, 3}) report("int8", count, CheckInt8(count, 1, rng));
  for (int64_t count : {1, 2, 3}) report("int8x2", count, CheckInt8(count, 2, rng));
#if defined(GPTOSS_MOE_GROUPED)
  // the groups of four pairs, at the real width (11 groups and a pair), at one group and at fewer pairs than a group
  for (int64_t cols : {kCols, int64_t{256}, int64_t{192}}) {
    char path[40];
    for (int pieces : {1, 2}) {
      std::snprintf(path, sizeof path, "%s grouped, %lld cols", pieces == 1 ? "int8" : "int8x2",
                    static_cast<long long>(cols));
      for (int64_t count : {1, 2, 3}) report(path, count, CheckInt8(count, pieces, rng, true, cols));
    }
  }
#endif
#if defined(GPTOSS_MOE_INT_TILES)
  for (int pieces : {1, 2}) {
    for (int64_t count : {4, 7, 17, 33, 64}) report(pieces == 1 ? "int8 tiles" : "int8x2 tiles", count,
                                                    CheckIntTiles(count, pieces, rng));
  }
#endif
  return ok ? 0 : 1;
}
