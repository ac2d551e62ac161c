#include "vec_math_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels_cpu.h"

namespace tessera::cpu {

namespace {

#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))

// How an element of a cache row reaches a register: f32 as stored; f16 and bf16 widened, exactly.
struct F32Row {
  static float at(const void* r, int64_t d) { return static_cast<const float*>(r)[d]; }
  TESSERA_AVX2 static __m256 load8(const void* r, int64_t d) { return _mm256_loadu_ps(static_cast<const float*>(r) + d); }
};
struct F16Row {
  static float at(const void* r, int64_t d) { return fp16_to_f32(static_cast<const uint16_t*>(r)[d]); }
  TESSERA_AVX2 static __m256 load8(const void* r, int64_t d) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(r) + d)));
  }
};
struct BF16Row {
  static float at(const void* r, int64_t d) { return bf16_to_f32(static_cast<const uint16_t*>(r)[d]); }
  TESSERA_AVX2 static __m256 load8(const void* r, int64_t d) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(r) + d));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

// Keys [from, round_up(n, 8)) into their chunks, zeros past n.
template <class Row>
void transpose_keys_from(const void* const* rows, int64_t from, int64_t n, int64_t hd, float* kt) {
  for (int64_t j = from; j < (n + 7) / 8 * 8; ++j) {
    float* col = kt + j / 8 * 8 * hd + j % 8;
    for (int64_t d = 0; d < hd; ++d) col[d * 8] = j < n ? Row::at(rows[j], d) : 0.0f;
  }
}

template <class Row>
void transpose_rows_generic(const void* const* rows, int64_t n, int64_t hd, float* kt) {
  transpose_keys_from<Row>(rows, 0, n, hd, kt);
}

// The two generic score loops must round alike: never inlined into the AVX2 functions, where the
// compiler could contract one of them into FMAs and not the other.
template <class Row>
__attribute__((noinline)) float dot_rows_generic(const float* q, const void* const* rows, int n, int64_t hd,
                                                 float scale, float* out) {
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    float s = 0;
    for (int64_t d = 0; d < hd; ++d) s += q[d] * Row::at(rows[j], d);
    out[j] = s * scale;
    mx = std::max(mx, out[j]);
  }
  return mx;
}

__attribute__((noinline)) float dot_cols_generic(const float* q, const float* kt, int n, int skip, int64_t hd,
                                                 float scale, float* out) {
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const float* col = kt + j / 8 * 8 * hd + j % 8;
    float s = 0;
    for (int64_t d = 0; d < hd; ++d) s += q[d] * col[d * 8];
    out[j] = s * scale;
    if (j >= skip) mx = std::max(mx, out[j]);
  }
  return mx;
}

float exp_shift_generic(float* s, int n, float shift) {
  float sum = 0;
  for (int j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - shift);
    sum += s[j];
  }
  return sum;
}

template <class Row>
void weighted_sum_generic(const float* p, const void* const* rows, int n, int64_t hd, float* acc) {
  for (int j = 0; j < n; ++j) {
    for (int64_t d = 0; d < hd; ++d) acc[d] += p[j] * Row::at(rows[j], d);
  }
}

TESSERA_AVX2 inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

template <class Row>
TESSERA_AVX2 void transpose_rows_avx2(const void* const* rows, int64_t n, int64_t hd, float* kt) {
  int64_t j = 0;
  if (hd % 8 == 0) {
    for (; j + 8 <= n; j += 8) {
      float* chunk = kt + j * hd;
      for (int64_t d = 0; d < hd; d += 8) {
        __m256 r[8], t[8];
        for (int u = 0; u < 8; ++u) r[u] = Row::load8(rows[j + u], d);
        for (int u = 0; u < 8; u += 2) {
          t[u] = _mm256_unpacklo_ps(r[u], r[u + 1]);
          t[u + 1] = _mm256_unpackhi_ps(r[u], r[u + 1]);
        }
        for (int u = 0; u < 8; u += 4) {
          r[u] = _mm256_shuffle_ps(t[u], t[u + 2], 0x44);
          r[u + 1] = _mm256_shuffle_ps(t[u], t[u + 2], 0xEE);
          r[u + 2] = _mm256_shuffle_ps(t[u + 1], t[u + 3], 0x44);
          r[u + 3] = _mm256_shuffle_ps(t[u + 1], t[u + 3], 0xEE);
        }
        for (int u = 0; u < 4; ++u) {
          _mm256_storeu_ps(chunk + (d + u) * 8, _mm256_permute2f128_ps(r[u], r[u + 4], 0x20));
          _mm256_storeu_ps(chunk + (d + u + 4) * 8, _mm256_permute2f128_ps(r[u], r[u + 4], 0x31));
        }
      }
    }
  }
  transpose_keys_from<Row>(rows, j, n, hd, kt);
}

