// GGUF Q2_K, Q3_K and Q5_K weights (layouts in core/src/gguf/block_formats.h) times int8 activations,
// read as stored, on the super-block GEMM of gemm_kquant_cpu.h (as Q4_K and Q6_K). With xq the
// activation quants, dx their scale and S_j the sums of xq over 16 elements:
//   Q2_K  Σ (d·sc_j·q - dmin·m_j)·x      =  dx·(d·Σ_j sc_j·Σ q·xq  -  dmin·Σ_j m_j·S_j)
//   Q3_K  Σ d·(sc_j - 32)·(q - 4)·x      =  dx·d·(Σ_j s_j·Σ q·xq  -  4·Σ_j s_j·S_j),  s_j = sc_j - 32
//   Q5_K  Σ (d·sc_j·q - dmin·m_j)·x      as Q4_K, the quants five bits
// where q is the stored quant made unsigned (Q3_K: the two low bits plus 4 for a set mask bit).
// vpmaddubsw multiplies the unsigned quants by xq, vpmaddwd applies the integer sub-block scales.
#include "gemm_kquant_cpu.h"

namespace tessera::cpu {

namespace {

using namespace kquant;

// The scale of each 16-element piece as int16, the eight of half h (elements 128h..) in both
// 128-bit halves; piece 2s + (upper half) of a 32-element quarter s is picked with a byte shuffle.
struct HalfScales {
  __m256i half[2];
  __attribute__((target("avx2,fma,f16c"))) explicit HalfScales(__m256i sc16)
      : half{_mm256_permute2x128_si256(sc16, sc16, 0x00), _mm256_permute2x128_si256(sc16, sc16, 0x11)} {}
  __attribute__((target("avx2,fma,f16c"))) __m256i quarter(int h, int s) const {
    return _mm256_shuffle_epi8(half[h], _mm256_setr_m128i(_mm_set1_epi16(short(0x0100 + 0x0202 * (2 * s))),
                                                          _mm_set1_epi16(short(0x0100 + 0x0202 * (2 * s + 1)))));
  }
};

// Q2_K: 84 bytes — 16 bytes (scale | min << 4) per 16 elements, 64 bytes of 2-bit quants (element
// 128h + 32s + l in bits 2s of byte 32h + l), fp16 d, fp16 dmin.
struct Q2K {
  static constexpr int64_t kBytes = 84;
  static constexpr int kBiasShift = 0;

  // For prefill (gemm_kquant_cpu.h): quarter s of half h is chunk 4h + s.
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, Unpacked& u) {
    int16_t piece[kSuper / kPiece];
    for (int p = 0; p < int(kSuper / kPiece); ++p) piece[p] = blk[p] & 0x0f, u.mn[p] = blk[p] >> 4;
    spread_scales(piece, u);
    u.d = load_fp16(blk + 80);
    u.dmin = load_fp16(blk + 82);
    const __m256i two = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * h));
      for (int s = 0; s < 4; ++s) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + 128 * h + 32 * s),
                            _mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), two));
      }
    }
  }

  __attribute__((target("avx2,fma,f16c"))) static void accumulate_row(const uint8_t* blk, const int8_t* xq,
                                                                       const int16_t* sums, float dx, __m256& acc) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low4));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
    const HalfScales scales(sc16);
    const __m256i two = _mm256_set1_epi8(3);
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * h));
      for (int s = 0; s < 4; ++s) {
        // Shifting 16-bit lanes is safe: the mask drops what crosses from the neighbouring byte.
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), two);
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 128 * h + 32 * s));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), scales.quarter(h, s)));
      }
    }
    const __m256i msum = _mm256_madd_epi16(mn16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_fp16(blk + 80) * dx), _mm256_cvtepi32_ps(isum), acc);
    acc = _mm256_fnmadd_ps(_mm256_set1_ps(load_fp16(blk + 82) * dx), _mm256_cvtepi32_ps(msum), acc);
  }
};

// Bit n of each byte of bits moved to bit `to` (n, to < 8), the others cleared: one 16-bit shift
// and an and. Each byte's bit comes from that same byte (the shift is by |n - to|, so what crosses
// from the neighbouring byte lands on bits the mask drops). An and, a compare against the bit and
// an and instead took 25% longer for Q3_K and 16% for Q5_K streaming 2048x768 GEMVs from memory (2
// threads, both ways timed in turn in one process).
template <int kTo>
__attribute__((target("avx2,fma,f16c"))) inline __m256i bit_to(__m256i bits, int n) {
  const __m256i moved = n >= kTo ? _mm256_srli_epi16(bits, n - kTo) : _mm256_slli_epi16(bits, kTo - n);
  return _mm256_and_si256(moved, _mm256_set1_epi8(char(1 << kTo)));
}

// Q3_K: 110 bytes — 32 bytes of high bits (element 128h + 32s + l: bit 4h + s of byte l), 64 bytes
// of 2-bit quants (as Q2_K), 12 bytes of 6-bit scales, fp16 d.
struct Q3K {
  static constexpr int64_t kBytes = 110;
  static constexpr int kBiasShift = 2;

