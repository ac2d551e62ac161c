// gemm: y[m][n] = x[m][k] · W[n][k]ᵀ for float, GGUF-block (Q8_0, Q4_0 here; Q4_1, Q5_0, Q5_1, IQ4_NL,
// Q2_K-Q6_K, IQ4_XS and the IQ2/IQ3 grid formats through gguf_blocks.cuh) and group-wise int4 weights.
// The weight is unpacked in registers (never expanded to a float copy in memory):
//   m <= kMaxM (decode): a warp per output feature streams its weight row once, in 16-byte (or
//     whole-block) units, against all m activation rows — bound by weight bandwidth, as decode is.
//   larger m (prefill, big batches): 64 x 64 output tiles through shared memory, the weight tile
//     dequantized to float as it is staged, 4 x 4 outputs per thread.
// Accumulation is in float throughout, so results match the CPU reference to float rounding.
#include "common.cuh"

namespace tessera::gpu {

int64_t weight_row_bytes(WFormat format, int64_t cols) {
  switch (format) {
    case WFormat::f32: return cols * 4;
    case WFormat::f16:
    case WFormat::bf16: return cols * 2;
    case WFormat::q8_0: return cols / 32 * 34;
    case WFormat::q4_0: return cols / 32 * 18;
    case WFormat::i4: return cols / 2;
    case WFormat::q4_1: return cols / 32 * gguf::Q4_1::kBytes;
    case WFormat::q5_0: return cols / 32 * gguf::Q5_0::kBytes;
    case WFormat::q5_1: return cols / 32 * gguf::Q5_1::kBytes;
    case WFormat::iq4_nl: return cols / 32 * gguf::Iq4Nl::kBytes;
    case WFormat::q2_k: return cols / 256 * gguf::Q2_K::kBytes;
    case WFormat::q3_k: return cols / 256 * gguf::Q3_K::kBytes;
    case WFormat::q4_k: return cols / 256 * gguf::Q4_K::kBytes;
    case WFormat::q5_k: return cols / 256 * gguf::Q5_K::kBytes;
    case WFormat::q6_k: return cols / 256 * gguf::Q6_K::kBytes;
    case WFormat::iq4_xs: return cols / 256 * gguf::Iq4Xs::kBytes;
    case WFormat::iq2_xxs: return cols / 256 * gguf::Iq2Xxs::kBytes;
    case WFormat::iq2_xs: return cols / 256 * gguf::Iq2Xs::kBytes;
    case WFormat::iq2_s: return cols / 256 * gguf::Iq2S::kBytes;
    case WFormat::iq3_xxs: return cols / 256 * gguf::Iq3Xxs::kBytes;
    case WFormat::iq3_s: return cols / 256 * gguf::Iq3S::kBytes;
  }
  return 0;
}

namespace {

constexpr int kMaxM = 8;          // activation rows per GEMV launch
constexpr int kGemvBlock = 256;   // threads: 8 warps of 32 or 4 wavefronts of 64
constexpr int kGemvRows = 8;      // output features per block (a warp takes several on wave64)

// ---- unit decoders for the GEMV ------------------------------------------------------------------
// A decoder reads unit u (kUnit consecutive elements of row j, starting at u * kUnit) in two steps:
// fetch() issues the unit's memory load, decode() turns the loaded bits into floats. The GEMV issues
// kDepth fetches per lane before decoding any of them, so enough bytes are in flight to keep HBM
// busy (one 16-byte load per lane at a time left the H200 at a quarter of its bandwidth).

struct DecF32x4 {
  static constexpr int kUnit = 4, kDepth = 4;
  using Raw = float4;
  __device__ static Raw fetch(const GpuWeight&, const uint8_t* row, int64_t, int64_t u) {
    return reinterpret_cast<const float4*>(row)[u];
  }
  __device__ static void decode(const GpuWeight&, const Raw& v, int64_t, int64_t, float* out) {
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
};

template <bool kBf16>
struct DecHalfx8 {
  static constexpr int kUnit = 8, kDepth = 4;
  using Raw = uint4;
  __device__ static Raw fetch(const GpuWeight&, const uint8_t* row, int64_t, int64_t u) {
    return reinterpret_cast<const uint4*>(row)[u];
  }
  __device__ static void decode(const GpuWeight&, const Raw& v, int64_t, int64_t, float* out) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t lo = uint16_t(words[i] & 0xffffu), hi = uint16_t(words[i] >> 16);
      out[2 * i] = kBf16 ? bf16_bits_to_float(lo) : half_bits_to_float(lo);
      out[2 * i + 1] = kBf16 ? bf16_bits_to_float(hi) : half_bits_to_float(hi);
    }
  }
};

// GGUF Q8_0: fp16 scale + 32 int8 (blocks are 34 bytes, so only 2-byte aligned); decode loads.
struct DecQ8_0 {
  static constexpr int kUnit = 32, kDepth = 1;
  using Raw = const uint8_t*;
  __device__ static Raw fetch(const GpuWeight&, const uint8_t* row, int64_t, int64_t u) { return row + u * 34; }
  __device__ static void decode(const GpuWeight&, Raw blk, int64_t, int64_t, float* out) {
    const float d = half_bits_to_float(load_u16(blk));
#pragma unroll
    for (int t = 0; t < 16; ++t) {
      const uint16_t q2 = load_u16(blk + 2 + 2 * t);
      out[2 * t] = d * float(int8_t(q2 & 0xff));
      out[2 * t + 1] = d * float(int8_t(q2 >> 8));
    }
  }
};

// GGUF Q4_0: fp16 scale + 16 bytes; byte i holds element i (low nibble) and i + 16 (high), offset 8.
struct DecQ4_0 {
  static constexpr int kUnit = 32, kDepth = 1;
  using Raw = const uint8_t*;
  __device__ static Raw fetch(const GpuWeight&, const uint8_t* row, int64_t, int64_t u) { return row + u * 18; }
  __device__ static void decode(const GpuWeight&, Raw blk, int64_t, int64_t, float* out) {
    const float d = half_bits_to_float(load_u16(blk));
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const uint16_t b2 = load_u16(blk + 2 + 2 * t);
      const int b0 = b2 & 0xff, b1 = b2 >> 8;
      out[2 * t] = d * float((b0 & 0x0f) - 8);
      out[2 * t + 1] = d * float((b1 & 0x0f) - 8);
      out[2 * t + 16] = d * float((b0 >> 4) - 8);
      out[2 * t + 17] = d * float((b1 >> 4) - 8);
    }
  }
};