TESSERA_AVX2 float max256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return std::max(_mm_cvtss_f32(m), _mm_cvtss_f32(_mm_shuffle_ps(m, m, 1)));
}

// Eight keys' lane vectors summed across lanes at once, in hsum256's order for each: lanes l and
// l+4, then the pairs (0,2) and (1,3), then the two halves. Per key ~2.5 shuffles and adds instead
// of hsum256's 6 and a scalar store.
TESSERA_AVX2 inline __m256 hsum8x256(const __m256* a) {
  __m256 s[4];
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) {  // low half: key u, high half: key u + 4
    s[u] = _mm256_add_ps(_mm256_permute2f128_ps(a[u], a[u + 4], 0x20), _mm256_permute2f128_ps(a[u], a[u + 4], 0x31));
  }
  const __m256 k01 = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], 0x44), _mm256_shuffle_ps(s[0], s[1], 0xEE));
  const __m256 k23 = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], 0x44), _mm256_shuffle_ps(s[2], s[3], 0xEE));
  return _mm256_hadd_ps(k01, k23);  // keys 0..7 in order
}

// Keys side by side (eight, then four), each a vector of 8 lane chains over the head, summed across
// lanes in hsum256's order.
template <class Row>
TESSERA_AVX2 float dot_rows_avx2(const float* q, const void* const* rows, int n, int64_t hd, float scale, float* out) {
  if (hd % 8 != 0) return dot_rows_generic<Row>(q, rows, n, hd, scale, out);
  int j = 0;
  const __m256 vscale = _mm256_set1_ps(scale);
  for (; j + 8 <= n; j += 8) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) a[u] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u) a[u] = _mm256_fmadd_ps(qv, Row::load8(rows[j + u], d), a[u]);
    }
    _mm256_storeu_ps(out + j, _mm256_mul_ps(hsum8x256(a), vscale));
  }
  for (; j + 4 <= n; j += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, Row::load8(rows[j], d), a0);
      a1 = _mm256_fmadd_ps(qv, Row::load8(rows[j + 1], d), a1);
      a2 = _mm256_fmadd_ps(qv, Row::load8(rows[j + 2], d), a2);
      a3 = _mm256_fmadd_ps(qv, Row::load8(rows[j + 3], d), a3);
    }
    out[j] = hsum256(a0) * scale;
    out[j + 1] = hsum256(a1) * scale;
    out[j + 2] = hsum256(a2) * scale;
    out[j + 3] = hsum256(a3) * scale;
  }
  for (; j < n; ++j) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), Row::load8(rows[j], d), a);
    out[j] = hsum256(a) * scale;
  }
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::max(m, out[i]);
  return m;
}

// A score's eight lane chains (one vector each, lanes over keys) summed: lanes l and l + 4, then
// the pairs (0, 2) and (1, 3), then the two halves, the order every score path keeps.
TESSERA_AVX2 inline __m256 lane_sum(const __m256* a) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                       _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
}

// One chunk (8 keys at c) scored into out[0, 8): lane l's chain for the 8 keys is one vector (8
// independent chains hide the FMA latency), and the lanes are summed in hsum256's order.
TESSERA_AVX2 inline void chunk_scores_avx2(const float* q, const float* c, int64_t hd, float scale, float* out) {
  __m256 a[8];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) a[l] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; d += 8, c += 64) {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) a[l] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d + l), _mm256_loadu_ps(c + 8 * l), a[l]);
  }
  _mm256_storeu_ps(out, _mm256_mul_ps(lane_sum(a), _mm256_set1_ps(scale)));
}

