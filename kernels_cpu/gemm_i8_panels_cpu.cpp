// The default int8 GEMM's packed layout and its kernel (gemm_i8_cpu.cpp quantizes x and calls in).
//
// Layout (prepare_weight_i8): rows in panels of 16. A panel stores, for each pair of columns
// (2h, 2h+1), the 16 rows' two values side by side — [row 0: c, c+1][row 1: c, c+1]... 32 bytes —
// then, when k is odd, the 16 rows' last column. Rows after the last full panel stay row-major.
//
// Kernel: weights are sign-extended to int16 and multiplied with vpmaddwd against a broadcast pair
// of int16 activations, so one instruction does 16 products and sums them in pairs into int32 —
// exact, like the vpmaddubsw path, with no per-pair sign fix-up. A 6 x 16 tile of y keeps 12
// int32 accumulators in registers; each pair step costs 2 loads and 24 integer ops for 192
// multiply-adds, about 1.5x what the FMA units do on f32 (measured), so int8 prefill is faster
// than f32. Decode (m = 1) reads each panel once, four panels side by side (panels_into_y): a
// quarter of the thread's claimed panels apart, so that each of the four streams runs on through
// its quarter.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kPanel = 16;
constexpr int64_t kMr = 6;
constexpr int64_t kPrefetchBytes = 2048;

// out[MR][16] = exact int32 dots over the kh column pairs.
template <int MR>
__attribute__((target("avx2,fma"))) void tile(const int32_t* xp, const int8_t* wp, int64_t kh, int32_t* out) {
  __m256i acc[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = _mm256_setzero_si256();
    acc[r][1] = _mm256_setzero_si256();
  }
  for (int64_t h = 0; h < kh; ++h) {
    if constexpr (MR == 1) _mm_prefetch(reinterpret_cast<const char*>(wp + h * 32) + kPrefetchBytes, _MM_HINT_T0);
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + h * 32)));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + h * 32 + 16)));
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256i xv = _mm256_set1_epi32(xp[h * MR + r]);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(xv, w0));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(xv, w1));
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * kPanel), acc[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * kPanel + 8), acc[r][1]);
  }
}

// Decode (one row of x, k even): tile<1>'s products, four column pairs (two cache lines) per step
// with one prefetch per line, rescaled straight into y as the general epilogue below does
// (float(acc) · (sx · scale)). Unrolled so, the loop issues about a third fewer instructions per
// byte than tile<1>'s, which leaves the core room to keep more of the stream in flight: the int8
// 110m decode runs 5-15% faster (alternating `tessera run` processes and BM_DecodeRoofline runs).
__attribute__((target("avx2,fma"))) inline void add_pair(const int32_t* xp, const int8_t* wp, int64_t h, __m256i& lo,
                                                         __m256i& hi) {
  const __m256i xv = _mm256_set1_epi32(xp[h]);
  const auto* w = reinterpret_cast<const __m128i*>(wp + h * 32);
  lo = _mm256_add_epi32(lo, _mm256_madd_epi16(xv, _mm256_cvtepi8_epi16(_mm_loadu_si128(w))));
  hi = _mm256_add_epi32(hi, _mm256_madd_epi16(xv, _mm256_cvtepi8_epi16(_mm_loadu_si128(w + 1))));
}

__attribute__((target("avx2,fma"))) void row_into_y(const int32_t* xp, const int8_t* wp, int64_t kh, float sx,
                                                    const float* scales, float* y) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  __m256i b0 = _mm256_setzero_si256(), b1 = _mm256_setzero_si256();
  int64_t h = 0;
  for (; h + 4 <= kh; h += 4) {
    _mm_prefetch(reinterpret_cast<const char*>(wp + h * 32) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wp + h * 32) + kPrefetchBytes + 64, _MM_HINT_T0);
    add_pair(xp, wp, h, a0, a1);
    add_pair(xp, wp, h + 1, b0, b1);
    add_pair(xp, wp, h + 2, a0, a1);
    add_pair(xp, wp, h + 3, b0, b1);
  }
  for (; h < kh; ++h) add_pair(xp, wp, h, a0, a1);
  const __m256 s = _mm256_set1_ps(sx);
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_add_epi32(a0, b0)), hi = _mm256_cvtepi32_ps(_mm256_add_epi32(a1, b1));
  _mm256_storeu_ps(y, _mm256_mul_ps(lo, _mm256_mul_ps(s, _mm256_loadu_ps(scales))));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(hi, _mm256_mul_ps(s, _mm256_loadu_ps(scales + 8))));
}

