#include <string>

#include "kernels_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

void kv_write(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t rows) {
  if (!kv_type_supported(kv.dtype)) {
    throw Error("cpu kv_write supports an f32, f16 or bf16 cache, not " + std::string(dtype_name(kv.dtype)));
  }
  const int64_t stride = kv.token_stride();
  const size_t row_bytes = dtype_row_bytes(kv.dtype, stride);
  const int64_t limit = kv.num_blocks * kv.block_size;
  auto* kd = static_cast<uint8_t*>(kv.k);
  auto* vd = static_cast<uint8_t*>(kv.v);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t slot = slots[r];
    if (slot < 0 || slot >= limit) {
      throw Error("kv slot " + std::to_string(slot) + " is outside the cache (" + std::to_string(limit) +
                  " slots)");
    }
    pack_row(kv.dtype, k + r * stride, kd + size_t(slot) * row_bytes, stride);
    pack_row(kv.dtype, v + r * stride, vd + size_t(slot) * row_bytes, stride);
  }
}

}  // namespace tessera::cpu
