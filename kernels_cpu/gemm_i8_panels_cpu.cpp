// The default int8 GEMM's packed layout and its kernel (gemm_i8_cpu.cpp quantizes x and calls in).
//
// Layout (prepare_weight_i8): rows in panels of 16. A panel stores, for each quad of columns
// (4q .. 4q+3), 64 bytes: rows 0-7's four values side by side, then rows 8-15's; then the columns
// after the last whole quad (k % 4 of them), 16 bytes each, one per row. Rows after the last full
// panel stay row-major.
//
// Kernel: vpmaddubsw multiplies 32 bytes of a panel (8 rows x 4 columns) with a broadcast quad of
// |x| and sums the products in pairs into int16; vpmaddwd against ones sums the pairs into int32,
// one lane per row. vpmaddubsw wants one unsigned operand, so the weights take the sign of x
// (vpsignb); with |x|, |w| <= 127 (both quantized symmetric to ±127) a pair is at most
// 2·127·127 = 32258 and the int16 step cannot saturate: exact, like the row-major path. Four
// vector operations per 32 products, where widening the weights to int16 for vpmaddwd (the
// previous layout, 16 rows x 2 columns) took six: decode GEMVs from cache ran 15-35% faster
// (BM_Gemm/2/1, 2 threads), room the core uses to keep more of the memory stream in flight, and
// the int8 110m decode read closer to the bandwidth probe (BM_DecodeRoofline/1 median share
// 0.84-0.87 -> 0.88-0.91 with the probe at 42-48 GB/s, 5 alternating pairs). Prefill does the same
// multiplies either way. A 6 x 16 tile of y keeps 12 int32 accumulators in registers (prefill).
// Decode (m = 1) reads each panel once, a thread's panels one after another (row_into_y).
// With AVX-512 VNNI (tile_vnni, row_into_y_vnni) vpdpbusd replaces the three operations after the
// sign: from cache the decode GEMV took 23% less time and the 128-row prefill 33% less (BM_Gemm/2/1
// and /2/128 at 2048x768, one thread, 30 alternating runs each); the int8 110m decode, bound by
// memory, gained ~4% (8 alternating `tessera run` pairs). The VNNI functions repeat their AVX2 twins'
// loops because a function's instruction set is fixed where it is defined.
// Those signed VNNI panels now serve only CPUs with AMX (its tiles read them for prefill, kernel
// auto): elsewhere VNNI reads the offset layout (kI8OffsetPanels, rows_into_y_offset, tile_offset),
// one 512-bit vpdpbusd per quad line and no sign step. On a Zen 4 VM (BM_Gemm/2, 2048x768, 2
// alternating runs each): the 128-row prefill 1957-1968 -> 1154-1174 us on one thread, 1030-1044 ->
// 589-648 us on two; the decode GEMV from cache 18.2-19.0 -> 17.3-17.5 us on one thread, 12.2-12.9
// -> 10.9-11.4 us on two; the int8 110m decode, in the minutes when the probe read 65-70 GB/s, from
// 0.81-0.84 of the probe to 0.87-0.89 (BM_DecodeRoofline/1, 4 and 5 runs of 16 alternating pairs;
// at ~37 GB/s both read as fast as the probe).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels_cpu.h"
#include "panel_out_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kPanel = PanelOut::kPanelColumns;
constexpr int64_t kQuadBytes = 4 * kPanel;  // one quad of columns of a panel
constexpr int64_t kMr = 6;
constexpr int64_t kPrefetchBytes = 2048;

// Decode's software prefetch of a step's two cache lines `ahead` bytes on (decode_prefetch_bytes).
inline void prefetch_step(const int8_t* w, int64_t ahead) {
  if (ahead != 0) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + ahead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w) + ahead + 64, _MM_HINT_T0);
  }
}

__attribute__((target("avx2"))) inline __m256i broadcast_quad(const int32_t* p) { return _mm256_set1_epi32(*p); }

// acc += the int32 dots of 8 rows (32 bytes at w) with one quad of x, given as |x| and x.
__attribute__((target("avx2"))) inline void add_quad(__m256i ax, __m256i sx, const void* w, __m256i ones,
                                                     __m256i& acc) {
  const __m256i wv = _mm256_loadu_si256(static_cast<const __m256i*>(w));
  acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, sx)), ones));
}

