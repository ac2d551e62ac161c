// Group-wise int4 GEMM: weights stay packed (two per byte) and are unpacked in registers; never
// expanded to a float copy of the matrix.
//
// AVX2 path (groups that are a multiple of 32): each activation row is quantized once per call to
// int8 in blocks of 32 (scale amax/127, as llama.cpp's Q8_0 activations), so a block of 32 weights
// costs one maddubs (unsigned nibble × signed int8) per weight row. The zero point is folded out of
// the inner loop:  Σ x·(q − z)·s  =  s·(Σ x·q − z·Σ x)  per group, with Σ x taken from the
// quantized activations so that the result is exactly the dot of the two dequantized vectors.
// A tile of four weight rows shares every activation load, and decode runs two tiles per pass over
// weights packed in 8-row bands (prepare_weight_i4): one sequential stream, at memory speed.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels_cpu.h"
#include "stealing_bands_cpu.h"
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
constexpr int64_t kRowsPerBand = 8;       // rows packed together: decode's two tiles in one stream
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

// One tile's nibbles and per-group scales (and zeros): four row-major rows (any tile, a short one
// repeating its last row), or four rows of a packed band (kPacked: pointers to the tile's first
// bytes and scales inside the band, which interleaves `band` rows per block and per group).
template <bool kPacked>
struct Tile {
  const uint8_t* w[kRowsPerTile];
  const float* s[kRowsPerTile];
  const float* z[kRowsPerTile];  // null: symmetric, zero point 8
  int64_t band = kRowsPerTile;
  // Block b of rows 0|1 (pair 0) or 2|3 (pair 1): [row 2p's 16 bytes | row 2p+1's 16 bytes].
  __attribute__((target("avx2,fma"))) __m256i pair(int64_t b, int p) const {
    if constexpr (kPacked) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[0] + b * (band * kBlock / 2) + p * kBlock));
    } else {
      return _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w[2 * p + 1] + b * (kBlock / 2)),
                                 reinterpret_cast<const __m128i*>(w[2 * p] + b * (kBlock / 2)));
    }
  }
  // Group gi's scales (zeros) of the four rows.
  __attribute__((target("avx2,fma"))) __m128 scales(int64_t gi) const {
    return kPacked ? _mm_loadu_ps(s[0] + gi * band) : _mm_setr_ps(s[0][gi], s[1][gi], s[2][gi], s[3][gi]);
  }
  __attribute__((target("avx2,fma"))) __m128 zeros(int64_t gi) const {
    if (z[0] == nullptr) return _mm_set1_ps(8.0f);
    return kPacked ? _mm_loadu_ps(z[0] + gi * band) : _mm_setr_ps(z[0][gi], z[1][gi], z[2][gi], z[3][gi]);
  }
};

// Σ over groups of s·z·Σx for the four rows of a tile (what the zero points add to x·q·s), side by
// side. Each product is rounded, then added into one of four sums by group index mod 4 (four
// independent chains: one chain of 24 dependent adds per tile was a sixth of a decode's time),
// and the sums are added as (0 + 1) + (2 + 3).
template <bool kPacked>
__attribute__((target("avx2,fma"))) inline __m128 zero_point_terms(const Tile<kPacked>& tl, const float* gs,
                                                                   int64_t groups) {
  __m128 sum[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
  for (int64_t gi = 0; gi < groups; ++gi) {
    __m128 p = _mm_mul_ps(_mm_mul_ps(tl.scales(gi), tl.zeros(gi)), _mm_set1_ps(gs[gi]));
    asm("" : "+x"(p));  // rounded, never fused into the add
    sum[gi & 3] = _mm_add_ps(sum[gi & 3], p);
  }
  return _mm_add_ps(_mm_add_ps(sum[0], sum[1]), _mm_add_ps(sum[2], sum[3]));
}

// The same for the two tiles of a packed band at once (lanes 0-3 the first, 4-7 the second; each
// lane's arithmetic is the four-row version's, so the bits agree).
__attribute__((target("avx2,fma"))) inline __m256 zero_point_terms_band(const Tile<true>& first, const float* gs,
                                                                        int64_t groups) {
  __m256 sum[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t gi = 0; gi < groups; ++gi) {
    const __m256 s = _mm256_loadu_ps(first.s[0] + gi * first.band);
    const __m256 z = first.z[0] != nullptr ? _mm256_loadu_ps(first.z[0] + gi * first.band) : _mm256_set1_ps(8.0f);
    __m256 p = _mm256_mul_ps(_mm256_mul_ps(s, z), _mm256_set1_ps(gs[gi]));
    asm("" : "+x"(p));
    sum[gi & 3] = _mm256_add_ps(sum[gi & 3], p);
  }
  return _mm256_add_ps(_mm256_add_ps(sum[0], sum[1]), _mm256_add_ps(sum[2], sum[3]));
}

// A pair of rows' block split into its low nibbles (even elements) and high nibbles (odd ones).
struct Nibbles {
  __m256i lo, hi;
};

__attribute__((target("avx2,fma"))) inline Nibbles split(__m256i b) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  return {_mm256_and_si256(b, mask), _mm256_and_si256(_mm256_srli_epi16(b, 4), mask)};
}