  // For prefill: quarter s of half h is chunk 4h + s; each piece's scale is also its bias term.
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, Unpacked& u) {
    int8_t sc[16];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sc), scales(blk + 96));
    for (int p = 0; p < int(kSuper / kPiece); ++p) u.mn[p] = sc[p];
    spread_scales(u.mn, u);
    u.d = load_fp16(blk + 108);
    u.dmin = 0;
    const __m256i two = _mm256_set1_epi8(3);
    const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * h));
      for (int s = 0; s < 4; ++s) {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), two);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + 128 * h + 32 * s),
                            _mm256_or_si256(low, bit_to<2>(hmask, 4 * h + s)));
      }
    }
  }

  // The sixteen scales less 32, as int8: low 4 bits of 0-7 in bytes 0-7's low nibbles, of 8-15 in
  // their high nibbles; top 2 bits of scale j in bit pair j / 4 of byte 8 + j % 4.
  __attribute__((target("avx2,fma,f16c"))) static __m128i scales(const uint8_t* s) {
    uint32_t w[3];
    std::memcpy(w, s, 12);
    const uint32_t four = 0x0f0f0f0f, two = 0x03030303;
    const __m128i sc = _mm_setr_epi32(int((w[0] & four) | ((w[2] & two) << 4)),
                                      int((w[1] & four) | (((w[2] >> 2) & two) << 4)),
                                      int(((w[0] >> 4) & four) | (((w[2] >> 4) & two) << 4)),
                                      int(((w[1] >> 4) & four) | (((w[2] >> 6) & two) << 4)));
    return _mm_sub_epi8(sc, _mm_set1_epi8(32));
  }

  __attribute__((target("avx2,fma,f16c"))) static void accumulate_row(const uint8_t* blk, const int8_t* xq,
                                                                       const int16_t* sums, float dx, __m256& acc) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(scales(blk + 96));
    const HalfScales halves(sc16);
    const __m256i two = _mm256_set1_epi8(3);
    const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * h));
      for (int s = 0; s < 4; ++s) {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), two);
        const __m256i q = _mm256_or_si256(low, bit_to<2>(hmask, 4 * h + s));
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 128 * h + 32 * s));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), halves.quarter(h, s)));
      }
    }
    // 4·Σ_j s_j·S_j for the -4 every quant carries.
    const __m256i bias =
        _mm256_slli_epi32(_mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums))), 2);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_fp16(blk + 108) * dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, bias)),
                          acc);
  }
};

// Q5_K: 176 bytes — fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs (Q4_K's), 32 bytes of
// fifth bits, 128 bytes of nibbles: chunk c (64 elements) is byte 48 + 32c + l's low nibble with bit
// 2c of fifth-bit byte l (elements 64c + l) and its high nibble with bit 2c + 1 (64c + 32 + l).
struct Q5K {
  static constexpr int64_t kBytes = 176;
  static constexpr int kBiasShift = 0;

  // For prefill: chunk 2c the low nibbles of bytes 48 + 32c.. with fifth bit 2c, 2c+1 the high
  // nibbles with bit 2c + 1.
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, Unpacked& u) {
    unpack_k4_scales(blk, u);
    const __m256i low = _mm256_set1_epi8(0x0f);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * c));
      const __m256i h0 = bit_to<4>(qh, 2 * c), h1 = bit_to<4>(qh, 2 * c + 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + 64 * c), _mm256_or_si256(_mm256_and_si256(q, low), h0));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + 64 * c + 32),
                          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), h1));
    }
  }

  __attribute__((target("avx2,fma,f16c"))) static void accumulate_row(const uint8_t* blk, const int8_t* xq,
                                                                       const int16_t* sums, float dx, __m256& acc) {
    __m128i sc8, mn8;
    scales_mins_k4(blk + 4, sc8, mn8);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * c));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * c + 32));
      const __m256i pick0 = _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * c)));
      const __m256i pick1 = _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * c + 1)));
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * c));
      const __m256i h0 = bit_to<4>(qh, 2 * c), h1 = bit_to<4>(qh, 2 * c + 1);
      const __m256i q0 = _mm256_or_si256(_mm256_and_si256(q, low), h0);
      const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), h1);
      // Pairs q·x are at most 2·31·127 = 7874; times a scale < 64, twice, far inside int32.
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q0, x0), _mm256_shuffle_epi8(sc16, pick0));
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q1, x1), _mm256_shuffle_epi8(sc16, pick1));
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
    }
    add_k4_super_block(blk, isum, mn8, sums, dx, acc);
  }
};

}  // namespace

bool gemm_kquant_more_supports(const WeightView& w) {
  return (w.dtype == DType::Q2_K || w.dtype == DType::Q3_K || w.dtype == DType::Q5_K) && w.cols % kSuper == 0 &&
         has_f16c();
}

void gemm_kquant_more(const float* x, int64_t m, const WeightView& w, float* y) {
  if (m <= 0) return;
  if (w.dtype == DType::Q2_K) return gemm_kquant<Q2K>(x, m, w, y);
  if (w.dtype == DType::Q3_K) return gemm_kquant<Q3K>(x, m, w, y);
  gemm_kquant<Q5K>(x, m, w, y);
}

}  // namespace tessera::cpu
