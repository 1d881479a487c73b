// Just enough of CUDA to run a kernel file's device code on the host, for tests: every thread of a block is
// a std::thread, the block's threads meet at __syncthreads on a barrier, a warp's 32 lanes exchange values
// for __shfl_down_sync through a per-warp slot array and barrier (so the lanes run in lockstep there), and
// blocks run one after another on the same threads (so `__shared__` variables can be function statics).
#pragma once

#include <barrier>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define GPTOSS_HOST_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT
};
struct uint4 {
  uint32_t x, y, z, w;
};
struct float4 {
  float x, y, z, w;
};
using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }

inline float __uint_as_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
inline uint32_t __float_as_uint(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
inline int atomicAdd(int* address, int value) { return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST); }

namespace emulation {

inline thread_local dim3 thread_index, block_index;
inline dim3 block_dim, grid_dim;

struct Warp {
  std::barrier<> meet{32};
  float slots[32];
};
struct Block {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<Warp>> warps;
};
inline thread_local Block* current_block;

inline float ShuffleDown(float value, int offset) {
  const unsigned lane = thread_index.x % 32;
  Warp& warp = *current_block->warps[thread_index.x / 32];
  warp.slots[lane] = value;
  warp.meet.arrive_and_wait();
  const float other = lane + offset < 32 ? warp.slots[lane + offset] : value;
  warp.meet.arrive_and_wait();
  return other;
}

template <typename Kernel, typename... Args>
void Launch(Kernel kernel, dim3 grid, dim3 block, Args... args) {
  // One std::thread per thread of a block, reused for every block in turn (a barrier between blocks).
  const unsigned threads = block.x * block.y * block.z;
  block_dim = block;
  grid_dim = grid;
  Block state;
  state.all = std::make_unique<std::barrier<>>(threads);
  for (unsigned w = 0; w < (threads + 31) / 32; ++w) state.warps.push_back(std::make_unique<Warp>());
  std::barrier<> block_done(threads);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      thread_index = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
      current_block = &state;
      for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
          for (unsigned bx = 0; bx < grid.x; ++bx) {
            block_index = dim3(bx, by, bz);
            kernel(args...);
            block_done.arrive_and_wait();
          }
    });
  }
  for (auto& thread : pool) thread.join();
}

}  // namespace emulation

#define threadIdx emulation::thread_index
#define blockIdx emulation::block_index
#define blockDim emulation::block_dim
#define gridDim emulation::grid_dim
#define __syncthreads() emulation::current_block->all->arrive_and_wait()
#define __shfl_down_sync(mask, value, offset) emulation::ShuffleDown(value, offset)
#define GPTOSS_LAUNCH(kernel, grid, block, stream, ...) emulation::Launch(kernel, grid, block, __VA_ARGS__)
