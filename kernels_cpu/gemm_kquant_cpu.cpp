// GGUF k-quant weights (Q4_K, Q6_K; layouts in core/src/dtype_kquant.cpp) times int8-quantized
// activations, read as stored: no float copy of a row. Each activation row is quantized per
// super-block of 256 (scale amax/127, rounded to nearest even) with the sums of its 16-element
// pieces, so that a super-block's sub-block scales stay integers inside the dot:
//   Q4_K  Σ (d·sc_j·q - dmin·m_j)·x  =  dx·(d·Σ_j sc_j·Σ q·xq  -  dmin·Σ_j m_j·Σ xq)
//   Q6_K  Σ d·sc_j·(q - 32)·x        =  dx·d·(Σ_j sc_j·Σ q·xq  -  32·Σ_j sc_j·Σ xq)
// vpmaddubsw multiplies the unsigned quants by the int8 activations, vpmaddwd applies the scales,
// and one float multiply-add per super-block and row remains. Weight rows go four at a time,
// super-block by super-block, against an activation block that stays in L1; every row of x sees
// the same arithmetic in the same order, so decode, prefill and verification agree to the bit.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels_cpu.h"
#include "stealing_bands_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kSuper = 256;
constexpr int64_t kPiece = 16;  // activation sums per 16 elements (Q6_K's scale granularity)
constexpr int64_t kRowsPerTile = 4;

struct KQuantX {
  std::vector<int8_t> q;      // [m][k]
  std::vector<float> d;       // [m][k / 256]
  std::vector<int16_t> sums;  // [m][k / 16]: Σ q over each 16 elements
};

__attribute__((target("avx2,fma,f16c"))) void quantize_x(const float* x, int64_t m, int64_t k, KQuantX& out) {
  const int64_t supers = k / kSuper;
  out.q.resize(size_t(m * k));
  out.d.resize(size_t(m * supers));
  out.sums.resize(size_t(m * (k / kPiece)));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < m * supers; ++i) {
    const float* xs = x + i * kSuper;
    __m256 vmax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int64_t c = 0; c < kSuper; c += 8) {
      const __m256 v = _mm256_loadu_ps(xs + c);
      vmax = _mm256_max_ps(vmax, _mm256_and_ps(abs_mask, v));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    const float amax = *std::max_element(lanes, lanes + 8);
    // A NaN or infinite activation makes the block's scale NaN, so the outputs it feeds are NaN too
    // (as in float arithmetic) instead of finite from clamped quants.
    const float d = _mm256_movemask_ps(nan) != 0 || std::isinf(amax) ? NAN : amax / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0 ? 1.0f / d : 0.0f);
    out.d[size_t(i)] = d;
    int8_t* q = out.q.data() + i * kSuper;
    for (int64_t c = 0; c < kSuper; c += kPiece) {
      // Sixteen values to int8 (|x·id| <= 127: packs never saturate) and their sum.
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + c), id));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + c + 8), id));
      const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);  // 16 int16 in order
      const __m128i w8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c), w8);
      const __m256i s = _mm256_madd_epi16(w16, _mm256_set1_epi16(1));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
      out.sums[size_t(i * (kSuper / kPiece) + c / kPiece)] = int16_t(_mm_cvtsi128_si32(s4));
    }
  }
}

__attribute__((target("avx2,fma,f16c"))) inline float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

__attribute__((target("avx2,fma,f16c"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

constexpr int64_t kPrefetchBytes = 4096;

// Q4_K: 144 bytes per super-block — fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs, 128
// bytes whose 32-byte chunk c holds sub-block 2c in its low nibbles and 2c+1 in its high ones.
struct Q4K {
  static constexpr int64_t kBytes = 144;

  // The eight 6-bit scales and mins, as bytes: entries 0-3 are the low 6 bits of bytes 0-3
  // (scales) and 4-7 (mins); entries 4-7 take their low 4 bits from bytes 8-11 and their top 2 bits
  // from the spare high bits of bytes 0-3 (scales) and 4-7 (mins). Worked on four bytes at a time.
  __attribute__((target("avx2,fma,f16c"))) static void scales_mins(const uint8_t* s, __m128i& sc, __m128i& mn) {
    uint32_t w[3];
    std::memcpy(w, s, 12);
    const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
    sc = _mm_setr_epi32(int(w[0] & six), int((w[2] & four) | (((w[0] >> 6) & two) << 4)), 0, 0);
    mn = _mm_setr_epi32(int(w[1] & six), int(((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4)), 0, 0);
  }

  // acc[r] (8 lanes) += d·dx·Σ_j sc_j·Σ q·xq  -  dmin·dx·Σ_j m_j·Σ xq over one super-block of each of
  // kRows rows (blk[r]), which share the activation loads.
  template <int kRows>
  __attribute__((target("avx2,fma,f16c"))) static void accumulate(const uint8_t* const* blk, const int8_t* xq,
                                                                   const int16_t* sums, float dx, __m256* acc) {
    // Each row's scales as int16 in both halves; chunk c broadcasts entries 2c and 2c+1 with a byte
    // shuffle.
    __m256i sc16[kRows], isum[kRows];
    __m128i mn8[kRows];
    for (int r = 0; r < kRows; ++r) {
      __m128i sc8;
      scales_mins(blk[r] + 4, sc8, mn8[r]);
      sc16[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
      isum[r] = _mm256_setzero_si256();
    }
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * c));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 64 * c + 32));
      const __m256i pick0 = _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * c)));
      const __m256i pick1 = _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * c + 1)));
      for (int r = 0; r < kRows; ++r) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + 16 + 32 * c));
        // Pairs q·x are at most 2·15·127 = 3810; times a scale < 64, twice, far inside int32.
        const __m256i p0 =
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(q, low), x0), _mm256_shuffle_epi8(sc16[r], pick0));
        const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), x1),
                                             _mm256_shuffle_epi8(sc16[r], pick1));
        isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
      }
    }
    const __m256i piece_sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums));
    for (int r = 0; r < kRows; ++r) {
      // Each min twice, against the sums of the two 16-element halves of its sub-block.
      const __m128i m16 = _mm_cvtepu8_epi16(mn8[r]);
      const __m256i mins = _mm256_setr_m128i(_mm_unpacklo_epi16(m16, m16), _mm_unpackhi_epi16(m16, m16));
      const __m256i msum = _mm256_madd_epi16(mins, piece_sums);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(load_fp16(blk[r]) * dx), _mm256_cvtepi32_ps(isum[r]), acc[r]);
      acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(load_fp16(blk[r] + 2) * dx), _mm256_cvtepi32_ps(msum), acc[r]);
    }
  }
};

