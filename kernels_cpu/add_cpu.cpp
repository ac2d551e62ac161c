#include "kernels_cpu.h"

namespace tessera::cpu {

void add(const float* a, const float* b, float* out, int64_t n) {
  if (n <= 8 * kParallelWork) {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
    return;
  }
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace tessera::cpu
