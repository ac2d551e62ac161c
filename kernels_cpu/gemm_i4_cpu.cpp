// Group-wise int4 GEMM: weights stay packed (two per byte) and are unpacked in registers; never
// expanded to a float copy of the matrix.
//
// AVX2 path (groups that are a multiple of 32): each activation row is quantized once per call to
// int8 in blocks of 32 (scale amax/127, as llama.cpp's Q8_0 activations), so a block of 32 weights
// costs one maddubs (unsigned nibble × signed int8) per weight row. The zero point is folded out of
// the inner loop:  Σ x·(q − z)·s  =  s·(Σ x·q − z·Σ x)  per group, with Σ x taken from the
// quantized activations so that the result is exactly the dot of the two dequantized vectors.
// Four weight rows share every activation load.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

namespace {

// WeightView::kernel_variant for I4 on the CPU: 0 the default (AVX2 when the CPU has it and groups
// are whole blocks of 32, otherwise the scalar code), 2 the scalar reference; plus the flag bit
// prepare_weight_i4 sets.
constexpr int32_t kVariantDefault = 0;
constexpr int32_t kVariantReference = 2;
constexpr int32_t kPackedTiles = 1 << 8;

constexpr int64_t kBlock = 32;            // activation quantization block (elements)
constexpr int64_t kRowsPerTile = 4;       // weight rows sharing one pass over x
constexpr int64_t kPrefetchBytes = 2048;  // how far ahead of a packed stream to prefetch

// Reference: float arithmetic, any group size; used without AVX2.
void gemm_i4_scalar(const float* x, int64_t m, const WeightView& w, float* y, int64_t j0, int64_t j1) {
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  const int64_t groups = k / g;
  const auto* packed = static_cast<const uint8_t*>(w.data);
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    for (int64_t j = j0; j < j1; ++j) {
      const uint8_t* wr = packed + j * (k / 2);
      float acc = 0;
      for (int64_t gi = 0; gi < groups; ++gi) {
        const float scale = w.scales[j * groups + gi];
        const float zero = w.zeros != nullptr ? w.zeros[j * groups + gi] : 8.0f;
        float part = 0;
        for (int64_t c = gi * g; c < (gi + 1) * g; ++c) {
          const int q = (c & 1) ? (wr[c / 2] >> 4) : (wr[c / 2] & 0x0f);
          part += xr[c] * (float(q) - zero);
        }
        acc += part * scale;
      }
      y[i * w.rows + j] = acc;
    }
  }
}

// x quantized for the AVX2 kernel. Within each block of 32 the int8 values are stored de-interleaved
// (the 16 even elements, then the 16 odd ones) to match the nibble order: the low nibbles of 16
// packed bytes are the even elements, the high nibbles the odd ones, so no shuffle of the weights.
struct QuantizedX {
  std::vector<int8_t> q;     // [m][k]
  std::vector<float> d;      // [m][k/32] block scales
  std::vector<float> gsum;   // [m][k/g] Σ x over each weight group (of the quantized values)
};

// max |x| over a block of 32.
__attribute__((target("avx2,fma"))) float block_amax_avx2(const float* xb) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v = _mm256_max_ps(_mm256_and_ps(abs_mask, _mm256_loadu_ps(xb)), _mm256_and_ps(abs_mask, _mm256_loadu_ps(xb + 8)));
  v = _mm256_max_ps(v, _mm256_and_ps(abs_mask, _mm256_loadu_ps(xb + 16)));
  v = _mm256_max_ps(v, _mm256_and_ps(abs_mask, _mm256_loadu_ps(xb + 24)));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// A block of 32 to int8 (x·id rounded to nearest even: cvtps under the default MXCSR, as
// nearbyint), stored de-interleaved (even elements, then odd); returns Σq.
__attribute__((target("avx2,fma"))) int quantize_block_avx2(const float* xb, float id, int8_t* qb) {
  const __m256 vid = _mm256_set1_ps(id);
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb), vid));
  const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), vid));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), vid));
  const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), vid));
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
  // packs interleaves 128-bit lanes; the dword permute restores element order, then each lane's
  // even bytes go first and the quadwords are regrouped: evens 0..30, then odds 1..31.
  __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  const __m256i even_odd = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  p = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p, even_odd), _MM_SHUFFLE(3, 1, 2, 0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), p);
  return _mm_cvtsi128_si32(s4);
}

