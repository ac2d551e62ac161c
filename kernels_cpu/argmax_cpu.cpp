#include "kernels_cpu.h"

namespace tessera::cpu {

void argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = logits + r * cols;
    int64_t best = 0;
    for (int64_t i = 1; i < cols; ++i) {
      if (v[i] > v[best]) best = i;
    }
    out[r] = static_cast<int32_t>(best);
  }
}

}  // namespace tessera::cpu
