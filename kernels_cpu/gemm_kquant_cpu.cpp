// GGUF k-quant weights (Q4_K, Q6_K; layouts in core/src/dtype_kquant.cpp) times int8-quantized
// activations, read as stored: no float copy of a row. Each activation row is quantized per
// super-block of 256 (scale amax/127, rounded to nearest even) with the sums of its 16-element
// pieces, so that a super-block's sub-block scales stay integers inside the dot:
//   Q4_K  Σ (d·sc_j·q - dmin·m_j)·x  =  dx·(d·Σ_j sc_j·Σ q·xq  -  dmin·Σ_j m_j·Σ xq)
//   Q6_K  Σ d·sc_j·(q - 32)·x        =  dx·d·(Σ_j sc_j·Σ q·xq  -  32·Σ_j sc_j·Σ xq)
// vpmaddubsw multiplies the unsigned quants by the int8 activations, vpmaddwd applies the scales,
// and one float multiply-add per super-block and row remains. Weight rows go a tile of four at a
// time, super-block by super-block, against an activation block that stays in L1; every row of x
// sees the same arithmetic in the same order, so decode, prefill and verification agree to the bit.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gemm_kquant_cpu.h"

namespace tessera::cpu {

namespace {

using namespace kquant;

// Q4_K: 144 bytes per super-block — fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs, 128
// bytes whose 32-byte chunk c holds sub-block 2c in its low nibbles and 2c+1 in its high ones.
struct Q4K {
  static constexpr int64_t kBytes = 144;
  static constexpr int kBiasShift = 0;

  // For prefill (gemm_kquant_cpu.h): chunk 2c the low nibbles of bytes 16 + 32c.., 2c+1 the high.
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, Unpacked& u) {
    unpack_k4_scales(blk, u);
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + 64 * c), _mm256_and_si256(q, low));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(q, 4), low));
    }
  }

  // acc (8 lanes) += d·dx·Σ_j sc_j·Σ q·xq  -  dmin·dx·Σ_j m_j·Σ xq over one super-block.
  __attribute__((target("avx2,fma,f16c"))) static void accumulate_row(const uint8_t* blk, const int8_t* xq,
                                                                       const int16_t* sums, float dx, __m256& acc) {
    // The scales as int16 in both halves; chunk c broadcasts entries 2c and 2c+1 with a byte shuffle.
    __m128i sc8, mn8;
    scales_mins_k4(blk + 4, sc8, mn8);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * c));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * c + 32));
      const __m256i pick0 = _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * c)));
      const __m256i pick1 = _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * c + 1)));
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
      // Pairs q·x are at most 2·15·127 = 3810; times a scale < 64, twice, far inside int32.
      const __m256i p0 =
          _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(q, low), x0), _mm256_shuffle_epi8(sc16, pick0));
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), x1),
                                           _mm256_shuffle_epi8(sc16, pick1));
      isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
    }
    add_k4_super_block(blk, isum, mn8, sums, dx, acc);
  }
};

// Q6_K: 210 bytes per super-block — 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales (one
// per 16 elements), fp16 d. Half h (128 elements) uses low bytes 64h.. and high bytes 128 + 32h..;
// its quarter i (32 elements) is the low (i = 0, 1) or high (i = 2, 3) nibbles of low bytes
// 64h + 32(i % 2).. with bit pair i of the high bytes on top.
struct Q6K {
  static constexpr int64_t kBytes = 210;
  static constexpr int kBiasShift = 5;

