// W8A8 GEMM: activations are quantized per row (token) to int8 with scale absmax/127, rounded to
// nearest even exactly as the CPU reference does; int8 products accumulate exactly in int32 (dp4a),
// and the dequantization is fused into the output write: y = float(acc) * (sx * w_scale). Every step
// is exact or a single IEEE operation in the same order as on the CPU, so the results agree bit for
// bit with the CPU backend.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kQuantBlock = 256;
// Float4s a thread of the vector kernel holds in registers between the two passes over its row.
constexpr int kQuantVec = 8;

__global__ void quantize_rows_kernel(const float* __restrict__ x, int64_t m, int64_t k, int8_t* __restrict__ xq,
                                     float* __restrict__ sx) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const float* xr = x + r * k;
    float amax = 0;
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) amax = fmaxf(amax, fabsf(xr[c]));
    amax = block_max(amax, scratch);
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
      const int q = __float2int_rn(__fmul_rn(xr[c], inv));
      xq[r * k + c] = int8_t(q < -127 ? -127 : (q > 127 ? 127 : q));
    }
    if (threadIdx.x == 0) sx[r] = amax / 127.0f;
  }
}

__device__ inline uint32_t quantize4(float4 v, float inv) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  uint32_t packed = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int q = __float2int_rn(__fmul_rn(f[e], inv));
    packed |= uint32_t(uint8_t(int8_t(q < -127 ? -127 : (q > 127 ? 127 : q)))) << (8 * e);
  }
  return packed;
}

// The same values for rows of at most kQuantBlock * kQuantVec * 4 floats, 16-byte aligned (k % 4 == 0):
// each row is read once, in float4s kept in registers for the second pass.
__global__ void quantize_rows_vec_kernel(const float* __restrict__ x, int64_t m, int64_t k, int8_t* __restrict__ xq,
                                         float* __restrict__ sx) {
  __shared__ float scratch[32];
  const int64_t vecs = k / 4;
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const float4* xr = reinterpret_cast<const float4*>(x + r * k);
    float4 v[kQuantVec];
    float amax = 0;
#pragma unroll
    for (int q = 0; q < kQuantVec; ++q) {
      const int64_t c = threadIdx.x + int64_t(q) * blockDim.x;
      if (c < vecs) {
        v[q] = xr[c];
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)), fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
      }
    }
    amax = block_max(amax, scratch);
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    uint32_t* out = reinterpret_cast<uint32_t*>(xq + r * k);
#pragma unroll
    for (int q = 0; q < kQuantVec; ++q) {
      const int64_t c = threadIdx.x + int64_t(q) * blockDim.x;
      if (c < vecs) out[c] = quantize4(v[q], inv);
    }
    if (threadIdx.x == 0) sx[r] = amax / 127.0f;
  }
}

// Four consecutive int8 of a row as one word; bytes past k read as 0 (any k, any alignment).
__device__ inline int load4(const int8_t* row, int64_t c, int64_t k, bool aligned) {
  if (aligned) return *reinterpret_cast<const int*>(row + c);
  uint32_t v = 0;
  for (int b = 0; b < 4; ++b) {
    if (c + b < k) v |= uint32_t(uint8_t(row[c + b])) << (8 * b);
  }
  return int(v);
}

// Small m: a warp per output feature, all m rows at once.
constexpr int kMaxM = 8, kGemvBlock = 256, kGemvRows = 8;

