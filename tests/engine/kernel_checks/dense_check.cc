// The dense kernels' blocks (dense_cpu.cc, included whole: its internals are this file's) run without ONNX Runtime
// against a double-precision reference, at gpt-oss's widths: what a build for another CPU (ARM under qemu-user,
// an x86-64 level the host lacks under an emulator) is checked with where the ORT library cannot be loaded.
// Prints one line per shape and exits 1 if any sum is off by more than 1e-5 of the magnitude of its products.
// `--quick` (for an emulator): the real width K = 2880 and the same blocks, without the unembedding's 201,088 rows.
#include "dense_cpu.cc"
#include "amx_cpu.cc"  // the AMX tiles (an x86-64-v4-amx build), which its prefill links to

#include <cmath>
#include <cstdio>
#include <random>

namespace {

template <typename W>
double Check(int64_t n, int64_t k, int64_t rows, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(rows * k), y(rows * n), scale;
  std::vector<typename W::Stored> w(n * k);
  for (auto& v : x) v = uniform(rng);
  for (auto& v : w) {
    if constexpr (sizeof(typename W::Stored) == 1) {
      v = static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
    } else {
      const float value = uniform(rng) * 0.1f;
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof bits);
      v = static_cast<uint16_t>(bits >> 16);
    }
  }
  gptoss::Problem<W> p{};
  if constexpr (sizeof(typename W::Stored) == 1) {
    scale.resize(n);
    for (auto& s : scale) s = 0.001f + 0.01f * (uniform(rng) + 1.0f);
    p.scale = scale.data();
  }
  p.x = x.data();
  p.w = w.data();
  p.y = y.data();
  p.rows = rows;
  p.k = k;
  p.n = n;
  std::vector<float> chunked;
  gptoss::ChunkInput(p, chunked);
  const int64_t tasks = (n + gptoss::kBlockRows - 1) / gptoss::kBlockRows;
  for (int64_t task = 0; task < tasks; ++task) gptoss::RunBlock<W>(&p, static_cast<size_t>(task));
  double worst = 0.0;
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const double product = static_cast<double>(x[m * k + i]) * W::Widen(w[j * k + i]);
        sum += product;
        magnitude += std::fabs(product);
      }
      const double s = p.Scale(j);
      worst = std::max(worst, std::fabs(y[m * n + j] - sum * s) / (magnitude * s + 1e-30));
    }
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  struct Shape {
    int64_t n, k, rows;
  };
  // QKV at decode (1 and 2 rows: whole blocks' rows read as streams apart), the attention output (at 3 to 8 rows:
  // two at a time from 4 where registers are few, a last 3 in one pass), the router past the dot products, prefill's
  // tiles, partial blocks and passes, and the 201,088-row unembedding
  std::vector<Shape> shapes = {{5120, 2880, 1}, {5120, 2880, 2}, {2880, 4096, 3}, {2880, 4096, 4}, {2880, 4096, 8},
                                {32, 2880, 9},  {37, 100, 13},  {37, 100, 5},   {37, 100, 6},   {37, 100, 7},
                                {37, 100, 2},   {37, 100, 1}};
  if (quick) {
    shapes.push_back({512, 2880, 40});  // prefill's tiles
  } else {
    shapes.push_back({5120, 2880, 40});
    shapes.push_back({201088, 2880, 1});
  }
  std::mt19937 rng(7);
  bool ok = true;
#if defined(GPTOSS_SIMD)
  std::printf("vector lanes %d\n", gptoss::Simd::kLanes);
#else
  std::printf("vector lanes 0\n");  // plain C++
#endif
  for (const Shape& s : shapes) {
    const double bf16 = Check<gptoss::Bf16Weights>(s.n, s.k, s.rows, rng);
    const double int8 = Check<gptoss::Int8Weights>(s.n, s.k, s.rows, rng);
    const bool good = bf16 < 1e-5 && int8 < 1e-5;
    ok = ok && good;
    std::printf("%s n=%lld k=%lld rows=%lld bf16 %.2e int8 %.2e\n", good ? "ok" : "FAIL", static_cast<long long>(s.n),
                static_cast<long long>(s.k), static_cast<long long>(s.rows), bf16, int8);
  }
  return ok ? 0 : 1;
}
