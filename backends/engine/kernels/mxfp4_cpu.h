// MXFP4 as the CPU kernels read it: blocks of 32 FLOAT4E2M1 codes (two a byte, the first in the low nibble) and one
// E8M0 scale byte (2^(e-127)) a block.
#pragma once

#include <cmath>

namespace gptoss {

constexpr int kBlock = 32;  // values one scale byte covers

// 2^(e-127) for every E8M0 byte (0 is 2^-127, a float subnormal; 255, NaN in the format, reads as infinity).
struct E8M0Table {
  float values[256];
  E8M0Table() {
    for (int e = 0; e < 256; ++e) values[e] = std::ldexp(1.0f, e - 127);
  }
};
inline const E8M0Table kE8M0;

}  // namespace gptoss
