// embedding: out[i] = table[ids[i]] as float, dequantizing f16/bf16 and GGUF block rows on the fly.
#include "common.cuh"

namespace tessera::gpu {

namespace {

constexpr int kBlock = 256;

__global__ void embedding_kernel(GpuWeight table, int64_t row_bytes, const int32_t* __restrict__ ids, int64_t n,
                                 float* out, DeviceStatus* status) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t id = ids[i];
    if (id < 0 || id >= table.rows) {
      if (threadIdx.x == 0) report(status, kStatusBadToken, id, table.rows);
      continue;  // the row is left as it was; the backend throws at the next synchronisation
    }
    const auto* row = static_cast<const uint8_t*>(table.data) + id * row_bytes;
    for (int64_t c = threadIdx.x; c < table.cols; c += blockDim.x) {
      out[i * table.cols + c] = weight_element(table, row, id, c);
    }
  }
}

}  // namespace

void embedding(const GpuWeight& table, const int32_t* ids, int64_t n, float* out, DeviceStatus* status,
               cudaStream_t stream) {
  if (n <= 0) return;
  embedding_kernel<<<capped_grid(n), kBlock, 0, stream>>>(table, weight_row_bytes(table.format, table.cols), ids,
                                                          n, out, status);
}

}  // namespace tessera::gpu
