// Row unpacking to float for the float GEMM's tiles and half-precision KV caches: vectorised for
// f16 and bf16; everything else (the k-quants on CPUs without AVX2 and F16C) goes through the
// portable dequantize_row. Q8_0, Q4_0, Q4_K and Q6_K have integer-dot kernels (gemm_q8_0_cpu.cpp,
// gemm_q4_0_cpu.cpp, gemm_kquant_cpu.cpp) and are not unpacked where those run. Packing (f32 to
// f16/bf16) is the KV cache's store.
#include <cpuid.h>
#include <immintrin.h>

#include <cstring>
#include <string>

#include "kernels_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

bool has_f16c() {
  static const bool value = [] {
    // CPUID.1:ECX bit 29, read directly: clang before 16 has no "f16c" for __builtin_cpu_supports.
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0 && has_avx2();
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

__attribute__((target("avx2,f16c"))) void pack_f16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) dst[i] = f32_to_fp16(src[i]);
}

// Round to nearest even as f32_to_bf16 does, NaNs kept quiet.
__attribute__((target("avx2"))) void pack_bf16(const float* src, uint16_t* dst, int64_t n) {
  const __m256i one = _mm256_set1_epi32(1), half_ulp = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x400000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i rounded =
        _mm256_add_epi32(x, _mm256_add_epi32(half_ulp, _mm256_and_si256(_mm256_srli_epi32(x, 16), one)));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, _mm256_or_si256(x, quiet), nan), 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
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

void pack_row(DType dtype, const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  switch (dtype) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case DType::F16:
      if (has_f16c()) return pack_f16(src, d, n);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
      return;
    case DType::BF16:
      if (has_avx2()) return pack_bf16(src, d, n);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    default: throw Error("cpu: cannot store a float row as " + std::string(dtype_name(dtype)));
  }
}

}  // namespace tessera::cpu
