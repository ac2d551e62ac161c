// Conversions for the vendor BLAS path: f32 activations to f16/bf16 bits (round to nearest even),
// and a quantized or half weight expanded to f16 bits (prefill amortises one expansion over many
// rows of x).
#include "common.cuh"
#include "elementwise.cuh"

namespace tessera::gpu {

namespace {

__global__ void floats_to_half_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ out, bool bf16) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = bf16 ? float_to_bf16_bits(x[i]) : float_to_half_bits(x[i]);
  }
}

__global__ void dequantize_to_f16_kernel(GpuWeight w, int64_t row_bytes, uint16_t* __restrict__ out) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t total = w.rows * w.cols;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t j = i / w.cols, c = i % w.cols;
    out[i] = float_to_half_bits(weight_element(w, base + j * row_bytes, j, c));
  }
}

}  // namespace

void floats_to_half(const float* x, int64_t n, uint16_t* out, bool bf16, cudaStream_t stream) {
  if (n <= 0) return;
  floats_to_half_kernel<<<elementwise_grid(n), kElementwiseBlock, 0, stream>>>(x, n, out, bf16);
}

void dequantize_to_f16(const GpuWeight& w, uint16_t* out, cudaStream_t stream) {
  const int64_t total = w.rows * w.cols;
  if (total <= 0) return;
  dequantize_to_f16_kernel<<<elementwise_grid(total), kElementwiseBlock, 0, stream>>>(
      w, weight_row_bytes(w.format, w.cols), out);
}

}  // namespace tessera::gpu
