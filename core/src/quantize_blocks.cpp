#include "tessera/quantize_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "gguf/block_formats.h"
#include "tessera/error.h"

namespace tessera {

namespace {

void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// roundf (halves away from zero) for |v| < 2^31 without the libm call, which dominated Q8_0.
int round_half_away(float v) {
  int t = static_cast<int>(v);  // toward zero; v - t is exact
  const float frac = v - static_cast<float>(t);
  if (frac >= 0.5f) ++t;
  else if (frac <= -0.5f) --t;
  return t;
}

// Block of 32: d = amax / 127, q = round(x / d). Like ggml, the quants use 1/d in f32 and only the
// stored scale is rounded to fp16.
void quantize_q8_0(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 34) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, f32_to_fp16(d));
    auto* q = reinterpret_cast<int8_t*>(out + 2);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(round_half_away(x[i] * id));
  }
}

// Block of 32: d = m / -8 where m is the element of largest magnitude (with its sign), so m maps
// exactly to quant 0 and the opposite side gets the extra level; q = floor(x/d + 8.5) clamped to
// 15. Element i goes in the low nibble of byte i, element i + 16 in its high nibble.
void quantize_q4_0(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 18) {
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        m = x[i];
      }
    }
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, f32_to_fp16(d));
    uint8_t* q = out + 2;
    auto level = [id](float v) {
      // x*id >= -8 (up to rounding), so the truncation below is a floor.
      const int l = static_cast<int>(v * id + 8.5f);
      return static_cast<uint8_t>(std::clamp(l, 0, 15));
    };
    for (int i = 0; i < 16; ++i) q[i] = static_cast<uint8_t>(level(x[i]) | (level(x[i + 16]) << 4));
  }
}

// A super-block scale (>= 0) as fp16, kept finite and, when positive, non-zero: past fp16's range
// the block clips instead of decoding to inf or NaN, and a tiny block keeps a usable step.
uint16_t super_scale(float v) {
  const uint16_t h = f32_to_fp16(std::min(v, 65504.0f));
  return h == 0 && v > 0 ? uint16_t(1) : h;  // 1: the smallest subnormal, 2^-24
}

// Q4_K super-block of 256 (layout in dtype_kquant.cpp): each sub-block of 32 spans [-min, max] with
// min = max(0, -smallest) in 16 levels, x ≈ (d·sc)·q - dmin·m; the 6-bit sc and m quantize the
// sub-blocks' scales and mins against d = largest scale / 63 and dmin = largest min / 63. A plain
// range fit: ggml's reference also searches nearby scales, for a somewhat smaller error.
void quantize_q4_k(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, x += 256, out += 144) {
    float scale[8], offset[8], max_scale = 0, max_offset = 0;
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      float lo = xs[0], hi = xs[0];
      for (int i = 1; i < 32; ++i) {
        lo = std::min(lo, xs[i]);
        hi = std::max(hi, xs[i]);
      }
      offset[j] = std::max(0.0f, -lo);
      scale[j] = (std::max(hi, 0.0f) + offset[j]) / 15.0f;
      max_scale = std::max(max_scale, scale[j]);
      max_offset = std::max(max_offset, offset[j]);
    }
    const uint16_t dh = super_scale(max_scale / 63.0f), dminh = super_scale(max_offset / 63.0f);
    const float d = fp16_to_f32(dh), dmin = fp16_to_f32(dminh);
    store_u16(out, dh);
    store_u16(out + 2, dminh);
    uint8_t* packed = out + 4;
    std::memset(packed, 0, 12);
    uint8_t q[256];
    for (int j = 0; j < 8; ++j) {
      const int sc = d > 0 ? std::clamp(round_half_away(scale[j] / d), 0, 63) : 0;
      const int m = dmin > 0 ? std::clamp(round_half_away(offset[j] / dmin), 0, 63) : 0;
      if (j < 4) {
        packed[j] = uint8_t(sc);
        packed[j + 4] = uint8_t(m);
      } else {  // low 4 bits in bytes 8-11, top 2 bits in the spare high bits of bytes 0-7
        packed[j + 4] = uint8_t((sc & 0x0f) | ((m & 0x0f) << 4));
        packed[j - 4] |= uint8_t((sc >> 4) << 6);
        packed[j] |= uint8_t((m >> 4) << 6);
      }
      const float step = d * float(sc), off = dmin * float(m);
      const float inv = step > 0 ? 1.0f / step : 0.0f;
      for (int i = 0; i < 32; ++i) {
        q[32 * j + i] = uint8_t(std::clamp(round_half_away((x[32 * j + i] + off) * inv), 0, 15));
      }
    }
    // 32-byte chunk c: sub-block 2c in the low nibbles, 2c+1 in the high ones.
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) out[16 + 32 * c + l] = uint8_t(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
  }
}

