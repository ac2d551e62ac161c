// GGUF Q4_1, Q5_0 and Q5_1 weights (layouts in core/src/gguf/block_formats.h) times int8
// activations, read as stored, on the block-of-32 GEMM of gemm_block32_cpu.h. With xq the block's
// activation quants, dx their scale and S their sum, and q the unsigned stored quant (nibble plus
// 16 times the fifth bit):
//   Q4_1, Q5_1  Σ (d·q + m)·x  =  dx·(d·Σ q·xq + m·S)
//   Q5_0        Σ d·(q - 16)·x =  dx·d·(Σ q·xq - 16·S)
// vpmaddubsw takes the unsigned quants directly; one or two float multiply-adds per block and row.
#include "gemm_block32_cpu.h"

namespace tessera::cpu {

namespace {

using namespace block32;

__attribute__((target("avx2,fma,f16c"))) inline __m256i dot(__m256i q, __m256i x) {
  // Pairs q·x are at most 2·31·127 = 7874.
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
}

// Q4_1 (kFifth false, 20 bytes: d, m, nibbles) and Q5_1 (24 bytes: d, m, fifth bits, nibbles).
template <bool kFifth>
struct WithMin {
  static constexpr int64_t kBytes = kFifth ? 24 : 20;
  __attribute__((target("avx2,fma,f16c"))) static void accumulate(const uint8_t* blk, __m256i x, int32_t sx, float dx,
                                                                   __m256& acc) {
    __m256i q = nibbles(blk + (kFifth ? 8 : 4));
    if (kFifth) q = _mm256_or_si256(q, fifth_bits(blk + 4));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_fp16(blk) * dx), _mm256_cvtepi32_ps(dot(q, x)), acc);
    // m·S in lane 0 only: the lanes are summed at the end.
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_fp16(blk + 2) * dx), _mm256_setr_ps(float(sx), 0, 0, 0, 0, 0, 0, 0),
                          acc);
  }
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, Unpacked& u) {
    __m256i q = nibbles(blk + (kFifth ? 8 : 4));
    if (kFifth) q = _mm256_or_si256(q, fifth_bits(blk + 4));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q), q);
    u.d = load_fp16(blk);
    u.m = load_fp16(blk + 2);
  }
  __attribute__((target("avx2,fma,f16c"))) static void accumulate_unpacked(const Unpacked& u, __m256i x, int32_t sx,
                                                                            float dx, __m256& acc) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.q));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(u.d * dx), _mm256_cvtepi32_ps(dot(q, x)), acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(u.m * dx), _mm256_setr_ps(float(sx), 0, 0, 0, 0, 0, 0, 0), acc);
  }
};

// Q5_0: 22 bytes — d, fifth bits, nibbles.
struct Q50 {
  static constexpr int64_t kBytes = 22;
  __attribute__((target("avx2,fma,f16c"))) static void accumulate(const uint8_t* blk, __m256i x, int32_t sx, float dx,
                                                                   __m256& acc) {
    const __m256i q = _mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2));
    // The -16 of every quant, exactly in int32 (lane 0).
    const __m256i isum = _mm256_sub_epi32(dot(q, x), _mm256_setr_epi32(16 * sx, 0, 0, 0, 0, 0, 0, 0));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_fp16(blk) * dx), _mm256_cvtepi32_ps(isum), acc);
  }
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, Unpacked& u) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q), _mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2)));
    u.d = load_fp16(blk);
    u.m = 0;
  }
  __attribute__((target("avx2,fma,f16c"))) static void accumulate_unpacked(const Unpacked& u, __m256i x, int32_t sx,
                                                                            float dx, __m256& acc) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.q));
    const __m256i isum = _mm256_sub_epi32(dot(q, x), _mm256_setr_epi32(16 * sx, 0, 0, 0, 0, 0, 0, 0));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(u.d * dx), _mm256_cvtepi32_ps(isum), acc);
  }
};

}  // namespace

bool gemm_block32_supports(const WeightView& w) {
  return (w.dtype == DType::Q4_1 || w.dtype == DType::Q5_0 || w.dtype == DType::Q5_1) && w.cols % kBlock == 0 &&
         has_f16c();
}

void gemm_block32(const float* x, int64_t m, const WeightView& w, float* y) {
  if (m <= 0) return;
  if (w.dtype == DType::Q4_1) return block32::gemm<WithMin<false>>(x, m, w, y);
  if (w.dtype == DType::Q5_1) return block32::gemm<WithMin<true>>(x, m, w, y);
  block32::gemm<Q50>(x, m, w, y);
}

}  // namespace tessera::cpu