// Σ nibble·x over one block for a pair of rows: lanes 0-3 row 2p, lanes 4-7 row 2p+1. The even and
// odd products are added as int16 (|each| ≤ 2·15·128, the sum fits) before one widening madd.
__attribute__((target("avx2,fma"))) inline __m256 pair_dot(Nibbles n, __m256i xe, __m256i xo) {
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(n.lo, xe), _mm256_maddubs_epi16(n.hi, xo));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

// One row of quantized x against kTiles consecutive tiles: y[t·4 + r] for r < rows (the last
// tile's). Nibbles come from `nib` (kReuse, one tile: unpacked once for all rows of x, 4 vectors per
// block: rows 0|1 low, high, rows 2|3 low, high) or straight from the tiles, with a prefetch ahead
// of the stream when packed. Decode runs two tiles per pass so that x's loads are shared. Each row
// sees the same arithmetic in the same order whichever way, so its result does not depend on m
// (decode, prefill and verification agree to the bit).
template <bool kPacked, bool kReuse, int kTiles>
__attribute__((target("avx2,fma"))) void tile_row(const int8_t* xr, const float* xd, const float* gsum,
                                                  const Tile<kPacked>* tl, const uint8_t* nib, int64_t k, int64_t g,
                                                  int64_t rows, float* y) {
  static_assert(!kReuse || kTiles == 1, "a reused unpacked tile is one tile");
  const int64_t groups = k / g;
  const int64_t blocks = k / kBlock;
  // One flat loop over blocks, the group's scales loaded with each block: a loop over groups around
  // one over blocks cost as many instructions as the block's arithmetic at g = 32.
  const int64_t blocks_per_group = g / kBlock;
  const __m256i sel01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i sel23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  __m256 a01[kTiles], a23[kTiles];
  for (int t = 0; t < kTiles; ++t) a01[t] = a23[t] = _mm256_setzero_ps();
  for (int64_t b = 0, gi = 0, in_group = 0; b < blocks; ++b) {
    if (in_group == blocks_per_group) {
      in_group = 0;
      ++gi;
    }
    ++in_group;
    const __m256i xe = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + b * kBlock)));
    const __m256i xo =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xr + b * kBlock + 16)));
    const __m256 dx = _mm256_set1_ps(xd[b]);
    // [s_r·dx] for each row pair, rows 2p and 2p+1 four lanes each. Two tiles of a band (decode)
    // have their eight scales side by side: one load, one multiply, a permute per pair.
    __m256 sd01[kTiles], sd23[kTiles];
    if constexpr (kPacked && kTiles == 2) {
      const __m256 sd8 = _mm256_mul_ps(_mm256_loadu_ps(tl[0].s[0] + gi * tl[0].band), dx);
      for (int t = 0; t < 2; ++t) {
        sd01[t] = _mm256_permutevar8x32_ps(sd8, _mm256_setr_epi32(4 * t, 4 * t, 4 * t, 4 * t, 4 * t + 1, 4 * t + 1,
                                                                  4 * t + 1, 4 * t + 1));
        sd23[t] = _mm256_permutevar8x32_ps(sd8, _mm256_setr_epi32(4 * t + 2, 4 * t + 2, 4 * t + 2, 4 * t + 2,
                                                                  4 * t + 3, 4 * t + 3, 4 * t + 3, 4 * t + 3));
      }
    } else {
      for (int t = 0; t < kTiles; ++t) {
        const __m128 s4 = tl[t].scales(gi);
        const __m256 sd = _mm256_mul_ps(_mm256_set_m128(s4, s4), dx);  // [s_r·dx] in both lanes
        sd01[t] = _mm256_permutevar_ps(sd, sel01);
        sd23[t] = _mm256_permutevar_ps(sd, sel23);
      }
    }
