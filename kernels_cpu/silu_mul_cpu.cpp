#include <algorithm>
#include <cmath>

#include "kernels_cpu.h"
#include "vec_math_cpu.h"

namespace tessera::cpu {

namespace {

// exp through the polynomial of vec_math_cpu.h (~2e-7 relative): libm's scalar expf was a
// measurable share of decode on wide FFNs.
__attribute__((target("avx2,fma"))) void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t i0,
                                                       int64_t i1) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256(_mm256_xor_ps(g, sign));
    _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_mul_ps(g, _mm256_loadu_ps(up + i)), _mm256_add_ps(one, e)));
  }
  for (; i < i1; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  if (has_avx2()) {
    if (n <= kParallelWork) return silu_mul_avx2(gate, up, out, 0, n);
    team_run([&](int t, int nt) {
      const TeamSlice mine = team_slice(n, t, nt);
      silu_mul_avx2(gate, up, out, mine.begin, mine.end);
    });
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace tessera::cpu
