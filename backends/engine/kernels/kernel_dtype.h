// The activation dtype the kernels are registered for (bit patterns of the 16-bit ones are converted with
// round-to-nearest-even).
#pragma once

namespace gptoss {

enum class Dtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

}  // namespace gptoss