// The other GGUF formats (gguf_blocks.cuh): 32 elements per unit, a whole block of 32 or one
// sub-block of a super-block of 256 (whose scales each lane decodes for itself).
template <class B>
struct DecGguf {
  static constexpr int kUnit = 32, kDepth = 1;
  using Raw = const uint8_t*;
  __device__ static Raw fetch(const GpuWeight&, const uint8_t* row, int64_t, int64_t u) {
    return row + (u / (B::kElems / 32)) * B::kBytes;
  }
  __device__ static void decode(const GpuWeight&, Raw blk, int64_t, int64_t u, float* out) {
    B::sub32(blk, int(u % (B::kElems / 32)), out);
  }
};

// The grid formats: the same, reading the codebooks the weight points to.
template <class B>
struct DecIq {
  static constexpr int kUnit = 32, kDepth = 1;
  using Raw = const uint8_t*;
  __device__ static Raw fetch(const GpuWeight&, const uint8_t* row, int64_t, int64_t u) {
    return row + (u / 8) * B::kBytes;
  }
  __device__ static void decode(const GpuWeight& w, Raw blk, int64_t, int64_t u, float* out) {
    B::sub32(blk, int(u % 8), out, w.iq_tables);
  }
};

// int4, low nibble first: 8 elements from one 4-byte word, all in one group (group_size % 8 == 0).
struct DecI4x8 {
  static constexpr int kUnit = 8, kDepth = 4;
  using Raw = uint32_t;
  __device__ static Raw fetch(const GpuWeight&, const uint8_t* row, int64_t, int64_t u) {
    return reinterpret_cast<const uint32_t*>(row)[u];
  }
  __device__ static void decode(const GpuWeight& w, Raw bits, int64_t j, int64_t u, float* out) {
    const int64_t gi = j * (w.cols / w.group_size) + (u * 8) / w.group_size;
    const float scale = w.scales[gi];
    const float zero = w.zeros != nullptr ? w.zeros[gi] : 8.0f;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (bits >> (8 * b)) & 0xffu;
      out[2 * b] = (float(byte & 0x0fu) - zero) * scale;
      out[2 * b + 1] = (float(byte >> 4) - zero) * scale;
    }
  }
};

// Any format, one element at a time: for shapes or pointers the vector units cannot take.
struct DecScalar {
  static constexpr int kUnit = 1, kDepth = 1;
  using Raw = float;
  __device__ static Raw fetch(const GpuWeight& w, const uint8_t* row, int64_t j, int64_t u) {
    return weight_element(w, row, j, u);
  }
  __device__ static void decode(const GpuWeight&, Raw v, int64_t, int64_t, float* out) { out[0] = v; }
};

