#include <cmath>

#include "kernels_cpu.h"

namespace tessera::cpu {

// In-place safe (out may equal x).
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps) {
  for_rows(rows, rows * dim > kParallelWork, [&](int64_t r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    const float ss = dot_f32(xr, xr, dim);
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  });
}

}  // namespace tessera::cpu
