// GGUF IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256, eight 32-element sub-blocks with
// 6-bit scales) weights times int8 activations, read as stored: each nibble picks one of the 16
// non-linear levels (kIq4NlValues) with a byte shuffle, so the weights are int8 in registers, and
// vpmaddubsw multiplies |w| by x with w's sign moved onto x (pairs at most 2·127·127 = 32258, inside
// int16). IQ4_NL runs on the block-of-32 GEMM (gemm_block32_cpu.h), IQ4_XS on the super-block one
// (gemm_kquant_cpu.h):
//   IQ4_NL  Σ d·v_q·x          =  dx·d·Σ v_q·xq
//   IQ4_XS  Σ d·(ls_j - 32)·v_q·x  =  dx·d·Σ_j (ls_j - 32)·Σ v_q·xq
#include "gemm_block32_cpu.h"
#include "gemm_kquant_cpu.h"

namespace tessera::cpu {

// prepare_weight_quant_tiles packs one tile size for both walks.
static_assert(block32::kRowsPerTile == kquant::kRowsPerTile);

namespace {

// The levels of 32 nibbles (elements in order, see block32::nibbles) as int8.
__attribute__((target("avx2,fma,f16c"))) inline __m256i levels(const uint8_t* qs) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
  return _mm256_shuffle_epi8(table, block32::nibbles(qs));
}

// Levels v times x as int16 pairs' sums: signed by signed through vpmaddubsw's unsigned first operand.
__attribute__((target("avx2,fma,f16c"))) inline __m256i signed_pairs(__m256i v, __m256i x) {
  return _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v));
}

// IQ4_NL: 18 bytes — fp16 d, 16 bytes of nibbles.
struct IQ4NL {
  static constexpr int64_t kBytes = 18;
  __attribute__((target("avx2,fma,f16c"))) static void accumulate(const uint8_t* blk, __m256i x, int32_t, float dx,
                                                                   __m256& acc) {
    const __m256i isum = _mm256_madd_epi16(signed_pairs(levels(blk + 2), x), _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(block32::load_fp16(blk) * dx), _mm256_cvtepi32_ps(isum), acc);
  }
  // Prefill: the levels looked up once per tile (stored as int8 bits), the same integer pairs.
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, block32::Unpacked& u) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q), levels(blk + 2));
    u.d = block32::load_fp16(blk);
    u.m = 0;
  }
  __attribute__((target("avx2,fma,f16c"))) static void accumulate_unpacked(const block32::Unpacked& u, __m256i x,
                                                                            int32_t, float dx, __m256& acc) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.q));
    const __m256i isum = _mm256_madd_epi16(signed_pairs(v, x), _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(u.d * dx), _mm256_cvtepi32_ps(isum), acc);
  }
};

// IQ4_XS: 136 bytes — fp16 d, u16 of the scales' top 2 bits (sub-block j: bits 2j), 4 bytes of
// their low nibbles (j: byte j / 2, low nibble for even j), 8 x 16 bytes of nibbles.
struct IQ4XS {
  static constexpr int64_t kBytes = 136;

  __attribute__((target("avx2,fma,f16c"))) static void accumulate_row(const uint8_t* blk, const int8_t* xq,
                                                                       const int16_t*, float dx, __m256& acc) {
    uint16_t high;
    std::memcpy(&high, blk + 2, 2);
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const int ls = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((high >> (2 * j)) & 3) << 4);
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * j));
      // Pairs <= 32258 times |ls - 32| <= 32, twice: inside int32.
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(signed_pairs(levels(blk + 8 + 16 * j), x),
                                                      _mm256_set1_epi16(short(ls - 32))));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(kquant::load_fp16(blk) * dx), _mm256_cvtepi32_ps(isum), acc);
  }

  // Prefill (gemm_kquant_cpu.h): the levels as int8 bits, each 32-element chunk's scale ls - 32 and
  // mins zero (so the shifted bias subtracts nothing): accumulate_row's integer sums and float steps.
  static constexpr int kBiasShift = 1;
  static constexpr bool kSignedQuants = true;
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, kquant::Unpacked& u) {
    uint16_t high;
    std::memcpy(&high, blk + 2, 2);
    int16_t piece[kquant::kSuper / kquant::kPiece];
    for (int j = 0; j < 8; ++j) {
      const int ls = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((high >> (2 * j)) & 3) << 4);
      piece[2 * j] = piece[2 * j + 1] = int16_t(ls - 32);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + 32 * j), levels(blk + 8 + 16 * j));
    }
    kquant::spread_scales(piece, u);
    for (auto& mn : u.mn) mn = 0;
    u.d = kquant::load_fp16(blk);
    u.dmin = 0;
  }
};

}  // namespace

bool gemm_iq4_supports(const WeightView& w) {
  if (!has_f16c()) return false;
  if (w.dtype == DType::IQ4_NL) return w.cols % block32::kBlock == 0;
  return w.dtype == DType::IQ4_XS && w.cols % kquant::kSuper == 0;
}

void gemm_iq4(const float* x, int64_t m, const WeightView& w, float* y) {
  if (m <= 0) return;
  if (w.dtype == DType::IQ4_NL) return block32::gemm<IQ4NL>(x, m, w, y);
  kquant::gemm_kquant<IQ4XS>(x, m, w, y);
}

}  // namespace tessera::cpu
