// Just enough of CUDA to run a kernel file's device code on the host, for tests. Every thread of a block is a
// fiber (ucontext) on one OS thread; a fiber runs until it meets a barrier, and a small scheduler resumes it
// once every live thread of its warp (for a shuffle) or of its block (for __syncthreads) has arrived. A warp's
// lanes exchange shuffle values through a per-warp slot array, double-buffered so that one barrier per
// shuffle suffices. Blocks run one after another (so `__shared__` variables can be function statics).
#pragma once

#include <ucontext.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#define GPTOSS_HOST_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

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
inline int atomicAdd(int* address, int value) {  // fibers share one OS thread: nothing runs in between
  const int old = *address;
  *address = value + old;
  return old;
}
enum cudaMemcpyKind { cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
inline cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(to, from, bytes);  // "device" memory is host memory here
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* to, int value, size_t bytes, cudaStream_t) {
  std::memset(to, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1 };
inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  // the emulation driver passes a non-null stream to stand for one being captured
  *status = stream ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

namespace emulation {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarp = 32;

enum class Wait { kNone, kWarp, kBlock };

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack{new char[kStackBytes]};
  dim3 index;
  unsigned linear = 0;      // its thread's index in the block
  Wait wait = Wait::kNone;
  unsigned generation = 0;  // of the barrier it waits at
  unsigned shuffles = 0;    // shuffles done: picks the slot buffer
  bool done = false;
};

// A barrier over the live threads of a warp or a block: `generation` moves on when all of them arrived.
struct Barrier {
  unsigned live = 0, arrived = 0, generation = 0;
  void Arrive() {
    if (++arrived == live) Release();
  }
  void Leave() {  // a thread returned: the others no longer wait for it
    --live;
    if (arrived > 0 && arrived == live) Release();
  }
  void Release() {
    arrived = 0;
    ++generation;
  }
};

struct Warp {
  Barrier barrier;
  uint64_t slots[2][kWarp];  // room for any shuffled value up to 8 bytes
};

inline dim3 thread_index, block_index, block_dim, grid_dim;
inline ucontext_t scheduler;
inline Fiber* current = nullptr;
inline std::vector<Warp> warps;
inline Barrier block_barrier;
inline std::function<void()> body;  // the kernel call of the block being run

inline void Yield(Wait wait, Barrier& barrier) {
  Fiber& self = *current;
  self.wait = wait;
  self.generation = barrier.generation;
  barrier.Arrive();
  swapcontext(&self.context, &scheduler);
  self.wait = Wait::kNone;
}

inline void SyncThreads() { Yield(Wait::kBlock, block_barrier); }

inline void SyncWarp() { Yield(Wait::kWarp, warps[current->linear / kWarp].barrier); }

// The value of lane + delta (down), lane - delta (up) or, `butterfly`, lane ^ delta; a lane past the warp's edge
// keeps its own.
template <typename T>
T Shuffle(T value, int delta, bool butterfly = false) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffled values are at most 8 bytes");
  const int lane = static_cast<int>(current->linear % kWarp);
  Warp& warp = warps[current->linear / kWarp];
  uint64_t* slots = warp.slots[current->shuffles++ % 2];
  std::memcpy(&slots[lane], &value, sizeof value);
  Yield(Wait::kWarp, warp.barrier);
  const int source = butterfly ? lane ^ delta : lane + delta;
  if (source < 0 || source >= kWarp) return value;
  T other;
  std::memcpy(&other, &slots[source], sizeof other);
  return other;
}

inline void Entry() {
  body();
  current->done = true;
}  // returns to `scheduler` through uc_link

inline bool Released(const Fiber& fiber) {
  switch (fiber.wait) {
    case Wait::kNone:
      return true;
    case Wait::kWarp:
      return warps[fiber.linear / kWarp].barrier.generation != fiber.generation;
    case Wait::kBlock:
      return block_barrier.generation != fiber.generation;
  }
  return false;
}

// Runs every thread of the current block to its end, each fiber until its next barrier in turn.
inline void RunBlock(std::vector<Fiber>& fibers) {
  const unsigned threads = static_cast<unsigned>(fibers.size());
  warps.assign((threads + kWarp - 1) / kWarp, Warp{});
  for (unsigned t = 0; t < threads; ++t) warps[t / kWarp].barrier.live++;
  block_barrier = Barrier{threads, 0, 0};
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& fiber = fibers[t];
    fiber.index = dim3(t % block_dim.x, t / block_dim.x % block_dim.y, t / (block_dim.x * block_dim.y));
    fiber.linear = t;
    fiber.wait = Wait::kNone;
    fiber.shuffles = 0;
    fiber.done = false;
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack.get();
    fiber.context.uc_stack.ss_size = kStackBytes;
    fiber.context.uc_link = &scheduler;
    makecontext(&fiber.context, Entry, 0);
  }
  for (unsigned remaining = threads; remaining > 0;) {
    bool progressed = false;
    for (Fiber& fiber : fibers) {
      if (fiber.done || !Released(fiber)) continue;
      current = &fiber;
      thread_index = fiber.index;
      swapcontext(&scheduler, &fiber.context);
      progressed = true;
      if (fiber.done) {
        --remaining;
        warps[fiber.linear / kWarp].barrier.Leave();
        block_barrier.Leave();
      }
    }
    if (!progressed) {
      std::fprintf(stderr, "emulation: threads of a block wait at barriers that none of the others reach\n");
      std::abort();
    }
  }
}