// The largest of out[skip, n).
TESSERA_AVX2 float scores_max(const float* out, int n, int skip) {
  float m = -INFINITY;
  int i = skip;
  for (; i < n && i % 8 != 0; ++i) m = std::max(m, out[i]);
  __m256 mx = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(out + i));
  m = max256(mx);
  for (; i < n; ++i) m = std::max(m, out[i]);
  return m;
}

TESSERA_AVX2 float dot_cols_avx2(const float* q, const float* kt, int n, int skip,
                                                       int64_t hd, float scale, float* out) {
  if (hd % 8 != 0) return dot_cols_generic(q, kt, n, skip, hd, scale, out);
  // The last chunk may hold keys past n (later keys or zeros): scored and ignored.
  for (int j = 0; j < n; j += 8) chunk_scores_avx2(q, kt + j * hd, hd, scale, out + j);
  return scores_max(out, n, skip);
}

// The AVX2 pair layout: qpair[2d] = qa[d], qpair[2d + 1] = qb[d].
void pair_queries_avx2(const float* qa, const float* qb, int64_t hd, float* qpair) {
  for (int64_t d = 0; d < hd; ++d) qpair[2 * d] = qa[d], qpair[2 * d + 1] = qb[d];
}

// dot_cols_avx2 for two queries (hd a multiple of 8: the callers pair only then): each chunk's
// lane vectors loaded once for both, in two passes of four lanes (sixteen chains would not fit the
// registers); each key's chains and sum as chunk_scores_avx2's, so the same bits.
TESSERA_AVX2 void dot_cols2_avx2(const float* qpair, const float* kt, int n_a, int n_b, int skip, int64_t hd,
                                 float scale, float* out_a, float* out_b, float* maxes) {
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int j = 0; j < n_b; j += 8) {
    __m256 a[8], b[8];
    for (int half = 0; half < 2; ++half) {
      const float* c = kt + j * hd + 32 * half;
      __m256 ah[4], bh[4];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) ah[u] = bh[u] = _mm256_setzero_ps();
      for (int64_t d = 0; d < hd; d += 8, c += 64) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const int64_t l = 4 * half + u;
          const __m256 k = _mm256_loadu_ps(c + 8 * u);
          ah[u] = _mm256_fmadd_ps(_mm256_broadcast_ss(qpair + 2 * (d + l)), k, ah[u]);
          bh[u] = _mm256_fmadd_ps(_mm256_broadcast_ss(qpair + 2 * (d + l) + 1), k, bh[u]);
        }
      }
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) a[4 * half + u] = ah[u], b[4 * half + u] = bh[u];
    }
    _mm256_storeu_ps(out_a + j, _mm256_mul_ps(lane_sum(a), vscale));
    _mm256_storeu_ps(out_b + j, _mm256_mul_ps(lane_sum(b), vscale));
  }
  maxes[0] = scores_max(out_a, n_a, skip);
  maxes[1] = scores_max(out_b, n_b, skip);
}

#define TESSERA_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

// lo in lanes 0-7, hi in 8-15; and the inverse, the upper eight lanes.
TESSERA_AVX512 inline __m512 join(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}
TESSERA_AVX512 inline __m256 upper(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// lane_sum on 512-bit vectors: each half summed as lane_sum sums it.
TESSERA_AVX512 inline __m512 lane_sum(const __m512* a) {
  return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                       _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
}

// dot_cols_avx2 two chunks at a time on 512-bit vectors: lanes 0-7 hold chunk j's keys, 8-15 chunk
// j + 8's, each key's lane chains and their sum the same as chunk_scores_avx2's, so the same bits
// with half the FMAs and broadcasts. A last odd chunk takes chunk_scores_avx2.
TESSERA_AVX512 float dot_cols_avx512(const float* q, const float* kt, int n, int skip, int64_t hd, float scale,
                                     float* out) {
  if (hd % 8 != 0) return dot_cols_generic(q, kt, n, skip, hd, scale, out);
  const __m512 vscale = _mm512_set1_ps(scale);
  const int64_t pair = 8 * hd;
  int j = 0;
  for (; j + 8 < n; j += 16) {  // chunk j + 8 holds a key below n
    const float* c = kt + j * hd;
    __m512 a[8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) a[l] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8, c += 64) {
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) {
        const __m512 keys = join(_mm256_loadu_ps(c + 8 * l), _mm256_loadu_ps(c + 8 * l + pair));  // chunks j, j + 8
        a[l] = _mm512_fmadd_ps(_mm512_set1_ps(q[d + l]), keys, a[l]);
      }
    }
    _mm512_storeu_ps(out + j, _mm512_mul_ps(lane_sum(a), vscale));
  }
  if (j < n) chunk_scores_avx2(q, kt + j * hd, hd, scale, out + j);
  return scores_max(out, n, skip);
}

