#include <cstring>
#include <string>

#include "kernels_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

void kv_write(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t rows) {
  if (kv.dtype != DType::F32) {
    throw Error("cpu kv_write supports an f32 cache, not " + std::string(dtype_name(kv.dtype)));
  }
  const int64_t stride = kv.token_stride();
  const int64_t limit = kv.num_blocks * kv.block_size;
  auto* kd = static_cast<float*>(kv.k);
  auto* vd = static_cast<float*>(kv.v);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t slot = slots[r];
    if (slot < 0 || slot >= limit) {
      throw Error("kv slot " + std::to_string(slot) + " is outside the cache (" + std::to_string(limit) +
                  " slots)");
    }
    std::memcpy(kd + slot * stride, k + r * stride, size_t(stride) * sizeof(float));
    std::memcpy(vd + slot * stride, v + r * stride, size_t(stride) * sizeof(float));
  }
}

}  // namespace tessera::cpu
