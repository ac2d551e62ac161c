#include <cstring>
#include <string>

#include "kernels_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  const size_t row_bytes = dtype_row_bytes(table.dtype, table.cols);
  const auto* base = static_cast<const uint8_t*>(table.data);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= table.rows) {
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                  std::to_string(table.rows - 1) + ")");
    }
    dequantize_row(table.dtype, base + size_t(id) * row_bytes, out + i * table.cols, table.cols);
  }
}

}  // namespace tessera::cpu
