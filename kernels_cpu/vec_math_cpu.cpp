#include "vec_math_cpu.h"

#include <immintrin.h>

#include <cmath>

#include "kernels_cpu.h"

namespace tessera::cpu {

namespace {

void dot_rows_generic(const float* q, const float* const* rows, int n, int64_t hd, float scale, float* out) {
  for (int j = 0; j < n; ++j) {
    float s = 0;
    for (int64_t d = 0; d < hd; ++d) s += q[d] * rows[j][d];
    out[j] = s * scale;
  }
}

float exp_shift_generic(float* s, int n, float shift) {
  float sum = 0;
  for (int j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - shift);
    sum += s[j];
  }
  return sum;
}

void weighted_sum_generic(const float* p, const float* const* rows, int n, int64_t hd, float* acc) {
  for (int j = 0; j < n; ++j) {
    for (int64_t d = 0; d < hd; ++d) acc[d] += p[j] * rows[j][d];
  }
}

__attribute__((target("avx2,fma"))) inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}


// Eight 8-wide products -> their eight horizontal sums, in one vector (lane j = sum of p[j]).
__attribute__((target("avx2,fma"))) inline __m256 hsum8x8(const __m256* p) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
  // a holds keys 0-3 from the low 128 bits in its low half and from the high bits in its high half.
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// Keys are independent, so four (or, for head size 8, eight) run side by side: one key's chain of
// FMAs over the head would otherwise wait on FMA latency at every step.
__attribute__((target("avx2,fma"))) void dot_rows_avx2(const float* q, const float* const* rows, int n, int64_t hd,
                                                       float scale, float* out) {
  if (hd % 8 != 0) return dot_rows_generic(q, rows, n, hd, scale, out);
  const __m256 vscale = _mm256_set1_ps(scale);
  int j = 0;
  if (hd == 8) {
    const __m256 qv = _mm256_loadu_ps(q);
    for (; j + 8 <= n; j += 8) {
      __m256 p[8];
      for (int u = 0; u < 8; ++u) p[u] = _mm256_mul_ps(qv, _mm256_loadu_ps(rows[j + u]));
      _mm256_storeu_ps(out + j, _mm256_mul_ps(hsum8x8(p), vscale));
    }
    for (; j < n; ++j) out[j] = hsum256(_mm256_mul_ps(qv, _mm256_loadu_ps(rows[j]))) * scale;
    return;
  }
  for (; j + 4 <= n; j += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[j] + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[j + 1] + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[j + 2] + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[j + 3] + d), a3);
    }
    out[j] = hsum256(a0) * scale;
    out[j + 1] = hsum256(a1) * scale;
    out[j + 2] = hsum256(a2) * scale;
    out[j + 3] = hsum256(a3) * scale;
  }
  for (; j < n; ++j) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(rows[j] + d), acc);
    out[j] = hsum256(acc) * scale;
  }
}

__attribute__((target("avx2,fma"))) float exp_shift_avx2(float* s, int n, float shift) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), sh));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum256(sum);
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - shift);
    total += s[j];
  }
  return total;
}

// Four partial sums over the keys (j mod 4) hide the FMA latency of one running sum.
__attribute__((target("avx2,fma"))) void weighted_sum_avx2(const float* p, const float* const* rows, int n, int64_t hd,
                                                           float* acc) {
  if (hd % 8 != 0) return weighted_sum_generic(p, rows, n, hd, acc);
  for (int64_t d = 0; d < hd; d += 8) {
    __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(rows[j] + d), a0);
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 1]), _mm256_loadu_ps(rows[j + 1] + d), a1);
      a2 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 2]), _mm256_loadu_ps(rows[j + 2] + d), a2);
      a3 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 3]), _mm256_loadu_ps(rows[j + 3] + d), a3);
    }
    for (; j < n; ++j) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(rows[j] + d), a0);
    _mm256_storeu_ps(acc + d, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
}

}  // namespace

const VecOps& vec_ops() {
  static const VecOps generic{dot_rows_generic, exp_shift_generic, weighted_sum_generic};
  static const VecOps avx2{dot_rows_avx2, exp_shift_avx2, weighted_sum_avx2};
  return has_avx2() ? avx2 : generic;
}

}  // namespace tessera::cpu
