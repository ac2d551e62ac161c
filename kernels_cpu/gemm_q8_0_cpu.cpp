// GGUF Q8_0 weights (per block of 32: an fp16 scale d_w, then 32 int8 quants) times int8-quantized
// activations: each block pair is one signed int8 dot (vpsignb/vpabsb + vpmaddubsw + vpmaddwd),
// scaled by d_w·d_x and accumulated in float (FMA). Four weight rows share each activation load, two
// of them per register; two activation rows share each weight load. Decode reads the blocks in
// place (eight rows at a time from a band: Q8::band_row); prefill copies a tile's quants, their
// absolute values and its scales as floats into a per-thread buffer first (gemm_blocks_cpu.h:
// run_tile_avx2, run_band_avx2, and gemm_blocks for tiles and threads).
#include <immintrin.h>

#include "gemm_blocks_cpu.h"

namespace tessera::cpu {

namespace {

// Σ over 32 products of two int8 vectors, as 8 int32 pair sums. vpmaddubsw wants one unsigned
// operand: it gets |w| and x carries the sign of w (as llama.cpp does). |x| <= 127 by construction
// and |w| <= 128 (vpabsb of -128 reads as 128 unsigned), so a pair is at most 2·128·127 = 32512 and
// the int16 step cannot saturate, even for a file holding -128.
__attribute__((target("avx2,fma"))) inline __m256i dot32(__m256i aw, __m256i w, __m256i x, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones);
}

// Rows 2p and 2p+1 of a tile's block, two rows per register: their elements 0-15 in lo, 16-31 in
// hi, row 2p in the low 128-bit half.
__attribute__((target("avx2,fma"))) inline void load_pair(const uint8_t* a, const uint8_t* b, __m256i& lo,
                                                          __m256i& hi) {
  const __m256i wa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2));
  const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  lo = _mm256_permute2x128_si256(wa, wb, 0x20);
  hi = _mm256_permute2x128_si256(wa, wb, 0x31);
}

struct Q8 {
  static constexpr int64_t kBlockBytes = 34;
  static constexpr int64_t kBufferBlockBytes = 2 * 4 * 32;  // per row pair: lo, hi, |lo|, |hi|