// Adds row j's products with the m activation rows to acc, over the units first, first + stride,
// ... in increasing order, kDepth fetches in flight at a time.
template <class D, bool kVecX, int kM, int kDepth>
__device__ inline void accumulate_row(const GpuWeight& w, const uint8_t* row, int64_t j, const float* __restrict__ x,
                                      int m, int64_t first, int64_t stride, float (&acc)[kM]) {
  const int64_t k = w.cols;
  const int64_t units = k / D::kUnit;
  for (int64_t u0 = first; u0 < units; u0 += kDepth * stride) {
    typename D::Raw raw[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t u = u0 + d * stride;
      if (u < units) raw[d] = D::fetch(w, row, j, u);
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t u = u0 + d * stride;
      if (u >= units) break;
      float wv[D::kUnit];
      D::decode(w, raw[d], j, u, wv);
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        if (i < m) {  // a guard, not a break, so the loop unrolls and acc stays in registers
          const float* xr = x + i * k + u * D::kUnit;
          float s = acc[i];
          if constexpr (kVecX) {
#pragma unroll
            for (int e = 0; e < D::kUnit; e += 4) {
              const float4 xv = *reinterpret_cast<const float4*>(xr + e);
              s += wv[e] * xv.x + wv[e + 1] * xv.y + wv[e + 2] * xv.z + wv[e + 3] * xv.w;
            }
          } else {
#pragma unroll
            for (int e = 0; e < D::kUnit; ++e) s += wv[e] * xr[e];
          }
          acc[i] = s;
        }
      }
    }
  }
}

// kM: activation rows this instance is built for (m <= kM), so that one decode row keeps few
// registers and many warps fit an SM; kDepth fetches per lane are in flight at a time.
template <class D, bool kVecX, int kM, int kDepth>
__global__ void __launch_bounds__(kGemvBlock) gemv_kernel(const float* __restrict__ x, int m, GpuWeight w,
                                                         int64_t row_bytes, float* __restrict__ y) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t n = w.rows;
  const int64_t j_end = min(n, int64_t(blockIdx.x + 1) * kGemvRows);
  for (int64_t j = int64_t(blockIdx.x) * kGemvRows + warp; j < j_end; j += warps) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + j * row_bytes;
    float acc[kM];
#pragma unroll
    for (int i = 0; i < kM; ++i) acc[i] = 0.0f;
    accumulate_row<D, kVecX, kM, kDepth>(w, row, j, x, m, lane, kWarpSize, acc);
#pragma unroll
    for (int i = 0; i < kM; ++i) {
      if (i < m) {
        const float s = warp_sum(acc[i]);
        if (lane == 0) y[i * n + j] = s;
      }
    }
  }
}

// The same product with a block per kSplitRows output features, so several warps share a row (four
// of 32 lanes, two of 64), each taking every kParts-th run of units, their sums added through shared
// memory: for weights with few rows (q/k/v, the output projection, the down projection of a decode
// step), where a warp per row leaves too few loads in flight to cover the memory latency. The host
// sizes the grid by rows alone: the warp size is only known in the device pass (vendor.h).
constexpr int kSplitRows = 2;

template <class D, bool kVecX, int kM, int kDepth>
__global__ void __launch_bounds__(kGemvBlock) gemv_split_kernel(const float* __restrict__ x, int m, GpuWeight w,
                                                               int64_t row_bytes, float* __restrict__ y) {
  constexpr int kWarps = kGemvBlock / kWarpSize;
  constexpr int kParts = kWarps / kSplitRows;
  static_assert(kParts * kSplitRows == kWarps, "a block holds whole rows");
  __shared__ float partial[kWarps][kM];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int part = warp % kParts;
  const int64_t n = w.rows;
  const int64_t j = int64_t(blockIdx.x) * kSplitRows + warp / kParts;
  float acc[kM];
#pragma unroll
  for (int i = 0; i < kM; ++i) acc[i] = 0.0f;
  if (j < n) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + j * row_bytes;
    accumulate_row<D, kVecX, kM, kDepth>(w, row, j, x, m, lane + int64_t(part) * kWarpSize,
                                         int64_t(kWarpSize) * kParts, acc);
  }
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    const float s = warp_sum(acc[i]);  // every lane of every warp: no divergence around the shuffles
    if (lane == 0) partial[warp][i] = s;
  }
  __syncthreads();
  if (part == 0 && lane == 0 && j < n) {
    for (int i = 0; i < m; ++i) {
      float s = 0.0f;
#pragma unroll
      for (int p = 0; p < kParts; ++p) s += partial[warp + p][i];
      y[i * n + j] = s;
    }
  }
}

