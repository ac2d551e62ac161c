// softmax over each row, in place: shifted by the row maximum so that large logits cannot overflow.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kBlock = 256;

__global__ void softmax_kernel(float* x, int64_t rows, int64_t cols) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* v = x + r * cols;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) mx = fmaxf(mx, v[i]);
    mx = block_max(mx, scratch);
    float sum = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += expf(v[i] - mx);
    sum = block_sum(sum, scratch);
    const float inv = 1.0f / sum;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) v[i] = expf(v[i] - mx) * inv;
    __syncthreads();
  }
}

}  // namespace

void softmax(float* x, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  softmax_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(x, rows, cols);
}

}  // namespace tessera::gpu