template <typename Kernel, typename... Args>
void Launch(Kernel kernel, dim3 grid, dim3 block, Args... args) {
  block_dim = block;
  grid_dim = grid;
  std::vector<Fiber> fibers(block.x * block.y * block.z);
  body = [&] { kernel(args...); };
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        block_index = dim3(bx, by, bz);
        RunBlock(fibers);
      }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: c += A B over the warp's fragments in PTX's layout (lane l:
// group l / 4, thread l % 4). Each lane leaves its A and B registers in the warp's slots, all wait, each computes
// its four C entries (float sums in K order), and all wait again before the slots are reused.
struct MmaSlots {
  uint32_t a[kWarp][4];
  uint32_t b[kWarp][2];
};
inline std::vector<MmaSlots> mma_slots;

inline float Element(const void* data, int type, int64_t index);

inline float MmaValue(uint32_t word, int half, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(half ? word >> 16 : word & 0xFFFFu);
  return Element(&bits, bf16 ? 14 : 2, 0);
}

inline void Mma16816(bool bf16, float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const unsigned lane = current->linear % kWarp, warp = current->linear / kWarp;
  if (mma_slots.size() < warps.size()) mma_slots.resize(warps.size());
  MmaSlots& slots = mma_slots[warp];
  std::memcpy(slots.a[lane], a, sizeof a);
  std::memcpy(slots.b[lane], b, sizeof b);
  Yield(Wait::kWarp, warps[warp].barrier);
  const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
  for (int entry = 0; entry < 4; ++entry) {
    const int row = g + (entry >= 2 ? 8 : 0), column = 2 * t + entry % 2;
    float sum = c[entry];
    for (int k = 0; k < 16; ++k) {
      const int a_lane = (row % 8) * 4 + (k % 8) / 2, a_reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
      const int b_lane = column * 4 + (k % 8) / 2, b_reg = k >= 8 ? 1 : 0;
      sum += MmaValue(slots.a[a_lane][a_reg], k % 2, bf16) * MmaValue(slots.b[b_lane][b_reg], k % 2, bf16);
    }
    c[entry] = sum;
  }
  Yield(Wait::kWarp, warps[warp].barrier);
}

// cuBLAS's three calls for the kernel file's GEMM path, on the host: cublasGemmEx's column-major
// C = alpha op(A) op(B) + beta C (C not read when beta is 0) with float32 accumulation, inputs float32 (0),
// float16 (2) or bfloat16 (14), output float32 and compute type 32F only (68), as the kernel file calls it.
inline float Element(const void* data, int type, int64_t index) {
  if (type == 0) return static_cast<const float*>(data)[index];
  const uint32_t bits = static_cast<const uint16_t*>(data)[index];
  if (type == 14) return __uint_as_float(bits << 16);
  const uint32_t sign = (bits & 0x8000u) << 16, exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return __uint_as_float(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mantissa), -24);
  return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline int CublasCreate(void** handle) {
  *handle = nullptr;
  return 0;
}
inline int CublasSetStream(void*, cudaStream_t) { return 0; }
inline int CublasGemmEx(void*, int transa, int transb, int m, int n, int k, const void* alpha, const void* a,
                        int a_type, int lda, const void* b, int b_type, int ldb, const void* beta, void* c, int c_type,
                        int ldc, int compute_type, int) {
  const auto known = [](int type) { return type == 0 || type == 2 || type == 14; };
  const auto op = [](int value) { return value == 0 || value == 1; };
  if (!known(a_type) || !known(b_type) || c_type != 0 || compute_type != 68 || !op(transa) || !op(transb)) return 15;
  const float scale = *static_cast<const float*>(alpha), keep = *static_cast<const float*>(beta);
  float* out = static_cast<float*>(c);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (int l = 0; l < k; ++l) {
        const int64_t at = transa ? l + static_cast<int64_t>(i) * lda : i + static_cast<int64_t>(l) * lda;
        const int64_t bt = transb ? j + static_cast<int64_t>(l) * ldb : l + static_cast<int64_t>(j) * ldb;
        sum += Element(a, a_type, at) * Element(b, b_type, bt);
      }
      float& target = out[i + static_cast<int64_t>(j) * ldc];
      target = scale * sum + (keep == 0.0f ? 0.0f : keep * target);
    }
  }
  return 0;
}

}  // namespace emulation

#define threadIdx emulation::thread_index
#define blockIdx emulation::block_index
#define blockDim emulation::block_dim
#define gridDim emulation::grid_dim
#define __syncthreads() emulation::SyncThreads()
#define __syncwarp(...) emulation::SyncWarp()
#define __shfl_down_sync(mask, value, offset) emulation::Shuffle(value, offset)
#define __shfl_up_sync(mask, value, offset) emulation::Shuffle(value, -(offset))
#define __shfl_xor_sync(mask, value, lanes) emulation::Shuffle(value, lanes, true)
#define GPTOSS_LAUNCH(kernel, grid, block, stream, ...) emulation::Launch(kernel, grid, block, __VA_ARGS__)