// Rows below which (with rows long enough to split) the GEMV splits each row over kParts warps.
constexpr int64_t kSplitMaxRows = 4096, kSplitMinCols = 1024;

template <class D, bool kVecX>
void launch_gemv(const float* x, int64_t m, const GpuWeight& w, float* y, cudaStream_t stream) {
  const int64_t row_bytes = weight_row_bytes(w.format, w.cols);
  const unsigned grid = static_cast<unsigned>((w.rows + kGemvRows - 1) / kGemvRows);
  for (int64_t i0 = 0; i0 < m; i0 += kMaxM) {
    const int rows = static_cast<int>(m - i0 < kMaxM ? m - i0 : kMaxM);
    const float* xi = x + i0 * w.cols;
    float* yi = y + i0 * w.rows;
    if constexpr (D::kUnit < 32) {  // GGUF blocks decode a whole 32-element block per lane: not split
      if (w.rows <= kSplitMaxRows && w.cols >= kSplitMinCols) {
      const unsigned split_grid = static_cast<unsigned>((w.rows + kSplitRows - 1) / kSplitRows);
      if (rows == 1) {
        gemv_split_kernel<D, kVecX, 1, D::kDepth><<<split_grid, kGemvBlock, 0, stream>>>(xi, rows, w, row_bytes, yi);
      } else if (rows <= 4) {
        gemv_split_kernel<D, kVecX, 4, D::kDepth><<<split_grid, kGemvBlock, 0, stream>>>(xi, rows, w, row_bytes, yi);
      } else {
        gemv_split_kernel<D, kVecX, kMaxM, D::kDepth><<<split_grid, kGemvBlock, 0, stream>>>(xi, rows, w, row_bytes,
                                                                                             yi);
      }
      continue;
      }
    }
    if (rows == 1) {
      gemv_kernel<D, kVecX, 1, 2 * D::kDepth><<<grid, kGemvBlock, 0, stream>>>(xi, rows, w, row_bytes, yi);
    } else if (rows <= 4) {
      gemv_kernel<D, kVecX, 4, D::kDepth><<<grid, kGemvBlock, 0, stream>>>(xi, rows, w, row_bytes, yi);
    } else {
      gemv_kernel<D, kVecX, kMaxM, D::kDepth><<<grid, kGemvBlock, 0, stream>>>(xi, rows, w, row_bytes, yi);
    }
  }
}

// ---- tiled kernel for larger m -------------------------------------------------------------------

constexpr int kTileM = 64, kTileN = 64, kTileK = 32, kTileThreads = 256;

__global__ void gemm_tiled_kernel(const float* __restrict__ x, int64_t m, GpuWeight w, int64_t row_bytes,
                                  float* __restrict__ y) {
  // Transposed tiles ([k][row]) so the inner loop reads a row of each; +1 avoids bank conflicts on
  // the transposing stores.
  __shared__ float xs[kTileK][kTileM + 1];
  __shared__ float ws[kTileK][kTileN + 1];
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const int64_t k = w.cols, n = w.rows;
  const int64_t m0 = int64_t(blockIdx.y) * kTileM, n0 = int64_t(blockIdx.x) * kTileN;
  const auto* base = static_cast<const uint8_t*>(w.data);
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
    for (int e = t; e < kTileM * kTileK; e += kTileThreads) {
      const int r = e / kTileK, kk = e % kTileK;
      const int64_t i = m0 + r, c = k0 + kk;
      xs[kk][r] = (i < m && c < k) ? x[i * k + c] : 0.0f;
    }
    for (int e = t; e < kTileN * kTileK; e += kTileThreads) {
      const int r = e / kTileK, kk = e % kTileK;
      const int64_t j = n0 + r, c = k0 + kk;
      ws[kk][r] = (j < n && c < k) ? weight_element(w, base + j * row_bytes, j, c) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        a[q] = xs[kk][ty + 16 * q];
        b[q] = ws[kk][tx + 16 * q];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[q][r] += a[q] * b[r];
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
      if (j < n) y[i * n + j] = acc[q][r];
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }


}  // namespace

