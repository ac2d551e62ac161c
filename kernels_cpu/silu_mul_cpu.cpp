#include <cmath>

#include "kernels_cpu.h"

namespace tessera::cpu {

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
#pragma omp parallel for if (n > kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace tessera::cpu
