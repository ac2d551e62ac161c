// rms_norm: out = x / sqrt(mean(x²) + eps) * weight, one block per row. In-place safe: each thread
// reads its elements before the barrier inside block_sum and writes the same elements after it.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kBlock = 256;
// Float4s a thread of the vector kernel holds in registers between the two passes over its row.
constexpr int kVec = 8;

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

// out = v * scale * weight for a thread's float4s of a row (those the vector kernels loaded into v).
__device__ inline void store_normed(const float4 (&v)[kVec], float scale, const float4* __restrict__ w4, float4* yr,
                                    int64_t vecs) {
#pragma unroll
  for (int q = 0; q < kVec; ++q) {
    const int64_t c = threadIdx.x + int64_t(q) * blockDim.x;
    if (c < vecs) {
      const float4 g = w4[c];
      yr[c] = make_float4(v[q].x * scale * g.x, v[q].y * scale * g.y, v[q].z * scale * g.z, v[q].w * scale * g.w);
    }
  }
}

// Rows of at most kBlock * kVec * 4 floats, 16-byte aligned: each row is read once (a decode step's
// single row is latency-bound, and one round of loads instead of two halves its time).
__global__ void rms_norm_vec_kernel(const float* x, const float* __restrict__ weight, float* out, int64_t rows,
                                    int64_t dim, float eps) {
  __shared__ float scratch[32];
  const int64_t vecs = dim / 4;
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float4* xr = reinterpret_cast<const float4*>(x + r * dim);
    float4 v[kVec];
    float ss = 0;
#pragma unroll
    for (int q = 0; q < kVec; ++q) {
      const int64_t c = threadIdx.x + int64_t(q) * blockDim.x;
      if (c < vecs) {
        v[q] = xr[c];
        ss += v[q].x * v[q].x + v[q].y * v[q].y + v[q].z * v[q].z + v[q].w * v[q].w;
      }
    }
    ss = block_sum(ss, scratch);  // ends with a barrier: every read of x is done before any write
    store_normed(v, 1.0f / sqrtf(ss / float(dim) + eps), w4, reinterpret_cast<float4*>(out + r * dim), vecs);
  }
}

// The residual add before a norm, fused: each thread adds its float4s, writes the sums and keeps
// them for the norm. The same arithmetic as add then rms_norm_vec_kernel, so the same bits.
__global__ void add_rms_norm_kernel(const float* a, const float* b, float* sum, const float* __restrict__ weight,
                                    float* out, int64_t rows, int64_t dim, float eps) {
  __shared__ float scratch[32];
  const int64_t vecs = dim / 4;
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float4* ar = reinterpret_cast<const float4*>(a + r * dim);
    const float4* br = reinterpret_cast<const float4*>(b + r * dim);
    float4* sr = reinterpret_cast<float4*>(sum + r * dim);
    float4 v[kVec];
    float ss = 0;
#pragma unroll
    for (int q = 0; q < kVec; ++q) {
      const int64_t c = threadIdx.x + int64_t(q) * blockDim.x;
      if (c < vecs) {
        const float4 x = ar[c], y = br[c];
        v[q] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        sr[c] = v[q];
        ss += v[q].x * v[q].x + v[q].y * v[q].y + v[q].z * v[q].z + v[q].w * v[q].w;
      }
    }
    ss = block_sum(ss, scratch);  // ends with a barrier: every read of a and b is done before any write of out
    store_normed(v, 1.0f / sqrtf(ss / float(dim) + eps), w4, reinterpret_cast<float4*>(out + r * dim), vecs);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool add_rms_norm_fits(const void* a, const void* b, const void* sum, const void* out, const void* weight,
                       int64_t dim) {
  return dim > 0 && dim % 4 == 0 && dim <= int64_t(kBlock) * kVec * 4 && aligned16(a) && aligned16(b) &&
         aligned16(sum) && aligned16(out) && aligned16(weight);
}

void add_rms_norm(const float* a, const float* b, float* sum, const float* weight, float* out, int64_t rows,
                  int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0) return;
  add_rms_norm_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(a, b, sum, weight, out, rows, dim, eps);
}

void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
              cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  if (dim % 4 == 0 && dim <= int64_t(kBlock) * kVec * 4 && aligned16(x) && aligned16(out) && aligned16(weight)) {
    rms_norm_vec_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(x, weight, out, rows, dim, eps);
  } else {
    rms_norm_kernel<<<capped_grid(rows), kBlock, 0, stream>>>(x, weight, out, rows, dim, eps);
  }
}

}  // namespace tessera::gpu