// Only the AVX2 kernel reads quantized x. Σ x per group is accumulated here, outside the AVX2
// functions, so that d·Σq is rounded before it is added (never fused).
void quantize_x(const float* x, int64_t m, int64_t k, int64_t g, QuantizedX& out) {
  const int64_t blocks = k / kBlock;
  const int64_t groups = k / g;
  const int64_t blocks_per_group = g / kBlock;
  out.q.resize(size_t(m * k));
  out.d.resize(size_t(m * blocks));
  out.gsum.assign(size_t(m * groups), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + i * k + b * kBlock;
      const float d = block_amax_avx2(xb) / 127.0f;
      const float id = d != 0 ? 1.0f / d : 0.0f;
      const int sum = quantize_block_avx2(xb, id, out.q.data() + i * k + b * kBlock);
      out.d[size_t(i * blocks + b)] = d;
      out.gsum[size_t(i * groups + b / blocks_per_group)] += d * float(sum);
    }
  }
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// 32 packed nibbles (16 bytes) → 32 unsigned bytes: low nibbles (even elements) in the low lane,
// high nibbles (odd elements) in the high lane.
__attribute__((target("avx2,fma"))) inline __m256i unpack32(const uint8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

// Σ over 32 elements of (nibble · int8), as 8 int32 partial sums converted to float.
__attribute__((target("avx2,fma"))) inline __m256 dot32(__m256i w, __m256i xq) {
  const __m256i pairs = _mm256_maddubs_epi16(w, xq);  // ≤ 2·15·127: no saturation
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// One tile's nibbles and per-group scales (and zeros): four row-major rows (any tile, a short one
// repeating its last row), or one packed tile (kPacked: whole tiles only, pointers to its start).
template <bool kPacked>
struct Tile {
  const uint8_t* w[kRowsPerTile];
  const float* s[kRowsPerTile];
  const float* z[kRowsPerTile];  // null: symmetric, zero point 8
  const uint8_t* block(int64_t r, int64_t b) const {
    return kPacked ? w[0] + b * (kRowsPerTile * kBlock / 2) + r * (kBlock / 2) : w[r] + b * (kBlock / 2);
  }
  float scale(int64_t r, int64_t gi) const { return kPacked ? s[0][gi * kRowsPerTile + r] : s[r][gi]; }
  // Group gi's scales (zeros) of the four rows.
  __attribute__((target("avx2,fma"))) __m128 scales(int64_t gi) const {
    return kPacked ? _mm_loadu_ps(s[0] + gi * kRowsPerTile) : _mm_setr_ps(s[0][gi], s[1][gi], s[2][gi], s[3][gi]);
  }
  __attribute__((target("avx2,fma"))) __m128 zeros(int64_t gi) const {
    if (z[0] == nullptr) return _mm_set1_ps(8.0f);
    return kPacked ? _mm_loadu_ps(z[0] + gi * kRowsPerTile) : _mm_setr_ps(z[0][gi], z[1][gi], z[2][gi], z[3][gi]);
  }
};

// Σ over groups of s·z·Σx for the four rows of a tile (what the zero points add to x·q·s), side by
// side, in group order. The products of the first 4·⌊groups/4⌋ groups are rounded before they are
// added (the barrier keeps the compiler from fusing them), the rest fused: the exact arithmetic of
// the per-row loop this replaced as GCC vectorized it, so results did not change by a bit.
template <bool kPacked>
__attribute__((target("avx2,fma"))) inline __m128 zero_point_terms(const Tile<kPacked>& tl, const float* gs,
                                                                   int64_t groups) {
  const int64_t rounded = groups & ~int64_t(3);
  __m128 corr = _mm_setzero_ps();
  for (int64_t gi = 0; gi < rounded; ++gi) {
    __m128 p = _mm_mul_ps(_mm_mul_ps(tl.scales(gi), tl.zeros(gi)), _mm_set1_ps(gs[gi]));
    asm("" : "+x"(p));
    corr = _mm_add_ps(corr, p);
  }
  for (int64_t gi = rounded; gi < groups; ++gi) {
    corr = _mm_fmadd_ps(_mm_mul_ps(tl.scales(gi), tl.zeros(gi)), _mm_set1_ps(gs[gi]), corr);
  }
  return corr;
}

// m = 1 on one packed tile (decode): one sequential stream of 64-byte blocks, prefetched ahead.
// A block's rows 0|1 (and 2|3) come in one 32-byte load; their low nibbles (even elements) meet x's
// even half broadcast to both lanes, the high nibbles its odd half. So each accumulator holds half
// of two rows' lanes: e01 = [row 0 lanes 0-3 | row 1 lanes 0-3], o01 the lanes 4-7. Every lane sees
// the same int32 partial sums and the same fma(·, s·dx, acc) chain as in tile_avx2, so the result
// is bit-identical, with no cross-lane shuffle of the weights.
__attribute__((target("avx2,fma"))) void gemv_packed(const QuantizedX& xq, const Tile<true>& tl, int64_t k,
                                                     int64_t g, float* y) {
  const int64_t groups = k / g;
  const int64_t blocks_per_group = g / kBlock;
  const int8_t* xr = xq.q.data();
  const float* xd = xq.d.data();
  const uint8_t* wp = tl.w[0];
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i sel01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i sel23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  __m256 e01 = _mm256_setzero_ps(), o01 = _mm256_setzero_ps(), e23 = _mm256_setzero_ps(), o23 = _mm256_setzero_ps();
  for (int64_t gi = 0, b = 0; gi < groups; ++gi) {
    const __m256 s = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(tl.s[0] + gi * kRowsPerTile));
    for (const int64_t end = b + blocks_per_group; b < end; ++b, wp += kRowsPerTile * kBlock / 2) {
      _mm_prefetch(reinterpret_cast<const char*>(wp) + kPrefetchBytes, _MM_HINT_T0);
      const __m256i xe = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + b * kBlock)));
      const __m256i xo =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + b * kBlock + 16)));
      const __m256 sd = _mm256_mul_ps(s, _mm256_set1_ps(xd[b]));  // [s_r·dx] in both lanes
      const __m256 d01 = _mm256_permutevar_ps(sd, sel01), d23 = _mm256_permutevar_ps(sd, sel23);
      const __m256i b01 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp));
      const __m256i b23 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + kBlock));
      e01 = _mm256_fmadd_ps(dot32(_mm256_and_si256(b01, mask), xe), d01, e01);
      o01 = _mm256_fmadd_ps(dot32(_mm256_and_si256(_mm256_srli_epi16(b01, 4), mask), xo), d01, o01);
      e23 = _mm256_fmadd_ps(dot32(_mm256_and_si256(b23, mask), xe), d23, e23);
      o23 = _mm256_fmadd_ps(dot32(_mm256_and_si256(_mm256_srli_epi16(b23, 4), mask), xo), d23, o23);
    }
  }
  float c[kRowsPerTile];
  _mm_storeu_ps(c, zero_point_terms(tl, xq.gsum.data(), groups));
  y[0] = hsum(_mm256_permute2f128_ps(e01, o01, 0x20)) - c[0];
  y[1] = hsum(_mm256_permute2f128_ps(e01, o01, 0x31)) - c[1];
  y[2] = hsum(_mm256_permute2f128_ps(e23, o23, 0x20)) - c[2];
  y[3] = hsum(_mm256_permute2f128_ps(e23, o23, 0x31)) - c[3];
}

