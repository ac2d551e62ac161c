#include <algorithm>
#include <cmath>

#include "kernels_cpu.h"

namespace tessera::cpu {

void softmax(float* x, int64_t rows, int64_t cols) {
  for_rows(rows, rows * cols > kParallelWork, [&](int64_t r) {
    float* v = x + r * cols;
    const float mx = *std::max_element(v, v + cols);
    double sum = 0;
    for (int64_t i = 0; i < cols; ++i) {
      v[i] = std::exp(v[i] - mx);
      sum += v[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < cols; ++i) v[i] *= inv;
  });
}

}  // namespace tessera::cpu
