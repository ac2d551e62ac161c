// The super-block GEMM shared by the k-quant kernels (gemm_kquant_cpu.cpp: Q4_K, Q6_K;
// gemm_kquant_more_cpu.cpp: Q2_K, Q3_K, Q5_K; gemm_iq4_cpu.cpp: IQ4_XS; gemm_iq23_cpu.cpp: IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): activations quantized to int8 per super-block of 256 with the sums
// of their 16-element pieces (KQuantX), and the walk over four-row tiles and threads; a format
// supplies kBytes and accumulate_row(block, xq, sums, dx, acc), adding one super-block of a row's dot
// to its 8 float lanes. Compiled as C++17.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels_cpu.h"
#include "stealing_bands_cpu.h"

namespace tessera::cpu::kquant {

constexpr int64_t kSuper = 256;
constexpr int64_t kPiece = 16;  // activation sums per 16 elements (Q6_K's scale granularity)
constexpr int64_t kRowsPerTile = 4;

struct KQuantX {
  std::vector<int8_t> q;      // [m][k]
  std::vector<float> d;       // [m][k / 256]
  std::vector<int16_t> sums;  // [m][k / 16]: Σ q over each 16 elements
};

__attribute__((target("avx2,fma,f16c"))) inline void quantize_x(const float* x, int64_t m, int64_t k, KQuantX& out) {
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

// Q4_K and Q5_K: the eight 6-bit scales and mins of the 12 bytes at s, as bytes (the low 8 of each
// register): entries 0-3 are the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); entries 4-7 take
// their low 4 bits from bytes 8-11 and their top 2 bits from the spare high bits of bytes 0-3
// (scales) and 4-7 (mins). Worked on four bytes at a time.
__attribute__((target("avx2,fma,f16c"))) inline void scales_mins_k4(const uint8_t* s, __m128i& sc, __m128i& mn) {
  uint32_t w[3];
  std::memcpy(w, s, 12);
  const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
  sc = _mm_setr_epi32(int(w[0] & six), int((w[2] & four) | (((w[0] >> 6) & two) << 4)), 0, 0);
  mn = _mm_setr_epi32(int(w[1] & six), int(((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4)), 0, 0);
}

// Q4_K's and Q5_K's last step for one row's super-block at blk: acc += d·dx·isum - dmin·dx·Σ_j m_j·S_j,
// each min (mn8, as scales_mins_k4 leaves them) taken twice, against the sums of the two 16-element
// halves of its sub-block.
__attribute__((target("avx2,fma,f16c"))) inline void add_k4_super_block(const uint8_t* blk, __m256i isum, __m128i mn8,
                                                                       const int16_t* sums, float dx, __m256& acc) {
  const __m128i m16 = _mm_cvtepu8_epi16(mn8);
  const __m256i mins = _mm256_setr_m128i(_mm_unpacklo_epi16(m16, m16), _mm_unpackhi_epi16(m16, m16));
  const __m256i msum = _mm256_madd_epi16(mins, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
  acc = _mm256_fmadd_ps(_mm256_set1_ps(load_fp16(blk) * dx), _mm256_cvtepi32_ps(isum), acc);
  acc = _mm256_fnmadd_ps(_mm256_set1_ps(load_fp16(blk + 2) * dx), _mm256_cvtepi32_ps(msum), acc);
}

// Prefill: from kBufferRows x rows on, a tile's super-blocks are first unpacked once per thread
// (Format::unpack, where a format has one) and every x row reads them from there: the bit and
// nibble work is done once per tile instead of once per x row, leaving each x row one vpmaddubsw,
// one vpmaddwd and one add per 32 elements. The integer lane sums are those of the format's
// accumulate and the float steps the same, so a row of a batch keeps the bits of that row alone.
constexpr int64_t kBufferRows = 4;

// One row's super-block as Format::unpack leaves it: the quants in element order (unsigned, or int8
// where the format says kSignedQuants); per 32-element chunk its pieces' scales as vpmaddubsw's 16
// sums take them (8 x the first piece's, 8 x the second's); per piece the term taken off: the min
// (kBiasShift 0: d·Σ sc·Σq·x - dmin·Σ mn·S) or the scale (kBiasShift s: d·(Σ sc·Σq·x - 2^s·Σ mn·S)).
struct Unpacked {
  uint8_t q[kSuper];
  int16_t sc[kSuper / 32][16];
  int16_t mn[kSuper / kPiece];
  float d, dmin;
};

template <class F, class = void>
struct Unpacks : std::false_type {};
template <class F>
struct Unpacks<F, std::void_t<decltype(&F::unpack)>> : std::true_type {};

// Chunk c's scale vector from the sixteen per-piece scales.
inline void spread_scales(const int16_t* piece, Unpacked& u) {
  for (int c = 0; c < int(kSuper / 32); ++c) {
    for (int l = 0; l < 16; ++l) u.sc[c][l] = piece[2 * c + l / 8];
  }
}

// Formats whose unpacked quants are signed int8 (IQ4_XS's levels, the IQ2/IQ3 values) say kSignedQuants.
template <class F, class = void>
struct SignedQuants : std::false_type {};
template <class F>
struct SignedQuants<F, std::void_t<decltype(F::kSignedQuants)>> : std::bool_constant<F::kSignedQuants> {};

// acc += one super-block of x against u, as Format::accumulate adds it.
template <int kBiasShift, bool kSigned = false>
__attribute__((target("avx2,fma,f16c"))) inline void accumulate_unpacked(const Unpacked& u, const int8_t* xq,
                                                                       const int16_t* sums, float dx, __m256& acc) {
  __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int c = 0; c < int(kSuper / 32); ++c) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.q + 32 * c));
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c));
    const __m256i sc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.sc[c]));
    // Signed quants: |q| by x carrying q's sign, vpmaddubsw's first operand being unsigned.
    const __m256i pairs = kSigned ? _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q))
                                  : _mm256_maddubs_epi16(q, x);
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, sc));
  }
  const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.mn)),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
  if constexpr (kBiasShift > 0) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(u.d * dx),
                          _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, _mm256_slli_epi32(msum, kBiasShift))), acc);
  } else {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(u.d * dx), _mm256_cvtepi32_ps(isum), acc);
    acc = _mm256_fnmadd_ps(_mm256_set1_ps(u.dmin * dx), _mm256_cvtepi32_ps(msum), acc);
  }
}