// out[MR][16] = exact int32 dots over the kq column quads; xp holds, per quad, each row's |x| and
// x quads (pack_x_quads).
template <int MR>
__attribute__((target("avx2,fma"))) void tile(const int32_t* xp, const int8_t* wp, int64_t kq, int32_t* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = _mm256_setzero_si256();
    acc[r][1] = _mm256_setzero_si256();
  }
  for (int64_t q = 0; q < kq; ++q) {
    if constexpr (MR == 1) _mm_prefetch(reinterpret_cast<const char*>(wp + q * kQuadBytes) + kPrefetchBytes, _MM_HINT_T0);
    const int32_t* xq = xp + q * MR * 2;
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256i ax = broadcast_quad(xq + 2 * r), sx = broadcast_quad(xq + 2 * r + 1);
      add_quad(ax, sx, wp + q * kQuadBytes, ones, acc[r][0]);
      add_quad(ax, sx, wp + q * kQuadBytes + 32, ones, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * kPanel), acc[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * kPanel + 8), acc[r][1]);
  }
}

// AVX-512 VNNI (256-bit vectors): vpdpbusd multiplies, sums each row's four products and adds
// them to its int32 lane in one instruction, where add_quad takes three after the sign: the same
// exact dots in half the vector operations.
__attribute__((target(VNNI_TARGET))) inline void add_quad_vnni(__m256i ax, __m256i sx, const void* w, __m256i& acc) {
  acc = _mm256_dpbusd_epi32(acc, ax, _mm256_sign_epi8(_mm256_loadu_si256(static_cast<const __m256i*>(w)), sx));
}

template <int MR>
__attribute__((target(VNNI_TARGET))) void tile_vnni(const int32_t* xp, const int8_t* wp, int64_t kq, int32_t* out) {
  __m256i acc[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (int64_t q = 0; q < kq; ++q) {
    const int32_t* xq = xp + q * MR * 2;
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256i ax = broadcast_quad(xq + 2 * r), sx = broadcast_quad(xq + 2 * r + 1);
      add_quad_vnni(ax, sx, wp + q * kQuadBytes, acc[r][0]);
      add_quad_vnni(ax, sx, wp + q * kQuadBytes + 32, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * kPanel), acc[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * kPanel + 8), acc[r][1]);
  }
}

// y[0, 16) = float(acc) · (sx · scale), rows 0-7 from lo and 8-15 from hi.
__attribute__((target("avx2"))) inline void store_rows(__m256i lo, __m256i hi, float sx, const float* scales, float* y) {
  const __m256 s = _mm256_set1_ps(sx);
  _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(s, _mm256_loadu_ps(scales))));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(s, _mm256_loadu_ps(scales + 8))));
}

// Decode of one panel (one row of x, k a multiple of 4): tile<1>'s products, two quads (two cache
// lines) per step and two accumulator chains, rescaled straight into y as the general epilogue
// below does. Unrolled so, the loop issues fewer instructions per byte than tile<1>'s, which leaves
// the core room to keep more of the stream in flight. A thread's panels follow one another in
// memory, one sequential stream; on AMD EPYC the hardware prefetcher alone ran ahead of it best
// (with a prefetch 2 KiB ahead the int8 110m decode was ~5% slower in the fast minutes), on Intel a
// software prefetch 8 KiB ahead keeps more in flight (`ahead`, decode_prefetch_bytes).
__attribute__((target("avx2,fma"))) void row_into_y(const int32_t* xp, const int8_t* wp, int64_t kq, float sx,
                                                    const float* scales, float* y, int64_t ahead) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
  int64_t q = 0;
  for (; q + 2 <= kq; q += 2) {
    const int8_t* w = wp + q * kQuadBytes;
    prefetch_step(w, ahead);
    const __m256i ax0 = broadcast_quad(xp + 2 * q), sx0 = broadcast_quad(xp + 2 * q + 1);
    const __m256i ax1 = broadcast_quad(xp + 2 * q + 2), sx1 = broadcast_quad(xp + 2 * q + 3);
    add_quad(ax0, sx0, w, ones, a0);
    add_quad(ax0, sx0, w + 32, ones, a1);
    add_quad(ax1, sx1, w + kQuadBytes, ones, b0);
    add_quad(ax1, sx1, w + kQuadBytes + 32, ones, b1);
  }
  for (; q < kq; ++q) {
    const __m256i ax = broadcast_quad(xp + 2 * q), sx0 = broadcast_quad(xp + 2 * q + 1);
    add_quad(ax, sx0, wp + q * kQuadBytes, ones, a0);
    add_quad(ax, sx0, wp + q * kQuadBytes + 32, ones, a1);
  }
  store_rows(_mm256_add_epi32(a0, b0), _mm256_add_epi32(a1, b1), sx, scales, y);
}

