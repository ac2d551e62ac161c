// y[m][n] = x[m][k] · W[n][k]ᵀ for float and GGUF-block weights. Quantized and half-precision rows
// are unpacked a few rows at a time into a small per-thread buffer (never a float copy of the
// matrix), then reused across all m rows of x.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels_cpu.h"
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
  unpacked.resize(static_cast<size_t>(kRowsPerTile * k));
  for (int64_t j = j0; j < j1; j += kRowsPerTile) {
    const int64_t rows = std::min(kRowsPerTile, j1 - j);
    const float* wr[kRowsPerTile];
    for (int64_t r = 0; r < kRowsPerTile; ++r) {
      const int64_t jr = j + std::min(r, rows - 1);  // pad a short tile by repeating its last row
      if (w.dtype == DType::F32) {
        wr[r] = reinterpret_cast<const float*>(base + size_t(jr) * row_bytes);
      } else {
        float* dst = unpacked.data() + r * k;
        if (r < rows) dequantize_row(w.dtype, base + size_t(jr) * row_bytes, dst, k);
        wr[r] = r < rows ? dst : wr[rows - 1];
      }
    }
    for (int64_t i = 0; i < m; ++i) {
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
    case DType::I8:
    case DType::I4: return true;
    default: return false;
  }
}

void gemm(const float* x, int64_t m, const WeightView& w, float* y) {
  if (!gemm_supports(w.dtype)) {
    throw Error("cpu gemm does not support " + std::string(dtype_name(w.dtype)) + " weights");
  }
  if (w.dtype == DType::I8) return gemm_i8(x, m, w, y);
  if (w.dtype == DType::I4) return gemm_i4(x, m, w, y);
  const int64_t n = w.rows;
  const int64_t work = m * n * w.cols;
  const int64_t tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  if (work < kParallelWork || omp_get_max_threads() == 1) {
    thread_local std::vector<float> unpacked;
    gemm_rows(x, m, w, y, 0, n, unpacked);
    return;
  }
#pragma omp parallel
  {
    thread_local std::vector<float> unpacked;
    const int nt = omp_get_num_threads();
    const int t = omp_get_thread_num();
    const int64_t per = (tiles + nt - 1) / nt;
    const int64_t j0 = std::min(n, per * t * kRowsPerTile);
    const int64_t j1 = std::min(n, per * (t + 1) * kRowsPerTile);
    if (j0 < j1) gemm_rows(x, m, w, y, j0, j1, unpacked);
  }
}

}  // namespace tessera::cpu
