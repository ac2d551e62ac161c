// f32 GEMM over panel-packed weights, the layout prepare_weight_f32 gives every f32 Linear.
//
// Layout: rows are grouped in panels of 16; a panel is stored transposed, [k][16], so that one
// step of k reads the 16 rows' values as two vectors. Rows past the last full panel stay
// row-major at their usual offsets (gemm_cpu.cpp runs them).
//
// Kernel: a 6 x 16 tile of y lives in 12 registers; each step of k broadcasts six x values
// against the panel's two vectors (12 FMAs for 8 loads, so FMA throughput bounds it, where the
// dot-product form was bound by loads). The broadcasts read x's rows where they are (six
// sequential streams): packing x into one stream first cost more than it saved (128-row GEMMs on
// two threads of an EPYC VM: 768x768 +13%, 768x2048 +18% without it, 110m prefill +2-9%). The
// panel slice (up to kKc x 16 floats) stays in L2 across all x rows.
//
// Every y[i][j] is one FMA chain over k in order, whatever m is and wherever row i falls in a
// tile, so a row's result does not depend on the batch around it (decode equals prefill, bit for
// bit). Decode (m = 1) streams each panel once, four neighbouring panels side by side (row_panels).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "kernels_cpu.h"
#include "panel_out_cpu.h"
#include "stealing_bands_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kPanel = PanelOut::kPanelColumns;
constexpr int64_t kMr = 6;
// Most k per pass: four panels' slice for it (512 KiB) stays in L2. The 768 x 2048 GEMM in one
// pass ran 4% faster than in three of 683 (128 rows, two threads of an EPYC VM).
constexpr int64_t kKc = 2048;
constexpr int32_t kPackedPanels = 1 << 9;  // kernel_variant flag set by prepare_weight_f32
constexpr int64_t kPrefetchFloats = 512;   // 2 KB ahead in the panel stream
constexpr int64_t kDecodePanels = 4;       // panels a decode pass streams side by side
constexpr int kWidePanels = 4;             // panels an AVX-512 prefill tile takes

// y rows [0, MR) x panel columns [0, 16) (+)= x[r][p] · panel[p][16] for p in [0, kc), x's rows
// ldx floats apart.
template <int MR, bool kPrefetch>
__attribute__((target("avx2,fma"))) void tile(const float* x, int64_t ldx, const float* wp, int64_t kc, float* y,
                                              int64_t ldy, bool first) {
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * ldy);
    acc[r][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * ldy + 8);
  }
  for (int64_t p = 0; p < kc; ++p) {
    if constexpr (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(wp + p * kPanel + kPrefetchFloats), _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(wp + p * kPanel);
    const __m256 w1 = _mm256_loadu_ps(wp + p * kPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + p);
      acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(y + r * ldy, acc[r][0]);
    _mm256_storeu_ps(y + r * ldy + 8, acc[r][1]);
  }
}

// Decode: one x row against P panels at once, `spacing` panels apart (P sequential streams for the
// hardware prefetcher; 2P FMA chains hide the FMA latency that one panel's two chains would wait
// on). On AMD EPYC four streams with no software prefetch read at the bandwidth probe's rate where
// two with a prefetch ahead fell short in the fast minutes (see gemm_i8_panels_cpu.cpp); with the
// intel tuning each stream prefetches a quarter of decode_prefetch_bytes ahead (`ahead`: f32 110m
// decode +5%, +18% in faster minutes, on a Xeon VM). run_panels
// spaces them a quarter of a claim apart, so that each runs on through its quarter: the int4
// pipeline's f32 output head (70% of its bytes a token) read ~3% closer to the probe in the fast
// minutes (BM_DecodeRoofline/2, 4 alternating pairs), f32 alone the same (within noise, at 95-99%).
template <int P>
__attribute__((target("avx2,fma"))) void row_panels(const float* x, const float* wp, int64_t k, int64_t spacing,
                                                    float* y, int64_t ahead) {
  __m256 acc[P][2];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) acc[p][0] = acc[p][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m256 xv = _mm256_broadcast_ss(x + i);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const float* w = wp + p * spacing * k * kPanel + i * kPanel;
      if (ahead != 0) _mm_prefetch(reinterpret_cast<const char*>(w) + ahead, _MM_HINT_T0);
      acc[p][0] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w), acc[p][0]);
      acc[p][1] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + 8), acc[p][1]);
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    _mm256_storeu_ps(y + p * spacing * kPanel, acc[p][0]);
    _mm256_storeu_ps(y + p * spacing * kPanel + 8, acc[p][1]);
  }
}