// qpair[d * 16, d * 16 + 16) = qa[d] eight times, then qb[d] eight times.
TESSERA_AVX512 void pair_queries_avx512(const float* qa, const float* qb, int64_t hd, float* qpair) {
  for (int64_t d = 0; d < hd; ++d) {
    _mm512_storeu_ps(qpair + d * 16, join(_mm256_set1_ps(qa[d]), _mm256_set1_ps(qb[d])));
  }
}

// Two queries against one chunk of 8 keys per step: the chunk loaded once into both halves of a
// vector, lanes 0-7 query a's chains, 8-15 query b's, each the chains and sum of
// chunk_scores_avx2, so the same bits with a quarter of the loads and half the FMAs of two dot_cols.
TESSERA_AVX512 void dot_cols2_avx512(const float* qpair, const float* kt, int n_a, int n_b, int skip, int64_t hd,
                                     float scale, float* out_a, float* out_b, float* maxes) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int j = 0; j < n_b; j += 8) {
    const float* c = kt + j * hd;
    __m512 a[8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) a[l] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8, c += 64) {
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) {
        const __m512 keys = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(c + 8 * l))));
        a[l] = _mm512_fmadd_ps(_mm512_loadu_ps(qpair + (d + l) * 16), keys, a[l]);
      }
    }
    const __m512 sum = _mm512_mul_ps(lane_sum(a), vscale);
    _mm256_storeu_ps(out_a + j, _mm512_castps512_ps256(sum));
    _mm256_storeu_ps(out_b + j, upper(sum));
  }
  maxes[0] = scores_max(out_a, n_a, skip);
  maxes[1] = scores_max(out_b, n_b, skip);
}

TESSERA_AVX2 float exp_shift_avx2(float* s, int n, float shift) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), sh));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum256(sum);
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - shift);
    total += s[j];
  }
  return total;
}

// Run<C>::go: acc[d0, d0 + 8C) += sum_j p[j] * rows[j][d0, d0 + 8C), keys in order (one chain per lane, as
// the portable loop sums them): each row's slice is read once, front to back, and C independent
// chains hide the FMA latency.
template <class Row>
struct WeightedCols256 {
  template <int C>
  struct Run {
    TESSERA_AVX2 static void go(int64_t d0, const float* p, const void* const* rows, int n, float* acc) {
      __m256 a[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[c] = _mm256_loadu_ps(acc + d0 + 8 * c);
      for (int j = 0; j < n; ++j) {
        const __m256 w = _mm256_set1_ps(p[j]);
        const void* r = rows[j];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) a[c] = _mm256_fmadd_ps(w, Row::load8(r, d0 + 8 * c), a[c]);
      }
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + d0 + 8 * c, a[c]);
    }
  };
};

// For heads of 8 or 16: four partial sums over the keys (j mod 4) hide the FMA latency that the
// one or two lane chains of WeightedCols256 would expose.
template <class Row>
TESSERA_AVX2 void weighted_sum_key_chains(const float* p, const void* const* rows, int n, int64_t hd, float* acc) {
  for (int64_t d = 0; d < hd; d += 8) {
    __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), Row::load8(rows[j], d), a0);
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 1]), Row::load8(rows[j + 1], d), a1);
      a2 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 2]), Row::load8(rows[j + 2], d), a2);
      a3 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 3]), Row::load8(rows[j + 3], d), a3);
    }
    for (; j < n; ++j) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), Row::load8(rows[j], d), a0);
    _mm256_storeu_ps(acc + d, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
}