// row_into_y with add_quad_vnni.
__attribute__((target(VNNI_TARGET))) void row_into_y_vnni(const int32_t* xp, const int8_t* wp, int64_t kq, float sx,
                                                         const float* scales, float* y, int64_t ahead) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
  int64_t q = 0;
  for (; q + 2 <= kq; q += 2) {
    const int8_t* w = wp + q * kQuadBytes;
    prefetch_step(w, ahead);
    const __m256i ax0 = broadcast_quad(xp + 2 * q), sx0 = broadcast_quad(xp + 2 * q + 1);
    const __m256i ax1 = broadcast_quad(xp + 2 * q + 2), sx1 = broadcast_quad(xp + 2 * q + 3);
    add_quad_vnni(ax0, sx0, w, a0);
    add_quad_vnni(ax0, sx0, w + 32, a1);
    add_quad_vnni(ax1, sx1, w + kQuadBytes, b0);
    add_quad_vnni(ax1, sx1, w + kQuadBytes + 32, b1);
  }
  for (; q < kq; ++q) {
    const __m256i ax = broadcast_quad(xp + 2 * q), sx0 = broadcast_quad(xp + 2 * q + 1);
    add_quad_vnni(ax, sx0, wp + q * kQuadBytes, a0);
    add_quad_vnni(ax, sx0, wp + q * kQuadBytes + 32, a1);
  }
  store_rows(_mm256_add_epi32(a0, b0), _mm256_add_epi32(a1, b1), sx, scales, y);
}

