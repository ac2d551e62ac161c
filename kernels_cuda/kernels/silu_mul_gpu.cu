// silu_mul: out = silu(gate) * up, elementwise (the SwiGLU feed-forward).
#include "../kernels_gpu.h"
#include "elementwise.cuh"

namespace tessera::gpu {

namespace {

__global__ void silu_mul_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                float* __restrict__ out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float g = gate[i];
    // expf, not __expf: the result must stay within a few ulp of the CPU reference.
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  silu_mul_kernel<<<elementwise_grid(n), kElementwiseBlock, 0, stream>>>(gate, up, out, n);
}

}  // namespace tessera::gpu