// Run<C>::go(d, args...) over a head of hd floats (a multiple of kLanes) in runs of up to kMaxRun
// (at most 8) vectors of kLanes: the value sums' column chains, as many as fit in registers.
template <int kLanes, template <int> class Run, int kMaxRun = 8, class... Args>
inline void column_runs(int64_t hd, Args... args) {
  int64_t d = 0;
  for (; d + kMaxRun * kLanes <= hd; d += kMaxRun * kLanes) Run<kMaxRun>::go(d, args...);
  switch ((hd - d) / kLanes) {
    case 1: return Run<1>::go(d, args...);
    case 2: return Run<2>::go(d, args...);
    case 3: return Run<3>::go(d, args...);
    case 4: return Run<4>::go(d, args...);
    case 5: return Run<5>::go(d, args...);
    case 6: return Run<6>::go(d, args...);
    case 7: return Run<7>::go(d, args...);
    default: return;
  }
}

// From 24 wide, keys in the inner loop: a head's value rows are strided by a token's whole row in
// the cache, and walking each once (instead of once per slice of the head) halves the time of a
// long-context decode over an f16 cache. Every path (decode, prefill, verification) sums through
// this one function, so a query's output does not depend on which ran it.
template <class Row>
TESSERA_AVX2 void weighted_sum_avx2(const float* p, const void* const* rows, int n, int64_t hd, float* acc) {
  if (hd % 8 != 0) return weighted_sum_generic<Row>(p, rows, n, hd, acc);
  if (hd <= 16) return weighted_sum_key_chains<Row>(p, rows, n, hd, acc);
  column_runs<8, WeightedCols256<Row>::template Run>(hd, p, rows, n, acc);
}

// WeightedCols256 for two queries, each row's slice loaded once for both (runs of up to 4 vectors
// a query: 8 chains in the 16 registers).
template <class Row>
struct WeightedColsPair256 {
  template <int C>
  struct Run {
    TESSERA_AVX2 static void go(int64_t d0, const float* pa, const float* pb, const void* const* rows, int n,
                                float* acc_a, float* acc_b) {
      __m256 a[C], b[C];
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) a[c] = _mm256_loadu_ps(acc_a + d0 + 8 * c), b[c] = _mm256_loadu_ps(acc_b + d0 + 8 * c);
      for (int j = 0; j < n; ++j) {
        const __m256 wa = _mm256_set1_ps(pa[j]), wb = _mm256_set1_ps(pb[j]);
        const void* r = rows[j];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          const __m256 v = Row::load8(r, d0 + 8 * c);
          a[c] = _mm256_fmadd_ps(wa, v, a[c]);
          b[c] = _mm256_fmadd_ps(wb, v, b[c]);
        }
      }
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc_a + d0 + 8 * c, a[c]), _mm256_storeu_ps(acc_b + d0 + 8 * c, b[c]);
    }
  };
};

template <class Row>
TESSERA_AVX2 void weighted_sum2_avx2(const float* pa, const float* pb, const void* const* rows, int n, int64_t hd,
                                     float* acc_a, float* acc_b) {
  if (hd % 8 != 0 || hd <= 16) {
    weighted_sum_avx2<Row>(pa, rows, n, hd, acc_a);
    return weighted_sum_avx2<Row>(pb, rows, n, hd, acc_b);
  }
  column_runs<8, WeightedColsPair256<Row>::template Run, 4>(hd, pa, pb, rows, n, acc_a, acc_b);
}

