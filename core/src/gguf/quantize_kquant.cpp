// The k-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) from floats with ggml's reference scale searches
// (quantize_row_q*_K_ref, which llama-quantize runs when no importance matrix is given), so the
// blocks are the ones llama.cpp writes for the same floats:
//  - Q2_K/Q4_K/Q5_K: per sub-block, a weighted least-squares fit of (scale, min) tried over a range
//    of scales around the range fit (make_qkx2_quants), then 4- or 6-bit quantized scales and mins;
//  - Q3_K: per 16 elements, a symmetric fit refined one quant at a time (make_q3_quants), scales
//    quantized to signed 6 bits;
//  - Q6_K: per 16 elements, the best of 19 symmetric scales weighted by x² (make_qx_quants),
//    scales quantized to int8.
// After the scales are fixed, every element is re-quantized against its stored scale; a sub-block
// whose stored scale is 0 keeps the fit's quants, as the reference does.
// Bit-identity needs the reference's float operation order (w·l·l is (w·l)·l, sums run in element
// order) and no fused multiply-adds: core/CMakeLists.txt builds this file with -ffp-contract=off.
// One deliberate difference: a super-block scale past fp16's range is stored as 65504 (the block
// clips) where the reference would write inf, a file llama.cpp's own validation refuses.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "block_formats.h"
#include "tessera/error.h"

namespace tessera::gguf_blocks {

namespace {

constexpr float kGroupMaxEps = 1e-15f;  // below this a group counts as all zero

// ggml's nearest_int: adding 1.5·2^23 leaves round-half-even(v) in the low mantissa bits for
// |v| <= 2^22; beyond that (a fit's ratio of near-zero sums) it gives what ggml's gives, not a
// clamp, so that even those quants match.
int nearest(float v) {
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// A super-block scale as fp16: finite values past the range clip to the largest half.
void store_super_scale(uint8_t* p, float v) {
  uint16_t h = f32_to_fp16(v);
  if ((h & 0x7fff) == 0x7c00 && std::isfinite(v)) h = uint16_t((h & 0x8000) | 0x7bff);
  std::memcpy(p, &h, 2);
}

// Fits x ≈ scale·L + min (min <= 0, L in 0..nmax) minimizing Σ w·|error| (use_mad) or Σ w·error²:
// the range fit, then nstep + 1 other scales (rmin + rdelta·i + nmax levels over the range, the
// range's low end following the best min so far), each with the least-squares scale and min for
// the levels it rounds to. Returns the scale; *neg_min gets -min.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep, bool use_mad) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::fill(L, L + n, uint8_t(0));
    *neg_min = -lo;
    return 0.0f;
  }
  auto error = [use_mad](float diff) { return use_mad ? std::fabs(diff) : diff * diff; };
  float iscale = float(nmax) / (hi - lo), scale = 1.0f / iscale, best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = uint8_t(std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax));
    best += w[i] * error(scale * float(L[i]) + lo - x[i]);
  }
  uint8_t aux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax);
      aux[i] = uint8_t(l);
      const float wl = w[i] * float(l);
      sum_l += wl;
      sum_l2 += wl * float(l);
      sum_xl += wl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) err += w[i] * error(this_scale * float(aux[i]) + this_min - x[i]);
    if (err < best) {
      std::copy(aux, aux + n, L);
      best = err;
      scale = this_scale;
      lo = this_min;
    }
  }
  *neg_min = -lo;
  return scale;
}

// The element of largest magnitude, with its sign, and that magnitude.
float signed_max(int n, const float* x, float* amax) {
  float m = 0;
  *amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > *amax) {
      *amax = std::fabs(x[i]);
      m = x[i];
    }
  }
  return m;
}

// Symmetric fit x ≈ scale·l, l in -nmax..nmax-1, weighted by x²: rounded against the element of
// largest magnitude, then each l moved to its least-squares value while that lowers the error
// (at most five passes). L gets l + nmax (0 throughout for an all-zero group); returns the scale.
float fit_symmetric_refined(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float m = signed_max(n, x, &amax);
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t(0));
    return 0.0f;
  }
  const float iscale = -float(nmax) / m;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * float(L[i]);
      if (slx <= 0) continue;
      float sl2 = suml2 - w * float(L[i]) * float(L[i]);
      const int nl = std::clamp(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (nl == L[i]) continue;
      slx += w * x[i] * float(nl);
      sl2 += w * float(nl) * float(nl);
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = int8_t(nl);
        sumlx = slx;
        suml2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
  return suml2 > 0 ? sumlx / suml2 : 0.0f;
}