// Q6_K: 210 bytes per super-block — 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales (one
// per 16 elements), fp16 d. Half h (128 elements) uses low bytes 64h.. and high bytes 128 + 32h..;
// its quarter i (32 elements) is the low (i = 0, 1) or high (i = 2, 3) nibbles of low bytes
// 64h + 32(i % 2).. with bit pair i of the high bytes on top.
struct Q6K {
  static constexpr int64_t kBytes = 210;

  template <int kRows>
  __attribute__((target("avx2,fma,f16c"))) static void accumulate(const uint8_t* const* blks, const int8_t* xq,
                                                                   const int16_t* sums, float dx, __m256* accs) {
    for (int r = 0; r < kRows; ++r) accumulate_row(blks[r], xq, sums, dx, accs[r]);
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

// Rows [j0, j1) of W against all m rows of x, four rows at a time.
template <class Format>
__attribute__((target("avx2,fma,f16c"))) void gemm_rows(const KQuantX& xq, int64_t m, const WeightView& w,
                                                        float* y, int64_t j0, int64_t j1) {
  const int64_t k = w.cols, n = w.rows, supers = k / kSuper;
  const size_t row_bytes = size_t(supers * Format::kBytes);
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t j = j0; j < j1; j += kRowsPerTile) {
    const int64_t rows = std::min(kRowsPerTile, j1 - j);
    for (int64_t i = 0; i < m; ++i) {
      __m256 acc[kRowsPerTile];
      for (auto& a : acc) a = _mm256_setzero_ps();
      for (int64_t b = 0; b < supers; ++b) {
        const int8_t* x = xq.q.data() + i * k + b * kSuper;
        const int16_t* sums = xq.sums.data() + (i * supers + b) * (kSuper / kPiece);
        const float dx = xq.d[size_t(i * supers + b)];
        const uint8_t* blk[kRowsPerTile];
        for (int64_t r = 0; r < rows; ++r) blk[r] = base + size_t(j + r) * row_bytes + size_t(b * Format::kBytes);
        // The hardware prefetcher does not follow four rows read a super-block at a time: each
        // row's bytes a few KiB ahead (the tiles after this one, rows being contiguous).
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t line = 0; line < Format::kBytes; line += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(blk[r]) + kPrefetchBytes + line, _MM_HINT_T0);
          }
        }
        if (rows == kRowsPerTile) {
          Format::template accumulate<kRowsPerTile>(blk, x, sums, dx, acc);
        } else {
          for (int64_t r = 0; r < rows; ++r) Format::template accumulate<1>(blk + r, x, sums, dx, acc + r);
        }
      }
      for (int64_t r = 0; r < rows; ++r) y[i * n + j + r] = hsum(acc[r]);
    }
  }
}

template <class Format>
void gemm_kquant(const float* x, int64_t m, const WeightView& w, float* y) {
  thread_local KQuantX xq;
  quantize_x(x, m, w.cols, xq);
  const int64_t n = w.rows;
  if ((m * n * w.cols < kParallelWork && n * int64_t(dtype_row_bytes(w.dtype, w.cols)) < kParallelStreamBytes) ||
      team_max_threads() == 1) {
    return gemm_rows<Format>(xq, m, w, y, 0, n);
  }
  const KQuantX& shared = xq;
  const int64_t tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  for_units(tiles, [&](int64_t t0, int64_t t1) {
    gemm_rows<Format>(shared, m, w, y, t0 * kRowsPerTile, std::min(n, t1 * kRowsPerTile));
  });
}

}  // namespace

bool gemm_kquant_supports(const WeightView& w) {
  return (w.dtype == DType::Q4_K || w.dtype == DType::Q6_K) && w.cols % kSuper == 0 && has_f16c();
}

void gemm_kquant(const float* x, int64_t m, const WeightView& w, float* y) {
  if (m <= 0) return;
  if (w.dtype == DType::Q4_K) return gemm_kquant<Q4K>(x, m, w, y);
  gemm_kquant<Q6K>(x, m, w, y);
}

}  // namespace tessera::cpu