// row_into_y_vnni over S panels side by side, `spacing` panels apart: S streams, each step one quad
// (a cache line) of each, each stream prefetching `ahead` bytes on every other line. With the
// intel tuning decode reads four (see stream_tuning).
template <int S>
__attribute__((target(VNNI_TARGET))) void rows_into_y_vnni(const int32_t* xp, const int8_t* wp, int64_t kq,
                                                          int64_t spacing, float sx, const float* scales, float* y,
                                                          int64_t ahead) {
  const int64_t stride = spacing * kPanel * kq * 4;  // bytes from one stream's panel to the next's
  __m256i a[S][2];
#pragma GCC unroll 4
  for (int p = 0; p < S; ++p) a[p][0] = a[p][1] = _mm256_setzero_si256();
  for (int64_t q = 0; q < kq; ++q) {
    const __m256i ax = broadcast_quad(xp + 2 * q), sxq = broadcast_quad(xp + 2 * q + 1);
#pragma GCC unroll 4
    for (int p = 0; p < S; ++p) {
      const int8_t* w = wp + p * stride + q * kQuadBytes;
      if ((q & 1) == 0) prefetch_step(w, ahead);
      add_quad_vnni(ax, sxq, w, a[p][0]);
      add_quad_vnni(ax, sxq, w + 32, a[p][1]);
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < S; ++p) {
    store_rows(a[p][0], a[p][1], sx, scales + p * spacing * kPanel, y + p * spacing * kPanel);
  }
}

// The offset layout (kI8OffsetPanels, VNNI): a panel's whole quads hold w + 128 (w ^ 0x80), so
// vpdpbusd takes the weights as its unsigned operand and x, signed, as it is: one 512-bit vpdpbusd
// per 64-byte quad line, the broadcast of x folded in, where the signed layout needs vpsignb and two
// 256-bit vpdpbusd after broadcasting |x| and x. The sum is Σ(w + 128)·x = Σw·x + 128·Σx, and
// 128·Σx (x_offset, per row of x) is subtracted in int32: the same exact dots, the same bits.
// xp here holds x's quads alone, (q · rows + r) for a block of rows.

// Decode of S panels `spacing` panels apart (S streams; 1 on AMD, see stream_tuning), two quads a
// step, each stream prefetching `ahead` bytes on.
template <int S>
__attribute__((target(VNNI_TARGET))) void rows_into_y_offset(const int32_t* xp, int32_t x_offset, const int8_t* wp,
                                                            int64_t kq, int64_t spacing, float sx,
                                                            const float* scales, float* y, int64_t ahead) {
  const int64_t stride = spacing * kPanel * kq * 4;  // bytes from one stream's panel to the next's
  __m512i a[S], b[S];
#pragma GCC unroll 4
  for (int p = 0; p < S; ++p) a[p] = b[p] = _mm512_setzero_si512();
  int64_t q = 0;
  for (; q + 2 <= kq; q += 2) {
    const __m512i x0 = _mm512_set1_epi32(xp[q]), x1 = _mm512_set1_epi32(xp[q + 1]);
#pragma GCC unroll 4
    for (int p = 0; p < S; ++p) {
      const int8_t* w = wp + p * stride + q * kQuadBytes;
      prefetch_step(w, ahead);
      a[p] = _mm512_dpbusd_epi32(a[p], _mm512_loadu_si512(w), x0);
      b[p] = _mm512_dpbusd_epi32(b[p], _mm512_loadu_si512(w + kQuadBytes), x1);
    }
  }
  if (q < kq) {
    const __m512i x0 = _mm512_set1_epi32(xp[q]);
#pragma GCC unroll 4
    for (int p = 0; p < S; ++p) a[p] = _mm512_dpbusd_epi32(a[p], _mm512_loadu_si512(wp + p * stride + q * kQuadBytes), x0);
  }
  const __m512i offset = _mm512_set1_epi32(x_offset);
  const __m512 s = _mm512_set1_ps(sx);
#pragma GCC unroll 4
  for (int p = 0; p < S; ++p) {
    const __m512i dots = _mm512_sub_epi32(_mm512_add_epi32(a[p], b[p]), offset);
    const __m512 scale = _mm512_mul_ps(s, _mm512_loadu_ps(scales + p * spacing * kPanel));
    _mm512_storeu_ps(y + p * spacing * kPanel, _mm512_mul_ps(_mm512_cvtepi32_ps(dots), scale));
  }
}

// Σ of a row's n bytes of x (n a multiple of 4), exact: vpdpbusd against ones, 64 bytes at a time.
__attribute__((target(VNNI_TARGET))) int32_t sum_of_bytes(const int8_t* v, int64_t n) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc = _mm512_setzero_si512();
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) acc = _mm512_dpbusd_epi32(acc, ones, _mm512_loadu_si512(v + c));
  int32_t sum = _mm512_reduce_add_epi32(acc);
  for (; c < n; ++c) sum += v[c];
  return sum;
}

// out[MR][16] = the offset dots Σ(w + 128)·x over the kq quads of MR rows of x.
template <int MR>
__attribute__((target(VNNI_TARGET))) void tile_offset(const int32_t* xp, const int8_t* wp, int64_t kq, int32_t* out) {
  __m512i acc[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_si512();
  for (int64_t q = 0; q < kq; ++q) {
    const __m512i w = _mm512_loadu_si512(wp + q * kQuadBytes);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_dpbusd_epi32(acc[r], w, _mm512_set1_epi32(xp[q * MR + r]));
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) _mm512_storeu_si512(out + r * kPanel, acc[r]);
}

using TileFn = void (*)(const int32_t*, const int8_t*, int64_t, int32_t*);
constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};
constexpr TileFn kTilesVnni[kMr + 1] = {nullptr,       tile_vnni<1>, tile_vnni<2>, tile_vnni<3>,
                                        tile_vnni<4>, tile_vnni<5>, tile_vnni<6>};
constexpr TileFn kTilesOffset[kMr + 1] = {nullptr,         tile_offset<1>, tile_offset<2>, tile_offset<3>,
                                          tile_offset<4>, tile_offset<5>, tile_offset<6>};

