// y[m][n] = x[m][k] · W[n][k]ᵀ for float weights (and the GGUF k-quants on CPUs without AVX2); int8,
// int4, Q8_0, Q4_0 and the k-quants have integer-dot kernels of their own (dispatched below).
// Half-precision and k-quant rows are unpacked a few rows at a time into a small per-thread buffer
// (never a float copy of the matrix), then reused across all m rows of x; decode converts
// half-precision rows in registers instead.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "gemm_blocks_cpu.h"
#include "kernels_cpu.h"
#include "stealing_bands_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kRowsPerTile = 4;

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Four dot products of one x row against four W rows, sharing the x loads.
__attribute__((target("avx2,fma"))) void dot4_avx2(const float* x, const float* w0, const float* w1,
                                                   const float* w2, const float* w3, int64_t k,
                                                   float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w0 + i), a0);
    a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w1 + i), a1);
    a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w2 + i), a2);
    a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w3 + i), a3);
  }
  float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
  for (; i < k; ++i) {
    s0 += x[i] * w0[i];
    s1 += x[i] * w1[i];
    s2 += x[i] * w2[i];
    s3 += x[i] * w3[i];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

// A 3 x 4 tile: three x rows against four W rows, 12 accumulators in registers, so every load
// feeds 1.7 FMAs instead of 0.8 (prefill is otherwise bound by loads, not by FMA throughput).
__attribute__((target("avx2,fma"))) void dot3x4_avx2(const float* x0, const float* x1, const float* x2,
                                                     const float* const* w, int64_t k, float* out0,
                                                     float* out1, float* out2) {
  __m256 a[3][4];
  for (auto& row : a) {
    for (auto& v : row) v = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 xv0 = _mm256_loadu_ps(x0 + i);
    const __m256 xv1 = _mm256_loadu_ps(x1 + i);
    const __m256 xv2 = _mm256_loadu_ps(x2 + i);
    for (int r = 0; r < 4; ++r) {
      const __m256 wv = _mm256_loadu_ps(w[r] + i);
      a[0][r] = _mm256_fmadd_ps(xv0, wv, a[0][r]);
      a[1][r] = _mm256_fmadd_ps(xv1, wv, a[1][r]);
      a[2][r] = _mm256_fmadd_ps(xv2, wv, a[2][r]);
    }
  }
  float* outs[3] = {out0, out1, out2};
  const float* xs[3] = {x0, x1, x2};
  for (int q = 0; q < 3; ++q) {
    for (int r = 0; r < 4; ++r) {
      float s = hsum(a[q][r]);
      for (int64_t t = i; t < k; ++t) s += xs[q][t] * w[r][t];
      outs[q][r] = s;
    }
  }
}

// Eight half-precision weights as floats (exact).
template <DType kDtype>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load_half8(const uint8_t* row, int64_t i) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
  if constexpr (kDtype == DType::F16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

constexpr int64_t kHalfPrefetchBytes = 4096;

// dot4_avx2 on four f16 or bf16 rows converted in registers, k a multiple of 8: the same products
// in the same order as on unpacked rows, so the same bits. For decode, where each weight is read
// once, unpacking to a buffer first would only add a store and a load per element.
template <DType kDtype>
__attribute__((target("avx2,fma,f16c"))) void dot4_half_avx2(const float* x, const uint8_t* const* w, int64_t k,
                                                             float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 8) {
    if ((i & 31) == 0) {  // once a cache line: the four row streams, which the hardware does not follow
      for (int r = 0; r < 4; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + 2 * i) + kHalfPrefetchBytes, _MM_HINT_T0);
      }
    }
    const __m256 xv = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(xv, load_half8<kDtype>(w[0], i), a0);
    a1 = _mm256_fmadd_ps(xv, load_half8<kDtype>(w[1], i), a1);
    a2 = _mm256_fmadd_ps(xv, load_half8<kDtype>(w[2], i), a2);
    a3 = _mm256_fmadd_ps(xv, load_half8<kDtype>(w[3], i), a3);
  }
  out[0] = hsum(a0);
  out[1] = hsum(a1);
  out[2] = hsum(a2);
  out[3] = hsum(a3);
}

void dot4_generic(const float* x, const float* w0, const float* w1, const float* w2,
                  const float* w3, int64_t k, float* out) {
  out[0] = dot_f32(x, w0, k);
  out[1] = dot_f32(x, w1, k);
  out[2] = dot_f32(x, w2, k);
  out[3] = dot_f32(x, w3, k);
}

