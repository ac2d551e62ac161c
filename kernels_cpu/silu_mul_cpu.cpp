#include <algorithm>
#include <cmath>

#include "kernels_cpu.h"
#include "vec_math_cpu.h"

namespace tessera::cpu {

namespace {

// exp through the polynomial of vec_math_cpu.h (~2e-7 relative): libm's scalar expf was a
// measurable share of decode on wide FFNs. The last few elements go through the same vector
// arithmetic from a padded copy: an element's bits must not depend on where it falls, since a
// batch's rows are one array here (with a scalar tail, a 172-wide FFN row decoded alone gave
// other bits than in a batch of two, and a thread's share boundary moved them too).
__attribute__((target("avx2,fma"))) inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = exp256(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
  return _mm256_div_ps(_mm256_mul_ps(g, u), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

__attribute__((target("avx2,fma"))) void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t i0,
                                                       int64_t i1) {
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < i1) {
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    std::copy(gate + i, gate + i1, g);
    std::copy(up + i, up + i1, u);
    _mm256_store_ps(o, silu_mul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::copy(o, o + (i1 - i), out + i);
  }
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
