// gelu_mul: out = gelu(gate) * up, GELU by its tanh approximation (Gemma's GeGLU feed-forward),
// written as g / (1 + exp(-2y)) as the CPU reference does.
#include "../kernels_gpu.h"
#include "elementwise.cuh"

namespace tessera::gpu {

namespace {

__global__ void gelu_mul_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                float* __restrict__ out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float g = gate[i];
    const float y = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    // expf, not __expf: the result must stay within a few ulp of the CPU reference.
    out[i] = g / (1.0f + expf(-2.0f * y)) * up[i];
  }
}

}  // namespace

void gelu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_mul_kernel<<<elementwise_grid(n), kElementwiseBlock, 0, stream>>>(gate, up, out, n);
}

}  // namespace tessera::gpu
