// kv_write: stores this step's K and V rows at their cache slots (converting to the cache type).
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kBlock = 128;

template <class T>
__global__ void kv_write_kernel(T* kpool, T* vpool, int64_t limit, int64_t stride, const float* __restrict__ k,
                                const float* __restrict__ v, const int32_t* __restrict__ slots, int64_t rows,
                                DeviceStatus* status) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t slot = slots[r];
    if (slot < 0 || slot >= limit) {
      if (threadIdx.x == 0) report(status, kStatusBadSlot, slot, limit);
      continue;
    }
    for (int64_t e = threadIdx.x; e < stride; e += blockDim.x) {
      kpool[slot * stride + e] = CacheElem<T>::store_value(k[r * stride + e]);
      vpool[slot * stride + e] = CacheElem<T>::store_value(v[r * stride + e]);
    }
  }
}

template <class T>
void launch(const KvPools& kv, const float* k, const float* v, const int32_t* slots, int64_t rows,
            DeviceStatus* status, cudaStream_t stream) {
  kv_write_kernel<T><<<capped_grid(rows), kBlock, 0, stream>>>(
      static_cast<T*>(kv.k), static_cast<T*>(kv.v), kv.num_blocks * kv.block_size, kv.n_kv_heads * kv.head_dim, k,
      v, slots, rows, status);
}

}  // namespace

void kv_write(const KvPools& kv, const float* k, const float* v, const int32_t* slots, int64_t rows,
              DeviceStatus* status, cudaStream_t stream) {
  if (rows <= 0) return;
  switch (kv.type) {
    case CacheType::f32: return launch<float>(kv, k, v, slots, rows, status, stream);
    case CacheType::f16: return launch<Half>(kv, k, v, slots, rows, status, stream);
    case CacheType::bf16: return launch<BHalf>(kv, k, v, slots, rows, status, stream);
  }
}

}  // namespace tessera::gpu
