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
#include <vector>

#include "kernels_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kBlock = 32;       // activation quantization block (elements)
constexpr int64_t kRowsPerTile = 4;  // weight rows sharing one pass over x

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
      float amax = 0;
      for (int64_t c = 0; c < kBlock; ++c) amax = std::max(amax, std::fabs(xb[c]));
      const float d = amax / 127.0f;
      const float id = d != 0 ? 1.0f / d : 0.0f;
      int8_t* qb = out.q.data() + i * k + b * kBlock;
      int sum = 0;
      for (int64_t c = 0; c < kBlock; ++c) {
        const int v = int(std::nearbyint(xb[c] * id));
        qb[(c & 1) * 16 + c / 2] = int8_t(v);
        sum += v;
      }
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

// Rows [j0, j1) of W against all m quantized rows of x. For m > 1 a tile's nibbles are unpacked
// once into `tile` (4 rows x k bytes, L1-resident) and reused by every row of x.
__attribute__((target("avx2,fma"))) void gemm_i4_avx2(const QuantizedX& xq, int64_t m, const WeightView& w,
                                                      float* y, int64_t j0, int64_t j1,
                                                      std::vector<uint8_t>& tile) {
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  const int64_t g = w.group_size;
  const int64_t groups = k / g;
  const int64_t blocks = k / kBlock;
  const int64_t blocks_per_group = g / kBlock;
  const auto* packed = static_cast<const uint8_t*>(w.data);
  const int64_t row_bytes = k / 2;
  const bool reuse = m > 1;
  if (reuse) tile.resize(size_t(kRowsPerTile * blocks * 32));
  auto* t = reinterpret_cast<__m256i*>(tile.data());
  for (int64_t j = j0; j < j1; j += kRowsPerTile) {
    const int64_t rows = std::min(kRowsPerTile, j1 - j);
    // A short tile repeats its last row; only the real rows are stored.
    int64_t jr[kRowsPerTile];
    for (int64_t r = 0; r < kRowsPerTile; ++r) jr[r] = j + std::min(r, rows - 1);
    const uint8_t* w0 = packed + jr[0] * row_bytes;
    const uint8_t* w1 = packed + jr[1] * row_bytes;
    const uint8_t* w2 = packed + jr[2] * row_bytes;
    const uint8_t* w3 = packed + jr[3] * row_bytes;
    const float* s0 = w.scales + jr[0] * groups;
    const float* s1 = w.scales + jr[1] * groups;
    const float* s2 = w.scales + jr[2] * groups;
    const float* s3 = w.scales + jr[3] * groups;
    if (reuse) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t off = b * (kBlock / 2);
        _mm256_storeu_si256(t + 4 * b + 0, unpack32(w0 + off));
        _mm256_storeu_si256(t + 4 * b + 1, unpack32(w1 + off));
        _mm256_storeu_si256(t + 4 * b + 2, unpack32(w2 + off));
        _mm256_storeu_si256(t + 4 * b + 3, unpack32(w3 + off));
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* xr = xq.q.data() + i * k;
      const float* xd = xq.d.data() + i * blocks;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
             a3 = _mm256_setzero_ps();
      for (int64_t gi = 0; gi < groups; ++gi) {
        const __m256 d0 = _mm256_set1_ps(s0[gi]), d1 = _mm256_set1_ps(s1[gi]),
                     d2 = _mm256_set1_ps(s2[gi]), d3 = _mm256_set1_ps(s3[gi]);
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
            const int64_t off = b * (kBlock / 2);
            u0 = unpack32(w0 + off);
            u1 = unpack32(w1 + off);
            u2 = unpack32(w2 + off);
            u3 = unpack32(w3 + off);
          }
          a0 = _mm256_fmadd_ps(dot32(u0, xv), _mm256_mul_ps(d0, dx), a0);
          a1 = _mm256_fmadd_ps(dot32(u1, xv), _mm256_mul_ps(d1, dx), a1);
          a2 = _mm256_fmadd_ps(dot32(u2, xv), _mm256_mul_ps(d2, dx), a2);
          a3 = _mm256_fmadd_ps(dot32(u3, xv), _mm256_mul_ps(d3, dx), a3);
        }
      }
      float out[kRowsPerTile] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
      // Zero points: subtract s·z·Σx per group.
      const float* gs = xq.gsum.data() + i * groups;
      for (int64_t r = 0; r < rows; ++r) {
        const float* s = w.scales + jr[r] * groups;
        const float* z = w.zeros != nullptr ? w.zeros + jr[r] * groups : nullptr;
        float corr = 0;
        for (int64_t gi = 0; gi < groups; ++gi) corr += s[gi] * (z != nullptr ? z[gi] : 8.0f) * gs[gi];
        y[i * n + j + r] = out[r] - corr;
      }
    }
  }
}

// Splits output rows [0, n) into tiles across an OpenMP team when the work is large enough.
template <class F>
void for_row_ranges(int64_t m, int64_t n, int64_t k, F run) {
  const int64_t tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  if (m * n * k < kParallelWork || omp_get_max_threads() == 1 || tiles == 1) {
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

}  // namespace

void gemm_i4(const float* x, int64_t m, const WeightView& view, float* y) {
  WeightView w = view;
  if (w.group_size <= 0) w.group_size = w.cols;  // one group per row
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  if (has_avx2() && g > 0 && g % kBlock == 0 && k % g == 0) {
    thread_local QuantizedX xq;  // the caller's; shared read-only by the team below
    quantize_x(x, m, k, g, xq);
    const QuantizedX& shared = xq;
    for_row_ranges(m, w.rows, k, [&](int64_t j0, int64_t j1) {
      thread_local std::vector<uint8_t> tile;  // each thread's unpacked tile
      gemm_i4_avx2(shared, m, w, y, j0, j1, tile);
    });
    return;
  }
  for_row_ranges(m, w.rows, k, [&](int64_t j0, int64_t j1) { gemm_i4_scalar(x, m, w, y, j0, j1); });
}

}  // namespace tessera::cpu