// One tile of W against all m quantized rows of x; writes y[i][0..rows) (y at the tile's column).
// For m > 1 the tile's nibbles are unpacked once into `t` (4 rows x k bytes, L1-resident) and
// reused by every row of x. Both layouts run the same arithmetic in the same order.
template <bool kPacked>
__attribute__((target("avx2,fma"))) void tile_avx2(const QuantizedX& xq, int64_t m, const Tile<kPacked>& tl,
                                                   int64_t rows, int64_t k, int64_t g, float* y, int64_t n,
                                                   __m256i* t) {
  const int64_t groups = k / g;
  const int64_t blocks = k / kBlock;
  const int64_t blocks_per_group = g / kBlock;
  const bool reuse = m > 1;
  if (reuse) {
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t r = 0; r < kRowsPerTile; ++r) _mm256_storeu_si256(t + 4 * b + r, unpack32(tl.block(r, b)));
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* xr = xq.q.data() + i * k;
    const float* xd = xq.d.data() + i * blocks;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
           a3 = _mm256_setzero_ps();
    for (int64_t gi = 0; gi < groups; ++gi) {
      const __m256 d0 = _mm256_set1_ps(tl.scale(0, gi)), d1 = _mm256_set1_ps(tl.scale(1, gi)),
                   d2 = _mm256_set1_ps(tl.scale(2, gi)), d3 = _mm256_set1_ps(tl.scale(3, gi));
      for (int64_t b = gi * blocks_per_group; b < (gi + 1) * blocks_per_group; ++b) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + b * kBlock));
        const __m256 dx = _mm256_set1_ps(xd[b]);
        __m256i u0, u1, u2, u3;
        if (reuse) {
          u0 = _mm256_loadu_si256(t + 4 * b + 0);
          u1 = _mm256_loadu_si256(t + 4 * b + 1);
          u2 = _mm256_loadu_si256(t + 4 * b + 2);
          u3 = _mm256_loadu_si256(t + 4 * b + 3);
        } else {
          u0 = unpack32(tl.block(0, b));
          u1 = unpack32(tl.block(1, b));
          u2 = unpack32(tl.block(2, b));
          u3 = unpack32(tl.block(3, b));
        }
        a0 = _mm256_fmadd_ps(dot32(u0, xv), _mm256_mul_ps(d0, dx), a0);
        a1 = _mm256_fmadd_ps(dot32(u1, xv), _mm256_mul_ps(d1, dx), a1);
        a2 = _mm256_fmadd_ps(dot32(u2, xv), _mm256_mul_ps(d2, dx), a2);
        a3 = _mm256_fmadd_ps(dot32(u3, xv), _mm256_mul_ps(d3, dx), a3);
      }
    }
    float c[kRowsPerTile];
    _mm_storeu_ps(c, zero_point_terms(tl, xq.gsum.data() + i * groups, groups));
    const float out[kRowsPerTile] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
    for (int64_t r = 0; r < rows; ++r) y[i * n + r] = out[r] - c[r];
  }
}