// Decode over P panels at once (P <= kI8DecodePanels), `spacing` panels apart, without software
// prefetch: P sequential streams are what the hardware prefetcher keeps fed best. On this project's
// VM, in minutes when the bandwidth probe reads 44-47 GB/s, four streams read at the probe's rate
// where one stream with a prefetch ahead fell 8% short, and the int8 110m decode ran 13-24% faster;
// in slower minutes the two were equal (BM_DecodeRoofline, 4 + 5 alternating pairs). One stream
// through four interleaved panels lost 10-20%. A lone panel keeps row_into_y's prefetch: one stream
// without it reads ~10% slower.
template <int P>
__attribute__((target("avx2,fma"))) void panels_into_y(const int32_t* xp, const int8_t* wp, int64_t kh,
                                                       int64_t spacing, float sx, const float* scales, float* y) {
  const int64_t stride = spacing * kh * 2 * kPanel;
  __m256i acc[P][2];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) acc[p][0] = acc[p][1] = _mm256_setzero_si256();
  for (int64_t h = 0; h < kh; ++h) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) add_pair(xp, wp + p * stride, h, acc[p][0], acc[p][1]);
  }
  const __m256 s = _mm256_set1_ps(sx);
#pragma GCC unroll 8
  for (int i = 0; i < 2 * P; ++i) {
    const int64_t at = (i / 2) * spacing * kPanel + (i % 2) * 8;
    const __m256 v = _mm256_cvtepi32_ps(acc[i / 2][i % 2]);
    _mm256_storeu_ps(y + at, _mm256_mul_ps(v, _mm256_mul_ps(s, _mm256_loadu_ps(scales + at))));
  }
}

using TileFn = void (*)(const int32_t*, const int8_t*, int64_t, int32_t*);
constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// The output order of vpmaddwd's lanes: panel byte pair h*32 + 2c holds row c (c < 8 in the first
// 16 bytes, c >= 8 in the second), so row c of a tile lands in int32 lane c.
inline int64_t pair_offset(int64_t row, int64_t h) { return h * 32 + row * 2; }

}  // namespace

void prepare_weight_i8_panels(WeightView& w) {
  const int64_t k = w.cols;
  const int64_t kh = k / 2;
  auto* data = static_cast<int8_t*>(const_cast<void*>(w.data));
  std::vector<int8_t> rows(size_t(kPanel * k));
  for (int64_t j = 0; j + kPanel <= w.rows; j += kPanel) {
    int8_t* panel = data + j * k;
    std::copy(panel, panel + kPanel * k, rows.begin());
    for (int64_t r = 0; r < kPanel; ++r) {
      const int8_t* row = rows.data() + r * k;
      for (int64_t h = 0; h < kh; ++h) {
        panel[pair_offset(r, h)] = row[2 * h];
        panel[pair_offset(r, h) + 1] = row[2 * h + 1];
      }
      if (k % 2 != 0) panel[kh * 32 + r] = row[k - 1];
    }
  }
  w.kernel_variant |= kI8PackedPanels;
}

int64_t i8_panel_rows(const WeightView& w) {
  return (w.kernel_variant & kI8PackedPanels) != 0 ? (w.rows / kPanel) * kPanel : 0;
}

// One row (decode): its pairs are the row widened to int16, sixteen values an instruction.
__attribute__((target("avx2"))) void widen_row(const int8_t* row, int64_t kh, int32_t* xp) {
  auto* out = reinterpret_cast<int16_t*>(xp);
  int64_t c = 0;
  for (; c + 16 <= 2 * kh; c += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), _mm256_cvtepi8_epi16(v));
  }
  for (; c < 2 * kh; ++c) out[c] = row[c];
}

