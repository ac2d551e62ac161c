// Small vector routines for the attention inner loops, with an AVX2 and a portable version picked
// once at run time (never in a global initialiser): AVX2 with FMA and F16C, or portable; where the
// CPU has AVX-512F too, the transposed-key scores and the value sums run on 512-bit vectors with
// the same per-element arithmetic, so the same bits (attention op over a 2048-token prompt ~8%
// faster, a cold 512-key decode ~5%: BM_AttentionOp/2048/1, BM_DecodeAttentionCold/512/0 against
// TESSERA_CPU_ISA=avx2, 3 alternating runs each, Zen 5). The *2 routines take two queries that
// share their rows, each row read once for both (attention_cpu.cpp says where and what it gains).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "tessera/dtype.h"

namespace tessera::cpu {

// The routines that read key/value rows as the cache stores them (f32, f16 or bf16; half types are
// widened exactly on load, so a row gives the same bits in every type that holds its values).
struct RowOps {
  // Scores out[j] = scale * q·key_j, in two forms that give the same bits (a query's scores do
  // not depend on how many queries share its keys): from the key rows, or from keys transposed in
  // chunks of 8 (kt[(j / 8) * 8 * hd + d * 8 + j % 8] = rows[j][d], the last chunk's missing keys
  // zero, see VecOps::dot_cols), which costs a transposition per attention task but no horizontal
  // sums per key. With AVX2 and hd a multiple of 8 a score is 8 lane chains of FMAs over
  // d = l, l+8, ... then ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)); otherwise one sequential sum.
  // dot_rows: j < n, returns the max.
  float (*dot_rows)(const float* q, const void* const* rows, int n, int64_t hd, float scale, float* out);
  void (*transpose_rows)(const void* const* rows, int64_t n, int64_t hd, float* kt);
  // acc[0..hd) += sum_j p[j] * rows[j][0..hd).
  void (*weighted_sum)(const float* p, const void* const* rows, int n, int64_t hd, float* acc);
  // dot_rows for two queries over the same rows (a GQA pair), each row read once for both; the same
  // bits as two dot_rows calls, maxes[0] and maxes[1] theirs. Null where not faster.
  void (*dot_rows2)(const float* qa, const float* qb, const void* const* rows, int n, int64_t hd, float scale,
                    float* out_a, float* out_b, float* maxes);
  // weighted_sum for two queries over the same rows (a GQA pair, see VecOps::dot_cols2), each
  // row read once for both; the same bits as two weighted_sum calls. Null where not faster.
  void (*weighted_sum2)(const float* pa, const float* pb, const void* const* rows, int n, int64_t hd, float* acc_a,
                        float* acc_b);
};

struct VecOps {
  RowOps f32, f16, bf16;
  // Scores from transposed keys: kt at a chunk start, out needs room for round_up(n, 8), returns
  // the max over [skip, n).
  float (*dot_cols)(const float* q, const float* kt, int n, int skip, int64_t hd, float scale, float* out);
  // s[j] = exp(s[j] - shift); returns the sum.
  float (*exp_shift)(float* s, int n, float shift);
  // Two queries sharing their keys (a GQA group's, or consecutive positions of one head), where the
  // CPU has a faster way to score them together (null otherwise): pair_queries lays qa and qb out
  // once (hd * 16 floats at qpair), and dot_cols2 then gives each its dot_cols scores and max over
  // its own n (maxes[0] over [skip, n_a), maxes[1] over [skip, n_b); n_a <= n_b), the same bits.
  // hd a multiple of 8.
  void (*pair_queries)(const float* qa, const float* qb, int64_t hd, float* qpair);
  void (*dot_cols2)(const float* qpair, const float* kt, int n_a, int n_b, int skip, int64_t hd, float scale,
                    float* out_a, float* out_b, float* maxes);

  const RowOps& rows(DType t) const { return t == DType::F16 ? f16 : t == DType::BF16 ? bf16 : f32; }
};

const VecOps& vec_ops();

// exp(x) for x <= 88 (larger x would overflow the exponent): 2^(x·log2 e) split into an integer power and a degree-6
// polynomial on [-0.5, 0.5]; relative error ~2e-7, far below what attention weights need.
__attribute__((target("avx2,fma"))) inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 k = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, k), _mm256_set1_ps(0.693147180559945309f));
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace tessera::cpu