// Rows [j0, j1) of W (j0 a multiple of kRowsPerTile) against all m quantized rows of x.
void gemm_i4_avx2(const QuantizedX& xq, int64_t m, const WeightView& w, float* y, int64_t j0, int64_t j1,
                  std::vector<uint8_t>& scratch) {
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  const int64_t g = w.group_size;
  const int64_t groups = k / g;
  const auto* packed = static_cast<const uint8_t*>(w.data);
  const int64_t row_bytes = k / 2;
  const bool packed_tiles = (w.kernel_variant & kPackedTiles) != 0;
  if (m > 1) scratch.resize(size_t(kRowsPerTile * k));
  auto* t = reinterpret_cast<__m256i*>(scratch.data());
  for (int64_t j = j0; j < j1; j += kRowsPerTile) {
    const int64_t rows = std::min(kRowsPerTile, j1 - j);
    if (packed_tiles && rows == kRowsPerTile && j + kRowsPerTile <= n) {
      const Tile<true> tl{{packed + j * row_bytes},
                          {w.scales + j * groups},
                          {w.zeros != nullptr ? w.zeros + j * groups : nullptr}};
      if (m == 1) {
        gemv_packed(xq, tl, k, g, y + j);
      } else {
        tile_avx2(xq, m, tl, rows, k, g, y + j, n, t);
      }
      continue;
    }
    Tile<false> tl{};
    for (int64_t r = 0; r < kRowsPerTile; ++r) {
      const int64_t jr = j + std::min(r, rows - 1);
      tl.w[r] = packed + jr * row_bytes;
      tl.s[r] = w.scales + jr * groups;
      tl.z[r] = w.zeros != nullptr ? w.zeros + jr * groups : nullptr;
    }
    tile_avx2(xq, m, tl, rows, k, g, y + j, n, t);
  }
}

