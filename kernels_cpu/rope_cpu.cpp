#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels_cpu.h"

namespace tessera::cpu {

namespace {

// cos/sin of every (position, frequency) pair seen so far, for one (theta, rope_dim): the model
// rotates q and k of every layer at the same positions, so each angle is computed once (in double,
// as before) instead of per call. One table per calling thread; grown before the parallel loop.
struct AngleTable {
  float theta = 0;
  int64_t rope_dim = 0;
  int64_t positions = 0;
  std::vector<float> cos, sin;  // [position][rope_dim / 2]

  void cover(float t, int64_t dim, int64_t max_pos) {
    if (t != theta || dim != rope_dim) {
      theta = t;
      rope_dim = dim;
      positions = 0;
      cos.clear();
      sin.clear();
    }
    if (max_pos < positions) return;
    const int64_t half = dim / 2;
    const int64_t grown = std::max(max_pos + 1, 2 * positions);
    cos.resize(size_t(grown * half));
    sin.resize(size_t(grown * half));
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(t), -2.0 * double(i) / double(dim));
      for (int64_t p = positions; p < grown; ++p) {
        const double a = double(p) * inv_freq;
        cos[size_t(p * half + i)] = static_cast<float>(std::cos(a));
        sin[size_t(p * half + i)] = static_cast<float>(std::sin(a));
      }
    }
    positions = grown;
  }
};

}  // namespace

void rope(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rope_dim, float theta, RopeStyle style) {
  const int64_t half = rope_dim / 2;
  thread_local AngleTable table;
  int32_t max_pos = 0;
  for (int64_t r = 0; r < rows; ++r) max_pos = std::max(max_pos, positions[r]);
  table.cover(theta, rope_dim, max_pos);
  const float* cos_all = table.cos.data();
  const float* sin_all = table.sin.data();
  for_rows(rows, rows * n_heads * head_dim > kParallelWork, [&](int64_t r) {
    const float* cos_v = cos_all + int64_t(positions[r]) * half;
    const float* sin_v = sin_all + int64_t(positions[r]) * half;
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
  });
}

}  // namespace tessera::cpu
