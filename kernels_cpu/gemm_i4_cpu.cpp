// Group-wise int4 GEMM: weights stay packed (two per byte) and are unpacked group by group in the
// inner loop; never expanded to a float copy of the matrix.
#include "kernels_cpu.h"

namespace tessera::cpu {

void gemm_i4(const float* x, int64_t m, const WeightView& w, float* y) {
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  const int64_t groups = k / g;
  const auto* packed = static_cast<const uint8_t*>(w.data);
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    for (int64_t j = 0; j < w.rows; ++j) {
      const uint8_t* wr = packed + j * (k / 2);
      float acc = 0;
      for (int64_t gi = 0; gi < groups; ++gi) {
        const float scale = w.scales[j * groups + gi];
        const float zero = w.zeros != nullptr ? w.zeros[j * groups + gi] : 8.0f;
        float part = 0;
        for (int64_t c = gi * g; c < (gi + 1) * g; ++c) {
          const int q = (c & 1) ? (wr[c / 2] >> 4) : (wr[c / 2] & 0x0f);
          part += xr[c] * (float(q) - zero);
        }
        acc += part * scale;
      }
      y[i * w.rows + j] = acc;
    }
  }
}

}  // namespace tessera::cpu
