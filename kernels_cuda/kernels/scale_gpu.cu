// scale: x[i] *= s (Gemma's embeddings times sqrt(dim)).
#include "../kernels_gpu.h"
#include "elementwise.cuh"

namespace tessera::gpu {

namespace {

__global__ void scale_kernel(float* __restrict__ x, float s, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) x[i] *= s;
}

}  // namespace

void scale(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<elementwise_grid(n), kElementwiseBlock, 0, stream>>>(x, s, n);
}

}  // namespace tessera::gpu
