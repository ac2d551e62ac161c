// W8A8 GEMM: each row of x is quantized to int8 with its own scale (dynamic, per token), dotted
// with int8 weight rows in int32, and the result rescaled by both scales.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels_cpu.h"

namespace tessera::cpu {

void gemm_i8(const float* x, int64_t m, const WeightView& w, float* y) {
  const int64_t k = w.cols;
  const auto* wq = static_cast<const int8_t*>(w.data);
  std::vector<int8_t> xq(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(xr[c]));
    const float sx = amax / 127.0f;
    const float inv = sx > 0 ? 1.0f / sx : 0.0f;
    for (int64_t c = 0; c < k; ++c) xq[size_t(c)] = static_cast<int8_t>(std::lrintf(xr[c] * inv));
    for (int64_t j = 0; j < w.rows; ++j) {
      const int8_t* wr = wq + j * k;
      int32_t acc = 0;
      for (int64_t c = 0; c < k; ++c) acc += int32_t(xq[size_t(c)]) * int32_t(wr[c]);
      y[i * w.rows + j] = float(acc) * sx * w.scales[j];
    }
  }
}

}  // namespace tessera::cpu