// Q6_K super-block of 256 (layout in dtype_kquant.cpp): each 16 elements get the scale that maps
// their value of largest magnitude to -32 (as Q4_0 does to -8), x ≈ d·sc·(q - 32) with q in 0..63;
// the int8 sc quantize those scales against d = largest |scale| / 127.
void quantize_q6_k(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, x += 256, out += 210) {
    float scale[16], max_abs = 0;
    for (int j = 0; j < 16; ++j) {
      float m = 0;
      for (int i = 0; i < 16; ++i) {
        if (std::fabs(x[16 * j + i]) > std::fabs(m)) m = x[16 * j + i];
      }
      scale[j] = m / -32.0f;
      max_abs = std::max(max_abs, std::fabs(scale[j]));
    }
    const uint16_t dh = super_scale(max_abs / 127.0f);
    const float d = fp16_to_f32(dh);
    store_u16(out + 208, dh);
    uint8_t q[256];
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0 ? std::clamp(round_half_away(scale[j] / d), -128, 127) : 0;
      out[192 + j] = uint8_t(int8_t(sc));
      const float step = d * float(sc);
      const float inv = step != 0 ? 1.0f / step : 0.0f;
      for (int i = 0; i < 16; ++i) {
        q[16 * j + i] = uint8_t(std::clamp(round_half_away(x[16 * j + i] * inv) + 32, 0, 63));
      }
    }
    // Half h: low 4 bits of elements l and l+64 share byte 64h+l, of l+32 and l+96 byte 64h+32+l;
    // the top 2 bits of l, l+32, l+64, l+96 are the bit pairs of byte 128+32h+l.
    for (int h = 0; h < 2; ++h) {
      const uint8_t* qh = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        out[64 * h + l] = uint8_t((qh[l] & 0x0f) | ((qh[l + 64] & 0x0f) << 4));
        out[64 * h + 32 + l] = uint8_t((qh[l + 32] & 0x0f) | ((qh[l + 96] & 0x0f) << 4));
        out[128 + 32 * h + l] =
            uint8_t((qh[l] >> 4) | ((qh[l + 32] >> 4) << 2) | ((qh[l + 64] >> 4) << 4) | ((qh[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace

bool quantize_supported(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q6_K:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q5_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS: return true;
    default: return false;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  if (!quantize_supported(t)) {
    throw Error("cannot quantize f32 to " + std::string(dtype_name(t)) +
                " (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, "
                "iq4_xs)");
  }
  dtype_row_bytes(t, n);  // validates n against the block size
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) store_u16(out + 2 * i, f32_to_fp16(src[i]));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) store_u16(out + 2 * i, f32_to_bf16(src[i]));
      return;
    case DType::Q8_0: quantize_q8_0(src, out, n); return;
    case DType::Q4_0: quantize_q4_0(src, out, n); return;
    case DType::Q4_K: quantize_q4_k(src, out, n); return;
    case DType::Q6_K: quantize_q6_k(src, out, n); return;
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1: gguf_blocks::quantize_legacy_row(t, src, out, n); return;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q5_K: gguf_blocks::quantize_kquant_more_row(t, src, out, n); return;
    case DType::IQ4_NL:
    case DType::IQ4_XS: gguf_blocks::quantize_iq4_row(t, src, out, n); return;
    default: return;
  }
}

}  // namespace tessera