// Where row `row`'s value of column `col` sits in its panel (col below the last whole quad).
inline int64_t quad_offset(int64_t row, int64_t col) {
  return col / 4 * kQuadBytes + row / 8 * 32 + row % 8 * 4 + col % 4;
}

// One quad of x (4 bytes at src) as the kernels take it: its |x| at dst[0], itself at dst[1].
inline void put_quad(const int8_t* src, int32_t* dst) {
  int8_t a[4];
  for (int i = 0; i < 4; ++i) a[i] = static_cast<int8_t>(std::abs(src[i]));
  std::memcpy(dst, a, 4);
  std::memcpy(dst + 1, src, 4);
}

// One row's quads of |x| and x, interleaved (dst[2q] = |x| quad q, dst[2q + 1] = x quad q): the
// decode's x, 32 columns an instruction.
__attribute__((target("avx2"))) void quads_of_row(const int8_t* row, int64_t kq, int32_t* dst) {
  int64_t q = 0;
  for (; q + 8 <= kq; q += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 4 * q));
    const __m256i a = _mm256_abs_epi8(v);
    // unpack interleaves within 128-bit lanes; the permutes put quads 0-3, then 4-7, in order.
    const __m256i lo = _mm256_unpacklo_epi32(a, v), hi = _mm256_unpackhi_epi32(a, v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * q), _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * q + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
  }
  for (; q < kq; ++q) put_quad(row + 4 * q, dst + 2 * q);
}

}  // namespace

void prepare_weight_i8_panels(WeightView& w, bool offset) {
  const int64_t k = w.cols;
  const int8_t flip = offset ? int8_t(-128) : int8_t(0);  // w ^ 0x80 = w + 128 as an unsigned byte
  auto* data = static_cast<int8_t*>(const_cast<void*>(w.data));
  std::vector<int8_t> rows(size_t(kPanel * k));
  for (int64_t j = 0; j + kPanel <= w.rows; j += kPanel) {
    int8_t* panel = data + j * k;
    std::copy(panel, panel + kPanel * k, rows.begin());
    const int64_t whole = k / 4 * 4;
    for (int64_t r = 0; r < kPanel; ++r) {
      const int8_t* row = rows.data() + r * k;
      for (int64_t c = 0; c < whole; ++c) panel[quad_offset(r, c)] = int8_t(row[c] ^ flip);
      for (int64_t c = whole; c < k; ++c) panel[whole * kPanel + (c - whole) * kPanel + r] = row[c];
    }
  }
  w.kernel_variant |= kI8PackedPanels | (offset ? kI8OffsetPanels : 0);
}

int64_t i8_panel_rows(const WeightView& w) {
  return (w.kernel_variant & kI8PackedPanels) != 0 ? (w.rows / kPanel) * kPanel : 0;
}

void pack_x_quads(const int8_t* xq, int64_t m, int64_t k, int64_t b0, int64_t b1, bool offset, int32_t* xp,
                  int32_t* x_offset) {
  const int64_t kq = k / 4;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t i0 = b * kMr;
    const int64_t mr = std::min(kMr, m - i0);
    if (offset) {
      int32_t* dst = xp + i0 * kq;
      for (int64_t r = 0; r < mr; ++r) {
        const int8_t* row = xq + (i0 + r) * k;
        x_offset[i0 + r] = 128 * sum_of_bytes(row, kq * 4);
        if (mr == 1) {
          std::memcpy(dst, row, size_t(kq) * 4);
          continue;
        }
        for (int64_t q = 0; q < kq; ++q) std::memcpy(dst + q * mr + r, row + 4 * q, 4);
      }
      continue;
    }
    int32_t* dst = xp + i0 * kq * 2;
    if (mr == 1) {
      quads_of_row(xq + i0 * k, kq, dst);
      continue;
    }
    for (int64_t r = 0; r < mr; ++r) {
      const int8_t* row = xq + (i0 + r) * k;
      for (int64_t q = 0; q < kq; ++q) put_quad(row + 4 * q, dst + (q * mr + r) * 2);
    }
  }
}

int64_t x_quad_blocks(int64_t m) { return (m + kMr - 1) / kMr; }

