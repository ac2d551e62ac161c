// rope: rotates pairs of each head by position * theta^(-2i/rope_dim), in place. The angles are
// computed in double, as the CPU reference does, so rotations agree with it to float rounding
// (greedy tokens of a model must not depend on the backend). Double-precision pow/sin/cos cost
// microseconds per launch, so the backend keeps a table of them for the first positions
// (fill_rope_table) and the kernel computes only positions past it.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kBlock = 256;

__device__ inline void rope_angle(int64_t pos, int64_t i, int64_t rope_dim, float theta, float* c, float* s) {
  const double a = double(pos) * pow(double(theta), -2.0 * double(i) / double(rope_dim));
  *c = float(cos(a));
  *s = float(sin(a));
}

__global__ void rope_table_kernel(float* table, int64_t positions, int64_t rope_dim, float theta) {
  const int64_t half = rope_dim / 2;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < positions * half;
       e += int64_t(gridDim.x) * blockDim.x) {
    rope_angle(e / half, e % half, rope_dim, theta, &table[2 * e], &table[2 * e + 1]);
  }
}

// One block per row; threads walk the (head, pair) grid of the row, over x's heads and then x2's.
__global__ void rope_kernel(float* x, int64_t n_heads, float* x2, int64_t n_heads2,
                            const int32_t* __restrict__ positions, int64_t rows, int64_t head_dim, int64_t rope_dim,
                            float theta, bool neox, const float* __restrict__ table, int64_t table_positions) {
  const int64_t half = rope_dim / 2;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t pos = positions[r];
    const bool tabled = pos >= 0 && pos < table_positions;
    for (int64_t e = threadIdx.x; e < (n_heads + n_heads2) * half; e += blockDim.x) {
      const int64_t hh = e / half, i = e % half;
      const bool first = hh < n_heads;
      const int64_t h = first ? hh : hh - n_heads;
      float c, s;
      if (tabled) {
        c = table[2 * (pos * half + i)];
        s = table[2 * (pos * half + i) + 1];
      } else {
        rope_angle(pos, i, rope_dim, theta, &c, &s);
      }
      float* v = first ? x + (r * n_heads + h) * head_dim : x2 + (r * n_heads2 + h) * head_dim;
      const int64_t i0 = neox ? i : 2 * i;
      const int64_t i1 = neox ? i + half : 2 * i + 1;
      const float a0 = v[i0], b0 = v[i1];
      v[i0] = a0 * c - b0 * s;
      v[i1] = a0 * s + b0 * c;
    }
  }
}

// rope_freqs: pair i of each head turns by position * inv_freq[i] (in double, as the CPU reference),
// cos and sin times mscale. One block per row.
__global__ void rope_freqs_kernel(float* x, const int32_t* __restrict__ positions, int64_t rows, int64_t n_heads,
                                  int64_t head_dim, int64_t rope_dim, const float* __restrict__ inv_freq, float mscale,
                                  bool neox) {
  const int64_t half = rope_dim / 2;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const double pos = double(positions[r]);
    for (int64_t e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
      const int64_t h = e / half, i = e % half;
      const double a = pos * double(inv_freq[i]);
      const float c = float(cos(a)) * mscale, s = float(sin(a)) * mscale;
      float* v = x + (r * n_heads + h) * head_dim;
      const int64_t i0 = neox ? i : 2 * i;
      const int64_t i1 = neox ? i + half : 2 * i + 1;
      const float a0 = v[i0], b0 = v[i1];
      v[i0] = a0 * c - b0 * s;
      v[i1] = a0 * s + b0 * c;
    }
  }
}

}  // namespace

void rope_freqs(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
                const float* inv_freq, float mscale, bool neox, cudaStream_t stream) {
  if (rows <= 0 || n_heads <= 0 || rope_dim < 2) return;
  rope_freqs_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(x, positions, rows, n_heads, head_dim, rope_dim, inv_freq,
                                                              mscale, neox);
}

void fill_rope_table(float* table, int64_t positions, int64_t rope_dim, float theta, cudaStream_t stream) {
  if (positions <= 0 || rope_dim < 2) return;
  rope_table_kernel<<<capped_grid((positions * (rope_dim / 2) + kBlock - 1) / kBlock, 4096), kBlock, 0, stream>>>(
      table, positions, rope_dim, theta);
}

void rope(float* x, int64_t n_heads, float* x2, int64_t n_heads2, const int32_t* positions, int64_t rows,
          int64_t head_dim, int64_t rope_dim, float theta, bool neox, const float* table, int64_t table_positions,
          cudaStream_t stream) {
  if (x2 == nullptr) n_heads2 = 0;
  if (rows <= 0 || n_heads + n_heads2 <= 0 || rope_dim < 2) return;
  rope_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(x, n_heads, x2, n_heads2, positions, rows, head_dim, rope_dim,
                                                        theta, neox, table, table_positions);
}

}  // namespace tessera::gpu