void gemm(const float* x, int64_t m, const GpuWeight& w, float* y, cudaStream_t stream) {
  if (m <= 0 || w.rows <= 0) return;
  const int64_t k = w.cols;
  if (m > kMaxM) {
    const dim3 grid(static_cast<unsigned>((w.rows + kTileN - 1) / kTileN),
                    static_cast<unsigned>((m + kTileM - 1) / kTileM));
    gemm_tiled_kernel<<<grid, kTileThreads, 0, stream>>>(x, m, w, weight_row_bytes(w.format, k), y);
    return;
  }
  // Vector units need whole units per row and 16-byte aligned rows (x rows too, for float4 loads).
  // The GGUF formats past Q8_0/Q4_0 decode blocks of 32 (rows are whole blocks, checked by the
  // backend) against aligned x only, each instance costing compile time; other x take DecScalar.
  const bool vx = aligned16(x) && k % 4 == 0;
  const bool vw = aligned16(w.data);
  switch (w.format) {
    case WFormat::f32:
      if (vw && vx) return launch_gemv<DecF32x4, true>(x, m, w, y, stream);
      break;
    case WFormat::f16:
      if (vw && vx && k % 8 == 0) return launch_gemv<DecHalfx8<false>, true>(x, m, w, y, stream);
      break;
    case WFormat::bf16:
      if (vw && vx && k % 8 == 0) return launch_gemv<DecHalfx8<true>, true>(x, m, w, y, stream);
      break;
    case WFormat::q8_0:
      return vx ? launch_gemv<DecQ8_0, true>(x, m, w, y, stream) : launch_gemv<DecQ8_0, false>(x, m, w, y, stream);
    case WFormat::q4_0:
      return vx ? launch_gemv<DecQ4_0, true>(x, m, w, y, stream) : launch_gemv<DecQ4_0, false>(x, m, w, y, stream);
    case WFormat::i4:
      if (vw && vx && k % 8 == 0 && w.group_size % 8 == 0) return launch_gemv<DecI4x8, true>(x, m, w, y, stream);
      break;
    case WFormat::q4_1:
      if (vx) return launch_gemv<DecGguf<gguf::Q4_1>, true>(x, m, w, y, stream);
      break;
    case WFormat::q5_0:
      if (vx) return launch_gemv<DecGguf<gguf::Q5_0>, true>(x, m, w, y, stream);
      break;
    case WFormat::q5_1:
      if (vx) return launch_gemv<DecGguf<gguf::Q5_1>, true>(x, m, w, y, stream);
      break;
    case WFormat::iq4_nl:
      if (vx) return launch_gemv<DecGguf<gguf::Iq4Nl>, true>(x, m, w, y, stream);
      break;
    case WFormat::q2_k:
      if (vx) return launch_gemv<DecGguf<gguf::Q2_K>, true>(x, m, w, y, stream);
      break;
    case WFormat::q3_k:
      if (vx) return launch_gemv<DecGguf<gguf::Q3_K>, true>(x, m, w, y, stream);
      break;
    case WFormat::q4_k:
      if (vx) return launch_gemv<DecGguf<gguf::Q4_K>, true>(x, m, w, y, stream);
      break;
    case WFormat::q5_k:
      if (vx) return launch_gemv<DecGguf<gguf::Q5_K>, true>(x, m, w, y, stream);
      break;
    case WFormat::q6_k:
      if (vx) return launch_gemv<DecGguf<gguf::Q6_K>, true>(x, m, w, y, stream);
      break;
    case WFormat::iq4_xs:
      if (vx) return launch_gemv<DecGguf<gguf::Iq4Xs>, true>(x, m, w, y, stream);
      break;
    case WFormat::iq2_xxs:
      if (vx) return launch_gemv<DecIq<gguf::Iq2Xxs>, true>(x, m, w, y, stream);
      break;
    case WFormat::iq2_xs:
      if (vx) return launch_gemv<DecIq<gguf::Iq2Xs>, true>(x, m, w, y, stream);
      break;
    case WFormat::iq2_s:
      if (vx) return launch_gemv<DecIq<gguf::Iq2S>, true>(x, m, w, y, stream);
      break;
    case WFormat::iq3_xxs:
      if (vx) return launch_gemv<DecIq<gguf::Iq3Xxs>, true>(x, m, w, y, stream);
      break;
    case WFormat::iq3_s:
      if (vx) return launch_gemv<DecIq<gguf::Iq3S>, true>(x, m, w, y, stream);
      break;
  }
  launch_gemv<DecScalar, false>(x, m, w, y, stream);
}

}  // namespace tessera::gpu