#pragma GCC unroll 2
    for (int t = 0; t < kTiles; ++t) {
      Nibbles n01, n23;
      if constexpr (kReuse) {
        const auto* v = reinterpret_cast<const __m256i*>(nib) + 4 * b;
        n01 = {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
        n23 = {_mm256_loadu_si256(v + 2), _mm256_loadu_si256(v + 3)};
      } else {
        if constexpr (kPacked) {
          _mm_prefetch(reinterpret_cast<const char*>(tl[t].w[0] + b * (tl[t].band * kBlock / 2)) + kPrefetchBytes,
                       _MM_HINT_T0);
        }
        n01 = split(tl[t].pair(b, 0));
        n23 = split(tl[t].pair(b, 1));
      }
      a01[t] = _mm256_fmadd_ps(pair_dot(n01, xe, xo), sd01[t], a01[t]);
      a23[t] = _mm256_fmadd_ps(pair_dot(n23, xe, xo), sd23[t], a23[t]);
    }
  }
  float c[kTiles * kRowsPerTile];
  if constexpr (kPacked && kTiles == 2) {
    _mm256_storeu_ps(c, zero_point_terms_band(tl[0], gsum, groups));
  } else {
    for (int t = 0; t < kTiles; ++t) _mm_storeu_ps(c + 4 * t, zero_point_terms(tl[t], gsum, groups));
  }
  for (int t = 0; t < kTiles; ++t) {
    // Each row's four lanes summed: hadd twice gives [r0 r2 r0 r2 | r1 r3 r1 r3].
    const __m256 h = _mm256_hadd_ps(a01[t], a23[t]);
    float part[8];
    _mm256_storeu_ps(part, _mm256_hadd_ps(h, h));
    const float out[kRowsPerTile] = {part[0], part[4], part[1], part[5]};
    const int64_t n = t == kTiles - 1 ? rows : kRowsPerTile;
    for (int64_t r = 0; r < n; ++r) y[t * kRowsPerTile + r] = out[r] - c[t * kRowsPerTile + r];
  }
}

// One tile against all m quantized rows of x (y at the tile's column). For m > 1 the tile is
// unpacked once into `scratch` (128 bytes per block of 32 columns, L1-resident) and reused by
// every row.
template <bool kPacked>
__attribute__((target("avx2,fma"))) void run_tile(const QuantizedX& xq, int64_t m, const Tile<kPacked>& tl,
                                                  int64_t rows, int64_t k, int64_t g, float* y, int64_t n,
                                                  std::vector<uint8_t>& scratch) {
  const int64_t blocks = k / kBlock;
  const int64_t groups = k / g;
  if (m == 1) return tile_row<kPacked, false, 1>(xq.q.data(), xq.d.data(), xq.gsum.data(), &tl, nullptr, k, g, rows, y);
  scratch.resize(size_t(blocks * 4 * sizeof(__m256i)));
  auto* v = reinterpret_cast<__m256i*>(scratch.data());
  for (int64_t b = 0; b < blocks; ++b, v += 4) {
    const Nibbles n01 = split(tl.pair(b, 0)), n23 = split(tl.pair(b, 1));
    _mm256_storeu_si256(v, n01.lo);
    _mm256_storeu_si256(v + 1, n01.hi);
    _mm256_storeu_si256(v + 2, n23.lo);
    _mm256_storeu_si256(v + 3, n23.hi);
  }
  for (int64_t i = 0; i < m; ++i) {
    tile_row<kPacked, true, 1>(xq.q.data() + i * k, xq.d.data() + i * blocks, xq.gsum.data() + i * groups, &tl,
                            scratch.data(), k, g, rows, y + i * n);
  }
}

// Rows [j0, j1) of W (j0 a multiple of kRowsPerBand) against all m quantized rows of x. Packed
// weights: bands of 8 rows, then one of 4 if that many remain, then row-major rows.
void gemm_i4_avx2(const QuantizedX& xq, int64_t m, const WeightView& w, float* y, int64_t j0, int64_t j1,
                  std::vector<uint8_t>& scratch) {
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  const int64_t g = w.group_size;
  const int64_t groups = k / g;
  const auto* packed = static_cast<const uint8_t*>(w.data);
  const int64_t row_bytes = k / 2;
  const bool packed_tiles = (w.kernel_variant & kPackedTiles) != 0;
  const int64_t bands_end = packed_tiles ? n / kRowsPerBand * kRowsPerBand : 0;
  const int64_t packed_end = packed_tiles ? n / kRowsPerTile * kRowsPerTile : 0;
  // Tile `sub` of the band starting at row j.
  // Only element 0 of a packed tile's pointers is read; the rest stay unset (zeroing the arrays,
  // a rep stos per tile, cost a few percent of a decode).
  auto band_tile = [&](int64_t j, int64_t band, int64_t sub) {
    auto params = [&](const float* p) { return p != nullptr ? p + j * groups + sub * kRowsPerTile : nullptr; };
    Tile<true> t;
    t.w[0] = packed + j * row_bytes + sub * kRowsPerTile * (kBlock / 2);
    t.s[0] = params(w.scales);
    t.z[0] = params(w.zeros);
    t.band = band;
    return t;
  };
  for (int64_t j = j0; j < j1;) {
    if (j < bands_end) {
      const Tile<true> pair[2] = {band_tile(j, kRowsPerBand, 0), band_tile(j, kRowsPerBand, 1)};
      if (m == 1) {
        tile_row<true, false, 2>(xq.q.data(), xq.d.data(), xq.gsum.data(), pair, nullptr, k, g, kRowsPerTile, y + j);
      } else {
        run_tile(xq, m, pair[0], kRowsPerTile, k, g, y + j, n, scratch);
        run_tile(xq, m, pair[1], kRowsPerTile, k, g, y + j + kRowsPerTile, n, scratch);
      }
      j += kRowsPerBand;
      continue;
    }
    if (j < packed_end) {
      run_tile(xq, m, band_tile(j, kRowsPerTile, 0), kRowsPerTile, k, g, y + j, n, scratch);
      j += kRowsPerTile;
      continue;
    }
    const int64_t rows = std::min(kRowsPerTile, j1 - j);
    Tile<false> tl{};
    for (int64_t r = 0; r < kRowsPerTile; ++r) {
      const int64_t jr = j + std::min(r, rows - 1);
      tl.w[r] = packed + jr * row_bytes;
      tl.s[r] = w.scales + jr * groups;
      tl.z[r] = w.zeros != nullptr ? w.zeros + jr * groups : nullptr;
    }
    run_tile(xq, m, tl, rows, k, g, y + j, n, scratch);
    j += rows;
  }
}