void pack_x_pairs(const int8_t* xq, int64_t m, int64_t k, int64_t b0, int64_t b1, int32_t* xp) {
  const int64_t kh = k / 2;
  if (m == 1 && b0 == 0 && b1 == 1) return widen_row(xq, kh, xp);  // little-endian: low half first
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t i0 = b * kMr;
    const int64_t mr = std::min(kMr, m - i0);
    int32_t* dst = xp + i0 * kh;
    for (int64_t r = 0; r < mr; ++r) {
      const int8_t* row = xq + (i0 + r) * k;
      for (int64_t h = 0; h < kh; ++h) {
        dst[h * mr + r] = int32_t(uint32_t(uint16_t(int16_t(row[2 * h]))) |
                                  (uint32_t(uint16_t(int16_t(row[2 * h + 1]))) << 16));
      }
    }
  }
}

int64_t x_pair_blocks(int64_t m) { return (m + kMr - 1) / kMr; }

void gemm_i8_panels(const int32_t* xp, const int8_t* xq, const float* sx, int64_t m, const WeightView& w,
                    int64_t q0, int64_t q1, float* y) {
  const int64_t k = w.cols;
  const int64_t kh = k / 2;
  const int64_t n = w.rows;
  const auto* panels = static_cast<const int8_t*>(w.data);
  if (m == 1 && k % 2 == 0) {
    static_assert(kI8DecodePanels == 4);
    // Whole units: four streams through the range's quarters. Each stream then reads panels one
    // after another for as long as the range lasts, where four neighbouring panels at a time
    // restarted every stream after one panel (12 KiB at k = 768): the int8 110m decode read 1-8%
    // closer to the bandwidth probe (BM_DecodeRoofline/1, 5 alternating pairs), and with gemm_i8's
    // larger claims 6-10% in the fast minutes, 2-6% in the common ones (4 pairs).
    if ((q1 - q0) % kI8DecodePanels == 0 && q1 - q0 > kI8DecodePanels) {
      const int64_t spacing = (q1 - q0) / kI8DecodePanels;
      for (int64_t q = q0; q < q0 + spacing; ++q) {
        panels_into_y<4>(xp, panels + q * kPanel * k, kh, spacing, sx[0], w.scales + q * kPanel, y + q * kPanel);
      }
      return;
    }
    using RowsFn = void (*)(const int32_t*, const int8_t*, int64_t, int64_t, float, const float*, float*);
    constexpr RowsFn kRows[5] = {nullptr, nullptr, panels_into_y<2>, panels_into_y<3>, panels_into_y<4>};
    for (int64_t q = q0; q < q1; q += kI8DecodePanels) {
      const int64_t count = std::min(kI8DecodePanels, q1 - q);
      if (count == 1) {
        row_into_y(xp, panels + q * kPanel * k, kh, sx[0], w.scales + q * kPanel, y + q * kPanel);
      } else {
        kRows[count](xp, panels + q * kPanel * k, kh, 1, sx[0], w.scales + q * kPanel, y + q * kPanel);
      }
    }
    return;
  }
  alignas(32) int32_t out[kMr * kPanel];
  for (int64_t q = q0; q < q1; ++q) {
    const int8_t* wp = panels + q * kPanel * k;
    const int64_t j = q * kPanel;
    for (int64_t i0 = 0; i0 < m; i0 += kMr) {
      const int64_t mr = std::min(kMr, m - i0);
      kTiles[mr](xp + i0 * kh, wp, kh, out);
      for (int64_t r = 0; r < mr; ++r) {
        const int64_t i = i0 + r;
        int32_t* acc = out + r * kPanel;
        if (k % 2 != 0) {
          const int32_t xl = xq[i * k + k - 1];
          for (int64_t c = 0; c < kPanel; ++c) acc[c] += xl * int32_t(wp[kh * 32 + c]);
        }
        for (int64_t c = 0; c < kPanel; ++c) y[i * n + j + c] = float(acc[c]) * (sx[i] * w.scales[j + c]);
      }
    }
  }
}

}  // namespace tessera::cpu
