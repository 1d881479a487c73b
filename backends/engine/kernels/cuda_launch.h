// What the CUDA kernel files take from CUDA, and their launch written as GPTOSS_LAUNCH, so that each file also
// compiles as host C++ under the warp-emulation shim (tests/support/kernel_emulation/cuda_shim.h, included
// first: it defines GPTOSS_HOST_EMULATION and its own GPTOSS_LAUNCH).
#pragma once

#ifndef GPTOSS_HOST_EMULATION
#include <cuda_runtime.h>
#endif

#ifndef GPTOSS_LAUNCH
#define GPTOSS_LAUNCH(kernel, grid, block, stream, ...) kernel<<<grid, block, 0, stream>>>(__VA_ARGS__)
#endif
