// add_rows: x[r][c] += row[c] (a bias added to every token's row).
#include "../kernels_gpu.h"
#include "elementwise.cuh"

namespace tessera::gpu {

namespace {

__global__ void add_rows_kernel(float* __restrict__ x, const float* __restrict__ row, int64_t n, int64_t cols) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) x[i] += row[i % cols];
}

}  // namespace

void add_rows(float* x, const float* row, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  add_rows_kernel<<<elementwise_grid(n), kElementwiseBlock, 0, stream>>>(x, row, n, cols);
}

}  // namespace tessera::gpu