// Symmetric fit weighted by x² over 19 scales: nmax ± 0.1·k levels (k = -9..9) on the element of
// largest magnitude, keeping the one whose least-squares scale explains most of Σ w·x². L gets
// l + nmax (0 throughout for an all-zero group); returns the scale.
float fit_symmetric_search(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float m = signed_max(n, x, &amax);
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t(0));
    return 0.0f;
  }
  auto sums = [&](float iscale, float& sumlx, float& suml2, bool keep) {
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
      if (keep) L[i] = int8_t(l + nmax);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
  };
  float sumlx, suml2;
  sums(-float(nmax) / m, sumlx, suml2, true);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float iscale = -(float(nmax) + 0.1f * float(is)) / m;
    sums(iscale, sumlx, suml2, false);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      sums(iscale, sumlx, suml2, true);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Packs 2-bit quants: element 128h + 32s + l into bits 2s of byte 32h + l.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* p = L + 128 * h + l;
      qs[32 * h + l] = uint8_t(p[0] | (p[32] << 2) | (p[64] << 4) | (p[96] << 6));
    }
  }
}

void quantize_q2_k(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 256, out += 84) {
    uint8_t L[256];
    float scales[16], mins[16], weights[16], max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    uint8_t* sc = out;
    std::fill(sc, sc + 16, uint8_t(0));
    store_fp16(out + 80, 0.0f);
    store_fp16(out + 82, 0.0f);
    if (max_scale > 0) {
      const float iscale = 15.0f / max_scale;
      for (int j = 0; j < 16; ++j) sc[j] = uint8_t(nearest(iscale * scales[j]));
      store_super_scale(out + 80, max_scale / 15.0f);
    }
    if (max_min > 0) {
      const float iscale = 15.0f / max_min;
      for (int j = 0; j < 16; ++j) sc[j] |= uint8_t(nearest(iscale * mins[j]) << 4);
      store_super_scale(out + 82, max_min / 15.0f);
    }
    const float d_all = load_fp16(out + 80), dmin_all = load_fp16(out + 82);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * float(sc[j] & 0x0f);
      if (d == 0) continue;
      const float dm = dmin_all * float(sc[j] >> 4);
      for (int i = 0; i < 16; ++i) L[16 * j + i] = uint8_t(std::clamp(nearest((x[16 * j + i] + dm) / d), 0, 3));
    }
    pack_2bit(L, out + 16);
  }
}

void quantize_q3_k(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 256, out += 110) {
    int8_t L[256];
    float scales[16], amax = 0, max_scale = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_refined(16, 4, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    uint8_t* sc = out + 96;
    std::fill(sc, sc + 12, uint8_t(0));
    store_fp16(out + 108, 0.0f);
    if (max_scale != 0) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int l = std::clamp(nearest(iscale * scales[j]), -32, 31) + 32;
        if (j < 8) {
          sc[j] = uint8_t(l & 0x0f);
        } else {
          sc[j - 8] |= uint8_t((l & 0x0f) << 4);
        }
        sc[8 + j % 4] |= uint8_t((l >> 4) << (2 * (j / 4)));
      }
      store_super_scale(out + 108, 1.0f / iscale);
    }
    const float d_all = load_fp16(out + 108);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * float(q3k_scale(j, sc) - 32);
      if (d == 0) continue;
      for (int i = 0; i < 16; ++i) L[16 * j + i] = int8_t(std::clamp(nearest(x[16 * j + i] / d), -4, 3) + 4);
    }
    // Levels 4..7 set their bit in the mask (element i: bit i / 32 of byte i % 32) and keep 0..3.
    uint8_t* hmask = out;
    std::fill(hmask, hmask + 32, uint8_t(0));
    uint8_t low[256];
    for (int i = 0; i < 256; ++i) {
      int l = L[i];
      if (l > 3) {
        hmask[i % 32] |= uint8_t(1 << (i / 32));
        l -= 4;
      }
      low[i] = uint8_t(l);
    }
    pack_2bit(low, out + 32);
  }
}

