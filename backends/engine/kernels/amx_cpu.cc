// The AMX tile paths (amx_cpu.h): compiled in the x86-64-v4-amx variant only; empty elsewhere.
#include "amx_cpu.h"

#if defined(GPTOSS_AMX)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace gptoss {
namespace {

constexpr long kArchRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
constexpr long kTileData = 18;                   // XFEATURE_XTILEDATA
constexpr int64_t kTileBytes = 64;               // bytes of a tile row: kAmxDepth bfloat16 values

// The tile registers' shapes (palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t row_bytes[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int tile = 0; tile < 8; ++tile) {
      row_bytes[tile] = kTileBytes;
      rows[tile] = kAmxRows;
    }
  }
};

// The tile of vector block `block`, depth chunk `chunk`, piece `piece` in PackVectors' layout.
template <typename T>
T* PackedTile(T* packed, int64_t chunks, int64_t block, int64_t chunk, int piece) {
  return packed + ((block * chunks + chunk) * kAmxPieces + piece) * kAmxTileValues;
}

// A sums tile stored in `sums` (16 rows x 16 vectors of float) into out[r * count + v] for the rows from `row` and
// the vectors of block `block` that exist.
void CopySums(const float* sums, float* out, int64_t row, int64_t block, int64_t count) {
  const int64_t first = block * kAmxRows, vectors = std::min(kAmxRows, count - first);
  for (int64_t r = 0; r < kAmxRows; ++r) {
    std::memcpy(out + (row + r) * count + first, sums + r * kAmxRows, sizeof(float) * vectors);
  }
}

}  // namespace

bool AmxReady() {
  static const bool ready = [] {
    const char* setting = std::getenv("GATEWAY_CPU_AMX");
    if (setting != nullptr && std::string(setting) == "0") return false;
    return syscall(SYS_arch_prctl, kArchRequestPermission, kTileData) == 0;
  }();
  return ready;
}

int64_t PackedVectorsSize(int64_t count, int64_t cols) {
  return (count + kAmxRows - 1) / kAmxRows * kAmxRows * cols * kAmxPieces;
}

void PackVectors(const float* const* vectors, int64_t count, int64_t cols, uint16_t* packed) {
  const int64_t chunks = cols / kAmxDepth, blocks = (count + kAmxRows - 1) / kAmxRows;
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t v = 0; v < kAmxRows; ++v) {
      const int64_t vector = block * kAmxRows + v;
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        // the chunk's 32 values as pieces: each rounded to bfloat16, then what it left rounded again
        __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
        if (vector < count) {
          low = _mm512_loadu_ps(vectors[vector] + chunk * kAmxDepth);
          high = _mm512_loadu_ps(vectors[vector] + chunk * kAmxDepth + 16);
        }
        const __m512i first = (__m512i)_mm512_cvtne2ps_pbh(high, low);  // values 0-31 in order
        // a bfloat16 widened back to float: its bits shifted up
        const __m512 first_low = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(first)), 16));
        const __m512 first_high =
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(first, 1)), 16));
        const __m512i second = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(high, first_high), _mm512_sub_ps(low, first_low));
        // value pair i (a 32-bit word) to row i of the piece's tile, at this vector's word
        alignas(64) uint32_t words[2][16];
        _mm512_store_si512(words[0], first);
        _mm512_store_si512(words[1], second);
        for (int piece = 0; piece < kAmxPieces; ++piece) {
          uint32_t* tile = reinterpret_cast<uint32_t*>(PackedTile(packed, chunks, block, chunk, piece));
          for (int64_t pair = 0; pair < kAmxRows; ++pair) tile[pair * kAmxRows + v] = words[piece][pair];
        }
      }
    }
  }
}

void AmxDots(const uint16_t* tiles, int64_t rows, int64_t cols, const uint16_t* packed, int64_t count, float* out) {
  static const TileConfig config;
  _tile_loadconfig(&config);
  const int64_t chunks = cols / kAmxDepth, groups = rows / kAmxRows, blocks = (count + kAmxRows - 1) / kAmxRows;
  // two groups of rows against two blocks of vectors at a time: tiles 0-3 the sums (group, block: 00, 01, 10, 11),
  // 4-5 the groups' weights, 6-7 the blocks' pieces (one piece at a time); each tile loaded feeds two products
  for (int64_t group = 0; group < groups; group += 2) {
    const bool two_groups = group + 1 < groups;
    const uint16_t* first = tiles + group * chunks * kAmxTileValues;
    const uint16_t* second = first + chunks * kAmxTileValues;
    for (int64_t block = 0; block < blocks; block += 2) {
      const bool two_blocks = block + 1 < blocks;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        _tile_loadd(4, first + chunk * kAmxTileValues, kTileBytes);
        if (two_groups) _tile_loadd(5, second + chunk * kAmxTileValues, kTileBytes);
        for (int piece = 0; piece < kAmxPieces; ++piece) {
          _tile_loadd(6, PackedTile(packed, chunks, block, chunk, piece), kTileBytes);
          if (two_blocks) _tile_loadd(7, PackedTile(packed, chunks, block + 1, chunk, piece), kTileBytes);
          _tile_dpbf16ps(0, 4, 6);
          if (two_blocks) _tile_dpbf16ps(1, 4, 7);
          if (two_groups) {
            _tile_dpbf16ps(2, 5, 6);
            if (two_blocks) _tile_dpbf16ps(3, 5, 7);
          }
        }
      }
      alignas(64) float sums[kAmxRows * kAmxRows];
      const int64_t row = group * kAmxRows, next = row + kAmxRows;
      _tile_stored(0, sums, kAmxRows * sizeof(float));
      CopySums(sums, out, row, block, count);
      if (two_blocks) {
        _tile_stored(1, sums, kAmxRows * sizeof(float));
        CopySums(sums, out, row, block + 1, count);
      }
      if (two_groups) {
        _tile_stored(2, sums, kAmxRows * sizeof(float));
        CopySums(sums, out, next, block, count);
        if (two_blocks) {
          _tile_stored(3, sums, kAmxRows * sizeof(float));
          CopySums(sums, out, next, block + 1, count);
        }
      }
    }
  }
  _tile_release();
}

}  // namespace gptoss
#endif