// dot_rows_avx2 for two queries, four keys at a time (eight chains in registers), each key's
// chains summed in hsum256's order as dot_rows_avx2 sums them, so the same bits.
template <class Row>
TESSERA_AVX2 void dot_rows2_avx2(const float* qa, const float* qb, const void* const* rows, int n, int64_t hd,
                                 float scale, float* out_a, float* out_b, float* maxes) {
  if (hd % 8 != 0) {
    maxes[0] = dot_rows_avx2<Row>(qa, rows, n, hd, scale, out_a);
    maxes[1] = dot_rows_avx2<Row>(qb, rows, n, hd, scale, out_b);
    return;
  }
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    __m256 a[4], b[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) a[u] = b[u] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) {
      const __m256 qva = _mm256_loadu_ps(qa + d), qvb = _mm256_loadu_ps(qb + d);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const __m256 r = Row::load8(rows[j + u], d);
        a[u] = _mm256_fmadd_ps(qva, r, a[u]);
        b[u] = _mm256_fmadd_ps(qvb, r, b[u]);
      }
    }
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) out_a[j + u] = hsum256(a[u]) * scale, out_b[j + u] = hsum256(b[u]) * scale;
  }
  if (j < n) {
    dot_rows_avx2<Row>(qa, rows + j, n - j, hd, scale, out_a + j);
    dot_rows_avx2<Row>(qb, rows + j, n - j, hd, scale, out_b + j);
  }
  maxes[0] = maxes[1] = -INFINITY;
  for (int i = 0; i < n; ++i) maxes[0] = std::max(maxes[0], out_a[i]), maxes[1] = std::max(maxes[1], out_b[i]);
}

// 16 elements of a cache row from d on, widened as load8 widens them.
template <class Row>
TESSERA_AVX512 inline __m512 load16(const void* r, int64_t d);
template <>
TESSERA_AVX512 inline __m512 load16<F32Row>(const void* r, int64_t d) {
  return _mm512_loadu_ps(static_cast<const float*>(r) + d);
}
template <>
TESSERA_AVX512 inline __m512 load16<F16Row>(const void* r, int64_t d) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(r) + d)));
}
template <>
TESSERA_AVX512 inline __m512 load16<BF16Row>(const void* r, int64_t d) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(r) + d));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// WeightedCols256 on 512-bit vectors: acc[d0, d0 + 16C), each element the same chain of FMAs over
// the keys in order, so the same bits with half the instructions. (The 512-bit functions repeat
// their AVX2 twins' loops: a function's instruction set is fixed where it is defined, and an AVX2
// twin compiled for AVX-512 could use instructions an AVX2-only CPU lacks.)
template <class Row>
struct WeightedCols512 {
  template <int C>
  struct Run {
    TESSERA_AVX512 static void go(int64_t d0, const float* p, const void* const* rows, int n, float* acc) {
      __m512 a[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[c] = _mm512_loadu_ps(acc + d0 + 16 * c);
      for (int j = 0; j < n; ++j) {
        const __m512 w = _mm512_set1_ps(p[j]);
        const void* r = rows[j];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) a[c] = _mm512_fmadd_ps(w, load16<Row>(r, d0 + 16 * c), a[c]);
      }
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + d0 + 16 * c, a[c]);
    }
  };
};

// WeightedCols512 for two queries: each row's slice loaded once for both.
template <class Row>
struct WeightedColsPair512 {
  template <int C>
  struct Run {
    TESSERA_AVX512 static void go(int64_t d0, const float* pa, const float* pb, const void* const* rows, int n,
                                  float* acc_a, float* acc_b) {
      __m512 a[C], b[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[c] = _mm512_loadu_ps(acc_a + d0 + 16 * c), b[c] = _mm512_loadu_ps(acc_b + d0 + 16 * c);
      for (int j = 0; j < n; ++j) {
        const __m512 wa = _mm512_set1_ps(pa[j]), wb = _mm512_set1_ps(pb[j]);
        const void* r = rows[j];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          const __m512 v = load16<Row>(r, d0 + 16 * c);
          a[c] = _mm512_fmadd_ps(wa, v, a[c]);
          b[c] = _mm512_fmadd_ps(wb, v, b[c]);
        }
      }
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc_a + d0 + 16 * c, a[c]), _mm512_storeu_ps(acc_b + d0 + 16 * c, b[c]);
    }
  };
};

// weighted_sum_avx2 for heads of a multiple of 16 past 16 (smaller ones, and others, take it).
template <class Row>
TESSERA_AVX512 void weighted_sum_avx512(const float* p, const void* const* rows, int n, int64_t hd, float* acc) {
  if (hd % 16 != 0 || hd <= 16) return weighted_sum_avx2<Row>(p, rows, n, hd, acc);
  column_runs<16, WeightedCols512<Row>::template Run>(hd, p, rows, n, acc);
}