  // For prefill: quarter i of half h is chunk 4h + i; each piece's scale is also its bias term.
  __attribute__((target("avx2,fma,f16c"))) static void unpack(const uint8_t* blk, Unpacked& u) {
    for (int p = 0; p < int(kSuper / kPiece); ++p) u.mn[p] = int8_t(blk[192 + p]);
    spread_scales(u.mn, u);
    u.d = load_fp16(blk + 208);
    u.dmin = 0;
    const __m256i low = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
          _mm256_or_si256(_mm256_and_si256(ql1, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), _mm256_and_si256(qh, bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45))};
      for (int i = 0; i < 4; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + 128 * h + 32 * i), q[i]);
    }
  }

  __attribute__((target("avx2,fma,f16c"))) static void accumulate_row(const uint8_t* blk, const int8_t* xq,
                                                                       const int16_t* sums, float dx, __m256& acc) {
    // The sixteen scales as int16: half h's eight in both 128-bit halves of scales[h].
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    const __m256i scales[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                               _mm256_permute2x128_si256(sc16, sc16, 0x11)};
    const __m256i low = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30);
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m256i nibble[4] = {_mm256_and_si256(ql0, low), _mm256_and_si256(ql1, low),
                                 _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                                 _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low)};
      // Bit pair i of the high bytes moved to bits 4-5 and masked: one shift (none for i = 2) and an
      // and. Shifting 16-bit lanes is safe: the mask drops what crosses from the neighbouring byte.
      const __m256i high[4] = {_mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45),
                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45), _mm256_and_si256(qh, bits45),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45)};
      for (int i = 0; i < 4; ++i) {
        const __m256i q = _mm256_or_si256(nibble[i], high[i]);
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 128 * h + 32 * i));
        // Elements 0-15 of the quarter (the low 128 bits) take scale 2i of the half, 16-31 scale
        // 2i + 1: one byte shuffle spreads them. Pairs q·x are at most 2·63·127 = 16002.
        const __m256i scale = _mm256_shuffle_epi8(
            scales[h], _mm256_setr_m128i(_mm_set1_epi16(short(0x0100 + 0x0202 * (2 * i))),
                                         _mm_set1_epi16(short(0x0100 + 0x0202 * (2 * i + 1)))));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), scale));
      }
    }
    // Σ_j sc_j·Σ xq times 32, for the -32 every quant carries (|32·sc·Σ xq| <= 32·128·2032 per lane).
    const __m256i bias = _mm256_slli_epi32(
        _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums))), 5);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_fp16(blk + 208) * dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, bias)),
                          acc);
  }
};

}  // namespace

void prepare_weight_quant_tiles(WeightView& w) {
  // The AVX2 kernels of every supported variant read the tiles; a view is packed once.
  if (!simd_kernel(w.kernel_variant) || (w.kernel_variant & kQuantTilesPacked) != 0) return;
  const size_t row_bytes = dtype_row_bytes(w.dtype, w.cols);
  const size_t bb = dtype_block_bytes(w.dtype);
  const size_t blocks = row_bytes / bb;
  auto* data = static_cast<uint8_t*>(const_cast<void*>(w.data));
  std::vector<uint8_t> rows(size_t(kRowsPerTile) * row_bytes);
  for (int64_t j = 0; j + kRowsPerTile <= w.rows; j += kRowsPerTile) {
    uint8_t* tile = data + size_t(j) * row_bytes;
    std::memcpy(rows.data(), tile, rows.size());
    for (size_t b = 0; b < blocks; ++b) {
      for (size_t r = 0; r < size_t(kRowsPerTile); ++r) {
        std::memcpy(tile + (b * kRowsPerTile + r) * bb, rows.data() + r * row_bytes + b * bb, bb);
      }
    }
  }
  w.kernel_variant |= kQuantTilesPacked;
}

bool gemm_kquant_supports(const WeightView& w) {
  return (w.dtype == DType::Q4_K || w.dtype == DType::Q6_K) && w.cols % kSuper == 0 && has_f16c();
}

void gemm_kquant(const float* x, int64_t m, const WeightView& w, float* y) {
  if (m <= 0) return;
  if (w.dtype == DType::Q4_K) return gemm_kquant<Q4K>(x, m, w, y);
  gemm_kquant<Q6K>(x, m, w, y);
}

}  // namespace tessera::cpu