// Q4_K and Q5_K's d, dmin and 6-bit scales and mins (per 32 elements) into u.
__attribute__((target("avx2,fma,f16c"))) inline void unpack_k4_scales(const uint8_t* blk, Unpacked& u) {
  __m128i sc8, mn8;
  scales_mins_k4(blk + 4, sc8, mn8);
  uint8_t sc[16], mn[16];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sc), sc8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(mn), mn8);
  int16_t piece[kSuper / kPiece];
  for (int p = 0; p < int(kSuper / kPiece); ++p) piece[p] = sc[p / 2], u.mn[p] = mn[p / 2];
  spread_scales(piece, u);
  u.d = load_fp16(blk);
  u.dmin = load_fp16(blk + 2);
}

// Rows [j0, j1) of W against all m rows of x, four rows at a time.
template <class Format>
__attribute__((target("avx2,fma,f16c"))) inline void gemm_rows(const KQuantX& xq, int64_t m, const WeightView& w,
                                                        float* y, int64_t j0, int64_t j1) {
  const int64_t k = w.cols, n = w.rows, supers = k / kSuper;
  const size_t row_bytes = size_t(supers * Format::kBytes);
  const auto* base = static_cast<const uint8_t*>(w.data);
  const bool packed = (w.kernel_variant & kQuantTilesPacked) != 0;
  for (int64_t j = j0; j < j1; j += kRowsPerTile) {
    const int64_t rows = std::min(kRowsPerTile, j1 - j);
    // A whole tile is stored block-interleaved where the view is packed (prepare_weight_quant_tiles):
    // one sequential stream; a last partial tile stays row-major.
    const bool tile = packed && rows == kRowsPerTile;
    const uint8_t* start = base + size_t(j) * row_bytes;
    auto block_at = [&](int64_t r, int64_t b) {
      return tile ? start + size_t((b * kRowsPerTile + r) * Format::kBytes)
                  : start + size_t(r) * row_bytes + size_t(b * Format::kBytes);
    };
    if constexpr (Unpacks<Format>::value) {
      if (m >= kBufferRows) {
        thread_local std::vector<Unpacked> buf;
        buf.resize(size_t(supers * kRowsPerTile));
        for (int64_t b = 0; b < supers; ++b) {
          for (int64_t r = 0; r < rows; ++r) Format::unpack(block_at(r, b), buf[size_t(b * kRowsPerTile + r)]);
        }
        for (int64_t i = 0; i < m; ++i) {
          __m256 acc[kRowsPerTile];
          for (auto& a : acc) a = _mm256_setzero_ps();
          for (int64_t b = 0; b < supers; ++b) {
            const int8_t* x = xq.q.data() + i * k + b * kSuper;
            const int16_t* sums = xq.sums.data() + (i * supers + b) * (kSuper / kPiece);
            const float dx = xq.d[size_t(i * supers + b)];
            for (int64_t r = 0; r < rows; ++r) {
              accumulate_unpacked<Format::kBiasShift, SignedQuants<Format>::value>(buf[size_t(b * kRowsPerTile + r)], x,
                                                                                   sums, dx, acc[r]);
            }
          }
          for (int64_t r = 0; r < rows; ++r) y[i * n + j + r] = hsum(acc[r]);
        }
        continue;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      __m256 acc[kRowsPerTile];
      for (auto& a : acc) a = _mm256_setzero_ps();
      for (int64_t b = 0; b < supers; ++b) {
        const int8_t* x = xq.q.data() + i * k + b * kSuper;
        const int16_t* sums = xq.sums.data() + (i * supers + b) * (kSuper / kPiece);
        const float dx = xq.d[size_t(i * supers + b)];
        const uint8_t* blk[kRowsPerTile];
        if (tile) {
          for (int64_t r = 0; r < kRowsPerTile; ++r) blk[r] = start + size_t((b * kRowsPerTile + r) * Format::kBytes);
          // The stream a few KiB ahead: the hardware prefetcher starts late on each thread's run.
          const char* ahead = reinterpret_cast<const char*>(blk[0]) + kPrefetchBytes;
          for (int64_t line = 0; line < kRowsPerTile * Format::kBytes; line += 64) {
            _mm_prefetch(ahead + line, _MM_HINT_T0);
          }
        } else {
          for (int64_t r = 0; r < rows; ++r) blk[r] = start + size_t(r) * row_bytes + size_t(b * Format::kBytes);
          // The hardware prefetcher does not follow four rows read a super-block at a time: each
          // row's bytes a few KiB ahead (the tiles after this one, rows being contiguous).
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t line = 0; line < Format::kBytes; line += 64) {
              _mm_prefetch(reinterpret_cast<const char*>(blk[r]) + kPrefetchBytes + line, _MM_HINT_T0);
            }
          }
        }
        // A row at a time: Q4_K's and Q5_K's four rows sharing each activation load (one function
        // for the tile) streamed 5-14% slower from memory, and IQ4_XS's four calls inlined into one
        // body 11% slower (2 threads, both ways timed in turn in one process).
        for (int64_t r = 0; r < rows; ++r) Format::accumulate_row(blk[r], x, sums, dx, acc[r]);
      }
      for (int64_t r = 0; r < rows; ++r) y[i * n + j + r] = hsum(acc[r]);
    }
  }
}

template <class Format>
inline void gemm_kquant(const float* x, int64_t m, const WeightView& w, float* y) {
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

}  // namespace tessera::cpu::kquant
