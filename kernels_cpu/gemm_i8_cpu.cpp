// W8A8 GEMM: each row of x is quantized to int8 with its own scale (dynamic, per token: absmax/127,
// round to nearest), dotted with int8 weight rows in int32, and the result rescaled by both scales
// as it is stored (the dequantization is fused into the output write).
//
// WeightView::kernel_variant for I8 on the CPU (kernels_cpu.h):
//   0  auto: vnni where the CPU has AVX-512 VNNI, else avx2, else portable scalar code
//   1  dnnl: oneDNN's s8·s8->s32 matmul (builds with TESSERA_DNNL only, CPUs with AVX-512 VNNI;
//      refused by name otherwise)
//   2  the scalar reference, whatever the CPU (for tests and comparisons)
//   3  avx2: vpmaddubsw + vpmaddwd, even where the CPU has VNNI (scalar without AVX2)
//   4  vnni: vpdpbusd (refused where the CPU lacks it)
// All quantize x the same way and accumulate exactly in int32, so they agree to the last bit.
//
// prepare_weight() packs the weights of auto, avx2 and vnni into 16-row panels that the kernels in
// gemm_i8_panels_cpu.cpp read (flag kI8PackedPanels; for VNNI off AMX, as w + 128, flag
// kI8OffsetPanels); the rows after the last full panel, and
// the other variants, read row-major weights here.
//
// A call with m = 0 only validates the view, so a quantizer can learn at load time that a variant
// is missing.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels_cpu.h"
#include "panel_out_cpu.h"
#include "stealing_bands_cpu.h"
#include "tessera/error.h"

#ifdef TESSERA_HAVE_DNNL
#include <map>
#include <mutex>
#include <utility>

#include <dnnl.hpp>
#endif

namespace tessera::cpu {

namespace {

constexpr int32_t kVariantDnnl = 1;

constexpr int64_t kRowsPerTile = 4;  // weight rows sharing each load of x
constexpr int64_t kBlockM = 64;      // x rows kept hot in cache while a thread walks its W rows

inline int8_t quantize_one(float v, float inv) {
  const long q = std::lrintf(v * inv);
  return static_cast<int8_t>(std::clamp(q, -127L, 127L));
}

// x row -> int8 with scale absmax/127. Both versions compute the same products and round the same
// way (nearest even, like lrintf), so they produce identical bytes.
float quantize_row_generic(const float* x, int64_t k, int8_t* q) {
  float amax = 0;
  for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(x[c]));
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  for (int64_t c = 0; c < k; ++c) q[c] = quantize_one(x[c], inv);
  return amax / 127.0f;
}

__attribute__((target("avx2,fma"))) float quantize_row_avx2(const float* x, int64_t k, int8_t* q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(abs_mask, _mm256_loadu_ps(x + c)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  float amax = _mm_cvtss_f32(m4);
  for (; c < k; ++c) amax = std::max(amax, std::fabs(x[c]));
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  const __m256 vinv = _mm256_set1_ps(inv);
  // packs interleaves 128-bit lanes; this puts the 4-byte groups back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  c = 0;
  for (; c + 32 <= k; c += 32) {
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c), vinv));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c + 8), vinv));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c + 16), vinv));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c + 24), vinv));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + c), _mm256_permutevar8x32_epi32(p, order));
  }
  for (; c < k; ++c) q[c] = quantize_one(x[c], inv);
  return amax / 127.0f;
}

__attribute__((target("avx2,fma"))) inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// 32 products x·w summed in pairs into 8 int32. vpmaddubsw wants one unsigned operand, so it gets
// |x| and w carries the sign of x; with |x|, |w| <= 127 a pair is at most 2·127·127 = 32258 and the
// int16 step cannot saturate (an x+128 offset would reach 2·255·127 and could).
__attribute__((target("avx2,fma"))) inline __m256i dot32(__m256i ax, __m256i xs, __m256i w, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, xs)), ones);
}