// Splits output rows [0, n) into bands across an OpenMP team when the work is large enough, or
// (decode) when the weights streamed are: one core reaches about half of the memory bandwidth.
template <class F>
void for_row_ranges(int64_t m, const WeightView& w, F run) {
  const int64_t n = w.rows, k = w.cols;
  const int64_t bands = (n + kRowsPerBand - 1) / kRowsPerBand;
  const int64_t groups = k / w.group_size;
  const int64_t bytes = n * (k / 2) + n * groups * int64_t(sizeof(float)) * (w.zeros != nullptr ? 2 : 1);
  if ((m * n * k < kParallelWork && bytes < kParallelStreamBytes) || omp_get_max_threads() == 1 || bands == 1) {
    run(int64_t(0), n);
    return;
  }
  for_units(bands, [&](int64_t b0, int64_t b1) { run(b0 * kRowsPerBand, std::min(n, b1 * kRowsPerBand)); });
}

bool avx2_applies(const WeightView& w) {
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  return has_avx2() && g > 0 && g % kBlock == 0 && k % g == 0;
}

}  // namespace

void prepare_weight_i4(WeightView& w) {
  // Only the default variant's AVX2 kernel reads packed bands (the scalar code reads rows); a view
  // is packed once. A band of R rows (8, or 4 for the last whole tile) stores each block of 32
  // columns as R rows' 16 bytes side by side, and each group's R scales (zeros) side by side: the
  // kernel then reads one sequential stream of weights and one of scales.
  WeightView v = w;
  if (v.group_size <= 0) v.group_size = v.cols;  // one group per row, as gemm_i4 reads it
  if (w.kernel_variant != kVariantDefault || !avx2_applies(v)) return;
  const int64_t k = w.cols;
  const int64_t row_bytes = k / 2;
  const int64_t blocks = k / kBlock;
  const int64_t groups = k / v.group_size;
  constexpr int64_t kChunk = kBlock / 2;  // one row's bytes of a block
  auto* data = static_cast<uint8_t*>(const_cast<void*>(w.data));
  std::vector<uint8_t> rows(size_t(kRowsPerBand * row_bytes));
  std::vector<float> params(size_t(kRowsPerBand * groups));
  // Per-group floats of a band from [row][group] to [group][row].
  auto transpose = [&](float* band, int64_t r_count) {
    std::copy(band, band + r_count * groups, params.begin());
    for (int64_t r = 0; r < r_count; ++r) {
      for (int64_t gi = 0; gi < groups; ++gi) band[gi * r_count + r] = params[size_t(r * groups + gi)];
    }
  };
  for (int64_t j = 0; j + kRowsPerTile <= w.rows;) {
    const int64_t r_count = j + kRowsPerBand <= w.rows ? kRowsPerBand : kRowsPerTile;
    uint8_t* band = data + j * row_bytes;
    std::copy(band, band + r_count * row_bytes, rows.begin());
    for (int64_t r = 0; r < r_count; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* src = rows.data() + r * row_bytes + b * kChunk;
        std::copy(src, src + kChunk, band + (b * r_count + r) * kChunk);
      }
    }
    transpose(const_cast<float*>(w.scales) + j * groups, r_count);
    if (w.zeros != nullptr) transpose(const_cast<float*>(w.zeros) + j * groups, r_count);
    j += r_count;
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
