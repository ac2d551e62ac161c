// Launch shape shared by the elementwise kernels: a grid-stride loop over n values, so one launch
// covers any n (including n beyond 2^31) with a bounded grid.
#pragma once

#include <cstdint>

#include "../vendor.h"

namespace tessera::gpu {

constexpr int kElementwiseBlock = 256;

inline unsigned elementwise_grid(int64_t n) {
  // 65535 blocks keep the grid legal on every target; the loop covers the rest.
  const int64_t blocks = (n + kElementwiseBlock - 1) / kElementwiseBlock;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

__device__ inline int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace tessera::gpu
