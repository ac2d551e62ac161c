// GGUF Q4_0 weights (per block of 32: an fp16 scale d_w, then 16 bytes whose low nibbles are
// elements 0-15 and high nibbles elements 16-31, each meaning q - 8) times int8-quantized
// activations. The nibbles are unpacked in registers, two weight rows per register (the 16 bytes of
// rows r and r+1 side by side, so one mask/shift unpacks both), and the -8 is folded out:
//   Σ (q - 8)·x  =  Σ q·x - Σ 8·x
// so vpmaddubsw takes the unsigned nibbles directly (no sign trick) and 8·x is computed once per
// activation block for the tile. Each block is scaled by d_w·d_x and accumulated in float (FMA). Two
// activation rows share each weight load. Decode reads the blocks in place (eight rows at a time
// from a band: Q4::band_row); prefill unpacks a tile's nibbles and scales into a per-thread buffer
// first (gemm_blocks_cpu.h: run_tile_avx2, run_band_avx2, and gemm_blocks for tiles and threads).
#include <immintrin.h>

#include "gemm_blocks_cpu.h"

namespace tessera::cpu {

namespace {

// Rows 2p and 2p+1 of a tile's block: their low nibbles (elements 0-15) in lo, high nibbles
// (elements 16-31) in hi, row 2p in the low 128-bit half.
__attribute__((target("avx2,fma"))) inline void unpack_pair(const uint8_t* a, const uint8_t* b, __m256i& lo,
                                                            __m256i& hi) {
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2));
  const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
  const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
  lo = _mm256_and_si256(q, low_mask);
  hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask);
}

struct Q4 {
  static constexpr int64_t kBlockBytes = 18;
  static constexpr int64_t kBufferBlockBytes = 2 * 2 * 32;  // per row pair: lo, hi