// acc[r][i] = int32 dot of x rows x0 (and x1 when two) with the four W rows.
template <int kX>
__attribute__((target("avx2,fma"))) void dot4_avx2(const int8_t* const* xr, const int8_t* const* wr,
                                                   int64_t k, int32_t (*acc)[2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a[4][kX];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
#pragma GCC unroll 2
    for (int i = 0; i < kX; ++i) a[r][i] = _mm256_setzero_si256();
  }
  const int64_t k32 = k & ~int64_t(31);
  for (int64_t c = 0; c < k32; c += 32) {
    __m256i xs[kX], ax[kX];
#pragma GCC unroll 2
    for (int i = 0; i < kX; ++i) {
      xs[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[i] + c));
      ax[i] = _mm256_abs_epi8(xs[i]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + c));
#pragma GCC unroll 2
      for (int i = 0; i < kX; ++i) a[r][i] = _mm256_add_epi32(a[r][i], dot32(ax[i], xs[i], w, ones));
    }
  }
  const int64_t tail = k - k32;
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    const int8_t* rest = wr[r] + k32;
#pragma GCC unroll 2
    for (int i = 0; i < kX; ++i) {
      int32_t s = hsum_i32(a[r][i]);
      for (int64_t t = 0; t < tail; ++t) s += int32_t(xr[i][k32 + t]) * int32_t(rest[t]);
      acc[r][i] = s;
    }
  }
}

void dot4_generic(const int8_t* const* xr, const int8_t* const* wr, int64_t k, int32_t (*acc)[2]) {
  for (int r = 0; r < 4; ++r) {
    int32_t s = 0;
    for (int64_t t = 0; t < k; ++t) s += int32_t(xr[0][t]) * int32_t(wr[r][t]);
    acc[r][0] = s;
  }
}

// y rows [i0, i1) x row-major W rows [j0, j1), with x already quantized.
void gemm_rows(const int8_t* xq, const float* sx, int64_t i0, int64_t i1, const WeightView& w,
               int64_t j0, int64_t j1, float* y, bool avx2) {
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  const auto* wq = static_cast<const int8_t*>(w.data);
  for (int64_t ib = i0; ib < i1; ib += kBlockM) {
    const int64_t ie = std::min(i1, ib + kBlockM);
    for (int64_t j = j0; j < j1; j += kRowsPerTile) {
      const int64_t rows = std::min(kRowsPerTile, j1 - j);
      const int8_t* wr[kRowsPerTile];
      // A short tile repeats its last row; the extra results are not stored.
      for (int64_t r = 0; r < kRowsPerTile; ++r) wr[r] = wq + (j + std::min(r, rows - 1)) * k;
      int64_t i = ib;
      int32_t acc[kRowsPerTile][2];
      if (avx2) {
        for (; i + 2 <= ie; i += 2) {
          const int8_t* xr[2] = {xq + i * k, xq + (i + 1) * k};
          dot4_avx2<2>(xr, wr, k, acc);
          for (int64_t r = 0; r < rows; ++r) {
            y[i * n + j + r] = float(acc[r][0]) * (sx[i] * w.scales[j + r]);
            y[(i + 1) * n + j + r] = float(acc[r][1]) * (sx[i + 1] * w.scales[j + r]);
          }
        }
      }
      for (; i < ie; ++i) {
        const int8_t* xr[1] = {xq + i * k};
        if (avx2) {
          dot4_avx2<1>(xr, wr, k, acc);
        } else {
          dot4_generic(xr, wr, k, acc);
        }
        for (int64_t r = 0; r < rows; ++r) y[i * n + j + r] = float(acc[r][0]) * (sx[i] * w.scales[j + r]);
      }
    }
  }
}

void quantize_rows(const float* x, int64_t i0, int64_t i1, int64_t k, int8_t* xq, float* sx, bool avx2) {
  for (int64_t i = i0; i < i1; ++i) {
    sx[i] = avx2 ? quantize_row_avx2(x + i * k, k, xq + i * k) : quantize_row_generic(x + i * k, k, xq + i * k);
  }
}

#ifdef TESSERA_HAVE_DNNL
// oneDNN does only the int32 products; quantizing x and the rescale stay ours, so this variant
// gives the same numbers as the others. One primitive per weight shape, with M given at run time
// (prefill chunks vary), shared by all threads.
struct DnnlMatmuls {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<std::pair<int64_t, int64_t>, dnnl::matmul> by_shape;  // (n, k)
};

DnnlMatmuls& dnnl_matmuls() {
  static DnnlMatmuls* m = new DnnlMatmuls();  // never destroyed: no teardown order at unload
  return *m;
}