  template <int kX, BlockSource kSrc>
  __attribute__((target("avx2,fma,f16c"))) static void tile(const uint8_t* const* wr, const uint8_t* buf,
                                                            const float* bufd, const int8_t* const* xq,
                                                            const float* const* xd, int64_t blocks, float (*out)[2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][kX];  // [row pair][x row]: lanes 0-3 row 2p, lanes 4-7 row 2p+1
    for (auto& row : acc) {
      for (auto& a : row) a = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk[4];
      __m256 dw = _mm256_setzero_ps();  // the buffer holds the scales spread out instead
      if constexpr (kSrc != BlockSource::buffer) {
        block_ptrs<kBlockBytes, kSrc == BlockSource::packed>(wr, b, blk);
        dw = _mm256_zextps128_ps256(scales4(blk));
      }
      __m256i xlo[kX], xhi[kX];  // the x block's elements 0-15 (16-31) in both halves
      __m256 dx[kX], sc[kX];
      for (int i = 0; i < kX; ++i) {
        const int8_t* xb = xq[i] + b * kQBlock;
        xlo[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb)));
        xhi[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)));
        dx[i] = _mm256_set1_ps(xd[i][b]);
        sc[i] = _mm256_mul_ps(dw, dx[i]);  // lanes 0-3: d_w[r]·d_x (in place)
      }
      for (int p = 0; p < 2; ++p) {
        __m256i lo, hi, alo, ahi;
        if constexpr (kSrc == BlockSource::buffer) {
          const auto* q = reinterpret_cast<const __m256i*>(buf + b * kBufferBlockBytes + p * 128);
          lo = _mm256_loadu_si256(q);
          hi = _mm256_loadu_si256(q + 1);
          alo = _mm256_loadu_si256(q + 2);
          ahi = _mm256_loadu_si256(q + 3);
        } else {
          load_pair(blk[2 * p], blk[2 * p + 1], lo, hi);
          alo = _mm256_abs_epi8(lo);
          ahi = _mm256_abs_epi8(hi);
        }
        for (int i = 0; i < kX; ++i) {
          // Two int32 sums: the int16 pair sums of lo and hi could overflow if added first.
          const __m256i s = _mm256_add_epi32(dot32(alo, lo, xlo[i], ones), dot32(ahi, hi, xhi[i], ones));
          acc[p][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), pair_scale<kSrc>(sc[i], dx[i], bufd, 2 * b + p, p),
                                      acc[p][i]);
        }
      }
    }
    store_pair_sums<kX>(acc, out);
  }

  // One x row against a band (gemm_blocks_cpu.h): y[0..8). A block's eight scales convert at once
  // and each half of a row pair is one 32-byte load, with no lane permutes.
  __attribute__((target("avx2,fma,f16c"))) static void band_row(const uint8_t* band, const int8_t* xq,
                                                                const float* xd, int64_t blocks, float* y,
                                                                int64_t ahead) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < blocks; ++b) {
      const BandStep st = band_step<kRowsPerBand * kBlockBytes>(band, xq, xd, b, ahead);
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const auto* q = reinterpret_cast<const __m256i*>(st.blk + kBandScaleBytes + 64 * p);
        const __m256i lo = _mm256_loadu_si256(q), hi = _mm256_loadu_si256(q + 1);
        const __m256i s = _mm256_add_epi32(dot32(_mm256_abs_epi8(lo), lo, st.xlo, ones),
                                           dot32(_mm256_abs_epi8(hi), hi, st.xhi, ones));
        acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_permutevar8x32_ps(st.sc, band_pair_lanes(p)), acc[p]);
      }
    }
    store_band_sums(acc, y);
  }

  // band_row with vpdpbusd doing vpmaddubsw, vpmaddwd and the add (|w| <= 128 against x carrying
  // w's sign, exact in int32 either way).
  __attribute__((target(VNNI_TARGET ",f16c"))) static void band_row_vnni(const uint8_t* band, const int8_t* xq,
                                                                        const float* xd, int64_t blocks, float* y,
                                                                        int64_t ahead) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < blocks; ++b) {
      const BandStep st = band_step<kRowsPerBand * kBlockBytes>(band, xq, xd, b, ahead);
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const auto* q = reinterpret_cast<const __m256i*>(st.blk + kBandScaleBytes + 64 * p);
        const __m256i lo = _mm256_loadu_si256(q), hi = _mm256_loadu_si256(q + 1);
        __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(lo), _mm256_sign_epi8(st.xlo, lo));
        s = _mm256_dpbusd_epi32(s, _mm256_abs_epi8(hi), _mm256_sign_epi8(st.xhi, hi));
        acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_permutevar8x32_ps(st.sc, band_pair_lanes(p)), acc[p]);
      }
    }
    store_band_sums(acc, y);
  }

  __attribute__((target("avx2,fma,f16c"))) static void unpack_band_half(const uint8_t* band, int half,
                                                                        int64_t blocks, TileBuffer& buf) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = band + b * kRowsPerBand * kBlockBytes;
      store_spread_scales(buf.d.data(), b, band_half_scales(blk, half));
      for (int p = 0; p < 2; ++p) {
        const auto* src = reinterpret_cast<const __m256i*>(blk + kBandScaleBytes + 64 * (2 * half + p));
        const __m256i lo = _mm256_loadu_si256(src), hi = _mm256_loadu_si256(src + 1);
        auto* dst = reinterpret_cast<__m256i*>(buf.q.data() + b * kBufferBlockBytes + p * 128);
        _mm256_storeu_si256(dst, lo);
        _mm256_storeu_si256(dst + 1, hi);
        _mm256_storeu_si256(dst + 2, _mm256_abs_epi8(lo));
        _mm256_storeu_si256(dst + 3, _mm256_abs_epi8(hi));
      }
    }
  }

  // The band as band_rows_vnni reads it: the quants plus 128 (w ^ 0x80, unsigned).
  static constexpr uint8_t kVnniOffset = 128;
  __attribute__((target(VNNI_TARGET ",f16c"))) static void unpack_band_vnni(const uint8_t* band, int64_t blocks,
                                                                           TileBuffer& buf) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = band + b * kRowsPerBand * kBlockBytes;
      for (int half = 0; half < 2; ++half) {
        store_spread_scales(buf.d.data(), 2 * b + half, band_half_scales(blk, half));
        const auto* src = reinterpret_cast<const __m256i*>(blk + kBandScaleBytes + 128 * half);  // pairs 2h, 2h + 1
        const __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(src)), _mm256_loadu_si256(src + 2), 1);
        const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(src + 1)), _mm256_loadu_si256(src + 3), 1);
        auto* dst = reinterpret_cast<__m512i*>(buf.q.data() + (2 * b + half) * kVnniTileBlockBytes);
        _mm512_storeu_si512(dst, _mm512_xor_si512(lo, flip));
        _mm512_storeu_si512(dst + 1, _mm512_xor_si512(hi, flip));
      }
    }
  }

  // The tile as tile<kX, BlockSource::buffer> reads it.
  template <bool kPacked>
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* const* wr, int64_t blocks, uint8_t* buf,
                                                              float* bufd) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk[4];
      block_ptrs<kBlockBytes, kPacked>(wr, b, blk);
      store_spread_scales(bufd, b, scales4(blk));
      for (int p = 0; p < 2; ++p) {
        __m256i lo, hi;
        load_pair(blk[2 * p], blk[2 * p + 1], lo, hi);
        auto* q = reinterpret_cast<__m256i*>(buf + b * kBufferBlockBytes + p * 128);
        _mm256_storeu_si256(q, lo);
        _mm256_storeu_si256(q + 1, hi);
        _mm256_storeu_si256(q + 2, _mm256_abs_epi8(lo));
        _mm256_storeu_si256(q + 3, _mm256_abs_epi8(hi));
      }
    }
  }
};

// Portable code, row-major blocks: the same exact int dots, summed over blocks in another order.
void run_tile_scalar(const uint8_t* const* wr, const BlockActivations& x, int64_t i0, int64_t i1, float* y,
                     int64_t ldy, int64_t rows) {
  const int64_t blocks = x.k / kQBlock;
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = wr[r] + b * Q8::kBlockBytes;
        const int8_t* xb = x.q + i * x.k + b * kQBlock;
        int32_t s = 0;
        for (int c = 0; c < kQBlock; ++c) s += int32_t(static_cast<int8_t>(blk[2 + c])) * int32_t(xb[c]);
        acc += fp16_to_f32(load_u16(blk)) * x.d[i * blocks + b] * float(s);
      }
      y[(i - i0) * ldy + r] = acc;
    }
  }
}

const BlockKernels kKernels = {
    "q8_0", Q8::kBlockBytes, {run_tile_avx2<Q8, false>, run_tile_avx2<Q8, true>}, run_tile_scalar, run_band_avx2<Q8>,
    run_band_vnni<Q8>};

}  // namespace

void gemm_q8_0(const float* x, int64_t m, const WeightView& w, float* y) { gemm_blocks(x, m, w, y, kKernels); }

}  // namespace tessera::cpu