// tile<MR> on P neighbouring panels at once with AVX-512: a panel's 16 columns are one zmm, so
// 6 rows x 4 panels keep 24 of the 32 zmm registers as accumulators, 24 FMAs of 16 lanes for 4
// loads and 6 broadcasts a step of k. Each lane runs tile's FMA chain over k in the same order:
// the same bits as P tile<MR> calls. On CPUs with two 512-bit FMA units this doubles the flops a
// cycle (128-row GEMM at 2048x768 on a Xeon VM, 2 threads: AVX2 217 GFLOP/s, 2 panels 311-318,
// 3 panels 312-329, 4 panels 330-349; the 16-lane FMA peak 465).
template <int MR, int P>
__attribute__((target("avx512f,avx2,fma"))) void tile_panels_avx512(const float* x, int64_t ldx, const float* wp,
                                                                    int64_t stride, int64_t kc, float* y, int64_t ldy,
                                                                    bool first) {
  __m512 acc[MR][P];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < P; ++j) acc[r][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + r * ldy + j * kPanel);
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m512 wv[P];
#pragma GCC unroll 4
    for (int j = 0; j < P; ++j) wv[j] = _mm512_loadu_ps(wp + j * stride + p * kPanel);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + p]);
#pragma GCC unroll 4
      for (int j = 0; j < P; ++j) acc[r][j] = _mm512_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < P; ++j) _mm512_storeu_ps(y + r * ldy + j * kPanel, acc[r][j]);
  }
}

using PanelsFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, bool);
constexpr PanelsFn kWideTiles[kMr + 1] = {nullptr,
                                          tile_panels_avx512<1, kWidePanels>,
                                          tile_panels_avx512<2, kWidePanels>,
                                          tile_panels_avx512<3, kWidePanels>,
                                          tile_panels_avx512<4, kWidePanels>,
                                          tile_panels_avx512<5, kWidePanels>,
                                          tile_panels_avx512<6, kWidePanels>};

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool);
// Only a single pass over a panel (decode) streams it from memory; a batch rereads it from L1.
constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1, true>, tile<2, false>, tile<3, false>, tile<4, false>, tile<5, false>, tile<6, false>};

// Few rows of x fit in L1 whole: one pass over k streams each panel once. Otherwise k is cut into
// equal passes of at most kKc.
int64_t pass_length(int64_t m, int64_t k) {
  const int64_t passes = m < 2 * kMr ? 1 : (k + kKc - 1) / kKc;
  return (k + passes - 1) / passes;
}

// Panel q against all m rows of x, for the pass [p0, p0 + kc).
void panel_pass(const float* x, int64_t m, const WeightView& w, const PanelOut& out, int64_t q, int64_t p0,
                int64_t kc) {
  const int64_t k = w.cols;
  const float* wp = static_cast<const float*>(w.data) + q * kPanel * k + p0 * kPanel;
  int64_t ld = 0;
  float* y = out.columns(q, 1, ld);
  for (int64_t i0 = 0; i0 < m; i0 += kMr) {
    const int64_t mr = std::min(kMr, m - i0);
    kTiles[mr](x + i0 * k + p0, k, wp, kc, y + i0 * ld, ld, p0 == 0);
  }
}

// Panels [q0, q1) against all m rows of x, for the pass [p0, p0 + kc): kWidePanels at a time
// (tile_panels_avx512) where the CPU has AVX-512 and they go to one part, else one by one.
void panels_pass(const float* x, int64_t m, const WeightView& w, const PanelOut& out, int64_t q0, int64_t q1,
                 int64_t p0, int64_t kc) {
  const int64_t k = w.cols;
  int64_t q = q0;
  for (int64_t ld = 0; has_avx512f() && q + kWidePanels <= q1; q += kWidePanels) {
    float* y = out.columns(q, kWidePanels, ld);
    if (y == nullptr) {
      for (int64_t j = q; j < q + kWidePanels; ++j) panel_pass(x, m, w, out, j, p0, kc);
      continue;
    }
    const float* wp = static_cast<const float*>(w.data) + q * kPanel * k + p0 * kPanel;
    for (int64_t i0 = 0; i0 < m; i0 += kMr) {
      const int64_t mr = std::min(kMr, m - i0);
      kWideTiles[mr](x + i0 * k + p0, k, wp, kPanel * k, kc, y + i0 * ld, ld, p0 == 0);
    }
  }
  for (; q < q1; ++q) panel_pass(x, m, w, out, q, p0, kc);
}