__global__ void gemv_i8_kernel(const int8_t* __restrict__ xq, const float* __restrict__ sx, int m,
                               const int8_t* __restrict__ w, const float* __restrict__ w_scales, int64_t n,
                               int64_t k, bool aligned, float* __restrict__ y) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t words = (k + 3) / 4;
  const int64_t j_end = min(n, int64_t(blockIdx.x + 1) * kGemvRows);
  for (int64_t j = int64_t(blockIdx.x) * kGemvRows + warp; j < j_end; j += warps) {
    const int8_t* wr = w + j * k;
    int acc[kMaxM];
#pragma unroll
    for (int i = 0; i < kMaxM; ++i) acc[i] = 0;
    for (int64_t u = lane; u < words; u += kWarpSize) {
      const int wv = load4(wr, 4 * u, k, aligned);
#pragma unroll
      for (int i = 0; i < kMaxM; ++i) {
        if (i < m) acc[i] = dp4a(load4(xq + i * k, 4 * u, k, aligned), wv, acc[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kMaxM; ++i) {
      if (i < m) {
        const int s = warp_sum(acc[i]);
        if (lane == 0) y[i * n + j] = float(s) * (sx[i] * w_scales[j]);
      }
    }
  }
}

// The same with 16-byte loads, kVecDepth of them per lane in flight before the dot products (rows
// 16-byte aligned: k % 16 == 0 and aligned bases). Integer sums are exact in any order, so both
// kernels give the same bits. kM and kVecDepth as in gemm_gpu.cu's gemv_kernel: one decode row
// keeps few registers. x holds the m activation rows as k / 16 int4 each (global or shared memory).
template <int kM, int kVecDepth>
__device__ inline void gemv_i8_rows(const int4* x, const float* sx, int m, const int8_t* __restrict__ w,
                                    const float* __restrict__ w_scales, int64_t n, int64_t k, float* __restrict__ y) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t units = k / 16;
  const int64_t j_end = min(n, int64_t(blockIdx.x + 1) * kGemvRows);
  for (int64_t j = int64_t(blockIdx.x) * kGemvRows + warp; j < j_end; j += warps) {
    const int4* wr = reinterpret_cast<const int4*>(w + j * k);
    int acc[kM];
#pragma unroll
    for (int i = 0; i < kM; ++i) acc[i] = 0;
    for (int64_t u0 = lane; u0 < units; u0 += int64_t(kVecDepth) * kWarpSize) {
      int4 wv[kVecDepth];
#pragma unroll
      for (int d = 0; d < kVecDepth; ++d) {
        const int64_t u = u0 + int64_t(d) * kWarpSize;
        if (u < units) wv[d] = wr[u];
      }
#pragma unroll
      for (int d = 0; d < kVecDepth; ++d) {
        const int64_t u = u0 + int64_t(d) * kWarpSize;
        if (u >= units) break;
#pragma unroll
        for (int i = 0; i < kM; ++i) {
          if (i < m) {
            const int4 xv = x[i * units + u];
            int s = acc[i];
            s = dp4a(xv.x, wv[d].x, s);
            s = dp4a(xv.y, wv[d].y, s);
            s = dp4a(xv.z, wv[d].z, s);
            s = dp4a(xv.w, wv[d].w, s);
            acc[i] = s;
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kM; ++i) {
      if (i < m) {
        const int s = warp_sum(acc[i]);
        if (lane == 0) y[i * n + j] = float(s) * (sx[i] * w_scales[j]);
      }
    }
  }
}

template <int kM, int kVecDepth>
__global__ void __launch_bounds__(kGemvBlock) gemv_i8_vec_kernel(const int8_t* __restrict__ xq,
                                                                const float* __restrict__ sx, int m,
                                                                const int8_t* __restrict__ w,
                                                                const float* __restrict__ w_scales, int64_t n,
                                                                int64_t k, float* __restrict__ y) {
  gemv_i8_rows<kM, kVecDepth>(reinterpret_cast<const int4*>(xq), sx, m, w, w_scales, n, k, y);
}

// Decode without a separate quantization launch: each block quantizes the activation rows itself
// into shared memory (the arithmetic of quantize_rows_vec_kernel, so the same int8 values and
// scales) and then runs gemv_i8_vec_kernel's loop against them. Every block redoes the few
// kilobytes of quantization, from L2; one launch fewer per product is worth more in a decode step.
constexpr int64_t kFusedMaxBytes = 40 * 1024;  // m * k int8 activations in shared memory

template <int kM, int kVecDepth>
__global__ void __launch_bounds__(kGemvBlock) gemv_i8_fused_kernel(const float* __restrict__ x, int m,
                                                                  const int8_t* __restrict__ w,
                                                                  const float* __restrict__ w_scales, int64_t n,
                                                                  int64_t k, float* __restrict__ y) {
  extern __shared__ int4 xs4[];
  __shared__ float scratch[32];
  __shared__ float sxs[kM];
  auto* xs = reinterpret_cast<uint32_t*>(xs4);
  const int64_t vecs = k / 4;
  for (int i = 0; i < m; ++i) {
    const float4* xr = reinterpret_cast<const float4*>(x + i * k);
    float amax = 0;
    for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) {
      const float4 v = xr[c];
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    amax = block_max(amax, scratch);
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) xs[i * vecs + c] = quantize4(xr[c], inv);
    if (threadIdx.x == 0) sxs[i] = amax / 127.0f;
  }
  __syncthreads();
  gemv_i8_rows<kM, kVecDepth>(xs4, sxs, m, w, w_scales, n, k, y);
}

// Larger m: 64 x 64 output tiles, k in steps of 32 bytes (8 words) through shared memory.
constexpr int kTileM = 64, kTileN = 64, kTileWords = 8, kTileThreads = 256;

__global__ void gemm_i8_tiled_kernel(const int8_t* __restrict__ xq, const float* __restrict__ sx, int64_t m,
                                     const int8_t* __restrict__ w, const float* __restrict__ w_scales, int64_t n,
                                     int64_t k, bool aligned, float* __restrict__ y) {
  __shared__ int xs[kTileWords][kTileM + 1];
  __shared__ int ws[kTileWords][kTileN + 1];
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const int64_t m0 = int64_t(blockIdx.y) * kTileM, n0 = int64_t(blockIdx.x) * kTileN;
  int acc[4][4] = {};
  for (int64_t c0 = 0; c0 < k; c0 += 4 * kTileWords) {
    for (int e = t; e < kTileM * kTileWords; e += kTileThreads) {
      const int r = e / kTileWords, kw = e % kTileWords;
      const int64_t i = m0 + r, c = c0 + 4 * kw;
      xs[kw][r] = (i < m && c < k) ? load4(xq + i * k, c, k, aligned) : 0;
    }
    for (int e = t; e < kTileN * kTileWords; e += kTileThreads) {
      const int r = e / kTileWords, kw = e % kTileWords;
      const int64_t j = n0 + r, c = c0 + 4 * kw;
      ws[kw][r] = (j < n && c < k) ? load4(w + j * k, c, k, aligned) : 0;
    }
    __syncthreads();
#pragma unroll
    for (int kw = 0; kw < kTileWords; ++kw) {
      int a[4], b[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        a[q] = xs[kw][ty + 16 * q];
        b[q] = ws[kw][tx + 16 * q];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[q][r] = dp4a(a[q], b[r], acc[q][r]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int64_t i = m0 + ty + 16 * q;
    if (i >= m) continue;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t j = n0 + tx + 16 * r;
      if (j < n) y[i * n + j] = float(acc[q][r]) * (sx[i] * w_scales[j]);
    }
  }
}

__global__ void scale_i32_kernel(const int32_t* __restrict__ acc, const float* __restrict__ sx,
                                 const float* __restrict__ w_scales, int64_t m, int64_t n, float* __restrict__ y) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < m * n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / n, j = e % n;
    y[e] = float(acc[e]) * (sx[i] * w_scales[j]);
  }
}

}  // namespace

void scale_i32(const int32_t* acc, const float* sx, const float* w_scales, int64_t m, int64_t n, float* y,
               cudaStream_t stream) {
  if (m <= 0 || n <= 0) return;
  scale_i32_kernel<<<capped_grid((m * n + 255) / 256), 256, 0, stream>>>(acc, sx, w_scales, m, n, y);
}

void quantize_rows_i8(const float* x, int64_t m, int64_t k, int8_t* xq, float* sx, cudaStream_t stream) {
  if (m <= 0) return;
  const bool vec = k % 4 == 0 && k <= int64_t(kQuantBlock) * kQuantVec * 4 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(xq) % 4 == 0;
  if (vec) {
    quantize_rows_vec_kernel<<<capped_grid(m), kQuantBlock, 0, stream>>>(x, m, k, xq, sx);
  } else {
    quantize_rows_kernel<<<capped_grid(m), kQuantBlock, 0, stream>>>(x, m, k, xq, sx);
  }
}

bool gemv_i8_fused(const float* x, int64_t m, const int8_t* w, const float* w_scales, int64_t n, int64_t k, float* y,
                   cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (m < 1 || m > kMaxM || n <= 0 || k % 16 != 0 || m * k > kFusedMaxBytes || !aligned(x) || !aligned(w)) return false;
  const unsigned grid = static_cast<unsigned>((n + kGemvRows - 1) / kGemvRows);
  const size_t smem = size_t(m * k);
  const int rows = static_cast<int>(m);
  if (rows == 1) {
    gemv_i8_fused_kernel<1, 8><<<grid, kGemvBlock, smem, stream>>>(x, rows, w, w_scales, n, k, y);
  } else if (rows <= 4) {
    gemv_i8_fused_kernel<4, 4><<<grid, kGemvBlock, smem, stream>>>(x, rows, w, w_scales, n, k, y);
  } else {
    gemv_i8_fused_kernel<kMaxM, 4><<<grid, kGemvBlock, smem, stream>>>(x, rows, w, w_scales, n, k, y);
  }
  return true;
}

void gemm_i8(const int8_t* xq, const float* sx, int64_t m, const int8_t* w, const float* w_scales, int64_t n,
             int64_t k, float* y, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return;
  // Word loads need every row 4-byte aligned: k a multiple of 4 and both bases aligned.
  const bool aligned = k % 4 == 0 && reinterpret_cast<uintptr_t>(w) % 4 == 0 && reinterpret_cast<uintptr_t>(xq) % 4 == 0;
  if (m > kMaxM) {
    const dim3 grid(static_cast<unsigned>((n + kTileN - 1) / kTileN), static_cast<unsigned>((m + kTileM - 1) / kTileM));
    gemm_i8_tiled_kernel<<<grid, kTileThreads, 0, stream>>>(xq, sx, m, w, w_scales, n, k, aligned, y);
    return;
  }
  const unsigned grid = static_cast<unsigned>((n + kGemvRows - 1) / kGemvRows);
  const bool vec = k % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(xq) % 16 == 0;
  if (vec) {
    const int rows = static_cast<int>(m);
    if (rows == 1) {
      gemv_i8_vec_kernel<1, 8><<<grid, kGemvBlock, 0, stream>>>(xq, sx, rows, w, w_scales, n, k, y);
    } else if (rows <= 4) {
      gemv_i8_vec_kernel<4, 4><<<grid, kGemvBlock, 0, stream>>>(xq, sx, rows, w, w_scales, n, k, y);
    } else {
      gemv_i8_vec_kernel<kMaxM, 4><<<grid, kGemvBlock, 0, stream>>>(xq, sx, rows, w, w_scales, n, k, y);
    }
  } else {
    gemv_i8_kernel<<<grid, kGemvBlock, 0, stream>>>(xq, sx, static_cast<int>(m), w, w_scales, n, k, aligned, y);
  }
}

}  // namespace tessera::gpu
