#include <cmath>
#include <vector>

#include "kernels_cpu.h"

namespace tessera::cpu {

void rope(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rope_dim, float theta, RopeStyle style) {
  const int64_t half = rope_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[size_t(i)] = std::pow(static_cast<double>(theta), -2.0 * double(i) / double(rope_dim));
  }
#pragma omp parallel for if (rows * n_heads * head_dim > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    // The angles depend only on the position: compute them once for all heads of the row.
    float cs[256], sn[256];
    float* cos_v = cs;
    float* sin_v = sn;
    std::vector<float> big;
    if (half > 256) {
      big.resize(size_t(2 * half));
      cos_v = big.data();
      sin_v = big.data() + half;
    }
    const double pos = positions[r];
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * inv_freq[size_t(i)];
      cos_v[i] = static_cast<float>(std::cos(a));
      sin_v[i] = static_cast<float>(std::sin(a));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t i0 = style == RopeStyle::adjacent ? 2 * i : i;
        const int64_t i1 = style == RopeStyle::adjacent ? 2 * i + 1 : i + half;
        const float a = v[i0];
        const float b = v[i1];
        v[i0] = a * cos_v[i] - b * sin_v[i];
        v[i1] = a * sin_v[i] + b * cos_v[i];
      }
    }
  }
}

}  // namespace tessera::cpu
