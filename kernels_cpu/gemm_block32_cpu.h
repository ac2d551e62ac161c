// The GEMM shared by the GGUF blocks of 32 that run in place (gemm_block32_cpu.cpp: Q4_1, Q5_0,
// Q5_1; gemm_iq4_cpu.cpp: IQ4_NL): each activation row quantized to int8 per block of 32 (scale
// amax/127, rounded to nearest even) with the block's sum, and the walk over four-row tiles and
// threads as in gemm_kquant_cpu.h. A format supplies kBytes and
//   accumulate(block, x (32 int8), sx (x's sum in lane 0), dx, acc)
// adding one block's dot to 8 float lanes. Every row of x takes the same steps in the same order,
// so a row of a batch equals that row alone, bit for bit. Compiled as C++17.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels_cpu.h"
#include "stealing_bands_cpu.h"

namespace tessera::cpu::block32 {

constexpr int64_t kBlock = 32;
constexpr int64_t kRowsPerTile = 4;
constexpr int64_t kPrefetchBytes = 2048;

struct Block32X {
  std::vector<int8_t> q;     // [m][k]
  std::vector<float> d;      // [m][k / 32]
  std::vector<int32_t> sum;  // [m][k / 32]: Σ q over the block
};

__attribute__((target("avx2,fma,f16c"))) inline void quantize_x(const float* x, int64_t m, int64_t k, Block32X& out) {
  const int64_t blocks = m * (k / kBlock);
  out.q.resize(size_t(m * k));
  out.d.resize(size_t(blocks));
  out.sum.resize(size_t(blocks));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < blocks; ++i) {
    const float* xs = x + i * kBlock;
    __m256 v[4], vmax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      v[c] = _mm256_loadu_ps(xs + 8 * c);
      vmax = _mm256_max_ps(vmax, _mm256_and_ps(abs_mask, v[c]));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[c], v[c], _CMP_UNORD_Q));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    const float amax = *std::max_element(lanes, lanes + 8);
    // A NaN or infinite activation makes the block's scale NaN, and so the outputs it feeds.
    const float d = _mm256_movemask_ps(nan) != 0 || std::isinf(amax) ? NAN : amax / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0 ? 1.0f / d : 0.0f);
    out.d[size_t(i)] = d;
    __m256i w[4];
    for (int c = 0; c < 4; ++c) w[c] = _mm256_cvtps_epi32(_mm256_mul_ps(v[c], id));
    // |x·id| <= 127: the packs never saturate; they interleave lanes, undone by the permute.
    const __m256i w16 = _mm256_packs_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_packs_epi32(w[2], w[3]));
    const __m256i q = _mm256_permutevar8x32_epi32(w16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + i * kBlock), q);
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(w[0], w[1]), _mm256_add_epi32(w[2], w[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    out.sum[size_t(i)] = _mm_cvtsi128_si32(s4);
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

// The 16 bytes at p as 32 nibbles in element order: low nibbles (elements 0-15) in the low half,
// high nibbles (16-31) in the high half.
__attribute__((target("avx2,fma,f16c"))) inline __m256i nibbles(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i low = _mm_set1_epi8(0x0f);
  return _mm256_setr_m128i(_mm_and_si128(q, low), _mm_and_si128(_mm_srli_epi16(q, 4), low));
}

// 0x10 in byte i where bit i of the little-endian u32 at p is set (the fifth bits of Q5_0/Q5_1).
__attribute__((target("avx2,fma,f16c"))) inline __m256i fifth_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// Prefill: from kBufferRows x rows on, a tile's blocks are unpacked once per thread
// (Format::unpack, where a format has one: its 32 unsigned quants and its scales as float) and every
// x row reads them from there (Format::accumulate_unpacked), with the integer dots and float steps
// of Format::accumulate, so a row of a batch keeps the bits of that row alone.
constexpr int64_t kBufferRows = 4;

struct Unpacked {
  uint8_t q[kBlock];
  float d, m;  // the block's scale and its min (Q4_1, Q5_1; unused by Q5_0)
};

template <class F, class = void>
struct Unpacks : std::false_type {};
template <class F>
struct Unpacks<F, std::void_t<decltype(&F::unpack)>> : std::true_type {};

// Rows [j0, j1) of W against all m rows of x, four rows at a time.
template <class Format>
__attribute__((target("avx2,fma,f16c"))) inline void gemm_rows(const Block32X& xq, int64_t m, const WeightView& w,
                                                               float* y, int64_t j0, int64_t j1) {
  const int64_t k = w.cols, n = w.rows, blocks = k / kBlock;
  const size_t row_bytes = size_t(blocks * Format::kBytes);
  const auto* base = static_cast<const uint8_t*>(w.data);
  const bool packed = (w.kernel_variant & kQuantTilesPacked) != 0;
  for (int64_t j = j0; j < j1; j += kRowsPerTile) {
    const int64_t rows = std::min(kRowsPerTile, j1 - j);
    const uint8_t* start = base + size_t(j) * row_bytes;
    if constexpr (Unpacks<Format>::value) {
      if (m >= kBufferRows) {
        const bool tile = packed && rows == kRowsPerTile;
        thread_local std::vector<Unpacked> buf;
        buf.resize(size_t(blocks * kRowsPerTile));
        for (int64_t b = 0; b < blocks; ++b) {
          for (int64_t r = 0; r < rows; ++r) {
            const uint8_t* blk = tile ? start + size_t((b * kRowsPerTile + r) * Format::kBytes)
                                      : start + size_t(r) * row_bytes + size_t(b * Format::kBytes);
            Format::unpack(blk, buf[size_t(b * kRowsPerTile + r)]);
          }
        }
        for (int64_t i = 0; i < m; ++i) {
          __m256 acc[kRowsPerTile];
          for (auto& a : acc) a = _mm256_setzero_ps();
          for (int64_t b = 0; b < blocks; ++b) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q.data() + i * k + b * kBlock));
            const int32_t sx = xq.sum[size_t(i * blocks + b)];
            const float dx = xq.d[size_t(i * blocks + b)];
            for (int64_t r = 0; r < rows; ++r) {
              Format::accumulate_unpacked(buf[size_t(b * kRowsPerTile + r)], x, sx, dx, acc[r]);
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
      if (packed && rows == kRowsPerTile) {
        // A whole tile stored block-interleaved (prepare_weight_quant_tiles): one stream, read in
        // order, prefetched a line per step ahead (a step is 72-96 bytes).
        for (int64_t b = 0; b < blocks; ++b) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q.data() + i * k + b * kBlock));
          const int32_t sx = xq.sum[size_t(i * blocks + b)];
          const float dx = xq.d[size_t(i * blocks + b)];
          const uint8_t* blk = start + size_t(b * kRowsPerTile * Format::kBytes);
          _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes + 64, _MM_HINT_T0);
          for (int64_t r = 0; r < kRowsPerTile; ++r) Format::accumulate(blk + r * Format::kBytes, x, sx, dx, acc[r]);
        }
        for (int64_t r = 0; r < rows; ++r) y[i * n + j + r] = hsum(acc[r]);
        continue;
      }
      for (int64_t b = 0; b < blocks; ++b) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q.data() + i * k + b * kBlock));
        const int32_t sx = xq.sum[size_t(i * blocks + b)];
        const float dx = xq.d[size_t(i * blocks + b)];
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* blk = start + size_t(r) * row_bytes + size_t(b * Format::kBytes);
          // Four rows a block at a time defeat the hardware prefetcher: each row's bytes ahead.
          if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
          Format::accumulate(blk, x, sx, dx, acc[r]);
        }
      }
      for (int64_t r = 0; r < rows; ++r) y[i * n + j + r] = hsum(acc[r]);
    }
  }
}

template <class Format>
inline void gemm(const float* x, int64_t m, const WeightView& w, float* y) {
  thread_local Block32X xq;
  quantize_x(x, m, w.cols, xq);
  const int64_t n = w.rows;
  if ((m * n * w.cols < kParallelWork && n * int64_t(dtype_row_bytes(w.dtype, w.cols)) < kParallelStreamBytes) ||
      team_max_threads() == 1) {
    return gemm_rows<Format>(xq, m, w, y, 0, n);
  }
  const Block32X& shared = xq;
  const int64_t tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  for_units(tiles, [&](int64_t t0, int64_t t1) {
    gemm_rows<Format>(shared, m, w, y, t0 * kRowsPerTile, std::min(n, t1 * kRowsPerTile));
  });
}

}  // namespace tessera::cpu::block32
