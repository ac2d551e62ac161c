#include <algorithm>
#include <cmath>

#include "kernels_cpu.h"
#include "vec_math_cpu.h"

namespace tessera::cpu {

namespace {

// GELU by its tanh approximation, as Gemma's GeGLU uses it: 0.5 g (1 + tanh(y)) with
// y = sqrt(2/pi) (g + 0.044715 g^3), written as g / (1 + exp(-2y)) (the same function) so that it
// takes silu_mul's vector exp; the tail goes through the vector path from a padded copy, so an
// element's bits do not depend on where it falls (see silu_mul_cpu.cpp).
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__attribute__((target("avx2,fma"))) inline __m256 gelu_mul8(__m256 g, __m256 u) {
  const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 y = _mm256_mul_ps(_mm256_set1_ps(-2.0f * kSqrt2OverPi), _mm256_fmadd_ps(_mm256_set1_ps(kCubic), g3, g));
  const __m256 e = exp256(y);
  return _mm256_div_ps(_mm256_mul_ps(g, u), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

__attribute__((target("avx2,fma"))) void gelu_mul_avx2(const float* gate, const float* up, float* out, int64_t i0,
                                                       int64_t i1) {
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    _mm256_storeu_ps(out + i, gelu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < i1) {
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    std::copy(gate + i, gate + i1, g);
    std::copy(up + i, up + i1, u);
    _mm256_store_ps(o, gelu_mul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::copy(o, o + (i1 - i), out + i);
  }
}

}  // namespace

void gelu_mul(const float* gate, const float* up, float* out, int64_t n) {
  if (has_avx2()) {
    if (n <= kParallelWork) return gelu_mul_avx2(gate, up, out, 0, n);
    team_run([&](int t, int nt) {
      const TeamSlice mine = team_slice(n, t, nt);
      gelu_mul_avx2(gate, up, out, mine.begin, mine.end);
    });
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float y = kSqrt2OverPi * (g + kCubic * g * g * g);
    out[i] = g / (1.0f + std::exp(-2.0f * y)) * up[i];
  }
}

}  // namespace tessera::cpu
