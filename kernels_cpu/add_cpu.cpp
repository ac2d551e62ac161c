#include "kernels_cpu.h"

namespace tessera::cpu {

void add(const float* a, const float* b, float* out, int64_t n) {
  for_rows(n, n > 8 * kParallelWork, [&](int64_t i) { out[i] = a[i] + b[i]; });
}

}  // namespace tessera::cpu
