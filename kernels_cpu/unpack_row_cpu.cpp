// Row unpacking to float for the float GEMM's tiles: vectorised for f16 and bf16; everything else
// (the k-quants on CPUs without AVX2 and F16C) goes through the portable dequantize_row. Q8_0,
// Q4_0, Q4_K and Q6_K have integer-dot kernels (gemm_q8_0_cpu.cpp, gemm_q4_0_cpu.cpp,
// gemm_kquant_cpu.cpp) and are not unpacked where those run.
#include <immintrin.h>

#include "kernels_cpu.h"

namespace tessera::cpu {

bool has_f16c() {
  static const bool value = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") && has_avx2();
  }();
  return value;
}

namespace {

__attribute__((target("avx2,f16c"))) void unpack_f16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
  }
  if (i < n) dequantize_row(DType::F16, src + 2 * i, dst + i, n - i);
}

__attribute__((target("avx2"))) void unpack_bf16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
  }
  if (i < n) dequantize_row(DType::BF16, src + 2 * i, dst + i, n - i);
}

}  // namespace

void unpack_row(DType dtype, const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  if (has_f16c()) {
    switch (dtype) {
      case DType::F16: return unpack_f16(s, dst, n);
      case DType::BF16: return unpack_bf16(s, dst, n);
      default: break;
    }
  }
  dequantize_row(dtype, src, dst, n);
}

}  // namespace tessera::cpu