// Q4_K (nmax 15) and Q5_K (nmax 31): 8 sub-blocks of 32 with 6-bit scales and mins; the fit
// weighs each element by the sub-block's RMS plus its magnitude.
template <int kMax>
void quantize_q45_k(const float* x, uint8_t* out, int64_t nb) {
  constexpr bool kFifth = kMax == 31;
  constexpr size_t kBytes = kFifth ? 176 : 144;
  // Q4_K searches 21 scales from nmax - 1, Q5_K 16 from nmax - 0.5.
  constexpr float kRmin = kFifth ? -0.5f : -1.0f;
  constexpr int kSteps = kFifth ? 15 : 20;
  for (int64_t b = 0; b < nb; ++b, x += 256, out += kBytes) {
    uint8_t L[256];
    float scales[8], mins[8], weights[32], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
      scales[j] = fit_scale_min(32, kMax, xs, weights, L + 32 * j, &mins[j], kRmin, 0.1f, kSteps, false);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t* packed = out + 4;
    std::fill(packed, packed + 12, uint8_t(0));
    for (int j = 0; j < 8; ++j) {
      const int ls = std::min(63, int(uint8_t(nearest(inv_scale * scales[j]))));
      const int lm = std::min(63, int(uint8_t(nearest(inv_min * mins[j]))));
      if (j < 4) {
        packed[j] = uint8_t(ls);
        packed[j + 4] = uint8_t(lm);
      } else {  // low 4 bits in bytes 8-11, top 2 bits in the spare high bits of bytes 0-7
        packed[j + 4] = uint8_t((ls & 0x0f) | ((lm & 0x0f) << 4));
        packed[j - 4] |= uint8_t((ls >> 4) << 6);
        packed[j] |= uint8_t((lm >> 4) << 6);
      }
    }
    store_super_scale(out, max_scale / 63.0f);
    store_super_scale(out + 2, max_min / 63.0f);
    const float d_all = load_fp16(out), dmin_all = load_fp16(out + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min_k4(j, packed, sc, m);
      const float d = d_all * float(sc);
      if (d == 0) continue;
      const float dm = dmin_all * float(m);
      for (int i = 0; i < 32; ++i) {
        L[32 * j + i] = uint8_t(std::clamp(nearest((x[32 * j + i] + dm) / d), 0, kMax));
      }
    }
    // 32-byte chunk c: sub-block 2c in the low nibbles, 2c+1 in the high ones; Q5_K's fifth bits
    // of the two go to bits 2c and 2c+1 of byte l of qh.
    uint8_t* qs = out + (kFifth ? 48 : 16);
    uint8_t* qh = out + 16;
    if (kFifth) std::fill(qh, qh + 32, uint8_t(0));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int q0 = L[64 * c + l], q1 = L[64 * c + 32 + l];
        qs[32 * c + l] = uint8_t((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        if (kFifth) qh[l] |= uint8_t(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
      }
    }
  }
}

void quantize_q6_k(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 256, out += 210) {
    int8_t L[256];
    float scales[16], max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_search(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs < kGroupMaxEps) {  // all zero: every byte 0
      std::fill(out, out + 210, uint8_t(0));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    store_super_scale(out + 208, 1.0f / iscale);
    auto* sc = reinterpret_cast<int8_t*>(out + 192);
    for (int j = 0; j < 16; ++j) sc[j] = int8_t(std::min(127, nearest(iscale * scales[j])));
    const float d_all = load_fp16(out + 208);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * float(sc[j]);
      if (d == 0) continue;
      for (int i = 0; i < 16; ++i) L[16 * j + i] = int8_t(std::clamp(nearest(x[16 * j + i] / d), -32, 31) + 32);
    }
    // Half h: low 4 bits of elements l and l+64 share byte 64h+l, of l+32 and l+96 byte 64h+32+l;
    // the top 2 bits of l, l+32, l+64, l+96 are the bit pairs of byte 128+32h+l.
    for (int h = 0; h < 2; ++h) {
      const int8_t* q = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        out[64 * h + l] = uint8_t((q[l] & 0x0f) | ((q[l + 64] & 0x0f) << 4));
        out[64 * h + 32 + l] = uint8_t((q[l + 32] & 0x0f) | ((q[l + 96] & 0x0f) << 4));
        out[128 + 32 * h + l] =
            uint8_t((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace

void quantize_kquant_row(DType t, const float* src, uint8_t* dst, int64_t n) {
  switch (t) {
    case DType::Q2_K: return quantize_q2_k(src, dst, n / 256);
    case DType::Q3_K: return quantize_q3_k(src, dst, n / 256);
    case DType::Q4_K: return quantize_q45_k<15>(src, dst, n / 256);
    case DType::Q5_K: return quantize_q45_k<31>(src, dst, n / 256);
    case DType::Q6_K: return quantize_q6_k(src, dst, n / 256);
    default: break;
  }
  throw Error("quantize_kquant_row: " + std::string(dtype_name(t)) + " is not a k-quant (Q2_K..Q6_K)");
}

}  // namespace tessera::gguf_blocks