  template <int kX, BlockSource kSrc>
  __attribute__((target("avx2,fma,f16c"))) static void tile(const uint8_t* const* wr, const uint8_t* buf,
                                                            const float* bufd, const int8_t* const* xq,
                                                            const float* const* xd, int64_t blocks, float (*out)[2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i eights = _mm256_set1_epi8(8);
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
      // The x block's elements 0-15 in both halves (against the low nibbles), 16-31 in both halves
      // (against the high nibbles).
      __m256i xlo[kX], xhi[kX], x8[kX];
      __m256 dx[kX], sc[kX];
      for (int i = 0; i < kX; ++i) {
        const int8_t* xb = xq[i] + b * kQBlock;
        xlo[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb)));
        xhi[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)));
        // Pairs of 8·x over both halves, <= 4064 in magnitude.
        x8[i] = _mm256_add_epi16(_mm256_maddubs_epi16(eights, xlo[i]), _mm256_maddubs_epi16(eights, xhi[i]));
        dx[i] = _mm256_set1_ps(xd[i][b]);
        sc[i] = _mm256_mul_ps(dw, dx[i]);  // lanes 0-3: d_w[r]·d_x (in place)
      }
      for (int p = 0; p < 2; ++p) {
        __m256i lo, hi;
        if constexpr (kSrc == BlockSource::buffer) {
          const auto* q = reinterpret_cast<const __m256i*>(buf + b * kBufferBlockBytes + p * 64);
          lo = _mm256_loadu_si256(q);
          hi = _mm256_loadu_si256(q + 1);
        } else {
          unpack_pair(blk[2 * p], blk[2 * p + 1], lo, hi);
        }
        for (int i = 0; i < kX; ++i) {
          // Pairs q·x are at most 2·15·127 = 3810; two of them, less 8·x, stay far inside int16.
          const __m256i pairs = _mm256_sub_epi16(
              _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo[i]), _mm256_maddubs_epi16(hi, xhi[i])), x8[i]);
          const __m256 d = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
          acc[p][i] = _mm256_fmadd_ps(d, pair_scale<kSrc>(sc[i], dx[i], bufd, 2 * b + p, p), acc[p][i]);
        }
      }
    }
    store_pair_sums<kX>(acc, out);
  }

  // One x row against a band (gemm_blocks_cpu.h): y[0..8). A block's eight scales convert at once
  // and each row pair is one 32-byte load.
  __attribute__((target("avx2,fma,f16c"))) static void band_row(const uint8_t* band, const int8_t* xq,
                                                                const float* xd, int64_t blocks, float* y,
                                                                int64_t ahead) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i eights = _mm256_set1_epi8(8);
    const __m256i low_mask = _mm256_set1_epi8(0x0f);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < blocks; ++b) {
      const BandStep st = band_step<kRowsPerBand * kBlockBytes>(band, xq, xd, b, ahead);
      const __m256i x8 =
          _mm256_add_epi16(_mm256_maddubs_epi16(eights, st.xlo), _mm256_maddubs_epi16(eights, st.xhi));
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(st.blk + kBandScaleBytes + 32 * p));
        const __m256i lo = _mm256_and_si256(q, low_mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask);
        const __m256i pairs = _mm256_sub_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, st.xlo), _mm256_maddubs_epi16(hi, st.xhi)), x8);
        const __m256 d = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[p] = _mm256_fmadd_ps(d, _mm256_permutevar8x32_ps(st.sc, band_pair_lanes(p)), acc[p]);
      }
    }
    store_band_sums(acc, y);
  }

  // band_row with vpdpbusd: each int32 lane starts from minus its 8·x (two vpdpbusd a block,
  // shared by the four row pairs) and takes the two nibble dots on top; the same exact sums.
  __attribute__((target(VNNI_TARGET ",f16c"))) static void band_row_vnni(const uint8_t* band, const int8_t* xq,
                                                                        const float* xd, int64_t blocks, float* y,
                                                                        int64_t ahead) {
    const __m256i eights = _mm256_set1_epi8(8);
    const __m256i low_mask = _mm256_set1_epi8(0x0f);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < blocks; ++b) {
      const BandStep st = band_step<kRowsPerBand * kBlockBytes>(band, xq, xd, b, ahead);
      const __m256i x8 = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), eights, st.xlo), eights, st.xhi);
      const __m256i minus_x8 = _mm256_sub_epi32(_mm256_setzero_si256(), x8);
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(st.blk + kBandScaleBytes + 32 * p));
        const __m256i lo = _mm256_and_si256(q, low_mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask);
        const __m256i s = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(minus_x8, lo, st.xlo), hi, st.xhi);
        acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_permutevar8x32_ps(st.sc, band_pair_lanes(p)), acc[p]);
      }
    }
    store_band_sums(acc, y);
  }

  __attribute__((target("avx2,fma,f16c"))) static void unpack_band_half(const uint8_t* band, int half,
                                                                        int64_t blocks, TileBuffer& buf) {
    const __m256i low_mask = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = band + b * kRowsPerBand * kBlockBytes;
      store_spread_scales(buf.d.data(), b, band_half_scales(blk, half));
      for (int p = 0; p < 2; ++p) {
        const auto* src = reinterpret_cast<const __m256i*>(blk + kBandScaleBytes + 32 * (2 * half + p));
        const __m256i q = _mm256_loadu_si256(src);
        auto* dst = reinterpret_cast<__m256i*>(buf.q.data() + b * kBufferBlockBytes + p * 64);
        _mm256_storeu_si256(dst, _mm256_and_si256(q, low_mask));
        _mm256_storeu_si256(dst + 1, _mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask));
      }
    }
  }

  // The band as band_rows_vnni reads it: the nibbles as they are (q, so offset 8).
  static constexpr uint8_t kVnniOffset = 8;
  __attribute__((target(VNNI_TARGET ",f16c"))) static void unpack_band_vnni(const uint8_t* band, int64_t blocks,
                                                                           TileBuffer& buf) {
    const __m512i low_mask = _mm512_set1_epi8(0x0f);
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = band + b * kRowsPerBand * kBlockBytes;
      for (int half = 0; half < 2; ++half) {
        store_spread_scales(buf.d.data(), 2 * b + half, band_half_scales(blk, half));
        const __m512i q = _mm512_loadu_si512(blk + kBandScaleBytes + 64 * half);  // pairs 2h, 2h + 1
        auto* dst = reinterpret_cast<__m512i*>(buf.q.data() + (2 * b + half) * kVnniTileBlockBytes);
        _mm512_storeu_si512(dst, _mm512_and_si512(q, low_mask));
        _mm512_storeu_si512(dst + 1, _mm512_and_si512(_mm512_srli_epi16(q, 4), low_mask));
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
        unpack_pair(blk[2 * p], blk[2 * p + 1], lo, hi);
        auto* q = reinterpret_cast<__m256i*>(buf + b * kBufferBlockBytes + p * 64);
        _mm256_storeu_si256(q, lo);
        _mm256_storeu_si256(q + 1, hi);
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
        const uint8_t* blk = wr[r] + b * Q4::kBlockBytes;
        const int8_t* xb = x.q + i * x.k + b * kQBlock;
        int32_t s = 0;
        for (int c = 0; c < 16; ++c) {
          s += (int32_t(blk[2 + c] & 0x0f) - 8) * int32_t(xb[c]);
          s += (int32_t(blk[2 + c] >> 4) - 8) * int32_t(xb[c + 16]);
        }
        acc += fp16_to_f32(load_u16(blk)) * x.d[i * blocks + b] * float(s);
      }
      y[(i - i0) * ldy + r] = acc;
    }
  }
}

const BlockKernels kKernels = {
    "q4_0", Q4::kBlockBytes, {run_tile_avx2<Q4, false>, run_tile_avx2<Q4, true>}, run_tile_scalar, run_band_avx2<Q4>,
    run_band_vnni<Q4>};

}  // namespace

void gemm_q4_0(const float* x, int64_t m, const WeightView& w, float* y) { gemm_blocks(x, m, w, y, kKernels); }

}  // namespace tessera::cpu
