// Row unpacking to float for the GEMM tiles: vectorised for the formats decode reads most
// (f16, bf16, Q8_0, Q4_0); everything else goes through the portable dequantize_row.
#include <immintrin.h>

#include <cstring>

#include "kernels_cpu.h"

namespace tessera::cpu {

namespace {

bool has_f16c() {
  static const bool value = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") && has_avx2();
  }();
  return value;
}

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

__attribute__((target("avx2,f16c"))) inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

__attribute__((target("avx2,f16c"))) void unpack_q8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(src));
    for (int j = 0; j < 32; j += 8) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 2 + j));
      _mm256_storeu_ps(dst + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
  }
}

__attribute__((target("avx2,f16c"))) void unpack_q4_0(const uint8_t* src, float* dst, int64_t n) {
  const __m128i low = _mm_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi32(8);
  for (int64_t b = 0; b < n / 32; ++b, src += 18, dst += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(src));
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2));
    const __m128i lo = _mm_and_si128(bytes, low);                     // elements 0..15
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);  // elements 16..31
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[j]), eight);
      _mm256_storeu_ps(dst + 8 * j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
    }
  }
}

}  // namespace

void unpack_row(DType dtype, const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  if (has_f16c()) {
    switch (dtype) {
      case DType::F16: return unpack_f16(s, dst, n);
      case DType::BF16: return unpack_bf16(s, dst, n);
      case DType::Q8_0: return unpack_q8_0(s, dst, n);
      case DType::Q4_0: return unpack_q4_0(s, dst, n);
      default: break;
    }
  }
  dequantize_row(dtype, src, dst, n);
}

}  // namespace tessera::cpu