// Decode: panels [q0, q1) against the one row x, in one pass.
void decode_panels(const float* x, const WeightView& w, float* y, int64_t q0, int64_t q1) {
  const int64_t k = w.cols;
  const auto* panels = static_cast<const float*>(w.data);
  if ((q1 - q0) % kDecodePanels == 0 && q1 - q0 > kDecodePanels) {  // streams through the quarters
    const int64_t spacing = (q1 - q0) / kDecodePanels;
    for (int64_t q = q0; q < q0 + spacing; ++q) {
      row_panels<4>(x, panels + q * kPanel * k, k, spacing, y + q * kPanel, decode_prefetch_bytes(0) / 4);
    }
    return;
  }
  using RowFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t);
  constexpr RowFn kRows[kDecodePanels + 1] = {nullptr, nullptr, row_panels<2>, row_panels<3>, row_panels<4>};
  for (int64_t q = q0; q < q1; q += kDecodePanels) {
    const int64_t p = std::min(kDecodePanels, q1 - q);
    if (p == 1) {
      panel_pass(x, 1, w, PanelOut(y, w.rows), q, 0, k);  // one stream keeps tile<1>'s prefetch
    } else {
      kRows[p](x, panels + q * kPanel * k, k, 1, y + q * kPanel, decode_prefetch_bytes(0) / p);
    }
  }
}

bool small(int64_t m, const WeightView& w) {
  const int64_t work = m * (w.rows / kPanel) * kPanel * w.cols;
  const int64_t bytes = (w.rows / kPanel) * kPanel * w.cols * int64_t(sizeof(float));
  return (work < kParallelWork && bytes < kParallelStreamBytes) || team_max_threads() == 1;
}

// A batch (m > 1) through all the panels into `out`.
void gemm_batch(const float* x, int64_t m, const WeightView& w, const PanelOut& out) {
  const int64_t k = w.cols;
  const int64_t panels = w.rows / kPanel;
  const int64_t kc_max = pass_length(m, k);
  auto run = [&](int64_t q0, int64_t q1) {  // every pass of panels [q0, q1), in order
    for (int64_t p0 = 0; p0 < k; p0 += kc_max) panels_pass(x, m, w, out, q0, q1, p0, std::min(kc_max, k - p0));
  };
  if (small(m, w)) return run(0, panels);
  // The team takes panels a few at a time (a thread slowed by a neighbour on its core does not
  // hold the other at the end), each unit running all its passes: no barrier between passes (one a
  // pass cost the 768 x 2048 GEMM ~4% on two threads, each pass's last units finishing unevenly).
  const int64_t unit = has_avx512f() ? kWidePanels : 1;  // panels a tile call takes
  const int64_t units = (panels + unit - 1) / unit;
  std::atomic<int64_t> next{0};
  team_run([&](int, int) {
    for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
      run(u * unit, std::min(panels, (u + 1) * unit));
    }
  });
}

}  // namespace

void prepare_weight_f32(WeightView& w) {
  if (w.kernel_variant != 0 || !has_avx2() || w.rows < kPanel) return;
  const int64_t k = w.cols;
  auto* data = static_cast<float*>(const_cast<void*>(w.data));
  std::vector<float> rows(size_t(kPanel * k));
  for (int64_t j = 0; j + kPanel <= w.rows; j += kPanel) {
    float* panel = data + j * k;
    std::copy(panel, panel + kPanel * k, rows.begin());
    for (int64_t r = 0; r < kPanel; ++r) {
      for (int64_t p = 0; p < k; ++p) panel[p * kPanel + r] = rows[size_t(r * k + p)];
    }
  }
  w.kernel_variant |= kPackedPanels;
}

int64_t gemm_f32_panels(const float* x, int64_t m, const WeightView& w, float* y) {
  if ((w.kernel_variant & kPackedPanels) == 0) return 0;
  const int64_t panels = w.rows / kPanel;
  if (m > 1) {
    gemm_batch(x, m, w, PanelOut(y, w.rows));
  } else if (small(m, w)) {
    decode_panels(x, w, y, 0, panels);
  } else {
    // Each panel streamed once, kDecodePanels at a time, in bands (stolen at the end, see
    // stealing_bands_cpu.h) claimed half of what is left at a time: longer streams (row_panels).
    for_units((panels + kDecodePanels - 1) / kDecodePanels, [&](int64_t u0, int64_t u1) {
      decode_panels(x, w, y, kDecodePanels * u0, std::min(panels, kDecodePanels * u1));
    }, 2);
  }
  return panels * kPanel;
}

bool gemm_f32_parts(const float* x, int64_t m, const WeightView& w, const OutputPart* parts, size_t n_parts) {
  // kernel_variant bits mean something else for each weight type (i4 uses this one too).
  if (w.dtype != DType::F32 || (w.kernel_variant & kPackedPanels) == 0 || m < 2) return false;
  if (!PanelOut::splits(w.rows, parts, n_parts)) return false;
  gemm_batch(x, m, w, PanelOut(parts, n_parts));
  return true;
}

}  // namespace tessera::cpu
