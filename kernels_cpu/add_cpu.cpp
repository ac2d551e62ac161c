#include "kernels_cpu.h"

namespace tessera::cpu {

void add(const float* a, const float* b, float* out, int64_t n) {
  for_rows(n, n > 8 * kParallelWork, [&](int64_t i) { out[i] = a[i] + b[i]; });
}

void add_rows(float* x, const float* row, int64_t rows, int64_t cols) {
  for_rows(rows, rows * cols > 8 * kParallelWork, [&](int64_t r) {
    float* xr = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) xr[c] += row[c];
  });
}

void scale(float* x, float s, int64_t n) {
  for_rows(n, n > 8 * kParallelWork, [&](int64_t i) { x[i] *= s; });
}

}  // namespace tessera::cpu
