// GGUF IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S weights (codebook formats, super-blocks of 256)
// times int8 activations, read as stored, on the super-block GEMM (gemm_kquant_cpu.h). Per 32
// elements: the four groups' codebook entries (8 unsigned magnitudes each, at most 62) are one
// register, their 32 sign bits become a byte mask that moves the signs onto x, vpmaddubsw multiplies
// (pairs at most 2·62·127 = 15748, inside int16) and vpmaddwd applies each 16's odd scale 2l + 1
// (at most 31): Σ d·f·(2l+1)·g·s·x = dx·d·f·Σ (2l+1)·Σ g·s·xq, f = 1/8 (IQ2), 1/4 (IQ3_XXS), 1 (IQ3_S).
// Without AVX2 and F16C, gemm unpacks the rows to float (dequantize_row) instead.
#include "gemm_kquant_cpu.h"
#include "tessera/iq_grids.h"

namespace tessera::cpu {

namespace {

template <DType T>
struct IqGrid {
  static constexpr int64_t kBytes = T == DType::IQ2_XXS ? 66
                                    : T == DType::IQ2_XS ? 74
                                    : T == DType::IQ2_S  ? 82
                                    : T == DType::IQ3_XXS ? 98
                                                          : 110;

  // IQ3_S's elements 32·ib..: iq_group's magnitudes, signs (group l's in byte l) and scale for its
  // four groups, the eight 9-bit indices built in one register (their ninth bits are byte 66 + ib's)
  // and looked up with one gather. 45% faster streaming 2048x768 GEMVs from memory than four
  // iq_group calls (2 threads, both timed in turn in one process); for the IQ2 types' 64-bit entries
  // a gather was 14-37% slower, for IQ3_XXS (whose indices are plain bytes) no faster.
  __attribute__((target("avx2,fma,f16c"))) static void iq3_s_chunk(const uint8_t* blk, int ib, __m256i& mags,
                                                                   uint32_t& signs, int& scale) {
    const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * ib)));
    const __m256i high = _mm256_and_si256(
        _mm256_sllv_epi32(_mm256_set1_epi32(blk[66 + ib]), _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1)),
        _mm256_set1_epi32(256));
    mags = _mm256_i32gather_epi32(reinterpret_cast<const int*>(kIq3SGrid), _mm256_or_si256(low, high), 4);
    std::memcpy(&signs, blk + 74 + 4 * ib, 4);
    scale = 2 * ((blk[106 + ib / 2] >> (4 * (ib % 2))) & 15) + 1;
  }

  // Elements 32·ib.. of a super-block against x: Σ (2l+1)·Σ g·s·xq as int32 lanes.
  __attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256i chunk_sum(const uint8_t* blk,
                                                                                        const int8_t* xq, int ib) {
    // Byte k of the mask takes bit k % 8 of sign byte k / 8 (the broadcast's bytes 0-1 in the low
    // lane, 2-3 in the high one).
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    __m256i mags;
    uint32_t signs;
    int scale_lo, scale_hi;  // of elements 0-15 and 16-31
    if constexpr (T == DType::IQ3_S) {
      iq3_s_chunk(blk, ib, mags, signs, scale_lo);
      scale_hi = scale_lo;
    } else {
      const IqGroup g0 = iq_group(T, blk, 4 * ib), g1 = iq_group(T, blk, 4 * ib + 1);
      const IqGroup g2 = iq_group(T, blk, 4 * ib + 2), g3 = iq_group(T, blk, 4 * ib + 3);
      mags = _mm256_setr_epi64x(int64_t(g0.mags), int64_t(g1.mags), int64_t(g2.mags), int64_t(g3.mags));
      signs = uint32_t(g0.signs) | uint32_t(g1.signs) << 8 | uint32_t(g2.signs) << 16 | uint32_t(g3.signs) << 24;
      scale_lo = g0.scale;
      scale_hi = g2.scale;
    }
    const __m256i spread = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(int(signs)), pick), bit);
    const __m256i neg = _mm256_cmpeq_epi8(spread, bit);  // -1 where negative, else 0
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * ib));
    const __m256i pairs = _mm256_maddubs_epi16(mags, _mm256_sign_epi8(x, _mm256_or_si256(neg, _mm256_set1_epi8(1))));
    // Elements 0-15 (the low lane's pairs) take groups 0-1's scale, 16-31 groups 2-3's (equal for
    // the formats with one scale per 32).
    const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(short(scale_hi)), _mm_set1_epi16(short(scale_lo)));
    return _mm256_madd_epi16(pairs, sc);
  }

  __attribute__((target("avx2,fma,f16c"))) static void accumulate_row(const uint8_t* blk, const int8_t* xq,
                                                                       const int16_t*, float dx, __m256& acc) {
    __m256i isum = _mm256_setzero_si256();
    if constexpr (T == DType::IQ2_XS) {
      for (int ib = 0; ib < 8; ++ib) isum = _mm256_add_epi32(isum, chunk_sum(blk, xq, ib));
    } else {
      // Unrolled, each chunk's group indices and fields are constants: IQ2_XXS 38%, IQ2_S 60% and
      // IQ3_XXS 40% faster streaming 2048x768 GEMVs from memory, IQ3_S the same, IQ2_XS 48% slower
      // (2 threads, both ways timed in turn in one process).
#pragma GCC unroll 8
      for (int ib = 0; ib < 8; ++ib) isum = _mm256_add_epi32(isum, chunk_sum(blk, xq, ib));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(kquant::load_fp16(blk) * iq_scale_factor(T) * dx), _mm256_cvtepi32_ps(isum),
                          acc);
  }

  // Prefill (gemm_kquant_cpu.h): the signed values g·s as int8 (no magnitude is 0, so |q| and x
  // carrying q's sign are accumulate_row's operands), each 16's scale, mins zero (the shifted bias
  // subtracts nothing), d·f: accumulate_row's integer sums and float steps.
  static constexpr int kBiasShift = 1;
  static constexpr bool kSignedQuants = true;
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, kquant::Unpacked& u) {
    int16_t piece[kquant::kSuper / kquant::kPiece];
    for (int g = 0; g < 32; ++g) {
      const IqGroup q = iq_group(T, blk, g);
      for (int i = 0; i < 8; ++i) {
        const int v = int((q.mags >> (8 * i)) & 0xff);
        u.q[8 * g + i] = uint8_t(int8_t((q.signs >> i) & 1 ? -v : v));
      }
      if (g % 2 == 0) piece[g / 2] = int16_t(q.scale);
    }
    kquant::spread_scales(piece, u);
    for (auto& mn : u.mn) mn = 0;
    u.d = kquant::load_fp16(blk) * iq_scale_factor(T);
    u.dmin = 0;
  }
};

}  // namespace

bool gemm_iq23_supports(const WeightView& w) {
  const DType t = w.dtype;
  return (t == DType::IQ2_XXS || t == DType::IQ2_XS || t == DType::IQ2_S || t == DType::IQ3_XXS ||
          t == DType::IQ3_S) &&
         w.cols % kquant::kSuper == 0 && has_f16c();
}

void gemm_iq23(const float* x, int64_t m, const WeightView& w, float* y) {
  if (m <= 0) return;
  switch (w.dtype) {
    case DType::IQ2_XXS: return kquant::gemm_kquant<IqGrid<DType::IQ2_XXS>>(x, m, w, y);
    case DType::IQ2_XS: return kquant::gemm_kquant<IqGrid<DType::IQ2_XS>>(x, m, w, y);
    case DType::IQ2_S: return kquant::gemm_kquant<IqGrid<DType::IQ2_S>>(x, m, w, y);
    case DType::IQ3_XXS: return kquant::gemm_kquant<IqGrid<DType::IQ3_XXS>>(x, m, w, y);
    default: return kquant::gemm_kquant<IqGrid<DType::IQ3_S>>(x, m, w, y);
  }
}

}  // namespace tessera::cpu