void gemm_i8_panels(const int32_t* xp, const int32_t* x_offset, const int8_t* xq, const float* sx, int64_t m,
                    const WeightView& w, int64_t q0, int64_t q1, const PanelOut& out, bool vnni) {
  const int64_t k = w.cols;
  const int64_t kq = k / 4;
  const auto* panels = static_cast<const int8_t*>(w.data);
  const bool offset = (w.kernel_variant & kI8OffsetPanels) != 0;
  if (m == 1 && k % 4 == 0) {  // decode: one dense y (gemm_parts is for batches)
    float* const y = out.dense();
    // amd tuning: one stream a thread, its claimed panels one after another. On a Zen 3 VM (two
    // vCPUs) that read faster than four streams through the claim's quarters: int8 110m decode +7%
    // in the minutes when the bandwidth probe read ~33 GB/s, +5% when it read 40-56
    // (BM_DecodeRoofline/1, 38 + 9 runs alternated in one process); a pure read there one stream
    // 1-12% faster than four, up to 55% in the fast minutes. intel tuning (VNNI): four streams
    // through the claim's quarters, each prefetching ahead: on a Xeon VM the int8 110m decode 258
    // -> 334 tok/s (8 alternating `tessera run -n 256` pairs, all faster), BM_GemvStream/2 27 -> 35 GB/s.
    const int64_t ahead = decode_prefetch_bytes(0);
    constexpr int S = kIntelI8DecodeStreams;
    if (vnni && stream_tuning() == StreamTuning::intel && q1 - q0 >= S) {  // S streams through the claim's parts
      const int64_t spacing = (q1 - q0) / S;
      for (int64_t q = q0; q < q0 + spacing; ++q) {
        const int8_t* wp = panels + q * kPanel * k;
        if (offset) {
          rows_into_y_offset<S>(xp, x_offset[0], wp, kq, spacing, sx[0], w.scales + q * kPanel, y + q * kPanel, ahead / S);
        } else {
          rows_into_y_vnni<S>(xp, wp, kq, spacing, sx[0], w.scales + q * kPanel, y + q * kPanel, ahead / S);
        }
      }
      q0 += spacing * S;
    }
    for (int64_t q = q0; q < q1; ++q) {
      const int8_t* wp = panels + q * kPanel * k;
      if (offset) {
        rows_into_y_offset<1>(xp, x_offset[0], wp, kq, 1, sx[0], w.scales + q * kPanel, y + q * kPanel, ahead);
      } else {
        (vnni ? row_into_y_vnni : row_into_y)(xp, wp, kq, sx[0], w.scales + q * kPanel, y + q * kPanel, ahead);
      }
    }
    return;
  }
  alignas(32) int32_t dots[kMr * kPanel];
  const int64_t whole = kq * 4;
  for (int64_t q = q0; q < q1; ++q) {
    const int8_t* wp = panels + q * kPanel * k;
    const int64_t j = q * kPanel;
    int64_t ld = 0;
    float* const y = out.columns(q, 1, ld);
    for (int64_t i0 = 0; i0 < m; i0 += kMr) {
      const int64_t mr = std::min(kMr, m - i0);
      if (offset) {
        kTilesOffset[mr](xp + i0 * kq, wp, kq, dots);
      } else {
        (vnni ? kTilesVnni : kTiles)[mr](xp + i0 * kq * 2, wp, kq, dots);
      }
      for (int64_t r = 0; r < mr; ++r) {
        const int64_t i = i0 + r;
        int32_t* acc = dots + r * kPanel;
        if (offset) {
          for (int64_t c = 0; c < kPanel; ++c) acc[c] -= x_offset[i];
        }
        for (int64_t c = whole; c < k; ++c) {  // the columns after the last whole quad
          const int32_t xl = xq[i * k + c];
          const int8_t* wc = wp + whole * kPanel + (c - whole) * kPanel;
          for (int64_t row = 0; row < kPanel; ++row) acc[row] += xl * int32_t(wc[row]);
        }
        for (int64_t c = 0; c < kPanel; ++c) y[i * ld + c] = float(acc[c]) * (sx[i] * w.scales[j + c]);
      }
    }
  }
}

}  // namespace tessera::cpu
