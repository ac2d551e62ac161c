// rope: rotates pairs of each head by position * theta^(-2i/rope_dim), in place. The angles are
// computed in double, as the CPU reference does, so rotations agree with it to float rounding
// (greedy tokens of a model must not depend on the backend).
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kBlock = 128;

// One block per row; threads walk the (head, pair) grid of the row. cos/sin depend only on the
// position and the pair, so they are computed once per row into shared memory (for up to
// kMaxPairs pairs; beyond that, per element).
constexpr int kMaxPairs = 256;

__global__ void rope_kernel(float* x, const int32_t* __restrict__ positions, int64_t rows, int64_t n_heads,
                            int64_t head_dim, int64_t rope_dim, float theta, bool neox) {
  __shared__ float cos_s[kMaxPairs], sin_s[kMaxPairs];
  const int64_t half = rope_dim / 2;
  const bool cached = half <= kMaxPairs;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const double pos = positions[r];
    if (cached) {
      for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
        const double a = pos * pow(double(theta), -2.0 * double(i) / double(rope_dim));
        cos_s[i] = float(cos(a));
        sin_s[i] = float(sin(a));
      }
      __syncthreads();
    }
    for (int64_t e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
      const int64_t h = e / half, i = e % half;
      float c, s;
      if (cached) {
        c = cos_s[i];
        s = sin_s[i];
      } else {
        const double a = pos * pow(double(theta), -2.0 * double(i) / double(rope_dim));
        c = float(cos(a));
        s = float(sin(a));
      }
      float* v = x + (r * n_heads + h) * head_dim;
      const int64_t i0 = neox ? i : 2 * i;
      const int64_t i1 = neox ? i + half : 2 * i + 1;
      const float a0 = v[i0], b0 = v[i1];
      v[i0] = a0 * c - b0 * s;
      v[i1] = a0 * s + b0 * c;
    }
    __syncthreads();  // the next row overwrites cos_s/sin_s
  }
}

}  // namespace

void rope(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
          float theta, bool neox, cudaStream_t stream) {
  if (rows <= 0 || n_heads <= 0 || rope_dim < 2) return;
  rope_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(x, positions, rows, n_heads, head_dim, rope_dim, theta,
                                                        neox);
}

}  // namespace tessera::gpu
