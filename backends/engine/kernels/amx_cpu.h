// Intel AMX (tiles of bfloat16 products summed in float) for the CPU kernels' arithmetic-bound paths, in a build for
// it (the x86-64-v4-amx variant: GPTOSS_AMX defined). A tile multiply-add takes 16 rows x 32 bfloat16 values of
// weights against 32 values of 16 vectors at once; the vectors are split into two bfloat16 pieces, the value rounded
// to bfloat16 and its remainder rounded again (together within 2^-18 of the value: near float's 2^-24, far from one
// piece's 2^-9), so a product is the weight (exact in bfloat16: MXFP4 values and bf16 weights) times both pieces.
//
// Linux hands a process the tile registers only once asked (arch_prctl ARCH_REQ_XCOMP_PERM, kernels 5.16 on):
// AmxReady asks once and says whether the tiles may be used; where not (an older kernel, GATEWAY_CPU_AMX=0), the
// kernels take their AVX-512 paths.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define GPTOSS_AMX 1

namespace gptoss {

constexpr int64_t kAmxRows = 16;     // weight rows (and vectors) a tile holds
constexpr int64_t kAmxDepth = 32;    // values a tile row holds along the dot product
constexpr int64_t kAmxPieces = 2;    // bfloat16 pieces of each vector value
constexpr int64_t kAmxTileValues = kAmxRows * kAmxDepth;  // bfloat16 values of one tile (1 KiB)

// Where weight row `row` starts in the tiles' layout AmxDots reads (per group of 16 rows, per kAmxDepth values, a
// tile of the group's 16 rows) for rows of `chunks` x kAmxDepth values: its chunk c is kAmxDepth values at
// `chunk * kAmxTileValues` from there.
inline uint16_t* TileRow(uint16_t* tiles, int64_t row, int64_t chunks) {
  return tiles + row / kAmxRows * chunks * kAmxTileValues + row % kAmxRows * kAmxDepth;
}

// Whether this process may use the tiles (asked of the OS once) and GATEWAY_CPU_AMX is not "0".
bool AmxReady();

// uint16 values of PackVectors' output for `count` vectors of `cols` values (a multiple of kAmxDepth).
int64_t PackedVectorsSize(int64_t count, int64_t cols);

// `count` vectors of `cols` floats (vectors[i], cols a multiple of kAmxDepth) in the tiles' layout: per block of 16
// vectors (the last padded with zeros), per kAmxDepth values, per piece, a tile whose row i holds value pair i of
// each of the 16 vectors.
void PackVectors(const float* const* vectors, int64_t count, int64_t cols, uint16_t* packed);

// out[r * count + v] = row r . vector v for `rows` rows (a multiple of kAmxRows) of bfloat16 weights in the tiles'
// layout (TileRow) and the `count` vectors PackVectors laid out in `packed`.
void AmxDots(const uint16_t* tiles, int64_t rows, int64_t cols, const uint16_t* packed, int64_t count, float* out);

}  // namespace gptoss

#endif