void gemm_i8_dnnl(const int8_t* xq, const float* sx, int64_t m, const WeightView& w, float* y,
                  std::vector<int32_t>& acc) {
  using dnnl::memory;
  DnnlMatmuls& d = dnnl_matmuls();
  const int64_t k = w.cols, n = w.rows;
  const memory::desc src_any({DNNL_RUNTIME_DIM_VAL, k}, memory::data_type::s8, memory::format_tag::ab);
  const memory::desc wei_md({k, n}, memory::data_type::s8, memory::format_tag::ba);  // W[n][k] as [k][n]
  const memory::desc dst_any({DNNL_RUNTIME_DIM_VAL, n}, memory::data_type::s32, memory::format_tag::ab);
  dnnl::matmul prim;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    auto it = d.by_shape.find({n, k});
    if (it == d.by_shape.end()) {
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_any, wei_md, dst_any), d.engine);
      it = d.by_shape.emplace(std::make_pair(n, k), dnnl::matmul(pd)).first;
    }
    prim = it->second;
  }
  acc.resize(size_t(m * n));
  const memory src({{m, k}, memory::data_type::s8, memory::format_tag::ab}, d.engine, const_cast<int8_t*>(xq));
  const memory wei(wei_md, d.engine, const_cast<void*>(w.data));
  const memory dst({{m, n}, memory::data_type::s32, memory::format_tag::ab}, d.engine, acc.data());
  dnnl::stream stream(d.engine);
  prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
  stream.wait();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) y[i * n + j] = float(acc[size_t(i * n + j)]) * (sx[i] * w.scales[j]);
  }
}
#endif

}  // namespace

namespace {

// Prefill on AMX where the CPU has it (kernel auto only: avx2 and vnni name their instructions).
bool uses_amx(int32_t variant, int64_t m, const WeightView& w) {
  return (variant & ~kKernelFlags) == kKernelAuto && m > 1 && w.cols % 64 == 0 && amx_int8_usable();
}

}  // namespace

void prepare_weight_i8(WeightView& w) {
  // Only the AVX2 and VNNI kernels read panels (the scalar code reads rows); a view is packed once.
  // VNNI reads the offset layout, unless AMX may run the prefill (its tiles read signed panels).
  if (simd_kernel(w.kernel_variant) && has_avx2()) {
    const bool amx_may_run = (w.kernel_variant & ~kKernelFlags) == kKernelAuto && amx_int8_usable();
    prepare_weight_i8_panels(w, vnni_for(w.kernel_variant, "i8") && !amx_may_run);
  }
}

