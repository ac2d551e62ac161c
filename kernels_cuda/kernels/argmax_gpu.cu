// argmax of each row on the device (greedy decoding reads back one int per row instead of the
// logits). Ties go to the first maximum, as on the CPU: each thread keeps its first best, and the
// reduction prefers the lower index among equal values.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kBlock = 256;

struct Best {
  float v;
  int32_t i;  // -1: nothing above -inf seen (rows are indexed by int32 in the output)
};

__device__ inline Best better(Best a, Best b) {
  if (b.v > a.v) return b;
  if (a.v > b.v) return a;
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  return a.i < b.i ? a : b;
}

__global__ void argmax_kernel(const float* __restrict__ logits, int64_t rows, int64_t cols, int32_t* out) {
  __shared__ float sv[1024 / 32];
  __shared__ int32_t si[1024 / 32];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* v = logits + r * cols;
    Best best{-INFINITY, -1};
    for (int32_t i = threadIdx.x; i < cols; i += blockDim.x) {
      if (v[i] > best.v) best = Best{v[i], i};
    }
    for (int o = kWarpSize / 2; o > 0; o /= 2) {
      const Best other{shfl_xor(best.v, o), shfl_xor(best.i, o)};
      best = better(best, other);
    }
    if (lane == 0) {
      sv[warp] = best.v;
      si[warp] = best.i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      Best all{sv[0], si[0]};
      for (int w = 1; w < warps; ++w) all = better(all, Best{sv[w], si[w]});
      out[r] = all.i < 0 ? 0 : all.i;  // every value -inf (or NaN): the first, as on the CPU
    }
    __syncthreads();
  }
}

}  // namespace

void argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  argmax_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(logits, rows, cols, out);
}

}  // namespace tessera::gpu
