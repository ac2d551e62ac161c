// add: out = a + b, elementwise (residual connections).
#include "../kernels_gpu.h"
#include "elementwise.cuh"

namespace tessera::gpu {

namespace {

__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                           float* __restrict__ out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

}  // namespace

void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;  // a zero-sized grid is a launch error
  add_kernel<<<elementwise_grid(n), kElementwiseBlock, 0, stream>>>(a, b, out, n);
}

}  // namespace tessera::gpu