// Splits output rows [0, n) into tiles across an OpenMP team when the work is large enough, or
// (decode) when the weights streamed are: one core reaches about half of the memory bandwidth.
template <class F>
void for_row_ranges(int64_t m, const WeightView& w, F run) {
  const int64_t n = w.rows, k = w.cols;
  const int64_t tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  const int64_t groups = k / w.group_size;
  const int64_t bytes = n * (k / 2) + n * groups * int64_t(sizeof(float)) * (w.zeros != nullptr ? 2 : 1);
  if ((m * n * k < kParallelWork && bytes < kParallelStreamBytes) || omp_get_max_threads() == 1 || tiles == 1) {
    run(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const int nt = omp_get_num_threads();
    const int t = omp_get_thread_num();
    const int64_t per = (tiles + nt - 1) / nt;
    const int64_t j0 = std::min(n, per * t * kRowsPerTile);
    const int64_t j1 = std::min(n, per * (t + 1) * kRowsPerTile);
    if (j0 < j1) run(j0, j1);
  }
}

bool avx2_applies(const WeightView& w) {
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  return has_avx2() && g > 0 && g % kBlock == 0 && k % g == 0;
}

}  // namespace

void prepare_weight_i4(WeightView& w) {
  // Only the default variant's AVX2 kernel reads packed tiles (the scalar code reads rows); a view
  // is packed once.
  WeightView v = w;
  if (v.group_size <= 0) v.group_size = v.cols;  // one group per row, as gemm_i4 reads it
  if (w.kernel_variant != kVariantDefault || !avx2_applies(v)) return;
  const int64_t k = w.cols;
  const int64_t row_bytes = k / 2;
  const int64_t blocks = k / kBlock;
  const int64_t groups = k / v.group_size;
  constexpr int64_t kChunk = kBlock / 2;  // one row's bytes of a block
  auto* data = static_cast<uint8_t*>(const_cast<void*>(w.data));
  std::vector<uint8_t> rows(size_t(kRowsPerTile * row_bytes));
  std::vector<float> params(size_t(kRowsPerTile * groups));
  // Per-group floats of a tile from [row][group] to [group][row].
  auto transpose = [&](float* tile) {
    std::copy(tile, tile + kRowsPerTile * groups, params.begin());
    for (int64_t r = 0; r < kRowsPerTile; ++r) {
      for (int64_t gi = 0; gi < groups; ++gi) tile[gi * kRowsPerTile + r] = params[size_t(r * groups + gi)];
    }
  };
  for (int64_t j = 0; j + kRowsPerTile <= w.rows; j += kRowsPerTile) {
    uint8_t* tile = data + j * row_bytes;
    std::copy(tile, tile + kRowsPerTile * row_bytes, rows.begin());
    for (int64_t r = 0; r < kRowsPerTile; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* src = rows.data() + r * row_bytes + b * kChunk;
        std::copy(src, src + kChunk, tile + (b * kRowsPerTile + r) * kChunk);
      }
    }
    transpose(const_cast<float*>(w.scales) + j * groups);
    if (w.zeros != nullptr) transpose(const_cast<float*>(w.zeros) + j * groups);
  }
  w.kernel_variant |= kPackedTiles;
}

void gemm_i4(const float* x, int64_t m, const WeightView& view, float* y) {
  const int32_t variant = view.kernel_variant & ~kPackedTiles;
  if (variant != kVariantDefault && variant != kVariantReference) {
    throw Error("cpu gemm on i4: unknown kernel variant " + std::to_string(variant) +
                " (0 = default, 2 = scalar reference)");
  }
  WeightView w = view;
  if (w.group_size <= 0) w.group_size = w.cols;  // one group per row
  if (m <= 0 || w.rows <= 0) return;
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  if (variant == kVariantDefault && avx2_applies(w)) {
    thread_local QuantizedX xq;  // the caller's; shared read-only by the team below
    quantize_x(x, m, k, g, xq);
    const QuantizedX& shared = xq;
    for_row_ranges(m, w, [&](int64_t j0, int64_t j1) {
      thread_local std::vector<uint8_t> scratch;  // each thread's unpacked tile
      gemm_i4_avx2(shared, m, w, y, j0, j1, scratch);
    });
    return;
  }
  if ((w.kernel_variant & kPackedTiles) != 0) throw Error("cpu gemm on i4: a packed view needs the AVX2 kernel");
  for_row_ranges(m, w, [&](int64_t j0, int64_t j1) { gemm_i4_scalar(x, m, w, y, j0, j1); });
}

}  // namespace tessera::cpu