// Runs W rows [j0, j1) against all of x.
void gemm_rows(const float* x, int64_t m, const WeightView& w, float* y, int64_t j0, int64_t j1,
               std::vector<float>& unpacked) {
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  const size_t row_bytes = dtype_row_bytes(w.dtype, k);
  const auto* base = static_cast<const uint8_t*>(w.data);
  const bool avx2 = has_avx2();
  // Decode on half-precision rows: converted in registers, not unpacked.
  const bool half = w.dtype == DType::F16 || w.dtype == DType::BF16;
  const bool direct = half && m < 3 && k % 8 == 0 && has_f16c();
  unpacked.resize(static_cast<size_t>(kRowsPerTile * k));
  for (int64_t j = j0; j < j1; j += kRowsPerTile) {
    const int64_t rows = std::min(kRowsPerTile, j1 - j);
    if (direct) {
      const uint8_t* hr[kRowsPerTile];
      for (int64_t r = 0; r < kRowsPerTile; ++r) hr[r] = base + size_t(j + std::min(r, rows - 1)) * row_bytes;
      for (int64_t i = 0; i < m; ++i) {
        float out[kRowsPerTile];
        if (w.dtype == DType::F16) {
          dot4_half_avx2<DType::F16>(x + i * k, hr, k, out);
        } else {
          dot4_half_avx2<DType::BF16>(x + i * k, hr, k, out);
        }
        for (int64_t r = 0; r < rows; ++r) y[i * n + j + r] = out[r];
      }
      continue;
    }
    const float* wr[kRowsPerTile];
    for (int64_t r = 0; r < kRowsPerTile; ++r) {
      const int64_t jr = j + std::min(r, rows - 1);  // pad a short tile by repeating its last row
      if (w.dtype == DType::F32) {
        wr[r] = reinterpret_cast<const float*>(base + size_t(jr) * row_bytes);
      } else {
        float* dst = unpacked.data() + r * k;
        if (r < rows) unpack_row(w.dtype, base + size_t(jr) * row_bytes, dst, k);
        wr[r] = r < rows ? dst : wr[rows - 1];
      }
    }
    int64_t i = 0;
    if (avx2) {
      for (; i + 3 <= m; i += 3) {
        float out[3][kRowsPerTile];
        dot3x4_avx2(x + i * k, x + (i + 1) * k, x + (i + 2) * k, wr, k, out[0], out[1], out[2]);
        for (int64_t q = 0; q < 3; ++q) {
          for (int64_t r = 0; r < rows; ++r) y[(i + q) * n + j + r] = out[q][r];
        }
      }
    }
    for (; i < m; ++i) {
      float out[kRowsPerTile];
      if (avx2) {
        dot4_avx2(x + i * k, wr[0], wr[1], wr[2], wr[3], k, out);
      } else {
        dot4_generic(x + i * k, wr[0], wr[1], wr[2], wr[3], k, out);
      }
      for (int64_t r = 0; r < rows; ++r) y[i * n + j + r] = out[r];
    }
  }
}

}  // namespace

bool gemm_supports(DType dtype) {
  switch (dtype) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q6_K:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q5_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S:
    case DType::I8:
    case DType::I4: return true;
    default: return false;
  }
}

void prepare_weight(WeightView& w) {
  if (w.dtype == DType::F32) prepare_weight_f32(w);
  if (w.dtype == DType::I8) prepare_weight_i8(w);
  if (w.dtype == DType::Q8_0 || w.dtype == DType::Q4_0) prepare_weight_blocks(w);
  if (gemm_kquant_supports(w) || gemm_kquant_more_supports(w) || gemm_block32_supports(w) || gemm_iq4_supports(w) ||
      gemm_iq23_supports(w)) {
    prepare_weight_quant_tiles(w);
  }
  if (w.dtype == DType::I4) prepare_weight_i4(w);
}

void gemm(const float* x, int64_t m, const WeightView& w, float* y) {
  if (!gemm_supports(w.dtype)) {
    throw Error("cpu gemm does not support " + std::string(dtype_name(w.dtype)) + " weights");
  }
  if (w.dtype == DType::I8) return gemm_i8(x, m, w, y);
  if (w.dtype == DType::I4) return gemm_i4(x, m, w, y);
  if (w.dtype == DType::Q8_0) return gemm_q8_0(x, m, w, y);
  if (w.dtype == DType::Q4_0) return gemm_q4_0(x, m, w, y);
  if (gemm_kquant_supports(w)) return gemm_kquant(x, m, w, y);
  if (gemm_kquant_more_supports(w)) return gemm_kquant_more(x, m, w, y);
  if (gemm_block32_supports(w)) return gemm_block32(x, m, w, y);
  if (gemm_iq4_supports(w)) return gemm_iq4(x, m, w, y);
  if (gemm_iq23_supports(w)) return gemm_iq23(x, m, w, y);
  if (m <= 0) return;
  if (w.dtype == DType::F32) {
    // Packed panels first; the rows after the last full panel are row-major (few, one thread).
    const int64_t done = gemm_f32_panels(x, m, w, y);
    if (done > 0) {
      if (done < w.rows) {
        thread_local std::vector<float> unused;
        gemm_rows(x, m, w, y, done, w.rows, unused);
      }
      return;
    }
  }
  const int64_t n = w.rows;
  const int64_t work = m * n * w.cols;
  const int64_t tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  // Decode streams the weights: fork for their bytes too, not only for the multiply-adds.
  const int64_t bytes = n * int64_t(dtype_row_bytes(w.dtype, w.cols));
  if ((work < kParallelWork && bytes < kParallelStreamBytes) || team_max_threads() == 1) {
    thread_local std::vector<float> unpacked;
    gemm_rows(x, m, w, y, 0, n, unpacked);
    return;
  }
  for_units(tiles, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> unpacked;
    gemm_rows(x, m, w, y, t0 * kRowsPerTile, std::min(n, t1 * kRowsPerTile), unpacked);
  });
}

}  // namespace tessera::cpu
