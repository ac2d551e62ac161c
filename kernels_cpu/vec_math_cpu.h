// Small vector routines for the attention inner loops, with an AVX2 and a portable version picked
// once at run time (never in a global initialiser).
#pragma once

#include <cstdint>

namespace tessera::cpu {

struct VecOps {
  // out[j] = scale * dot(q, rows[j][0..hd)) for j < n.
  void (*dot_rows)(const float* q, const float* const* rows, int n, int64_t hd, float scale, float* out);
  // s[j] = exp(s[j] - shift); returns the sum.
  float (*exp_shift)(float* s, int n, float shift);
  // acc[0..hd) += sum_j p[j] * rows[j][0..hd).
  void (*weighted_sum)(const float* p, const float* const* rows, int n, int64_t hd, float* acc);
};

const VecOps& vec_ops();

}  // namespace tessera::cpu
