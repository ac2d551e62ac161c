// Row unpacking to float for the float GEMM's tiles: vectorised for f16, bf16 and the k-quants
// Q4_K and Q6_K (the same floats as the portable dequantize_row: the same products in the same
// order, never fused); anything else goes through dequantize_row. Q8_0 and Q4_0 have integer-dot
// kernels (gemm_q8_0_cpu.cpp, gemm_q4_0_cpu.cpp) and are not unpacked.
#include <immintrin.h>

#include <cstring>

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

__attribute__((target("avx2,f16c"))) float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Eight bytes (unsigned, or signed when kSigned) as floats.
template <bool kSigned>
__attribute__((target("avx2,f16c"))) __m256 bytes_to_floats(__m128i v) {
  return _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

// Q4_K (see dtype_kquant.cpp for the layout): per 32-element sub-block x = (d·scale)·q - dmin·min.
__attribute__((target("avx2,f16c"))) void unpack_q4_k(const uint8_t* src, float* dst, int64_t n) {
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < n / 256; ++b, src += 144, dst += 256) {
    const float d = load_fp16(src), dmin = load_fp16(src + 2);
    const uint8_t* s = src + 4;
    for (int chunk = 0; chunk < 4; ++chunk) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16 + 32 * chunk));
      alignas(32) uint8_t nib[2][32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(nib[0]), _mm256_and_si256(q, low));
      _mm256_store_si256(reinterpret_cast<__m256i*>(nib[1]), _mm256_and_si256(_mm256_srli_epi16(q, 4), low));
      for (int h = 0; h < 2; ++h) {
        // The 6-bit scale and min of sub-block j = 2·chunk + h.
        const int j = 2 * chunk + h;
        const int scale = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        const int min = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        const __m256 ds = _mm256_set1_ps(d * float(scale)), off = _mm256_set1_ps(dmin * float(min));
        float* y = dst + 64 * chunk + 32 * h;
        for (int g = 0; g < 32; g += 8) {
          const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(nib[h] + g));
          _mm256_storeu_ps(y + g, _mm256_sub_ps(_mm256_mul_ps(ds, bytes_to_floats<false>(v)), off));
        }
      }
    }
  }
}

// Q6_K (see dtype_kquant.cpp for the layout): x = d·(scale·q), q = 6 bits - 32, one int8 scale per
// 16 elements.
__attribute__((target("avx2,f16c"))) void unpack_q6_k(const uint8_t* src, float* dst, int64_t n) {
  const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3), bias = _mm256_set1_epi8(32);
  for (int64_t b = 0; b < n / 256; ++b, src += 210) {
    const __m256 d = _mm256_set1_ps(load_fp16(src + 208));
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    for (int half = 0; half < 2; ++half, dst += 128) {
      const uint8_t* ql = src + 64 * half;
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 128 + 32 * half));
      // Quarter i holds elements 32i..32i+31 of this half: low or high nibbles of ql0 or ql1 with
      // bit pair i of qh on top. Byte shifts through 16-bit lanes, masked after.
      const __m256i nibble[4] = {_mm256_and_si256(ql0, low), _mm256_and_si256(ql1, low),
                                 _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                                 _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low)};
      for (int i = 0; i < 4; ++i) {
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), two), 4);
        alignas(32) int8_t q[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(q), _mm256_sub_epi8(_mm256_or_si256(nibble[i], high), bias));
        for (int g = 0; g < 32; g += 8) {
          const __m256i scale = _mm256_set1_epi32(sc[8 * half + 2 * i + g / 16]);
          const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + g)));
          _mm256_storeu_ps(dst + 32 * i + g, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_mullo_epi32(scale, v))));
        }
      }
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
      case DType::Q4_K:
        if (n % 256 == 0) return unpack_q4_k(s, dst, n);
        break;
      case DType::Q6_K:
        if (n % 256 == 0) return unpack_q6_k(s, dst, n);
        break;
      default: break;
    }
  }
  dequantize_row(dtype, src, dst, n);
}

}  // namespace tessera::cpu
