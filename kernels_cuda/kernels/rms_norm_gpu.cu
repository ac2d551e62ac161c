// rms_norm: out = x / sqrt(mean(x²) + eps) * weight, one block per row. In-place safe: each thread
// reads its elements before the barrier inside block_sum and writes the same elements after it.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kBlock = 256;

__global__ void rms_norm_kernel(const float* x, const float* __restrict__ weight, float* out, int64_t rows,
                                int64_t dim, float eps) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / float(dim) + eps);
    float* yr = out + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * weight[i];
    __syncthreads();  // the next row's reads of x cannot race this row's writes when out == x
  }
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
              cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  rms_norm_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(x, weight, out, rows, dim, eps);
}

}  // namespace tessera::gpu