// dot_rows_avx2's eight keys for two queries at once: lanes 0-7 query a's 8 lane chains, 8-15
// query b's, each summed in hsum8x256's order, so the same bits; other key counts take dot_rows_avx2.
template <class Row>
TESSERA_AVX512 void dot_rows2_avx512(const float* qa, const float* qb, const void* const* rows, int n, int64_t hd,
                                     float scale, float* out_a, float* out_b, float* maxes) {
  if (hd % 8 != 0 || n != 8) {
    maxes[0] = dot_rows_avx2<Row>(qa, rows, n, hd, scale, out_a);
    maxes[1] = dot_rows_avx2<Row>(qb, rows, n, hd, scale, out_b);
    return;
  }
  __m512 a[8];
#pragma GCC unroll 8
  for (int u = 0; u < 8; ++u) a[u] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; d += 8) {
    const __m512 qv = join(_mm256_loadu_ps(qa + d), _mm256_loadu_ps(qb + d));
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) {
      const __m256 r = Row::load8(rows[u], d);
      a[u] = _mm512_fmadd_ps(qv, join(r, r), a[u]);
    }
  }
  __m256 lo[8], hi[8];
#pragma GCC unroll 8
  for (int u = 0; u < 8; ++u) {
    lo[u] = _mm512_castps512_ps256(a[u]);
    hi[u] = upper(a[u]);
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  _mm256_storeu_ps(out_a, _mm256_mul_ps(hsum8x256(lo), vscale));
  _mm256_storeu_ps(out_b, _mm256_mul_ps(hsum8x256(hi), vscale));
  maxes[0] = max256(_mm256_loadu_ps(out_a));
  maxes[1] = max256(_mm256_loadu_ps(out_b));
}

template <class Row>
TESSERA_AVX512 void weighted_sum2_avx512(const float* pa, const float* pb, const void* const* rows, int n, int64_t hd,
                                         float* acc_a, float* acc_b) {
  if (hd % 16 != 0 || hd <= 16) {
    weighted_sum_avx2<Row>(pa, rows, n, hd, acc_a);
    return weighted_sum_avx2<Row>(pb, rows, n, hd, acc_b);
  }
  column_runs<16, WeightedColsPair512<Row>::template Run>(hd, pa, pb, rows, n, acc_a, acc_b);
}

template <class Row>
constexpr RowOps generic_rows{dot_rows_generic<Row>, transpose_rows_generic<Row>, weighted_sum_generic<Row>, nullptr,
                               nullptr};
template <class Row>
constexpr RowOps avx2_rows{dot_rows_avx2<Row>, transpose_rows_avx2<Row>, weighted_sum_avx2<Row>,
                           dot_rows2_avx2<Row>, weighted_sum2_avx2<Row>};
template <class Row>
constexpr RowOps avx512_rows{dot_rows_avx2<Row>, transpose_rows_avx2<Row>, weighted_sum_avx512<Row>,
                             dot_rows2_avx512<Row>, weighted_sum2_avx512<Row>};

}  // namespace

const VecOps& vec_ops() {
  static const VecOps generic{generic_rows<F32Row>, generic_rows<F16Row>, generic_rows<BF16Row>, dot_cols_generic,
                              exp_shift_generic, nullptr, nullptr};
  static const VecOps avx2{avx2_rows<F32Row>, avx2_rows<F16Row>, avx2_rows<BF16Row>, dot_cols_avx2, exp_shift_avx2,
                           pair_queries_avx2, dot_cols2_avx2};
  static const VecOps avx512{avx512_rows<F32Row>, avx512_rows<F16Row>, avx512_rows<BF16Row>, dot_cols_avx512,
                             exp_shift_avx2, pair_queries_avx512, dot_cols2_avx512};
  if (!has_f16c()) return generic;  // has_f16c: F16C, AVX2 and FMA
  return has_avx512f() ? avx512 : avx2;
}

}  // namespace tessera::cpu
