// The MoE's experts with many tokens in a step (prefill) on int8 activations (the `int8_activations` attribute), in
// integer arithmetic where the build has AVX2 or AVX-512. Each token's vector is quantized per block of 32 as the
// decode's int8 path quantizes it (one piece, or two as one int16, 254 q + r: mxfp4_moe_cpu.cc) and laid out a token
// an int32 lane, a pair of values a lane; each weight row is decoded once a pass to twice its E2M1 values as int16
// (exact) and meets a group of tokens in word multiply-adds (a pair's two products summed into each token's lane).
// A block's int32 sums (exact: within 32 x 12 x 32385) are scaled in float by half the weight block's E8M0 scale
// times the token block's step and summed over the row: the integer sums of the decode's int8 path, the float
// rounding of their scaled sum its own. One 20b MoE layer's 512-token step with two pieces, against the float tiles
// (2 threads on a Zen 5 AMD EPYC, alternated in one process, medians of 7): 1.28x as fast with AVX2, 1.39x with
// AVX-512 and VNNI (bench/llama_cpp_bench.py's prefill rows show the engine's rates, with `float` beside).
#pragma once

#include <cstdint>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#define GPTOSS_MOE_INT_TILES 1

namespace gptoss {

// int32 words and floats PackTokens writes for `count` tokens of `cols` values (a multiple of 32).
int64_t PackedWordsSize(int64_t count, int64_t cols);
int64_t PackedStepsSize(int64_t count, int64_t cols);

// `count` tokens' quantized values (values[t]: `cols` int16) and block steps (steps[t]: cols / 32 floats) laid out
// for IntTileDots: per group of tokens, as many as the build's widest register has int32 lanes (the last group
// padded with zeros), per block, per pair of values, one int32 word a token (the pair); and per group, per block, one
// step a token.
void PackTokens(const int16_t* const* values, const float* const* steps, int64_t count, int64_t cols, int32_t* words,
                float* packed_steps);

// A task's decoded weight rows, kept per thread between calls.
struct IntTileScratch {
  std::vector<int16_t> rows;
  std::vector<float> scales;
};

// out[r * count + t] = MXFP4 row r . token t for `rows` consecutive rows (cols / 2 code bytes and cols / 32 scale
// bytes each) and the `count` tokens PackTokens laid out in words and packed_steps.
void IntTileDots(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, const int32_t* words,
                 const float* packed_steps, int64_t count, float* out, IntTileScratch& scratch);

}  // namespace gptoss

#endif