namespace {

// gemm_i8 into `out`: dense, or (gemm_i8_parts) parts of whole panels, which only the panel
// kernels write.
void gemm_i8_into(const float* x, int64_t m, const WeightView& w, const PanelOut& out) {
  const int32_t variant = w.kernel_variant & ~kKernelFlags;
#ifndef TESSERA_HAVE_DNNL
  if (variant == kVariantDnnl) {
    throw Error("cpu gemm on i8: kernel dnnl: this build has no oneDNN (install libdnnl-dev and configure "
                "with -DTESSERA_DNNL=ON)");
  }
#endif
  if (variant == kVariantDnnl && !has_avx512_vnni()) {
    // Without VNNI oneDNN's s8 matmul multiplies in vpmaddubsw, whose int16 sums saturate.
    throw Error("cpu gemm on i8: kernel dnnl needs AVX-512 VNNI, which this CPU lacks (or TESSERA_CPU_ISA=avx2 "
                "hides): without it oneDNN's int8 products saturate; use kernel auto or avx2");
  }
  if (!simd_kernel(variant) && variant != kVariantDnnl && variant != kKernelReference) {
    throw Error("cpu gemm on i8: unknown kernel variant " + std::to_string(variant) +
                " (0 = auto, 1 = oneDNN, 2 = scalar reference, 3 = avx2, 4 = vnni)");
  }
  const bool vnni = vnni_for(variant, "i8");
  const bool amx = uses_amx(variant, m, w);
  float* const y = out.dense();  // the AMX, oneDNN and row-major paths (never with parts)
  const bool avx2 = variant != kKernelReference && has_avx2();
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  if (m <= 0 || n <= 0) return;
  // Each thread's scratch: x quantized, and for the panels its |x| and x quads packed per 6-row block.
  struct Scratch {
    std::vector<int8_t> xq;
    std::vector<float> sx;
    std::vector<int32_t> xp;
    std::vector<int32_t> x_offset;
  };
  thread_local Scratch mine;
  const int64_t panel_rows = avx2 ? i8_panel_rows(w) : 0;
  const bool offset = (w.kernel_variant & kI8OffsetPanels) != 0;
  const int64_t panels = panel_rows / 16;
  const int64_t blocks = x_quad_blocks(m);
  auto size_scratch = [&](Scratch& s) {
    s.xq.resize(size_t(m * k));
    s.sx.resize(size_t(m));
    if (panel_rows > 0) {
      s.xp.resize(size_t(blocks * 6 * (k / 2)));
      s.x_offset.resize(size_t(m));
    }
  };
  size_scratch(mine);
#ifdef TESSERA_HAVE_DNNL
  if (variant == kVariantDnnl) {
    thread_local std::vector<int32_t> acc;
    quantize_rows(x, 0, m, k, mine.xq.data(), mine.sx.data(), avx2);
    gemm_i8_dnnl(mine.xq.data(), mine.sx.data(), m, w, y, acc);
    return;
  }
#endif

  // Work units: the packed panels, then the row-major tiles after them. Decode claims half of what
  // is left of a band at a time (not an eighth), in whole groups of kI8DecodeClaimPanels: a
  // thread's claims follow one another in memory, so its stream runs on. A thief takes one panel,
  // so that the threads finish at most a panel apart (with units of four panels, in the fast
  // minutes, neither thread worked in 4.8-5.3% of the GEMV regions' time; 3.7-4.6% with single
  // panels: scripts/omp_regions.sh around BM_DecodeRoofline/1).
  const int64_t row_tiles = (n - panel_rows + kRowsPerTile - 1) / kRowsPerTile;
  auto run_units = [&](const Scratch& s, UnitRange r) {
    if (r.begin < panels && amx) gemm_i8_amx(s.xq.data(), s.sx.data(), m, w, r.begin, std::min(r.end, panels), y);
    if (r.begin < panels && !amx) {
      gemm_i8_panels(s.xp.data(), s.x_offset.data(), s.xq.data(), s.sx.data(), m, w, r.begin, std::min(r.end, panels),
                     out, vnni);
    }
    if (r.end > panels) {
      const int64_t j0 = panel_rows + (std::max(r.begin, panels) - panels) * kRowsPerTile;
      gemm_rows(s.xq.data(), s.sx.data(), 0, m, w, j0,
                std::min(n, panel_rows + (r.end - panels) * kRowsPerTile), y, avx2);
    }
  };
  auto quantize = [&](Scratch& s, int64_t b0, int64_t b1) {
    quantize_rows(x, std::min(m, b0 * 6), std::min(m, b1 * 6), k, s.xq.data(), s.sx.data(), avx2);
    if (panel_rows > 0 && !amx) pack_x_quads(s.xq.data(), m, k, b0, b1, offset, s.xp.data(), s.x_offset.data());
  };

  if ((m * n * k < kParallelWork && n * k < kParallelStreamBytes) || team_max_threads() == 1) {
    quantize(mine, 0, blocks);
    if (panel_rows > 0 && amx) gemm_i8_amx(mine.xq.data(), mine.sx.data(), m, w, 0, panels, y);
    if (panel_rows > 0 && !amx) {
      gemm_i8_panels(mine.xp.data(), mine.x_offset.data(), mine.xq.data(), mine.sx.data(), m, w, 0, panels, out, vnni);
    }
    gemm_rows(mine.xq.data(), mine.sx.data(), 0, m, w, panel_rows, n, y, avx2);
    return;
  }
  StealingBands units(panels + row_tiles, team_max_threads(), m == 1 ? 2 : StealingBands::kClaimDivisor,
                      m == 1 ? kI8DecodeClaimPanels : 1);
  Scratch* caller = &mine;
  team_run([&](int t, int) {
    // Decode: the first lines of the thread's band are requested before it quantizes x, so that
    // their memory latency passes meanwhile and its stream starts ahead (int8 110m decode +4.5% in
    // the ~33 GB/s minutes, +1% in the fast ones: BM_DecodeRoofline/1, 14 + 14 runs alternated in
    // one process; 2 KiB was no better).
    const int64_t first = units.first_unit(t);
    if (m == 1 && first < panels) prefetch_lines(static_cast<const int8_t*>(w.data) + first * 16 * k, kStreamStartBytes);
    const Scratch& s = team_quantized_x(*caller, mine, m, blocks, size_scratch, quantize);  // slices: 6-row blocks
    for (UnitRange r; !(r = units.next(t)).empty();) run_units(s, r);
  });
}

}  // namespace

void gemm_i8(const float* x, int64_t m, const WeightView& w, float* y) { gemm_i8_into(x, m, w, PanelOut(y, w.rows)); }

bool gemm_i8_parts(const float* x, int64_t m, const WeightView& w, const OutputPart* parts, size_t n_parts) {
  const int32_t variant = w.kernel_variant & ~kKernelFlags;
  if (w.dtype != DType::I8 || m < 2 || i8_panel_rows(w) != w.rows || !simd_kernel(variant) ||
      uses_amx(variant, m, w) || !PanelOut::splits(w.rows, parts, n_parts)) {
    return false;
  }
  gemm_i8_into(x, m, w, PanelOut(parts, n_parts));
  return true;
}

}  // namespace tessera::cpu
